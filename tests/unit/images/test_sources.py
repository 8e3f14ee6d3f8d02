"""Sources pinned by content: the tree hash of apex and Megatron-LM archives (the vendored ones, and the same trees
in other archive bytes), refusals in one line, and flash-attn's prebuilt wheel refused until pinned."""

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from dockerlaunch.images import build, build_argv, constraints, sources, wheels
from dockerlaunch.images.build_argv import BuildOptions
from dockerlaunch.images.sources import SourceError, check_archive, tree_sha256
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

ROOT = Path(__file__).resolve().parents[3]
VENDOR = ROOT / "Dockerfiles" / "sources"  # the archives GitHub has, made by git archive (its README says how)


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def vendored(name: str) -> Path:
    path = VENDOR / name
    assert path.is_file(), f"{path} is missing: Dockerfiles/sources/ holds the pinned apex and Megatron-LM sources"
    return path


def test_every_archive_pin_in_the_matrix_is_the_vendored_tree(matrix):
    pins = {(p.archive_name, p.sha256) for s in matrix.stacks.values() for p in (s.apex, s.megatron_lm) if p}
    assert len(pins) == 5 and all(sha for _, sha in pins)  # 3 apex commits, 2 Megatron-LM commits, each hashed
    for name, sha in sorted(pins):
        assert tree_sha256(vendored(name)) == sha, name
        assert check_archive(vendored(name), name, sha) == sha


def repack(src: Path, dest: Path, change=None, github_style: bool = True) -> Path:
    """The same tree in other archive bytes, as GitHub's codeload gives it (another top folder name, a pax global
    header carrying the commit, other mtimes, another order, other gzip settings), optionally with one change."""
    members = []
    with tarfile.open(src, "r:gz") as tar:
        for m in tar:
            data = tar.extractfile(m).read() if m.isfile() else None
            members.append((m, data))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "0" * 40} if github_style else None) as tar:
        for m, data in reversed(members):
            m.name = "apex-renamed/" + m.name.split("/", 1)[1] if "/" in m.name else "apex-renamed"
            m.mtime = 1_700_000_000
            m.uname = m.gname = "github"
            if change:
                m, data = change(m, data)
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    dest.write_bytes(gzip.compress(out.getvalue(), compresslevel=1, mtime=123))
    return dest


def test_the_tree_hash_is_the_same_for_other_archive_bytes_and_differs_for_one_changed_byte_or_mode(tmp_path):
    src = vendored("apex-6424da3b4faa6c8f062da4a48c424fff3f02d42d.tar.gz")
    want = tree_sha256(src)
    other = repack(src, tmp_path / "github.tar.gz")
    assert other.read_bytes() != src.read_bytes() and tree_sha256(other) == want

    def one_byte(m, data):
        if m.name.endswith("/setup.py"):
            data = data.replace(b"import", b"imporT", 1)
        return m, data

    def exec_bit(m, data):
        if m.name.endswith("/setup.py"):
            m.mode ^= 0o100
        return m, data

    for change in (one_byte, exec_bit):
        assert tree_sha256(repack(src, tmp_path / f"{change.__name__}.tar.gz", change)) != want, change.__name__
    with pytest.raises(SourceError) as e:
        check_archive(repack(src, tmp_path / "x.tar.gz", one_byte), "apex 6424da3b4faa source", want)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("apex 6424da3b4faa source: x.tar.gz does not match its pin")
    assert f"expected sha256 {want}, got " in msg
    (tmp_path / "garbage.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(SourceError, match="not a readable source archive"):
        tree_sha256(tmp_path / "garbage.tar.gz")


def test_a_wrong_sha256_in_stacks_yaml_stops_the_build_in_one_line(matrix, monkeypatch, tmp_path):
    """A changed Megatron-LM archive (or a wrong pin): `build` refuses before anything runs, naming the source,
    the expected and the actual hash. The archive is the one vendored in Dockerfiles/sources: found with no
    environment variable."""
    monkeypatch.delenv(sources.SOURCE_DIRS_ENV, raising=False)
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    s = matrix.stacks["swift3.12-mcore0.15"]
    wrong = s.model_copy(update={"megatron_lm": s.megatron_lm.model_copy(update={"sha256": "0" * 64})})
    with pytest.raises(SourceError) as e:
        build.megatron_archive(wrong, BuildOptions(), print)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("Megatron-LM 309ffca6a405 source: ")
    assert f"expected sha256 {'0' * 64}, got {s.megatron_lm.sha256}" in msg
    assert build.megatron_archive(s, BuildOptions(), print)[0].name == s.megatron_lm.archive_name


def test_flash_attns_prebuilt_wheel_is_used_only_when_pinned_by_hash_else_flash_attn_compiles(matrix, tmp_path,
                                                                                               monkeypatch):
    """The cu128 stack builds as shipped: with no flash_attn_wheel_sha256 its flash-attn compiles from the lock's
    PyPI sdist (the compiled-wheel cache), and the unpinned GitHub wheel is never fetched."""
    from dockerlaunch.images import lock as locks

    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    s = matrix.stacks["swift4.6-mcore0.19-cu128"]
    assert s.flash_attn_wheel_sha256 is None and constraints.flash_attn_wheel(s)  # a wheel exists, unpinned
    assert build_argv.prebuilt_flash(s) is None and build.flash_attn_prebuilt(s, BuildOptions(), print) == []
    assert build_argv.flash_drop(s) == frozenset()  # the lock's sdist stays in
    lock = locks.checked(s, default_dockerfiles_dir())
    compiled = wheels.compiled_packages(s, lock, ["9.0"], flash_prebuilt=bool(build_argv.prebuilt_flash(s)))
    [fa] = [p for p in compiled if p.name == "flash-attn"]
    assert (fa.version, fa.kind, fa.source) == ("2.8.3", "sdist", "flash_attn-2.8.3.tar.gz")
    assert [f"sha256:{fa.source_sha256}"] == list(lock.get("flash-attn").hashes)  # the sdist, the only file
    # an unpinned file is still refused wherever it would be read (no path reaches here from build any more)
    unpinned = sources.Source("flash-attn's prebuilt wheel", "5-flash", constraints.flash_attn_wheel(s), "", "file",
                              constraints.flash_attn_wheel_url(s))
    with pytest.raises(wheels.WheelError, match="is not pinned by hash"):
        sources.get_source(unpinned, None, None, False, print)
    # pinned, and a wheelhouse file with other bytes: refused, naming both hashes
    pinned = s.model_copy(update={"flash_attn_wheel_sha256": "1" * 64})
    assert build_argv.prebuilt_flash(pinned) and build_argv.flash_drop(pinned) == {"flash-attn"}
    wh = tmp_path / "wh"
    (wh / "5-flash").mkdir(parents=True)
    (wh / "5-flash" / constraints.flash_attn_wheel(s)).write_bytes(b"a wheel from somewhere")
    with pytest.raises(wheels.WheelError, match=r"does not match its pin \(expected sha256 1{64}, got "):
        build.flash_attn_prebuilt(pinned, BuildOptions(wheelhouse=str(wh), offline=True), print)
    assert build.flash_attn_prebuilt(matrix.stacks["swift4.6-mcore0.19-cu13-py313"], BuildOptions(), print) == []
    assert os.environ[wheels.CACHE_ENV].startswith(str(tmp_path))


def test_every_vendored_source_is_found_with_no_environment_and_no_network(matrix, monkeypatch, tmp_path):
    """Each stack's apex and Megatron-LM archive comes from Dockerfiles/sources offline, checked against its pin."""
    monkeypatch.delenv(sources.SOURCE_DIRS_ENV, raising=False)
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    for s in matrix.stacks.values():
        for pin, layer in ((s.apex, "4-apex"), (s.megatron_lm, "6-megatron")):
            if pin:
                src = sources.Source(f"{pin.repo} source", layer, pin.archive_name, pin.sha256, "archive",
                                    pin.archive_url)
                said: list[str] = []
                got = sources.get_source(src, None, None, True, said.append)
                assert got == VENDOR / pin.archive_name, s.name
                assert said == [f"{pin.repo} source: {got} (its tree matches the pin)"]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.tar.gz"))


def test_a_source_neither_vendored_nor_reachable_names_the_archive_its_sha256_and_where_to_put_it(
        monkeypatch, tmp_path):
    monkeypatch.delenv(sources.SOURCE_DIRS_ENV, raising=False)
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    name, sha = f"apex-{'f' * 40}.tar.gz", "ab" * 32
    offline = sources.Source("apex ffffffffffff source", "4-apex", name, sha, "archive",
                            f"https://github.com/NVIDIA/apex/archive/{'f' * 40}.tar.gz")
    unreachable = sources.Source("apex ffffffffffff source", "4-apex", name, sha, "archive",
                                "http://127.0.0.1:9/apex.tar.gz")  # the discard port: nothing listens
    for src, offline_flag, why in ((offline, True, "--offline forbids a download"),
                                   (unreachable, False, "http://127.0.0.1:9/apex.tar.gz cannot be reached")):
        with pytest.raises(wheels.WheelError) as e:
            sources.get_source(src, None, None, offline_flag, print)
        msg = str(e.value)
        assert len(msg.splitlines()) == 1, msg
        assert msg.startswith(f"apex ffffffffffff source {name} (tree sha256 {sha}) is not vendored with "
                              "dockerlaunch and "), msg
        assert why in msg
        assert f"put it in {tmp_path / 'cache' / 'sources'} (or in a folder named by DOCKERLAUNCH_SOURCE_DIRS)" in msg
    assert not list((tmp_path / "cache").rglob("*.part"))  # nothing half-downloaded left behind


def test_a_source_from_a_shared_folder_is_used_as_the_copy_that_was_checked(matrix, monkeypatch, tmp_path):
    """A file in DOCKERLAUNCH_SOURCE_DIRS (often a shared, writable folder) could be swapped between its check and
    its unpacking: the launcher copies it, checks the copy, and hands out only the copy (issue 42, finding 10)."""
    pin = matrix.get("swift4.6-mcore0.19-cu13-py313").apex
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / pin.archive_name).write_bytes(vendored(pin.archive_name).read_bytes())
    monkeypatch.setenv(sources.SOURCE_DIRS_ENV, str(shared))
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    src = sources.Source(f"{pin.repo} source", "4-apex", pin.archive_name, pin.sha256, "archive", pin.archive_url)
    said: list[str] = []
    got = sources.get_source(src, None, None, True, said.append)
    (shared / pin.archive_name).write_bytes(b"swapped after the check")  # someone else's write, a moment later
    assert tree_sha256(got) == pin.sha256  # what the build unpacks is what was checked
    assert said == [f"{pin.repo} source: {shared / pin.archive_name} (its tree matches the pin; copied to {got})"]


@pytest.mark.parametrize("moment", ["after the copy, before the hash", "after the hash"])
def test_a_shared_source_swapped_between_the_copy_and_the_hash_never_reaches_the_build(matrix, monkeypatch,
                                                                                       tmp_path, moment):
    """The race of finding 10 run at the moments it is about: another user rewrites the shared folder's archive
    (the same apex tree with a setup.py of theirs) while the launcher is between its copy and its hash, or just
    after the hash. The check passes (it read the launcher's own copy) and what the build gets is the pinned tree;
    a launcher that hashed the shared file and copied it afterwards fails here either way."""
    pin = matrix.get("swift4.6-mcore0.19-cu13-py313").apex
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / pin.archive_name).write_bytes(vendored(pin.archive_name).read_bytes())

    def their_setup(m, data):
        if m.name.endswith("/setup.py"):
            data = b"import os; os.system('id')\n"
            m.size = len(data)
        return m, data

    theirs = repack(vendored(pin.archive_name), tmp_path / "theirs.tar.gz", change=their_setup)
    assert tree_sha256(theirs) != pin.sha256
    monkeypatch.setenv(sources.SOURCE_DIRS_ENV, str(shared))
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    real_check, hashed = sources.check_source, []

    def swap_around_the_hash(src, path):
        if moment == "after the copy, before the hash":
            (shared / pin.archive_name).write_bytes(theirs.read_bytes())
        hashed.append(path)
        real_check(src, path)
        if moment == "after the hash":
            (shared / pin.archive_name).write_bytes(theirs.read_bytes())

    monkeypatch.setattr(sources, "check_source", swap_around_the_hash)
    src = sources.Source(f"{pin.repo} source", "4-apex", pin.archive_name, pin.sha256, "archive", pin.archive_url)
    got = sources.get_source(src, None, None, True, lambda line: None)
    assert (shared / pin.archive_name).read_bytes() == theirs.read_bytes()  # the swap did happen
    assert tree_sha256(got) == pin.sha256 and got.parent == tmp_path / "cache" / "sources"
    assert hashed and shared / pin.archive_name not in hashed, hashed  # the hash read the launcher's copy
