"""`dockerlaunch verify` on real images, no GPU: images built here FROM a CUDA image with torch and the PyPI CUDA
toolkit, holding (a) a library built here that lost a symbol its dependent needs, (b) TransformerEngine 2.16.1's core
wheel on torch 2.11.0's cuBLAS 13.1.0.3 (it needs cublasLtGroupedMatrixLayoutInit_internal, which cuBLAS first
exports in 13.2), then on cuBLAS 13.3.0.5 recorded as an override. Images are shared per module and removed."""

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from dockerlaunch.cache import cache_root, load_image_needs
from tests.integration.helpers import dl, torch_wheels
from tests.unit.images.test_verify import gcc, version_script

pytestmark = pytest.mark.integration

CUDA_IMAGE_ENV = "DL_TEST_CUDA_IMAGE"
TE_LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"
SYMBOL = "cublasLtGroupedMatrixLayoutInit_internal"
# what the TE images install, pinned by hash (pure Python or manylinux, so any Python 3 base takes them)
WHEELS = """\
transformer-engine==2.16.1 --hash=sha256:1da67b1b8629bd4439711161957be656dc0cd3e0e4e47cbe7a21a40430b23c67
transformer-engine-cu13==2.16.1 --hash=sha256:e8bbfe2ef39795932c594c9e0f657599b021b8054f6cf41cea15ac66e7ca0cd1
nvidia-cublas==13.3.0.5 --hash=sha256:366568e2dc59e6fe71ffd179f9f2a38b8b2772aed626320a64008651b1e72974
pydantic==1.10.27 --hash=sha256:d714c3df0db634a6720abdc204d7b3bfc6c62d4ef7b4f9dcd64b37c29187a058
importlib-metadata==8.7.1 --hash=sha256:5a1f80bf1daa489495071efbb095d75a634cf28a8bc299581244063b53176151
zipp==3.23.1 --hash=sha256:0b3596c50a5c700c9cb40ba8d86d9f2cc4807e9bedb06bcdf7fac85633e444dc
packaging==25.0 --hash=sha256:29572ef2b1f17581046b3a2227d5c611fb25ec70ca1ba8554b24b0e69331a484
"""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@pytest.fixture(scope="module")
def cuda_base(engine, cuda_stage, images):
    """A CUDA image with Python, torch and the CUDA libraries from PyPI (torch 2.11.0 pins cuBLAS 13.1.0.3): the
    recommended stack's `cuda` stage plus torch 2.11.0 as pip resolves it (its wheels downloaded once per machine
    into the cache's test-wheels/torch-2.11.0/). DL_TEST_CUDA_IMAGE names another such image to use instead."""
    if os.environ.get(CUDA_IMAGE_ENV):
        engine.images.get(os.environ[CUDA_IMAGE_ENV])  # fails, naming it, when it is not here
        return os.environ[CUDA_IMAGE_ENV]
    dest = torch_wheels()
    return docker_build(new_tag(images, "cuda-base"), dest, f"""\
FROM {cuda_stage.tag}
RUN --mount=type=bind,source=.,target=/w pip install --no-cache-dir --no-index --find-links /w torch==2.11.0
""")


def docker_build(tag: str, context: Path, dockerfile: str) -> str:
    (context / "Dockerfile").write_text(dockerfile)
    r = subprocess.run(["docker", "build", "--network", "host", "-q", "-t", tag, str(context)], capture_output=True,
                       text=True, timeout=900, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return tag


@pytest.fixture(scope="module")
def images(engine):
    """Tags built by this module, removed at its end (newest first: later ones are FROM earlier ones)."""
    made: list[str] = []
    yield made
    for tag in reversed(made):
        try:
            engine.images.remove(tag, force=True)
        except docker.errors.APIError:
            pass


def new_tag(images: list[str], what: str) -> str:
    tag = f"dlt-verify/{what}:{secrets.token_hex(3)}"
    images.append(tag)
    return tag


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The TE images' wheels, downloaded once per machine (the cache folder's test-wheels/) and checked by hash."""
    dest = cache_root() / "test-wheels"
    dest.mkdir(parents=True, exist_ok=True)
    req = tmp_path_factory.mktemp("req") / "requirements.txt"
    req.write_text(WHEELS)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--require-hashes",
                        "--only-binary=:all:", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest),
                        "-r", str(req)],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ctx = tmp_path_factory.mktemp("wheels")
    for line in WHEELS.splitlines():
        name = line.split("==")[0].replace("-", "_")
        [whl] = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-" + line.split("==")[1]
                                                                               .split()[0])]
        if whl.stat().st_dev == ctx.stat().st_dev:
            os.link(whl, ctx / whl.name)
        else:
            shutil.copy(whl, ctx)
    return ctx


@pytest.fixture(scope="module")
def te_cublas131(cuda_base, wheels, images):
    """TE 2.16.1 (metadata + core wheel) on the base's cuBLAS 13.1.0.3, labelled as a dockerlaunch image; the pip CUDA
    folder registered with the loader as train.Dockerfile does on a made base (without it, importing TE before torch
    finds no libcublas.so.13 at all: verify's import orders show that)."""
    return docker_build(new_tag(images, "te-cublas131"), wheels, f"""\
FROM {cuda_base}
RUN echo /usr/local/cuda/lib > /etc/ld.so.conf.d/dockerlaunch-cuda.conf && ldconfig
RUN --mount=type=bind,source=.,target=/w pip install --no-cache-dir --no-index --find-links /w \\
    transformer-engine==2.16.1 transformer-engine-cu13==2.16.1 pydantic==1.10.27
LABEL ai.dockerlaunch.stack=dlt-verify ai.dockerlaunch.components=torch,transformer_engine.common \\
      ai.dockerlaunch.cuda-archs=9.0 ai.dockerlaunch.pin.transformer_engine=2.16.1
""")


@pytest.fixture(scope="module")
def te_cublas133(te_cublas131, wheels, images):
    """The same with nvidia-cublas 13.3.0.5 over torch's pin, recorded as the stack's override. A distribution that
    pins cuBLAS exactly stands for cuda-toolkit[cublas]==13.0.2 (pip check does not evaluate its extras, so the
    toolkit's own pin is never reported)."""
    pin = "Metadata-Version: 2.1\\nName: dlt-cublas-pin\\nVersion: 1.0\\nRequires-Dist: nvidia-cublas==13.1.0.3\\n"
    return docker_build(new_tag(images, "te-cublas133"), wheels, f"""\
FROM {te_cublas131}
RUN --mount=type=bind,source=.,target=/w \\
    pip install --no-cache-dir --no-index --no-deps /w/nvidia_cublas-13.3.0.5-*.whl \\
 && d="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dlt_cublas_pin-1.0.dist-info" \\
 && mkdir "$d" && printf '{pin}' > "$d/METADATA" && printf 'pip\\n' > "$d/INSTALLER" && : > "$d/RECORD"
LABEL ai.dockerlaunch.overrides=nvidia-cublas==13.3.0.5 ai.dockerlaunch.pin.nvidia-cublas=13.3.0.5
""")


@pytest.fixture(scope="module")
def lost_symbol(cuda_base, images, tmp_path_factory):
    """A package with two libraries built here: libdlvcons.so was linked against a libdlvprov.so.1 that had
    dlv_absent@DLVPROV_1; the one installed beside it no longer has it. No dockerlaunch labels."""
    t = tmp_path_factory.mktemp("lost")
    old, pkg = t / "old", t / "ctx" / "dlt_lost_symbol"
    gcc(old / "libdlvprov.so.1", "int dlv_present(void){return 1;} int dlv_absent(void){return 2;}",
        "-Wl,-soname,libdlvprov.so.1",
        version_script(t / "v1.map", "DLVPROV_1 { global: dlv_present; dlv_absent; local: *; };"))
    gcc(pkg / "libdlvcons.so", "extern int dlv_present(void); extern int dlv_absent(void);\n"
        "int use(void){return dlv_present() + dlv_absent();}", f"-L{old}", "-l:libdlvprov.so.1",
        "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")
    gcc(pkg / "libdlvprov.so.1", "int dlv_present(void){return 1;}", "-Wl,-soname,libdlvprov.so.1",
        version_script(t / "v2.map", "DLVPROV_1 { global: dlv_present; local: *; };"))
    for c in pkg.glob("*.c"):
        c.unlink()
    return docker_build(new_tag(images, "lost-symbol"), t / "ctx", f"""\
FROM {cuda_base}
COPY dlt_lost_symbol /tmp/dlt_lost_symbol
RUN cp -r /tmp/dlt_lost_symbol "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/" \\
 && rm -r /tmp/dlt_lost_symbol
""")


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The table's rows by check name (the columns are two spaces apart; details may hold single spaces)."""
    lines = stdout.splitlines()
    col_v, col_d = lines[0].index("verdict"), lines[0].index("detail")
    out = {}
    for line in lines[1:]:
        if line.startswith("verify"):
            continue
        out[line[:col_v].strip()] = (line[col_v:col_d].strip(), line[col_d:])
    return out


def test_a_library_that_lost_a_symbol_is_named_with_its_provider_and_the_image_fails(lost_symbol):
    r = dl("verify", lost_symbol, "--cuda-archs", "9.0", timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    out = rows(r.stdout)
    verdict, detail = out["symbols dlt_lost_symbol/libdlvcons.so"]
    assert verdict == "FAIL"
    assert "needs dlv_absent@DLVPROV_1, which libdlvprov.so.1 (dlt_lost_symbol/libdlvprov.so.1) does not define" \
        in detail
    assert "the loader says:" in detail and "undefined symbol: dlv_absent" in detail
    assert [k for k, (verdict, _) in out.items() if verdict == "FAIL"] == ["symbols dlt_lost_symbol/libdlvcons.so"]
    # no labels: what needs no pins still runs (archs from --cuda-archs, pip check), versions are listed
    assert out["archs"][0] == "PASS" and "from --cuda-archs" in out["archs"][1]
    assert out["pip check"] == ("PASS", "no broken requirements")
    assert out["versions"][0] == "NOTE" and "torch 2.11.0" in out["versions"][1]
    assert out["symbols: driver"][0] == "NEEDS-DRIVER"  # torch's libcaffe2_nvrtc.so links libcuda.so.1


def test_te_2_16_on_torch_2_11s_cublas_fails_naming_symbol_library_and_cublas_version(te_cublas131):
    r = dl("verify", te_cublas131, "--output", "json", timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    fails = {c["check"]: c["detail"] for c in report["checks"] if c["verdict"] == "FAIL"}
    detail = fails[f"symbols {TE_LIB}"]
    assert f"needs {SYMBOL}@libcublasLt.so.13, which libcublasLt.so.13 (nvidia-cublas 13.1.0.3, " \
           "nvidia/cu13/lib/libcublasLt.so.13) does not define" in detail
    assert "transformer-engine-cu13 2.16.1" in detail
    # the import fails for the same reason, in the loader's words; nothing else fails
    assert SYMBOL in fails["import transformer_engine.common"]
    assert set(fails) == {f"symbols {TE_LIB}", "import transformer_engine.common"}
    assert report["ok"] is False and report["counts"]["FAIL"] == 2
    assert report["versions"]["transformer_engine"] == {
        "installed": "transformer-engine 2.16.1, transformer-engine-cu13 2.16.1", "pinned": "2.16.1"}
    assert report["facts"]["cuda_archs"] == ["9.0"]
    assert "cublasLt" not in r.stderr


def test_te_2_16_on_cublas_13_3_passes_and_the_override_is_shown_as_recorded(te_cublas133):
    r = dl("verify", te_cublas133, timeout=900)
    out = rows(r.stdout)
    assert not [k for k in out if k.startswith("symbols transformer_engine")], r.stdout
    assert out["symbols"][0] == "PASS"
    assert out["import transformer_engine.common"] == ("PASS", "imported")
    assert out["version nvidia-cublas"] == ("PASS", "pinned 13.3.0.5, installed nvidia-cublas 13.3.0.5")
    pip_rows = [line for line in r.stdout.splitlines() if line.startswith("pip check")]
    assert any(" NOTE " in line and "recorded override nvidia-cublas==13.3.0.5" in line and
               "dlt-cublas-pin 1.0 has requirement nvidia-cublas==13.1.0.3, but you have nvidia-cublas 13.3.0.5"
               in line for line in pip_rows), r.stdout
    # TE's core wheel says cp310 in its WHEEL file although it holds no extension: a warning with the proof
    assert any(" WARN " in line and "transformer_engine_cu13 2.16.1 is not supported" in line for line in pip_rows)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("verify: PASS")
    # kept by Image ID for doctor: what each library with device code holds, and the runtime's CUDA
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", te_cublas133], capture_output=True,
                              text=True, check=True).stdout.strip()
    needs = load_image_needs(image_id)
    assert needs is not None and needs.image == te_cublas133 and needs.cuda == "13.0", needs
    [te] = [c for c in needs.code or () if c.library.endswith("libtransformer_engine.so")]
    assert "sm_90" in te.cubins and (te.dist or "").startswith("transformer-engine-cu13 2.16.1")


def test_the_same_pip_line_without_the_override_label_fails(te_cublas133, images, tmp_path):
    tag = docker_build(new_tag(images, "no-override"), tmp_path,
                       f"FROM {te_cublas133}\nLABEL ai.dockerlaunch.overrides=\"\"\n")
    r = dl("verify", tag, "--checks", "pip", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    [line] = [ln for ln in r.stdout.splitlines() if "dlt-cublas-pin 1.0 has requirement" in ln]
    assert line.split()[:3] == ["pip", "check", "FAIL"] and "recorded" not in line


def test_bad_input_is_one_line_with_the_fix(cuda_base, images, tmp_path):
    missing = dl("verify", "dlt-verify/not-here:404")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip() == ("error: image dlt-verify/not-here:404 is not on this machine: build it "
                                      "(dockerlaunch build --stack NAME), pull it (docker pull "
                                      "dlt-verify/not-here:404), or load it (docker load -i FILE; a bundle: `load`)")
    (tmp_path / "f").write_text("x")
    bare = docker_build(new_tag(images, "no-python"), tmp_path, "FROM scratch\nCOPY f /f\n")
    nopy = dl("verify", bare)
    assert nopy.returncode == 1 and len(nopy.stderr.strip().splitlines()) == 1, nopy.stderr
    assert nopy.stderr.startswith(f"error: image {bare} has no python (neither python3 nor python on its PATH)")
    stopped = subprocess.run([sys.executable, "-m", "dockerlaunch", "verify", cuda_base], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert stopped.returncode == 1 and len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
    assert stopped.stderr.startswith(f"error: verify {cuda_base}: the Docker engine is not usable")
    assert "scripts/install-docker" in stopped.stderr
    archs = dl("verify", cuda_base, "--cuda-archs", "hopper")
    assert archs.returncode == 2 and "is not a compute capability" in archs.stderr
    for r in (missing, nopy, stopped, archs):
        assert "Traceback" not in r.stderr


# ---- a check that could not run is ERROR (issue 40): each cause on a real image, through the CLI; `build` stamps
# its report into the image only when it is ok, so an ERROR never reaches the image as a PASS


def broken_tool_cache(tmp_path: Path, what: str) -> dict[str, str]:
    """A cache folder whose pinned tool is there (marked complete) but cannot work: pyelftools that fails to import,
    or a cuobjdump that cannot run. The environment for `dockerlaunch verify` to use it."""
    from dockerlaunch.images.verify_tools import CUOBJDUMP, PYELFTOOLS, ensure_tool

    cache = tmp_path / "cache"
    real = ensure_tool(PYELFTOOLS)  # the real one (the machine's cache), copied, so only `what` is broken
    tools = cache / "tools"
    tools.mkdir(parents=True)
    shutil.copytree(real, tools / real.name)
    tool = CUOBJDUMP["amd64"]
    cuobj = tools / f"{tool.name}-{tool.version}-{tool.sha256[:12]}"
    cuobj.mkdir()
    (cuobj / ".complete").write_text("test\n")
    if what == "pyelftools":
        (tools / real.name / "elftools" / "__init__.py").write_text("raise ImportError('a broken pyelftools')\n")
        shutil.copy(ensure_tool(tool) / "cuobjdump", cuobj / "cuobjdump")
    else:
        (cuobj / "cuobjdump").write_text("#!/bin/sh\necho 'cuobjdump fatal   : cannot run here' >&2\nexit 1\n")
        (cuobj / "cuobjdump").chmod(0o755)
    return {**os.environ, "DOCKERLAUNCH_CACHE_DIR": str(cache)}


def verify_json(image: str, *args: str, env=None) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "verify", image, "--output", "json", *args],
                       capture_output=True, text=True, timeout=900, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def errors_of(report: dict) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in report["checks"] if c["verdict"] == "ERROR"}


def test_a_symbol_scan_that_cannot_run_is_an_error(cuda_base, tmp_path):
    code, report = verify_json(cuda_base, "--checks", "symbols", env=broken_tool_cache(tmp_path, "pyelftools"))
    assert code == 1 and report["ok"] is False and report["outcome"] == "ERROR", report
    assert "the symbol scan did not run: pyelftools could not be imported here" in errors_of(report)["symbols"]
    assert not [c for c in report["checks"] if c["verdict"] == "PASS"], report["checks"]


def test_a_cuobjdump_that_cannot_run_is_an_error_for_every_library_it_could_not_read(cuda_base, tmp_path):
    code, report = verify_json(cuda_base, "--checks", "archs", "--cuda-archs", "9.0",
                               env=broken_tool_cache(tmp_path, "cuobjdump"))
    assert code == 1 and report["ok"] is False and report["outcome"] == "ERROR", report
    errors = errors_of(report)
    assert any(k.startswith("archs torch/lib/") for k in errors), errors
    assert all("not checked: cuobjdump could not read it (cuobjdump fatal   : cannot run here)" in d
               for d in errors.values()), errors
    assert not [c for c in report["checks"] if c["verdict"] in ("PASS", "FAIL")], report["checks"]


def test_an_image_without_pip_is_an_error_not_a_skip(cuda_base, images, tmp_path):
    tag = docker_build(new_tag(images, "no-pip"), tmp_path, f"FROM {cuda_base}\nRUN python -m pip uninstall -y pip\n")
    code, report = verify_json(tag, "--checks", "pip")
    assert code == 1 and report["ok"] is False and report["outcome"] == "ERROR", report
    assert errors_of(report) == {"pip check": "did not run: pip is not installed in the image"}
    text = dl("verify", tag, "--checks", "pip", timeout=300)
    assert text.returncode == 1 and text.stdout.rstrip().endswith("verify: ERROR"), text.stdout


# ---- an image keeps its pins (issue 40): PIP_CONSTRAINT and the override made true in installed metadata


def tiny_wheel(folder: Path, name: str, requires: list[str]) -> Path:
    """A pure wheel with no files but its metadata: a package that needs what `requires` says."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name.replace('-', '_')}-1.0"
    files = {f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n" +
             "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}

    def digest(t: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(t)},{len(t.encode())}\n" for p, t in files.items()) + \
        f"{dist}.dist-info/RECORD,,\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in {**files, f"{dist}.dist-info/RECORD": record}.items():
            z.writestr(p, t)
    return path


@pytest.fixture(scope="module")
def find_links(cuda_base, tmp_path_factory) -> Path:
    """What a user's offline `pip install --find-links` would see: torch 2.11.0 and everything it pins (cuBLAS
    13.1.0.3 among them), a package that only needs torch (like another peft), one that needs torch's cuBLAS."""
    folder = tmp_path_factory.mktemp("find-links")
    for whl in (cache_root() / "test-wheels" / "torch-2.11.0").glob("*.whl"):
        os.link(whl, folder / whl.name) if whl.stat().st_dev == folder.stat().st_dev else shutil.copy(whl, folder)
    assert list(folder.glob("nvidia_cublas-13.1.0.3-*.whl")), "torch 2.11.0's download lacks cuBLAS 13.1.0.3"
    tiny_wheel(folder, "dlt-needs-torch", ["torch>=2.0"])
    tiny_wheel(folder, "dlt-wants-old-cublas", ["nvidia-cublas==13.1.0.3"])
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def cublas133(cuda_base, wheels, images):
    """The base with TE's cuBLAS (13.3.0.5) over torch's exact 13.1.0.3, as the recommended stack installs it."""
    return docker_build(new_tag(images, "cublas133"), wheels, f"""\
FROM {cuda_base}
RUN --mount=type=bind,source=.,target=/w pip install --no-cache-dir --no-index --no-deps /w/nvidia_cublas-13.3.0.5-*.whl
""")


@pytest.fixture(scope="module")
def kept(cublas133, images, tmp_path_factory):
    """cublas133 made to keep its pins by what train.Dockerfile's top layer runs: keep_pins.py over a constraint
    file in build_context.keep_pins_text's format, and PIP_CONSTRAINT."""
    from dockerlaunch.images import build_context

    ctx = tmp_path_factory.mktemp("kept")
    (ctx / "keep_pins.py").write_text((Path(build_context.__file__).parent / "scripts" / "keep_pins.py").read_text())
    (ctx / "constraints.txt").write_text("# dockerlaunch\ntorch==2.11.0\nnvidia-nccl-cu13==2.28.9\n"
                                         "nvidia-cublas==13.3.0.5  # override\n")
    return docker_build(new_tag(images, "kept"), ctx, f"""\
FROM {cublas133}
COPY keep_pins.py constraints.txt /tmp/
RUN mkdir -p /etc/dockerlaunch && cp /tmp/constraints.txt /etc/dockerlaunch/constraints.txt \\
 && python /tmp/keep_pins.py /etc/dockerlaunch/constraints.txt /opt/dockerlaunch/overrides-applied.txt && pip check
ENV PIP_CONSTRAINT=/etc/dockerlaunch/constraints.txt
""")


def pip_install_then_versions(image: str, folder: Path, package: str) -> tuple[int, str, dict[str, str]]:
    script = (f"pip install --no-cache-dir --no-index --find-links /w {package} > /tmp/out 2>&1; rc=$?; cat /tmp/out; "
              "echo RC=$rc; python -c 'import importlib.metadata as m; "
              "print(\"V\", *(n + \"=\" + m.version(n) for n in "
              "(\"nvidia-cublas\", \"torch\", \"nvidia-nccl-cu13\")))'")
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{folder}:/w:ro", "--entrypoint", "sh",
                        image, "-c", script], capture_output=True, text=True, timeout=900)
    out = r.stdout
    rc = int(out.split("RC=")[-1].split()[0])
    versions = dict(kv.split("=") for kv in out.split("\nV ")[-1].split())
    return rc, out, versions


KEPT = {"nvidia-cublas": "13.3.0.5", "torch": "2.11.0", "nvidia-nccl-cu13": "2.28.9"}


def test_without_the_constraint_an_ordinary_install_puts_torchs_cublas_back(cublas133, find_links):
    """The control: what every image without kept pins does to TE's cuBLAS."""
    rc, out, versions = pip_install_then_versions(cublas133, find_links, "dlt-needs-torch")
    assert rc == 0, out
    assert versions["nvidia-cublas"] == "13.1.0.3", out  # moved back: TE's core would fail to load now


def test_an_install_that_needs_nothing_new_of_torch_succeeds_and_moves_nothing(kept, find_links):
    rc, out, versions = pip_install_then_versions(kept, find_links, "dlt-needs-torch")
    assert rc == 0, out
    assert versions == KEPT, out


def test_an_install_that_would_move_cublas_fails_naming_the_constraint(kept, find_links):
    rc, out, versions = pip_install_then_versions(kept, find_links, "dlt-wants-old-cublas")
    assert rc != 0 and "nvidia-cublas==13.3.0.5" in out and "constraint" in out, out
    assert versions == KEPT, out


# ---- every import order (issue 40) on a real image: an older cuBLAS registered with the loader beside the lock's


@pytest.fixture(scope="module")
def shadowed(te_cublas133, find_links, images, tmp_path_factory):
    """TE 2.16.1's core on the lock's cuBLAS 13.3.0.5 (pip), plus torch's cuBLAS 13.1.0.3 unpacked into
    /usr/local/cuda-13.1/lib64 and registered through ld.so.conf, as an nvidia/cuda base registers its own toolkit
    (the pip CUDA folder is registered too, as train.Dockerfile does on a made base; the older one sorts first)."""
    ctx = tmp_path_factory.mktemp("shadowed")
    [old] = find_links.glob("nvidia_cublas-13.1.0.3-*.whl")
    shutil.copy(old, ctx / "old-cublas.whl")
    unpack = ("import zipfile; z = zipfile.ZipFile('/w/old-cublas.whl'); "
              "[open('/usr/local/cuda-13.1/lib64/' + n.rsplit('/', 1)[1] + '.1.0.3', 'wb').write(z.read(n)) "
              "for n in z.namelist() if n.endswith(('/libcublas.so.13', '/libcublasLt.so.13'))]")
    return docker_build(new_tag(images, "shadowed"), ctx, f"""\
FROM {te_cublas133}
RUN --mount=type=bind,source=.,target=/w mkdir -p /usr/local/cuda-13.1/lib64 && python -c "{unpack}" \\
 && echo /usr/local/cuda-13.1/lib64 > /etc/ld.so.conf.d/00-cuda-13-1.conf && ldconfig \\
 && ldconfig -p | grep -q '/usr/local/cuda-13.1/lib64/libcublasLt.so.13$'
""")


def test_an_older_cublas_the_loader_prefers_fails_the_order_that_takes_it(shadowed):
    code, report = verify_json(shadowed, "--checks", "imports")
    assert code == 1, report
    rows = {c["check"]: (c["verdict"], c["detail"]) for c in report["checks"]}
    assert rows["import transformer_engine.common"][0] == "PASS"  # the stack's order (torch first) hides it
    te_first = [d for k, (verdict, d) in rows.items() if k.startswith("import order: transformer_engine.common")
                and "torch before" not in k and verdict == "FAIL"]
    assert te_first, rows
    for detail in te_first:
        assert SYMBOL in detail, detail
        assert "/usr/local/cuda-13.1/lib64/libcublasLt.so.13" in detail and "13.1.0.3" in detail, detail
        assert "nvidia/cu13/lib/libcublasLt.so.13 (nvidia-cublas 13.3.0.5)" in detail, detail
    assert "import order: torch before transformer_engine.common" not in rows  # torch first takes the lock's copy
    assert report["outcome"] == "FAIL"


WHEELS_FIRST = "dockerlaunch/images/scripts/wheels_first.sh"


@pytest.fixture(scope="module")
def shadowed_fixed(shadowed, images, tmp_path_factory):
    """The shadowed image with what train.Dockerfile does for every image: scripts/wheels_first.sh puts the wheels'
    library folders first for the loader, and TE's loader is pointed at the wheels (the recommended stack's values,
    whose Python, 3.13, is this base's)."""
    from dockerlaunch.images import build_argv
    from dockerlaunch.images.stacks import load_matrix

    ctx = tmp_path_factory.mktemp("fixed")
    shutil.copy(Path(__file__).resolve().parents[2] / WHEELS_FIRST, ctx / "wheels_first.sh")
    homes = build_argv.te_wheel_homes(load_matrix().stacks["swift4.6-mcore0.19-cu13-py313"])
    env = " ".join(f"{k.removesuffix('_WHEELS')}={v}" for k, v in homes.items())
    return docker_build(new_tag(images, "shadowed-fixed"), ctx, f"""\
FROM {shadowed}
RUN --mount=type=bind,source=wheels_first.sh,target=/tmp/wheels_first.sh sh /tmp/wheels_first.sh
ENV {env}
""")


def test_with_the_wheels_first_every_order_takes_the_locks_copies(shadowed_fixed):
    code, report = verify_json(shadowed_fixed, "--checks", "imports")
    rows = {c["check"]: (c["verdict"], c["detail"]) for c in report["checks"]}
    assert code == 0 and report["outcome"] == "PASS", rows
    assert rows["import orders"][0] == "PASS", rows
    assert "libcublasLt.so.13" in rows["import orders: duplicates"][1]  # still there, never taken
