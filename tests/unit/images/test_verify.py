"""verify's logic without an image: the loader-like symbol resolution on tiny libraries built here with gcc (and the
real loader's opinion of the same files), and the judging of recorded results (pip check with a recorded override,
architectures, imports that need a driver, versions, the report's table and json)."""

import ctypes
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dockerlaunch.errors import ConfigError
from dockerlaunch.gpu import cuda
from dockerlaunch.images import verify, verify_tools
from dockerlaunch.images import verify_judges as v

SCRIPTS = Path(v.__file__).parent / "scripts"


# ---------------------------------------------------------------- elfscan on real ELF files


@pytest.fixture(scope="module")
def elfscan():
    """scripts/elfscan.py as a module, with the pinned pyelftools verify mounts into images (fetched once)."""
    tool = verify_tools.ensure_tool(verify_tools.PYELFTOOLS)
    sys.path.insert(0, str(tool))
    spec = importlib.util.spec_from_file_location("dl_elfscan", SCRIPTS / "elfscan.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dl_elfscan"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("dl_elfscan", None)
    sys.path.remove(str(tool))


def gcc(out: Path, source: str, *args: str) -> Path:
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed to build the test libraries (apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name.replace(".", "_") + ".c")
    src.write_text(source)
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def version_script(path: Path, text: str) -> str:
    path.write_text(text)
    return f"-Wl,--version-script={path}"


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """A provider whose new build lost a versioned symbol its dependent uses (what TE 2.16 meets in cuBLAS 13.1),
    and the other shapes the resolver must tell apart."""
    t = tmp_path_factory.mktemp("elf")
    old, lib, pkg = t / "old", t / "lib", t / "pkg"
    both = version_script(t / "v1.map", "DLPROV_1 { global: dl_present; dl_absent; local: *; };")
    gcc(old / "libdlprov.so.1", "int dl_present(void){return 1;} int dl_absent(void){return 2;}",
        "-Wl,-soname,libdlprov.so.1", both)
    # the dependent links against the old provider and finds the new one through RUNPATH $ORIGIN/../lib
    gcc(pkg / "libdlcons.so", "extern int dl_present(void); extern int dl_absent(void);\n"
        "extern int dl_weak(void) __attribute__((weak));\n"
        "extern long PyLong_FromLong(long);\n"
        "int use(void){return dl_present() + dl_absent() + (dl_weak ? dl_weak() : 0) + (int)PyLong_FromLong(1);}",
        f"-L{old}", "-l:libdlprov.so.1", "-Wl,-rpath,$ORIGIN/../lib", "-Wl,--enable-new-dtags")
    one = version_script(t / "v2.map", "DLPROV_1 { global: dl_present; local: *; };")
    gcc(lib / "libdlprov.so.1", "int dl_present(void){return 1;}", "-Wl,-soname,libdlprov.so.1", one)
    # unversioned, two needed libraries with a common prefix: the longer name claims the symbol
    gcc(old / "libfakeblas.so.1", "int fakeblasCreate(void){return 0;}", "-Wl,-soname,libfakeblas.so.1")
    gcc(old / "libfakeblasLt.so.1", "int fakeblasLtCreate(void){return 0;} int fakeblasLtGroupedInit(void){return 0;}",
        "-Wl,-soname,libfakeblasLt.so.1")
    gcc(pkg / "libfakete.so", "extern int fakeblasCreate(void); extern int fakeblasLtGroupedInit(void);\n"
        "int te(void){return fakeblasCreate() + fakeblasLtGroupedInit();}",
        f"-L{old}", "-l:libfakeblas.so.1", "-l:libfakeblasLt.so.1", "-Wl,-rpath,$ORIGIN/../lib",
        "-Wl,--enable-new-dtags")
    gcc(lib / "libfakeblas.so.1", "int fakeblasCreate(void){return 0;}", "-Wl,-soname,libfakeblas.so.1")
    gcc(lib / "libfakeblasLt.so.1", "int fakeblasLtCreate(void){return 0;}", "-Wl,-soname,libfakeblasLt.so.1")
    # a symbol only a library loaded first with RTLD_GLOBAL provides (no DT_NEEDED names it)
    gcc(pkg / "libglob.so", "int dl_global_fn(void){return 7;}")
    gcc(pkg / "libneedsglob.so", "extern int dl_global_fn(void); int g(void){return dl_global_fn();}")
    # a needed library that is gone
    gcc(old / "libgone.so.1", "int gone_fn(void){return 0;}", "-Wl,-soname,libgone.so.1")
    gcc(pkg / "libneedsgone.so", "extern int gone_fn(void); int h(void){return gone_fn();}", f"-L{old}",
        "-l:libgone.so.1")
    # a version node the installed provider does not have at all
    v2 = version_script(t / "v3.map", "DLPROV_1 { global: dl_present; local: *; }; DLPROV_2 { global: dl_new; };")
    gcc(old / "new" / "libdlprov.so.1", "int dl_present(void){return 1;} int dl_new(void){return 3;}",
        "-Wl,-soname,libdlprov.so.1", v2)
    gcc(pkg / "libneedsv2.so", "extern int dl_new(void); int n(void){return dl_new();}", f"-L{old / 'new'}",
        "-l:libdlprov.so.1", "-Wl,-rpath,$ORIGIN/../lib", "-Wl,--enable-new-dtags")
    (pkg / "notelf.so").write_text("not an ELF file")
    return t


def resolver(elfscan, libs, *names, **kw):
    return elfscan.Resolver(scanned=[str(libs / "pkg" / n) if "/" not in n else str(libs / n) for n in names],
                            system_dirs=["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib",
                                         "/usr/lib"], **kw)


def test_a_versioned_symbol_the_new_provider_lost_names_symbol_and_provider(elfscan, libs):
    r = resolver(elfscan, libs, "pkg/libdlcons.so", "lib/libdlprov.so.1")
    f = r.check(str(libs / "pkg/libdlcons.so"))
    assert f["missing_symbols"] == [{"symbol": "dl_absent", "version": "DLPROV_1", "expected": "libdlprov.so.1",
                                     "expected_path": str(libs / "pkg/../lib/libdlprov.so.1")}]
    assert f["missing_libraries"] == [] and f["missing_versions"] == []
    # found through RUNPATH with $ORIGIN; the weak reference and the Python C-API symbol are not missing
    assert r.find("libdlprov.so.1", str(libs / "pkg/libdlcons.so")).how == "runpath"
    # and the real loader agrees
    with pytest.raises(OSError, match="undefined symbol: dl_absent"):
        ctypes.CDLL(str(libs / "pkg/libdlcons.so"), mode=ctypes.RTLD_GLOBAL | 2)  # RTLD_NOW


def test_the_provider_of_an_unversioned_symbol_is_the_needed_library_with_the_longest_matching_name(elfscan, libs):
    r = resolver(elfscan, libs, "pkg/libfakete.so")
    f = r.check(str(libs / "pkg/libfakete.so"))
    assert [(m["symbol"], m["expected"]) for m in f["missing_symbols"]] == [("fakeblasLtGroupedInit",
                                                                             "libfakeblasLt.so.1")]
    assert f["missing_symbols"][0]["expected_path"].endswith("lib/libfakeblasLt.so.1")


def test_a_symbol_a_package_loads_globally_first_is_not_missing_but_counted(elfscan, libs):
    r = resolver(elfscan, libs, "libneedsglob.so", "libglob.so")
    f = r.check(str(libs / "pkg/libneedsglob.so"))
    assert f["missing_symbols"] == [] and f["via_global"] == 1
    assert list(f["global_providers"]) == [str((libs / "pkg/libglob.so").resolve())]
    alone = resolver(elfscan, libs, "libneedsglob.so").check(str(libs / "pkg/libneedsglob.so"))
    assert [(m["symbol"], m["expected"]) for m in alone["missing_symbols"]] == [("dl_global_fn", None)]


def test_a_needed_library_that_is_gone_and_a_missing_version_node(elfscan, libs):
    r = resolver(elfscan, libs, "libneedsgone.so", "libneedsv2.so", "lib/libdlprov.so.1")
    gone = r.check(str(libs / "pkg/libneedsgone.so"))
    assert gone["missing_libraries"] == [{"name": "libgone.so.1", "needed_by": str((libs / "pkg/libneedsgone.so")
                                                                                  .resolve())}]
    assert [m["expected"] for m in gone["missing_symbols"]] == ["libgone.so.1"]  # gone_fn: the name's prefix
    v2 = r.check(str(libs / "pkg/libneedsv2.so"))
    assert [(m["file"], m["version"]) for m in v2["missing_versions"]] == [("libdlprov.so.1", "DLPROV_2")]
    assert [(m["symbol"], m["version"]) for m in v2["missing_symbols"]] == [("dl_new", "DLPROV_2")]
    assert r.linked_by(str(libs / "lib/libdlprov.so.1")) == [str((libs / "pkg/libneedsv2.so").resolve())]


def test_a_file_that_is_not_elf_is_an_error_not_a_crash(elfscan, libs):
    r = resolver(elfscan, libs, "notelf.so")
    assert "not an ELF" in r.check(str(libs / "pkg/notelf.so"))["error"]


def test_expected_provider_rules(elfscan):
    needed = ["libcublas.so.13", "libcudart.so.13", "libcublasLt.so.13", "libc10.so", "libcuda.so.1"]
    ep = elfscan.expected_provider
    assert ep("cublasLtGroupedMatrixLayoutInit_internal", None, None, needed) == "libcublasLt.so.13"
    assert ep("cublasLtGroupedMatrixLayoutInit_internal", "libcublasLt.so.13", "libcublasLt.so.13",
              ["libc.so.6"]) == "libcublasLt.so.13"
    assert ep("cublasGemmEx", None, None, needed) == "libcublas.so.13"
    assert ep("_ZN3c1019UndefinedTensorImpl10_singletonE", None, None, needed) == "libc10.so"
    assert ep("cuModuleLoadData", None, None, needed) == "libcuda.so.1"
    assert ep("something_else", None, None, needed) is None


def test_ldconfig_cache_parsing(elfscan):
    text = ("3 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
            "\tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n"
            "\tlibm.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libm.so.6\n")
    assert elfscan.parse_ldconfig(text) == {"libz.so.1": ["/lib/x86_64-linux-gnu/libz.so.1",
                                                          "/lib/i386-linux-gnu/libz.so.1"],
                                            "libm.so.6": ["/lib/x86_64-linux-gnu/libm.so.6"]}


# ---------------------------------------------------------------- tools: pinned by hash


def fake_wheel(tmp_path: Path) -> tuple[Path, str]:
    whl = tmp_path / "src" / "fake-0.1-py3-none-any.whl"
    whl.parent.mkdir()
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("elftools/__init__.py", "X = 1\n")
        z.writestr("fake-0.1.dist-info/METADATA", "Name: fake\n")
    return whl, hashlib.sha256(whl.read_bytes()).hexdigest()


def test_a_tool_is_downloaded_once_checked_and_unpacked_without_its_metadata(tmp_path):
    whl, sha = fake_wheel(tmp_path)
    tool = verify_tools.Tool("fake", "0.1", whl.name, whl.as_uri(), sha, "elftools/")
    d = verify_tools.ensure_tool(tool, tmp_path / "tools")
    assert (d / "elftools/__init__.py").read_text() == "X = 1\n"
    assert not list(d.glob("*.dist-info")) and (d / ".complete").is_file()
    whl.unlink()  # a second call needs nothing
    assert verify_tools.ensure_tool(tool, tmp_path / "tools") == d


def test_a_download_with_another_hash_is_refused_with_the_file_to_bring(tmp_path):
    whl, sha = fake_wheel(tmp_path)
    tool = verify_tools.Tool("fake", "0.1", whl.name, whl.as_uri(), "0" * 64, "elftools/")
    with pytest.raises(verify_tools.VerifyError, match=rf"sha256 {sha}, not the pinned 0+; put {whl.name} .* into "
                                            rf"{tmp_path / 'tools' / 'wheels'}/"):
        verify_tools.ensure_tool(tool, tmp_path / "tools")
    assert not list((tmp_path / "tools" / "wheels").iterdir())


def test_an_offline_machine_uses_a_wheel_put_into_the_tools_folder(tmp_path):
    whl, sha = fake_wheel(tmp_path)
    wheels = tmp_path / "tools" / "wheels"
    wheels.mkdir(parents=True)
    shutil.copy(whl, wheels / whl.name)
    tool = verify_tools.Tool("fake", "0.1", whl.name, "http://127.0.0.1:9/unreachable.whl", sha, "elftools/")
    assert (verify_tools.ensure_tool(tool, tmp_path / "tools") / "elftools/__init__.py").is_file()


# ---------------------------------------------------------------- labels, architectures


def test_arch_lists():
    assert verify.parse_archs("8.0;9.0") == ["8.0", "9.0"]
    assert verify.parse_archs("90, sm_100a 9.0") == ["9.0", "10.0a"]
    assert verify.parse_archs(None) == [] and verify.parse_archs("") == []
    with pytest.raises(ConfigError, match="'hopper' is not a compute capability"):
        verify.parse_archs("9.0;hopper")


@pytest.mark.parametrize("cubins, arch, ok", [
    (["sm_90"], "9.0", True), (["sm_90a"], "9.0", True), (["sm_80"], "9.0", False), (["sm_80"], "8.6", True),
    (["sm_86"], "8.0", False), (["sm_90a"], "9.0a", True), (["sm_90"], "9.0a", False), (["sm_100f"], "10.3", True),
    (["sm_100a"], "10.3", False), (["sm_120"], "12.0", True), ([], "9.0", False),
])
def test_which_cubin_runs_on_which_gpu(cubins, arch, ok):
    assert cuda.cubin_covers(cubins, arch) is ok


def test_override_labels():
    assert v.parse_pins("nvidia-cublas==13.3.0.5 Foo_Bar==1.0") == {"nvidia-cublas": "13.3.0.5", "foo-bar": "1.0"}


# ---------------------------------------------------------------- pip check

OVERRIDE_LINE = ("cuda-toolkit 13.0.2 has requirement nvidia-cublas==13.1.0.3; extra == \"cublas\", but you have "
                 "nvidia-cublas 13.3.0.5.")


def pip_rows(output: str, overrides: str = "", drop: str = "", unsupported=None) -> list[tuple[str, str]]:
    report = v.VerifyReport("img")
    v.judge_pip(report, {"rc": 1 if output.strip() else 0, "output": output, "unsupported": unsupported or {}},
                v.parse_pins(overrides), drop.split())
    return [(c.verdict, c.detail) for c in report.checks]


def test_pip_check_lines_are_parsed():
    items = v.parse_pip_check(OVERRIDE_LINE + "\nmcore-bridge 1.6.5 requires peft, which is not installed.\n"
                              "te 2.16.1 is not supported on this platform\nNo broken requirements found.\n")
    assert [(i["kind"], i.get("name"), i.get("have")) for i in items] == [
        ("version", "nvidia-cublas", "13.3.0.5"), ("missing", "peft", None), ("platform", None, None)]


def test_the_recorded_override_is_a_note_and_every_other_line_a_fail():
    rows = pip_rows(OVERRIDE_LINE + "\nmcore-bridge 1.6.5 requires peft, which is not installed.\n",
                    overrides="nvidia-cublas==13.3.0.5")
    assert rows[0][0] == v.NOTE and "recorded override nvidia-cublas==13.3.0.5" in rows[0][1]
    assert OVERRIDE_LINE in rows[0][1]
    assert rows[1] == (v.FAIL, "mcore-bridge 1.6.5 requires peft, which is not installed.")


def test_the_same_line_without_the_label_or_with_another_version_fails():
    assert pip_rows(OVERRIDE_LINE)[0][0] == v.FAIL
    assert pip_rows(OVERRIDE_LINE, overrides="nvidia-cublas==13.2.0.9")[0][0] == v.FAIL


def test_a_recorded_drop_is_a_note_and_a_clean_check_passes():
    rows = pip_rows("megatron-core 0.19.2 requires transformer_engine_cu12, which is not installed.",
                    drop="transformer-engine-cu12")
    assert rows[0][0] == v.NOTE and "recorded drop" in rows[0][1]
    assert pip_rows("No broken requirements found.\n") == [(v.PASS, "no broken requirements")]
    report = v.VerifyReport("img")
    v.judge_pip(report, {"error": "pip is not installed in the image"}, {}, [])
    assert [(c.verdict, c.detail) for c in report.checks] == [(v.ERROR, "did not run: pip is not installed in the "
                                                                        "image")]
    assert not report.ok


def test_a_wrong_wheel_tag_is_a_warning_only_when_no_extension_is_for_another_python():
    line = "transformer_engine_cu13 2.16.1 is not supported on this platform"
    harmless = {"transformer_engine_cu13": {"tags": ["cp310-cp310-manylinux_2_28_x86_64"], "extensions": [],
                                            "foreign": []}}
    rows = pip_rows(line, unsupported=harmless)
    assert rows[0][0] == v.WARN and "cp310-cp310" in rows[0][1] and "no Python extension" in rows[0][1]
    foreign = {"transformer_engine_cu13": {"tags": ["cp310-cp310-manylinux_2_28_x86_64"],
                                           "extensions": ["te.cpython-310-x86_64-linux-gnu.so"],
                                           "foreign": ["te.cpython-310-x86_64-linux-gnu.so"]}}
    assert pip_rows(line, unsupported=foreign)[0][0] == v.FAIL


# ---------------------------------------------------------------- a recorded run, judged

TE_LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"


def recorded(**changes) -> dict:
    """What verify_image.py printed for TE 2.16.1's core wheel on torch 2.11.0's cuBLAS (abridged)."""
    result = {
        "python": "3.13.5", "roots": ["/opt/venv/lib/python3.13/site-packages"], "libraries": 105, "skipped": [],
        "symbols": {
            "findings": {
                TE_LIB: {"missing_symbols": [{"symbol": "cublasLtGroupedMatrixLayoutInit_internal",
                                              "version": "libcublasLt.so.13", "expected": "libcublasLt.so.13",
                                              "expected_path": "nvidia/cu13/lib/libcublasLt.so.13",
                                              "expected_dist": "nvidia-cublas 13.1.0.3"}],
                         "missing_libraries": [], "missing_versions": [], "dist": "transformer-engine-cu13 2.16.1",
                         "linked_by": [], "extension": False, "global_providers": {}},
                "torch/lib/libcaffe2_nvrtc.so": {
                    "missing_symbols": [{"symbol": "cuInit", "version": None, "expected": "libcuda.so.1",
                                         "expected_path": None, "expected_dist": None}],
                    "missing_libraries": [{"name": "libcuda.so.1", "needed_by": "torch/lib/libcaffe2_nvrtc.so"}],
                    "missing_versions": [], "dist": "torch 2.11.0", "linked_by": [], "extension": False},
                "nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.3": {
                    "missing_symbols": [{"symbol": "MPI_Init", "version": None, "expected": "libmpi.so.40",
                                         "expected_path": None, "expected_dist": None}],
                    "missing_libraries": [{"name": "libmpi.so.40", "needed_by": "x"}], "missing_versions": [],
                    "dist": "nvidia-nvshmem-cu13 3.4.5", "linked_by": [], "extension": False},
            },
            "clean": 102, "via_global": 16, "driver": {"libcuda.so.1": None, "libnvidia-ml.so.1": None}},
        "loads": {TE_LIB: {"ok": False, "error": f"{TE_LIB}: undefined symbol: cublasLtGroupedMatrixLayoutInit_internal"
                                                 ", version libcublasLt.so.13"},
                  "torch/lib/libcaffe2_nvrtc.so": {"ok": False, "error": "libcuda.so.1: cannot open shared object"},
                  "nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.3": {"ok": False, "error": "libmpi.so.40: cannot"}},
        "loads_ok": 102,
        "cubins": {TE_LIB: {"elf": ["sm_100", "sm_120", "sm_80", "sm_90"], "ptx": ["sm_120"]},
                   "nvidia/cu13/lib/libcufft.so.12": {"elf": ["sm_75"], "ptx": []},
                   "flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so": {"elf": ["sm_80"], "ptx": ["sm_90"]},
                   "nvidia/cu13/lib/libcufftw.so.12": {"elf": [], "ptx": [], "none": True}},
        "device_dists": {TE_LIB: "transformer-engine-cu13 2.16.1", "nvidia/cu13/lib/libcufft.so.12":
                         "nvidia-cufft 12.0.0.61", "flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so":
                         "flash-attn 2.8.3"},
        "pip_check": {"rc": 1, "output": OVERRIDE_LINE + "\n", "unsupported": {}},
        "imports": {"torch": {"ok": True},
                    "transformer_engine.pytorch": {"ok": False, "error": f"OSError: {TE_LIB}: undefined symbol: "
                                                   "cublasLtGroupedMatrixLayoutInit_internal", "chain": []}},
        "dists": {"torch": "2.11.0+cu130", "transformer-engine-cu13": "2.16.1", "nvidia-cublas": "13.1.0.3",
                  "flash-attn": "2.8.3"},
    }
    result.update(changes)
    return result


LABELS = {"ai.dockerlaunch.stack": "s", "ai.dockerlaunch.pin.torch": "2.11.0",
          "ai.dockerlaunch.pin.transformer_engine": "2.16.1", "ai.dockerlaunch.pin.python": "3.13",
          "ai.dockerlaunch.pin.apex": "https://github.com/NVIDIA/apex@10417ace",
          "ai.dockerlaunch.overrides": "nvidia-cublas==13.3.0.5", "ai.dockerlaunch.pin.nvidia-cublas": "13.3.0.5"}


def rows(report) -> dict[str, tuple[str, str]]:
    return {c.check: (c.verdict, c.detail) for c in report.checks}


def test_the_cublas_case_names_symbol_library_and_provider_with_its_version():
    report = v.judge("img", LABELS, recorded(), ["9.0"], "label")
    verdict, detail = rows(report)[f"symbols {TE_LIB}"]
    assert verdict == v.FAIL
    assert ("transformer-engine-cu13 2.16.1) needs cublasLtGroupedMatrixLayoutInit_internal@libcublasLt.so.13, "
            "which libcublasLt.so.13 (nvidia-cublas 13.1.0.3, nvidia/cu13/lib/libcublasLt.so.13) does not define"
            in detail)
    assert "the loader says:" in detail
    # the import that fails for it points at the row; the driver and the plugin are not failures
    assert rows(report)["import transformer_engine.pytorch"][0] == v.FAIL
    assert f"see symbols {TE_LIB}" in rows(report)["import transformer_engine.pytorch"][1]
    assert rows(report)["symbols: driver"][0] == v.NEEDS_DRIVER
    assert rows(report)["symbols: plugins"][0] == v.NOTE and "libmpi.so.40" in rows(report)["symbols: plugins"][1]
    assert "load" not in rows(report)  # a library the loader refuses is in a FAIL row, so no PASS for loading
    assert not report.ok


def test_with_the_provider_fixed_symbols_and_loading_pass_and_say_what_the_notes_cover():
    result = recorded()
    del result["symbols"]["findings"][TE_LIB]
    del result["loads"][TE_LIB]
    result["symbols"]["clean"], result["loads_ok"] = 103, 103
    r = rows(v.judge("img", LABELS, result, ["9.0"], "label"))
    assert r["symbols"][0] == v.PASS and r["symbols"][1].startswith("103 of 105 libraries under /opt/venv")
    assert r["symbols"][1].endswith("(16 symbols only by libraries their package loads first); the other 2 are in "
                                    "the rows below")
    assert r["load"][0] == v.PASS and f"symbols {TE_LIB}" not in r


def test_with_gpus_a_missing_driver_is_a_failure():
    report = v.judge("img", LABELS, recorded(), ["9.0"], "label", gpus=True)
    assert rows(report)["symbols: driver"][0] == v.FAIL


def test_architectures_built_libraries_fail_nvidias_are_noted_and_none_is_json_only():
    report = v.judge("img", LABELS, recorded(), ["9.0"], "label")
    r = rows(report)
    assert r["archs flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so"][0] == v.FAIL
    assert "no cubin for sm_90 (only PTX for sm_90" in r["archs flash_attn_2_cuda.cpython-313-x86_64-linux-gnu.so"][1]
    assert r["archs: NVIDIA's libraries"][0] == v.NOTE and "libcufft.so.12" in r["archs: NVIDIA's libraries"][1]
    assert "archs" not in r and f"archs {TE_LIB}" not in r
    assert report.facts["archs"]["device_code_sections_without_code"] == ["nvidia/cu13/lib/libcufftw.so.12"]
    unknown = rows(v.judge("img", {}, recorded(), [], "label"))
    assert unknown["archs"][0] == v.SKIP and "--cuda-archs" in unknown["archs"][1]
    cpu = rows(v.judge("img", {}, recorded(cubins={}), [], "label"))
    assert cpu["archs"] == (v.SKIP, "no library holds GPU device code")
    assert rows(v.judge("img", {}, recorded(cubins={}), ["9.0"], "label"))["archs"][0] == v.FAIL


def test_versions_against_pins_and_the_override_as_a_pin():
    r = rows(v.judge("img", LABELS, recorded(), ["9.0"], "label"))
    assert r["version torch"] == (v.PASS, "pinned 2.11.0, installed torch 2.11.0+cu130")
    assert r["version transformer_engine"][0] == v.PASS
    assert r["version python"] == (v.PASS, "pinned 3.13, installed 3.13.5")
    assert r["version nvidia-cublas"] == (v.FAIL, "pinned 13.3.0.5, installed nvidia-cublas 13.1.0.3")
    assert "version apex" not in r  # a git pin is no version


def test_an_image_without_labels_lists_its_key_packages():
    report = v.judge("swift:release", {}, recorded(imports={}), [], "label")
    r = rows(report)
    assert r["versions"][0] == v.NOTE and "torch 2.11.0+cu130" in r["versions"][1]
    assert report.versions["transformer-engine-cu13"] == {"installed": "2.16.1", "pinned": None}
    assert report.versions["python"]["installed"] == "3.13.5"


NO_LIBCUDA = "OSError: libcuda.so.1: cannot open shared object file: No such file or directory"


@pytest.mark.parametrize("error, driver, gpus, verdict", [
    (NO_LIBCUDA, {"libcuda.so.1": None}, False, v.NEEDS_DRIVER),
    (NO_LIBCUDA, None, False, v.NEEDS_DRIVER),  # no scan: said so in the row
    (NO_LIBCUDA, {"libcuda.so.1": "/usr/local/cuda/compat/libcuda.so.1"}, False, v.FAIL),  # it is there: why not?
    (NO_LIBCUDA, {"libcuda.so.1": None}, True, v.FAIL),
    ("RuntimeError: Found no NVIDIA driver on your system.", {"libcuda.so.1": None}, False, v.NEEDS_DRIVER),
    ("RuntimeError: Found no NVIDIA driver on your system.", {"libcuda.so.1": "/compat/libcuda.so.1"}, False,
     v.NEEDS_DRIVER),  # a forward-compat libcuda in the image, no kernel driver: still only the GPU host's part
    ("RuntimeError: No CUDA GPUs are available", {"libcuda.so.1": None}, True, v.FAIL),
    ("OSError: x.so: undefined symbol: cuFoo | OSError: libcuda.so.1: cannot open shared object file", None, False,
     v.FAIL),
    ("ModuleNotFoundError: No module named 'swift'", {"libcuda.so.1": None}, False, v.FAIL),
])
def test_an_import_needs_a_driver_only_when_that_is_all_it_says(error, driver, gpus, verdict):
    report = v.VerifyReport("img")
    v.judge_imports(report, {"m": {"ok": False, "error": error, "chain": error.split(" | ")}}, driver, gpus, [])
    assert report.checks[0].verdict == verdict
    if verdict == v.NEEDS_DRIVER:
        assert "checked:" in report.checks[0].detail


def test_table_and_json():
    report = v.judge("img:1", LABELS, recorded(), ["9.0"], "label")
    d = json.loads(report.to_json())
    assert set(d) == {"image", "ok", "outcome", "counts", "checks", "versions", "facts"}
    assert d["ok"] is False and d["counts"]["FAIL"] == len(report.failed) > 0
    assert set(d["counts"]) == set(v.VERDICTS)
    assert all(set(c) == {"check", "verdict", "detail"} for c in d["checks"])
    assert d["versions"]["torch"] == {"installed": "2.11.0+cu130", "pinned": "2.11.0"}
    lines = report.render().splitlines()
    assert lines[0].split() == ["check", "verdict", "detail"]
    col = lines[0].index("verdict")
    assert all(line[col:].split()[0] in v.VERDICTS for line in lines[1:-2])
    assert lines[-2].startswith("verify img:1: ") and "FAIL" in lines[-2]
    assert lines[-1] == "verify: FAIL"  # the last line, as build's log and scripts read it


# ---- a check that could not run is ERROR, never a pass (issue 40): each cause turns a passing report into one
# that is not ok, whose last line says ERROR, and which `build` therefore never stamps into the image


def passing(**changes) -> dict:
    """A recorded result of a clean image: every check ran and passed."""
    clean = recorded(
        symbols={"findings": {}, "clean": 105, "via_global": 0, "driver": {"libcuda.so.1": None}},
        loads={}, loads_ok=105,
        cubins={TE_LIB: {"elf": ["sm_90"], "ptx": []}}, device_dists={TE_LIB: "transformer-engine-cu13 2.16.1"},
        pip_check={"rc": 0, "output": "No broken requirements found.\n", "unsupported": {}},
        imports={"torch": {"ok": True}},
        dists={"torch": "2.11.0+cu130"})
    clean.update(changes)
    return clean


def test_a_clean_result_passes():
    report = v.judge("img", {}, passing(), ["9.0"], "label")
    assert report.ok and report.outcome == v.PASS and report.render().endswith("verify: PASS"), report.render()


@pytest.mark.parametrize("cause, changes, row, words", [
    ("the symbol scan failed", {"symbols": {"error": "pyelftools could not be imported here (No module named x)"}},
     "symbols", "the symbol scan did not run: pyelftools could not be imported"),
    ("a library the scan could not read", {"symbols": {"findings": {"libbroken.so": {"error": "Magic number does "
                                                                                               "not match"}},
                                                       "clean": 104, "driver": {}}},
     "symbols libbroken.so", "not checked: it could not be read as ELF (Magic number does not match)"),
    ("cuobjdump failed on a library", {"cubins": {TE_LIB: {"elf": [], "ptx": [], "error": "cuobjdump fatal: ..."}}},
     f"archs {TE_LIB}", "not checked: cuobjdump could not read it (cuobjdump fatal: ...)"),
    ("no cuobjdump", {"cubins": {"error": "cuobjdump was not mounted"}}, "archs", "not checked: cuobjdump was not"),
    ("no pip", {"pip_check": {"error": "pip is not installed in the image"}}, "pip check",
     "did not run: pip is not installed in the image"),
    ("no result at all", {"pip_check": None}, "pip check", "did not run: the image's verify script returned no"),
])
def test_a_check_that_could_not_run_is_an_error_and_never_a_pass(cause, changes, row, words):
    result = passing(**changes)
    if changes.get("pip_check", 1) is None:
        del result["pip_check"]
    report = v.judge("img", {}, result, ["9.0"], "label")
    errors = {c.check: c.detail for c in report.checks if c.verdict == v.ERROR}
    assert row in errors and words in errors[row], (cause, errors)
    assert not report.ok and report.outcome == v.ERROR, cause
    assert report.render().splitlines()[-1] == "verify: ERROR" and "1 ERROR" in report.render().splitlines()[-2]
    assert json.loads(report.to_json())["ok"] is False
    # the row that could not run is not also reported as passing
    if row.startswith("archs"):
        assert not any(c.check == "archs" and c.verdict == v.PASS for c in report.checks), cause


def test_a_failure_beside_an_error_reads_fail():
    result = passing(pip_check={"error": "pip is not installed in the image"})
    result["imports"] = {"torch": {"ok": False, "error": "ImportError: boom", "chain": []}}
    report = v.judge("img", {}, result, ["9.0"], "label")
    assert report.outcome == v.FAIL and report.render().endswith("verify: FAIL")


def test_checks_not_asked_for_are_not_errors():
    result = {k: val for k, val in passing().items() if k not in ("pip_check", "cubins", "imports")}
    report = v.judge("img", {}, result, ["9.0"], "label", wanted=("symbols", "load", "dists"))
    assert report.ok, report.render()


def test_kept_pins_are_shown_and_a_constraint_pip_cannot_read_fails():
    def kept(constraint, built=True):
        report = v.VerifyReport("img")
        v.judge_kept_pins(report, constraint, built)
        return [(c.check, c.verdict, c.detail) for c in report.checks]

    assert kept({"path": "/etc/dockerlaunch/constraints.txt", "pins": 30,
                 "applied": ["cuda-toolkit 13.0.2: nvidia-cublas==13.1.0.3 -> ==13.3.0.5"]}) == [
        ("pins kept", v.PASS, "PIP_CONSTRAINT=/etc/dockerlaunch/constraints.txt keeps 30 pins; recorded overrides "
                              "made true in installed metadata: cuda-toolkit 13.0.2: nvidia-cublas==13.1.0.3 -> "
                              "==13.3.0.5")]
    [(_, verdict, detail)] = kept({"path": "/x", "pins": None, "applied": [], "error": "FileNotFoundError: /x"})
    assert verdict == v.FAIL and "every `pip install` in the image fails" in detail
    assert kept(None)[0][1] == v.WARN and "build it again" in kept(None)[0][2]
    assert kept(None, built=False) == []  # an image dockerlaunch did not build: nothing to say


# ---- every import order (issue 40): which copy of each CUDA library each order loads

SITE = "/opt/venv/lib/python3.13/site-packages"
PIP_LT = f"{SITE}/nvidia/cu13/lib/libcublasLt.so.13"
SYS_LT = "/usr/local/cuda-13.1/lib64/libcublasLt.so.13.1.0.3"
COPIES = {"libcublasLt.so.13": [{"path": SYS_LT, "where": "ld.so.cache", "dist": None, "loader": True},
                                {"path": PIP_LT, "where": "pip", "dist": "nvidia-cublas 13.3.0.5"}],
          "libcufft.so.12": [{"path": "/usr/local/cuda/lib64/libcufft.so.12.0.0.61", "where": "ld.so.cache",
                              "dist": None, "loader": True},
                             {"path": f"{SITE}/nvidia/cu13/lib/libcufft.so.12", "where": "pip",
                              "dist": "nvidia-cufft 12.0.0.61"}]}
TE = "transformer_engine.pytorch"
UNDEFINED = (f"OSError: {SITE}/transformer_engine/wheel_lib/libtransformer_engine.so: undefined symbol: "
             "cublasLtGroupedMatrixLayoutInit_internal, version libcublasLt.so.13")


def orders(te_first_loaded=None, te_first_failed=None):
    return [{"order": ["torch"], "failed": None, "loaded": {"libcublasLt.so.13": PIP_LT}},
            {"order": [TE], "failed": te_first_failed, "loaded": {}},
            {"order": [TE, "torch"], "failed": te_first_failed, "loaded": te_first_loaded or {}},
            {"order": ["torch", TE], "failed": None, "loaded": {"libcublasLt.so.13": PIP_LT}}]


def order_rows(runs, copies=COPIES):
    report = v.VerifyReport("img")
    v.judge_import_orders(report, runs, copies, {"libcuda.so.1": None}, False, {})
    return {c.check: (c.verdict, c.detail) for c in report.checks}


def test_every_order_loading_the_locks_copies_passes_and_the_duplicates_are_a_note():
    rows = order_rows(orders())
    assert rows["import orders"] == (v.PASS, "4 runs (each component alone, TE before torch and torch before TE): "
                                             "every CUDA library came from the lock's wheels")
    assert rows["import orders: duplicates"][0] == v.NOTE
    assert "libcublasLt.so.13" in rows["import orders: duplicates"][1] and "libcufft.so.12" in \
        rows["import orders: duplicates"][1]


def test_an_order_that_loads_the_systems_copy_fails_naming_the_library_both_files_and_the_order():
    rows = order_rows(orders(te_first_loaded={"libcublasLt.so.13": SYS_LT}))
    verdict, detail = rows["import order: libcublasLt.so.13"]
    assert verdict == v.FAIL and "import orders" not in rows
    assert detail == (f"{TE} before torch loads {SYS_LT} (ld.so.cache, 13.1.0.3), not the lock's {PIP_LT} "
                      "(nvidia-cublas 13.3.0.5): the library it then runs with is not the one the stack was checked "
                      "with")


def test_an_order_that_fails_on_the_systems_copy_names_the_copy_the_loader_takes():
    """TE imported before torch on an nvidia/cuda base: the failed dlopen unmaps the system cuBLAS, so the row
    names it from ld.so.cache, and the order; torch first takes the lock's copy and passes."""
    rows = order_rows(orders(te_first_failed=[TE, UNDEFINED]))
    for order in (f"{TE} alone", f"{TE} before torch"):
        verdict, detail = rows[f"import order: {order}"]
        assert verdict == v.FAIL and "cublasLtGroupedMatrixLayoutInit_internal" in detail
        assert f"the loader resolves libcublasLt.so.13 through ld.so.cache to {SYS_LT} (13.1.0.3), not the lock's " \
               f"{PIP_LT} (nvidia-cublas 13.3.0.5)" in detail
    assert "import order: torch before " + TE not in rows


def test_a_failure_only_for_want_of_a_driver_is_needs_driver_and_one_the_imports_row_has_is_not_repeated():
    no_gpu = [TE, "RuntimeError: Found no NVIDIA driver on your system"]
    runs = [{"order": [TE], "failed": no_gpu, "loaded": {}}, {"order": [TE, "torch"], "failed": no_gpu, "loaded": {}}]
    report = v.VerifyReport("img")
    v.judge_import_orders(report, runs, {}, {"libcuda.so.1": None}, False, {})
    assert [(c.check, c.verdict) for c in report.checks] == [(f"import order: {TE} alone", v.NEEDS_DRIVER),
                                                             (f"import order: {TE} before torch", v.NEEDS_DRIVER)]
    report = v.VerifyReport("img")  # the imports row already says it (the same error): nothing to add
    v.judge_import_orders(report, runs, {}, {"libcuda.so.1": None}, False, {TE: no_gpu[1]})
    assert report.checks == []
