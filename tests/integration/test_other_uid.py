"""What another login planted in the shared diagnostics folder must never be written into (diagdir.sh), nor read
by `dump`: files owned by another uid, made as root on a sim node over SSH, so these run wherever the suite runs
(a user namespace cannot make them; the suite itself may not be root). Real sh, real files, the real SSH path."""

import secrets

import pytest

from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.pyspy import OWNED
from dockerlaunch.diagnostics.dump import fetch_diag_files

pytestmark = pytest.mark.integration

NOBODY = 65534


@pytest.fixture
def node(remotes):
    """(the node's Remote, a fresh folder on it), removed afterwards."""
    remote = remotes[0]
    where = f"/tmp/other-uid-{secrets.token_hex(4)}"
    remote.check(["mkdir", where], "a test folder")
    yield remote, where
    remote.run(["rm", "-rf", where])


def sh(remote, text: str, *args: str):
    return remote.run(["sh", "-c", text, "sh", *args])


def diagdir(remote, root: str, job="j", *subdirs, mode="0755", owner="-"):
    return sh(remote, script("diagdir.sh"), root, job, mode, owner, *(subdirs or ("nccl",)))


def listing(remote, folder: str) -> list[str]:
    return sorted(remote.check(["ls", "-A", folder], "a listing").stdout.split())


def test_a_job_folder_of_another_user_is_refused(node):
    remote, where = node
    root = f"{where}/dl"
    remote.check(["sh", "-c", f"mkdir -p {root}/j && chown {NOBODY}:{NOBODY} {root}/j"], "a planted folder")
    r = diagdir(remote, root)
    assert r.exit_status == 1 and r.stderr == f"{root}/j belongs to another user or is a link\n", r


def test_owned_tells_ours_from_theirs(node):
    remote, where = node
    remote.check(["sh", "-c", f"touch {where}/mine {where}/theirs && chown {NOBODY} {where}/theirs"], "two files")
    check = OWNED + 'owned "$1"'
    assert sh(remote, check, f"{where}/mine").exit_status == 0
    assert sh(remote, check, f"{where}/theirs").exit_status != 0
    assert sh(remote, check, f"{where}/missing").exit_status != 0


def test_a_parent_another_user_made_first_is_refused_and_nothing_is_touched(node):
    """Another login creates the shared parent first, 0777: `up` refuses in one line naming the owner and the
    fix, and creates or removes nothing in it."""
    remote, where = node
    root = f"{where}/dl"
    remote.check(["sh", "-c", f"mkdir {root} && echo x > {root}/planted && chown -R {NOBODY}:{NOBODY} {root} && "
                  f"chmod 0777 {root}"], "a planted parent")
    r = diagdir(remote, root)
    assert r.exit_status == 1 and r.stderr == f"{root} belongs to uid {NOBODY}, another user, who could swap the " \
        "job's folder in it\n", r  # a fact; the launcher adds the one fix (test_local)
    assert listing(remote, root) == ["planted"]


def test_a_container_user_gets_its_own_folders_not_world_writable_ones(node):
    """container.user "1000": the flight-recorder and NCCL folders belong to uid 1000, 0700 (no other local user
    can plant a rank_N there)."""
    remote, where = node
    root = f"{where}/dl"
    r = diagdir(remote, root, "j", "fr", "nccl", mode="1777", owner="1000")
    assert r.exit_status == 0, r
    got = remote.check(["stat", "-c", "%n %u %a", f"{root}/j", f"{root}/j/fr", f"{root}/j/nccl"], "modes").stdout
    assert got.splitlines() == [f"{root}/j 0 755", f"{root}/j/fr 1000 700", f"{root}/j/nccl 1000 700"], got


def test_dump_takes_only_the_ranks_files_and_never_a_huge_one_into_memory(node, tmp_path):
    """fr/rank_1 planted by another uid is not collected (fr_trace would unpickle it); a 10 GB file (sparse)
    stays on the host; the rest comes, over SSH as `dump` fetches it."""
    remote, where = node
    job = f"{where}/job"
    remote.check(["sh", "-c", " && ".join([
        f"mkdir -p {job}/fr {job}/nccl",
        f"printf dump0 > {job}/fr/rank_0",
        f"echo 'NCCL INFO' > {job}/nccl/host.0.log",
        f"printf 'planted pickle' > {job}/fr/rank_1",
        f"chown {NOBODY} {job}/fr/rank_1",
        f"truncate -s 10G {job}/nccl/huge.log",
    ])], "a job's diagnostics folder")
    uid = remote.check(["id", "-u"], "the ranks' uid").stdout.strip()
    notes: list[str] = []
    dest = tmp_path / "out"
    n = fetch_diag_files(remote, job, uid, dest, notes)
    assert n == 1 and (dest / "fr" / "rank_0").read_bytes() == b"dump0" and (dest / "nccl" / "host.0.log").exists()
    assert not (dest / "fr" / "rank_1").exists() and not (dest / "nccl" / "huge.log").exists()
    assert any("not of the ranks' uid" in x for x in notes) and any("over 256 MB" in x for x in notes), notes
