"""The per-job diagnostics folder lives under a shared, world-writable parent: what another login planted there
must never be written into (diagdir.sh), nor run (dump's py-spy copy). Real sh, real files."""

import os
import subprocess

import pytest

from dockerlaunch.backends.docker import script
from dockerlaunch.diagnostics.dump import OWNED

NOBODY = 65534


def diagdir(root, job="j", *subdirs, mode="0755", owner="-"):
    return subprocess.run(["sh", "-c", script("diagdir.sh"), "sh", str(root), job, mode, owner,
                           *(subdirs or ("nccl",))], capture_output=True, text=True)


def test_the_folder_is_made_emptied_and_kept_private(tmp_path):
    root = tmp_path / "dl"
    assert diagdir(root, "j", "nccl", "fr").returncode == 0
    assert oct((root.stat().st_mode) & 0o7777) == "0o1777"  # shared like /tmp
    (root / "j" / "nccl" / "old.log").write_text("x")
    r = diagdir(root, "j", "nccl", "fr")
    assert r.returncode == 0, r.stderr
    assert list((root / "j" / "nccl").iterdir()) == [] and (root / "j" / "fr").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user")
def test_a_job_folder_of_another_user_is_refused(tmp_path):
    root = tmp_path / "dl"
    (root / "j").mkdir(parents=True)
    os.chown(root / "j", NOBODY, NOBODY)
    r = diagdir(root)
    assert r.returncode == 1 and r.stderr == f"{root}/j belongs to another user or is a link\n"


def test_a_planted_link_is_refused(tmp_path):
    root = tmp_path / "dl"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "j").symlink_to(tmp_path / "elsewhere")
    r = diagdir(root)
    assert r.returncode == 1 and "belongs to another user" in r.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file owned by another user")
def test_owned_tells_ours_from_theirs(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_text("")
    theirs.write_text("")
    os.chown(theirs, NOBODY, NOBODY)
    check = OWNED + 'owned "$1"'
    assert subprocess.run(["sh", "-c", check, "sh", str(mine)]).returncode == 0
    assert subprocess.run(["sh", "-c", check, "sh", str(theirs)]).returncode != 0
    assert subprocess.run(["sh", "-c", check, "sh", str(tmp_path / "missing")]).returncode != 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user")
def test_a_parent_another_user_made_first_is_refused_and_nothing_is_touched(tmp_path):
    """Another login creates the shared parent first, 0777: `up` refuses in one line naming the owner and the
    fix, and creates or removes nothing in it."""
    root = tmp_path / "dl"
    root.mkdir()
    os.chown(root, NOBODY, NOBODY)
    os.chmod(root, 0o777)
    (root / "planted").write_text("x")
    r = diagdir(root)
    assert r.returncode == 1 and r.stderr == f"{root} belongs to uid {NOBODY}, another user, who could swap the " \
        "job's folder in it\n"  # a fact; the launcher adds the one fix (test_local)
    assert sorted(p.name for p in root.iterdir()) == ["planted"]


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_parent_writable_by_others_without_the_sticky_bit_is_refused(tmp_path, mode):
    root = tmp_path / "dl"
    root.mkdir()
    os.chmod(root, mode)
    r = diagdir(root)
    assert r.returncode == 1 and r.stderr == f"{root} is writable by others without the sticky bit (mode " \
        f"{mode:o}), so they could swap the job's folder in it\n", r.stderr
    assert list(root.iterdir()) == []
    os.chmod(root, 0o1777)  # like /tmp: kept
    assert diagdir(root).returncode == 0


def test_a_parent_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dl").symlink_to(tmp_path / "elsewhere")
    r = diagdir(tmp_path / "dl")
    assert r.returncode == 1 and r.stderr == f"{tmp_path / 'dl'} is not a folder (a link or a file)\n"
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another uid")
def test_a_container_user_gets_its_own_folders_not_world_writable_ones(tmp_path):
    """container.user "1000": the flight-recorder and NCCL folders belong to uid 1000, 0700 (no other local user
    can plant a rank_N there)."""
    root = tmp_path / "dl"
    assert diagdir(root, "j", "fr", "nccl", mode="1777", owner="1000").returncode == 0
    for sub in ("fr", "nccl"):
        st = (root / "j" / sub).stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (1000, 0o700)
    assert (root / "j").stat().st_mode & 0o7777 == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file owned by another user")
def test_dump_takes_only_the_ranks_files_and_never_a_huge_one_into_memory(tmp_path):
    """fr/rank_1 planted by another uid is not collected (fr_trace would unpickle it); a 10 GB file (sparse)
    stays on the host; the rest comes, through a real `sh` as over SSH (the `local` host's Remote)."""
    from dockerlaunch.diagnostics.dump import fetch_diag_files
    from dockerlaunch.hosts.local import LocalRemote
    from dockerlaunch.hosts.targets import SSHTarget

    where = tmp_path / "job"
    (where / "fr").mkdir(parents=True)
    (where / "nccl").mkdir()
    (where / "fr" / "rank_0").write_bytes(b"dump0")
    (where / "nccl" / "host.0.log").write_text("NCCL INFO\n")
    (where / "fr" / "rank_1").write_bytes(b"planted pickle")
    os.chown(where / "fr" / "rank_1", NOBODY, NOBODY)
    with open(where / "nccl" / "huge.log", "wb") as f:
        f.truncate(10 * 2**30)
    notes: list[str] = []
    dest = tmp_path / "out"
    with LocalRemote(SSHTarget("local", "localhost", "root", local=True)) as remote:
        n = fetch_diag_files(remote, str(where), str(os.getuid()), dest, notes)
    assert n == 1 and (dest / "fr" / "rank_0").read_bytes() == b"dump0" and (dest / "nccl" / "host.0.log").exists()
    assert not (dest / "fr" / "rank_1").exists() and not (dest / "nccl" / "huge.log").exists()
    assert any("not of the ranks' uid" in x for x in notes) and any("over 256 MB" in x for x in notes), notes


def test_a_parent_that_cannot_be_made_is_named_as_such_not_as_a_link(tmp_path):
    """A parent folder the user cannot write into: the folder is missing, not "a link or a file"."""
    locked = tmp_path / "locked"
    locked.mkdir()
    r = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "sh", "-c",
                        script("diagdir.sh"), "sh", str(locked / "dl"), "j", "0755", "-", "nccl"],
                       capture_output=True, text=True) if os.geteuid() == 0 else \
        (locked.chmod(0o555), diagdir(locked / "dl"))[1]
    assert r.returncode == 1 and r.stderr.startswith(f"{locked / 'dl'} cannot be created by uid "), r.stderr
