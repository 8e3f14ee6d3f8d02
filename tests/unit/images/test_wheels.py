"""The wheel cache's pure parts: the failing file out of a compile log, progress from ninja's files, the progress
line, and why a cached wheel does not fit; a source archive unpacked into its build folder."""

import io
import tarfile
from pathlib import Path

import pytest

from dockerlaunch.images import compiles, wheels
from dockerlaunch.images.sources import WheelError

# a real log excerpt: apex 6424da3b on the PyPI toolkit without its profiler part
APEX_LOG = """\
  /opt/venv/lib/python3.13/site-packages/torch/include/c10/cuda/CUDAEvent.h:362:23: warning: use of 'std::hardware_destructive_interference_size' [-Winterference-size]
  [3/15] /usr/local/cuda/bin/nvcc -c /dl/build/src/csrc/megatron/fused.cu -o /dl/build/src/build/temp.linux-x86_64-cpython-313/x/fused.o
  FAILED: [code=1] /dl/build/src/build/temp.linux-x86_64-cpython-313/scaled_upper_triang_masked_softmax_cuda/csrc/megatron/scaled_upper_triang_masked_softmax_cuda.o
  /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c /dl/build/src/csrc/megatron/scaled_upper_triang_masked_softmax_cuda.cu
  /dl/build/src/csrc/megatron/scaled_upper_triang_masked_softmax_cuda.cu:21:10: fatal error: cuda_profiler_api.h: No such file or directory
     21 | #include <cuda_profiler_api.h>
  compilation terminated.
  RuntimeError: Error compiling objects for extension
  error: subprocess-exited-with-error
ERROR: Failed to build one or more wheels
"""  # noqa: E501


def test_a_failed_compile_is_its_file_and_first_error_not_the_warnings():
    assert compiles.first_error(APEX_LOG) == (
        "scaled_upper_triang_masked_softmax_cuda/csrc/megatron/scaled_upper_triang_masked_softmax_cuda.o: "
        "csrc/megatron/scaled_upper_triang_masked_softmax_cuda.cu:21:10: fatal error: cuda_profiler_api.h: No such "
        "file or directory")
    old_ninja = APEX_LOG.replace("FAILED: [code=1] ", "FAILED: ")
    assert compiles.first_error(old_ninja).startswith("scaled_upper_triang_masked_softmax_cuda/csrc/megatron/")
    assert compiles.first_error("running bdist_wheel\nOSError: CUDA_HOME not set\n") == "OSError: CUDA_HOME not set"


def ninja_tree(tmp_path: Path, objects: dict[str, bool], ext: str = "") -> Path:
    """A build folder as torch's BuildExtension leaves it: build.ninja with container paths, .ninja_log of the
    finished commands, the objects (True: finished; False: cut off mid-write, in the folder but not in the log)."""
    build = tmp_path / "build"
    temp = build / "src" / "build" / "temp.linux-x86_64-cpython-313" / ext
    temp.mkdir(parents=True, exist_ok=True)
    rel = f"src/build/temp.linux-x86_64-cpython-313/{ext + '/' if ext else ''}"
    lines, log = ["rule compile", "  command = nvcc $in"], ["# ninja log v7"]
    for name, finished in objects.items():
        target = f"{compiles.CONTAINER_DIR}/{rel}{name}.o"
        lines.append(f"build {target}: compile {compiles.CONTAINER_DIR}/src/{name}.cu")
        (temp / f"{name}.o").write_bytes(b"\x7fELF")
        if finished:
            log.append(f"0\t10\t1\t{target}\tabc")
    (temp / "build.ninja").write_text("\n".join(lines) + "\n")
    (temp / ".ninja_log").write_text("\n".join(log) + "\n")
    return build


def test_progress_counts_finished_objects_of_every_extension(tmp_path):
    assert compiles.ninja_progress(tmp_path / "nothing") == (0, 0)
    build = ninja_tree(tmp_path, {"a": True, "b": True, "c": False, "d": False})
    assert compiles.ninja_progress(build) == (2, 4)  # c was cut off mid-write: in the folder, not in ninja's log
    ninja_tree(tmp_path, {"e": True}, ext="amp_C")  # apex: one build.ninja per extension, as it reaches them
    assert compiles.ninja_progress(build) == (3, 5)


def test_progress_lines():
    pkg = wheels.Compiled("flash-attn", "2.8.3", "5-flash", "f.tar.gz", "0" * 64, "sdist", (), 6.5)
    assert compiles._progress_line(pkg, 0, 0, 0, 90, None) == "flash-attn 2.8.3: preparing the build (2 min)"
    assert compiles._progress_line(pkg, 30, 73, 20, 600, None) == \
        "flash-attn 2.8.3: 30/73 objects, 10 min, ~43 min left at this rate"
    last = {"wall_s": 7300, "objects": 73}
    assert compiles._progress_line(pkg, 20, 73, 20, 30, last) == \
        "flash-attn 2.8.3: 20/73 objects, 0 min, ~89 min left (last build)"


def test_a_build_that_lists_its_objects_as_it_goes_never_shows_an_eta_on_a_moving_total():
    """apex writes one build.ninja per extension as it reaches it: 2/16 then 16/18 ... 31/32 objects with "~1 min
    left" for eight minutes was an estimate on a moving total. The whole count comes from a finished build."""
    known = wheels.Compiled("apex", "6424da3b4faa", "4-apex", "a.tar.gz", "0" * 64, "archive", (), 3.0,
                            lists_grow=True)
    assert compiles._progress_line(known, 2, 16, 0, 120, None) == \
        "apex 6424da3b4faa: 2/37 objects, 2 min, ~35 min left at this rate"  # KNOWN_OBJECTS: measured, 37
    assert compiles._progress_line(known, 31, 32, 0, 1800, None).startswith("apex 6424da3b4faa: 31/37 objects, 30 min")
    other = wheels.Compiled("apex", "10417aceddd7", "4-apex", "a.tar.gz", "0" * 64, "archive", (), 3.0,
                            lists_grow=True)
    for done, seen in ((2, 16), (31, 32)):
        assert compiles._progress_line(other, done, seen, 0, 600, None) == (
            f"apex 10417aceddd7: {done} objects built, 10 min (the total is not known until the build reaches its "
            "last extension: no estimate yet)")
    assert compiles._progress_line(other, 0, 0, 0, 60, None) == "apex 10417aceddd7: preparing the build (1 min)"
    finished = {"wall_s": 2000, "objects": 40}  # a finished build of this version in the cache's history
    assert compiles._progress_line(other, 10, 16, 10, 30, finished) == \
        "apex 10417aceddd7: 10/40 objects, 0 min, ~25 min left (last build)"


def test_why_a_cached_wheel_does_not_fit():
    want = {"package": "flash-attn", "torch": "2.11.0+cu130", "flags": {"FLASH_ATTN_CUDA_ARCHS": "90"}}
    have = {"package": "flash-attn", "torch": "2.12.0+cu130", "flags": {"FLASH_ATTN_CUDA_ARCHS": "80;90"}}
    assert wheels.why_not(want, have) == ("flags: FLASH_ATTN_CUDA_ARCHS=80;90 (want 90); "
                                          "torch 2.12.0+cu130 (want 2.11.0+cu130)")


def test_count_objects_reads_ninja_files_as_text():
    """What `--on HOST` reads over SSH: build.ninja and .ninja_log texts, no files to stat."""
    ninja = "build /dl/build/src/a.o: compile a.cu\nbuild /dl/build/src/b.o: compile b.cu\nbuild x: phony\n"
    log = "# ninja log v5\n0\t9\t0\t/dl/build/src/a.o\tabc\n"
    assert compiles.count_objects([(ninja, log)]) == (1, 2)
    assert compiles.count_objects([(ninja, log), (ninja, "")]) == (1, 4)
    from dockerlaunch.transfer.host_compile import parse_progress

    assert parse_progress(f"@@dl-ninja\n{ninja}@@dl-log\n{log}@@dl-ninja\n{ninja}@@dl-log\n") == [(ninja, log),
                                                                                                 (ninja, "")]


def source_tar(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return path


def member(name: str, link: str | None = None, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.mode = (tarfile.SYMTYPE, 0o777) if link else (kind, 0o755 if kind == tarfile.DIRTYPE else 0o644)
    m.linkname, m.size = link or "", 3 if m.isfile() else 0
    return m


# 3.10.13 and every later Python CI runs have tarfile's extraction filters (3.10.12, 3.11.4, 3.12): the Pythons
# before them (requires-python allows 3.10.0) take the hand-written refusals, shown here by taking the filter away
@pytest.mark.parametrize("filters", [True, False], ids=["tar-filters", "before-the-filters"])
@pytest.mark.filterwarnings("ignore:Python 3.14 will:DeprecationWarning")  # 3.12+ when extracting unfiltered
def test_a_source_unpacks_into_its_top_folder_and_no_member_leaves_it(tmp_path, monkeypatch, filters):
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "build" / "src"
    good = source_tar(tmp_path / "apex.tar.gz", member("apex", kind=tarfile.DIRTYPE), member("apex/setup.py"),
                      member("apex/csrc", kind=tarfile.DIRTYPE), member("apex/csrc/a.cu"),
                      member("apex/setup.link", link="setup.py"))
    compiles.unpack(good, dest)
    assert (dest / "setup.py").read_bytes() == b"xxx" and (dest / "csrc" / "a.cu").is_file()
    assert (dest / "setup.link").resolve() == (dest / "setup.py").resolve()
    assert (dest / ".dockerlaunch-source").read_text() == "apex.tar.gz\n"

    outside = tmp_path / "outside"
    for i, evil in enumerate([member("apex/../../outside"), member(str(outside)),
                              member("apex/l", link=str(outside)), member("apex/l", link="../../outside"),
                              member("apex/dev", kind=tarfile.CHRTYPE)]):
        bad = source_tar(tmp_path / f"bad{i}.tar.gz", member("apex", kind=tarfile.DIRTYPE), member("apex/a"), evil)
        with pytest.raises(WheelError, match=f"bad{i}.tar.gz"):
            compiles.unpack(bad, tmp_path / f"b{i}" / "src")
        assert not outside.exists() and not (tmp_path / f"b{i}" / "src").exists(), evil.name
