"""An image keeps its pins: the constraint file's content per stack, and keep_pins.py's rewrite of an overridden
exact requirement in installed metadata (pure, then on a real venv with real pip)."""

import importlib.util
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from dockerlaunch.images import build_context
from dockerlaunch.images import lock as locks
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

SCRIPT = Path(build_context.__file__).parent / "scripts" / "keep_pins.py"


@pytest.fixture(scope="module")
def keep_pins():
    spec = importlib.util.spec_from_file_location("dl_keep_pins", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def constraints(name: str) -> str:
    s = load_matrix().stacks[name]
    return build_context.keep_pins_text(s, locks.checked(s, default_dockerfiles_dir()))


def test_the_recommended_stack_keeps_its_binary_core_and_marks_its_override():
    text = constraints("swift4.6-mcore0.19-cu13-py313")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert "torch==2.11.0" in lines and "nvidia-nccl-cu13==2.28.9" in lines
    assert {"transformer-engine==2.16.1", "transformer-engine-cu13==2.16.1", "transformer-engine-torch==2.16.1",
            "flash-attn==2.8.3", "cuda-toolkit==13.0.2"} <= set(lines)
    assert "nvidia-cublas==13.3.0.5  # override" in lines
    # free: pure-Python frameworks a user updates for a new model, and build tools (pip hands PIP_CONSTRAINT to the
    # isolated build environments of what a user installs)
    for free in ("ms-swift", "transformers", "peft", "trl", "megatron-core", "setuptools", "wheel", "numpy"):
        assert not any(ln.startswith(f"{free}==") for ln in lines), free
    assert all(" " not in ln.split("#")[0].strip() and "[" not in ln for ln in lines)  # no extras: pip refuses them


def test_a_dropped_distribution_is_not_kept():
    text = constraints("swift4.6-mcore0.19-cu128")
    assert "transformer-engine-cu13" not in text and "transformer-engine-cu12==2.16.1" in text


CUDA_TOOLKIT_METADATA = """\
Metadata-Version: 2.1
Name: cuda-toolkit
Version: 13.0.2
Requires-Dist: nvidia-cublas==13.1.0.3; extra == "cublas"
Requires-Dist: nvidia-cuda-runtime==13.0.96; extra == "cudart"
Requires-Dist: nvidia-cublas (==13.1.0.3) ; extra == 'all'
Requires-Dist: nvidia-cublas-cu12==12.8.4.1; extra == "cu12"
Requires-Dist: nvidia-cublas>=13.0; extra == "any"

Long description mentioning nvidia-cublas==13.1.0.3 stays as it is.
"""


def test_an_exact_requirement_on_an_overridden_name_is_set_to_the_override(keep_pins):
    new, changes = keep_pins.rewrite(CUDA_TOOLKIT_METADATA, {"nvidia-cublas": "13.3.0.5"})
    assert changes == ["nvidia-cublas==13.1.0.3 -> ==13.3.0.5", "nvidia-cublas==13.1.0.3 -> ==13.3.0.5"]
    assert 'Requires-Dist: nvidia-cublas==13.3.0.5; extra == "cublas"\n' in new
    assert "Requires-Dist: nvidia-cublas (==13.3.0.5) ; extra == 'all'\n" in new
    # other names, ranges and the description are untouched
    assert "nvidia-cublas-cu12==12.8.4.1" in new and "nvidia-cublas>=13.0" in new
    assert "Long description mentioning nvidia-cublas==13.1.0.3 stays" in new
    assert keep_pins.rewrite(new, {"nvidia-cublas": "13.3.0.5"})[1] == []  # once is enough


def test_keep_pins_makes_a_real_venv_resolve_under_its_constraint(tmp_path):
    """A venv holding a distribution that pins `dlt-lib==1.0` exactly while `dlt-lib 2.0` is installed (an
    override): pip check names the line; keep_pins.py rewrites it, records it, and pip check is clean."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for name, version, requires in (("dlt-lib", "2.0", ""), ("dlt-user", "1.0", "Requires-Dist: dlt-lib==1.0\n")):
        d = site / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}")
        (d / "INSTALLER").write_text("pip\n")
        (d / "RECORD").write_text("")
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 1 and "dlt-user 1.0 has requirement dlt-lib==1.0, but you have dlt-lib 2.0" in \
        check.stdout
    pins = tmp_path / "constraints.txt"
    pins.write_text("# header\ndlt-lib==2.0  # override\n")
    report = tmp_path / "out" / "applied.txt"
    r = subprocess.run([py, str(SCRIPT), str(pins), str(report)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert report.read_text() == "dlt-user 1.0: dlt-lib==1.0 -> ==2.0\n"
    assert subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True).returncode == 0
    usage = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert usage.returncode == 1 and usage.stderr.strip() == "usage: keep_pins.py CONSTRAINTS REPORT"
