"""The per-job diagnostics folder lives under a shared, world-writable parent: what another login planted there
must never be written into (diagdir.sh). Real sh, real files; the cases that need files of another uid are
tests/integration/test_other_uid.py's, made on a sim node."""

import os
import subprocess

import pytest

from dockerlaunch.backends.docker import script

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


def test_a_planted_link_is_refused(tmp_path):
    root = tmp_path / "dl"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "j").symlink_to(tmp_path / "elsewhere")
    r = diagdir(root)
    assert r.returncode == 1 and "belongs to another user" in r.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


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


def test_a_parent_that_cannot_be_made_is_named_as_such_not_as_a_link(tmp_path):
    """A parent folder the user cannot write into: the folder is missing, not "a link or a file"."""
    locked = tmp_path / "locked"
    locked.mkdir()
    r = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "sh", "-c",
                        script("diagdir.sh"), "sh", str(locked / "dl"), "j", "0755", "-", "nccl"],
                       capture_output=True, text=True) if os.geteuid() == 0 else \
        (locked.chmod(0o555), diagdir(locked / "dl"))[1]
    assert r.returncode == 1 and r.stderr.startswith(f"{locked / 'dl'} cannot be created by uid "), r.stderr
