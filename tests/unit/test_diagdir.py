"""The per-job diagnostics folder lives under a shared, world-writable parent: what another login planted there
must never be written into (diagdir.sh), nor run (dump's py-spy copy). Real sh, real files."""

import os
import subprocess

import pytest

from dockerlaunch.backends.docker import script
from dockerlaunch.diagnostics.dump import OWNED

NOBODY = 65534


def diagdir(root, job="j", *subdirs):
    return subprocess.run(["sh", "-c", script("diagdir.sh"), "sh", str(root), job, "0755", *(subdirs or ("nccl",))],
                          capture_output=True, text=True)


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
    assert r.returncode == 1 and "belongs to another user" in r.stderr


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
