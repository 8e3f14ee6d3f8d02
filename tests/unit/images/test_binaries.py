"""stacks check --binaries, its pure parts: where a wheel's member lands, which wheels can hold libraries, the
recorded tables answering exactly as the files do, symbolic links of a made base, a registry base's share."""

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile

import pytest

from dockerlaunch.images import binaries
from dockerlaunch.images import index as idx
from dockerlaunch.images import lock as locks
from tests.unit.images.test_verify import elfscan, libs  # noqa: F401 - fixtures

SCANNED = ("pkg/libdlcons.so", "pkg/libfakete.so", "pkg/libneedsgone.so", "pkg/libneedsv2.so", "pkg/libneedsglob.so",
           "pkg/libglob.so", "lib/libdlprov.so.1")


@pytest.mark.parametrize("member, where", [
    ("torch/lib/libtorch.so", "torch/lib/libtorch.so"),
    ("foo-1.0.data/platlib/foo/_x.so", "foo/_x.so"),
    ("foo-1.0.data/purelib/foo/_x.so", "foo/_x.so"),
    ("foo-1.0.data/scripts/tool", None),
    ("foo-1.0.data/data/share/x.so", None),
])
def test_a_members_place_under_site_packages(member, where):
    assert binaries.installed_path(member) == where


@pytest.mark.parametrize("name, binary", [
    ("torch-2.11.0-cp313-cp313-manylinux_2_28_x86_64.whl", True),
    ("nvidia_cublas-13.3.0.5-py3-none-manylinux_2_27_x86_64.whl", True),
    ("peft-0.19.1-py3-none-any.whl", False),
    ("not-a-wheel.tar.gz", False),
])
def test_which_wheels_can_hold_libraries(name, binary):
    assert binaries.is_binary_wheel(name) is binary


def _tables(elfscan, libs, root="/v"):  # noqa: F811 - the fixture
    """Every ELF file of the test tree as a table, through JSON, at a virtual path under `root`."""
    out = {}
    for d in ("pkg", "lib", "old"):
        for dirpath, _, files in os.walk(libs / d):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    obj = elfscan.read_elf(p)
                except Exception:  # noqa: BLE001 - the tree holds a file that is not ELF on purpose
                    continue
                virtual = root + p[len(str(libs)):]
                out[virtual] = elfscan.obj_from_dict(virtual, json.loads(json.dumps(elfscan.obj_to_dict(obj))))
    return out


def test_recorded_tables_answer_exactly_as_the_files_do(elfscan, libs):  # noqa: F811 - the fixtures
    files = elfscan.Resolver(scanned=[str(libs / n) for n in SCANNED], system_dirs=[])
    tables = elfscan.TableResolver(_tables(elfscan, libs), scanned=[f"/v/{n}" for n in SCANNED], system_dirs=[])
    for n in SCANNED:
        want = json.loads(json.dumps(files.check(str(libs / n))).replace(str(libs), "/v"))
        got = tables.check(f"/v/{n}")
        assert got == want, n
    # what the comparison rests on: the lost versioned symbol is found in both
    assert [m["symbol"] for m in tables.check("/v/pkg/libdlcons.so")["missing_symbols"]] == ["dl_absent"]


def test_a_made_bases_links_are_followed_without_touching_this_machine(elfscan, libs):  # noqa: F811
    objects = _tables(elfscan, libs, root="/usr/x")
    links = {"/lib": "usr/lib", "/usr/lib/prov": "/usr/x/lib", "/loop": "/loop2", "/loop2": "/loop"}
    r = elfscan.TableResolver(objects, links, scanned=[], system_dirs=[])
    assert r._real("/lib/prov/libdlprov.so.1") == "/usr/x/lib/libdlprov.so.1"
    assert r._real("/usr/x/pkg/../lib/libdlprov.so.1") == "/usr/x/lib/libdlprov.so.1"
    assert r._real("/loop/a")  # a cycle ends (40 hops), it does not hang
    assert r._is_file("/lib/prov/libdlprov.so.1") and not r._is_file(str(libs / "lib/libdlprov.so.1"))
    assert r.load("/nowhere/libx.so") is None and "not in the recorded tables" in r.errors["/nowhere/libx.so"]


def test_on_a_registry_base_what_its_libraries_answer_is_left_out_and_named():
    sym = {"clean": 3, "findings": {
        "a.so": {"missing_libraries": [{"name": "libc.so.6", "needed_by": "a.so"}],
                 "missing_symbols": [{"symbol": "memcpy", "expected": "libc.so.6"},
                                     {"symbol": "mystery", "expected": None}], "missing_versions": []},
        "b.so": {"missing_libraries": [{"name": "libstdc++.so.6", "needed_by": "b.so"}],
                 "missing_symbols": [{"symbol": "cublasLtX", "expected": "libcublasLt.so.13"}],
                 "missing_versions": []},
        "c.so": {"missing_libraries": [{"name": "libcublasLt.so.13", "needed_by": "c.so"}],
                 "missing_symbols": [], "missing_versions": []},
        "d.so": {"missing_libraries": [{"name": "libcuda.so.1", "needed_by": "d.so"}],
                 "missing_symbols": [{"symbol": "cuInit", "expected": "libcuda.so.1"}], "missing_versions": []}}}
    base = binaries._registry_base(sym, {"libcublasLt.so.13", "a.so", "b.so", "c.so"})
    assert base == {"libc.so.6", "libstdc++.so.6"}
    assert "a.so" not in sym["findings"] and sym["clean"] == 4
    # a wheel's own library and its symbols stay findings
    assert sym["findings"]["b.so"]["missing_symbols"] == [{"symbol": "cublasLtX", "expected": "libcublasLt.so.13"}]
    assert sym["findings"]["c.so"]["missing_libraries"] == [{"name": "libcublasLt.so.13", "needed_by": "c.so"}]
    # the driver is not the base's: verify's NEEDS-DRIVER row says it
    assert sym["findings"]["d.so"]["missing_libraries"] == [{"name": "libcuda.so.1", "needed_by": "d.so"}]


def test_package_folders_follow_verifys_order(elfscan):  # noqa: F811
    site = "/opt/venv/lib/python3.13/site-packages"
    paths = [f"{site}/{p}" for p in ("nvidia/cu13/lib/libcublas.so.13", "torch/lib/libtorch.so",
                                     "nvidia/nccl/lib/libnccl.so.2", "transformer_engine/libte.so")]
    assert binaries.package_dirs(site, paths, elfscan) == [f"{site}/torch/lib", f"{site}/nvidia/cu13/lib",
                                                           f"{site}/nvidia/nccl/lib"]


IN_CLOSE_NOWRITE = 0x10


def _swap_after_first_read(path, replacement, done: threading.Event) -> threading.Thread:
    """A thread that replaces `path` by `replacement` the moment the first reader closes it (inotify: the kernel
    says when the hash finished, no hook in the code under test)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, str(path).encode(), IN_CLOSE_NOWRITE) < 0:
        pytest.fail(f"inotify is needed for this test (errno {ctypes.get_errno()})")

    def run():
        try:
            os.read(fd, 4096)  # blocks until the first close of a read-only open
            os.replace(replacement, path)
            done.set()
        finally:
            os.close(fd)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wheel(path, member: str, elf) -> str:
    with zipfile.ZipFile(path, "w") as z:
        z.write(elf, member)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_find_links_wheel_swapped_after_its_hash_is_not_read(tmp_path, monkeypatch, elfscan, libs):  # noqa: F811
    """Issue 50, finding 7: the wheel hashed to pick it is the wheel whose tables are kept. Here the find-links
    file is replaced the moment its hash closes it (while a second candidate is still being hashed): the check
    must refuse the new bytes (or read the ones it hashed), never read them as the locked wheel."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    links = tmp_path / "links"
    links.mkdir()
    target = links / "dlswap-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    sha = _wheel(target, "dlswap/_locked.so", libs / "pkg" / "libglob.so")
    evil = tmp_path / "evil.whl"
    _wheel(evil, "dlswap/_swapped.so", libs / "pkg" / "libdlcons.so")
    decoy = links / "dlswap-1.0-cp312-cp312-manylinux_2_17_x86_64.whl"  # also a candidate: hashed after the target
    with open(decoy, "wb") as f:
        f.truncate(256 << 20)  # sparse: a quarter of a second of hashing, the window the swap lands in
    entry = locks.Entry("dlswap", "1.0", (f"sha256:{sha}",), "train")
    files = [idx.IndexFile(target.name, str(target), None), idx.IndexFile(decoy.name, str(decoy), None)]
    swapped = threading.Event()
    swapper = _swap_after_first_read(target, evil, swapped)
    try:
        table = binaries.wheel_table(entry, files, idx.target_tags("3.12"), elfscan, None, binaries.Costs(),
                                     lambda msg: None)
        refused = None
    except idx.FetchError as e:
        table, refused = None, str(e)
    swapper.join(10)
    assert swapped.is_set(), "the file was never read, so never swapped: the test proves nothing"
    if refused is None:
        assert sorted(table["objects"]) == ["dlswap/_locked.so"], \
            f"read the swapped file's {sorted(table['objects'])} as the locked wheel sha256:{table['sha256'][:12]}"
    else:
        assert target.name in refused and "do not match the lock" in refused, refused


NO_SPACE = """
import sys, zipfile
from pathlib import Path
from dockerlaunch.images import binaries, index as idx, lock as locks
wheel = Path(sys.argv[1])
entry = locks.Entry("dlbig", "1.0", ("sha256:" + idx.file_sha256(wheel),), "train")
try:
    binaries.wheel_table(entry, [idx.IndexFile(wheel.name, str(wheel), None)], idx.target_tags("3.12"), None, None,
                         binaries.Costs(), print)
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="mounts a small tmpfs (root, unshare)")
def test_a_find_links_wheel_larger_than_the_free_space_is_the_no_space_line(tmp_path):
    """The copy that finding 7 reads from fills the cache's disk first: still the one no-space line, not a
    'download failed' row."""
    wheel = tmp_path / "dlbig-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("dlbig/_big.so", os.urandom(3 << 20))  # incompressible: 3 MB on a 1 MB file system
    cache = tmp_path / "small"
    cache.mkdir()
    script = 'mount -t tmpfs -o size=1m tmpfs "$1" && shift && exec "$@"'
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(cache),
                        sys.executable, "-c", NO_SPACE, str(wheel)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DOCKERLAUNCH_CACHE_DIR": str(cache)}, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"BinariesError stacks check --binaries: no space left in {cache}/tables while "
                               f"reading {wheel.name}"), r.stdout
