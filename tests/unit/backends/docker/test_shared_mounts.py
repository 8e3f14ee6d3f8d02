"""doctor's `shared` check reads each host's mount table (mounts.sh: the kernel's /proc/self/mountinfo): the same
network filesystem at the same place proves the same storage; a local one never does. Tested on real mount tables
collected from public threads (tests/data/mountinfo/, each file names its address), and through the real script."""

import subprocess
from pathlib import Path

import pytest

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.doctor.observations import MountIdentity, mount_identity, parse_mounts

DATA = Path(__file__).resolve().parents[3] / "data" / "mountinfo"


def table(name: str) -> str:
    return "\n".join(line for line in (DATA / name).read_text().splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("name, path, fstype, source, inside", [
    # Lustre over InfiniBand (o2ib): a multi-rail MGS list as the source
    ("ufl-hipergator-lustre.txt", "/lustre/blue/group/ckpt", "lustre",
     "10.13.133.11@o2ib,10.13.133.29@o2ib:10.13.133.10@o2ib,10.13.133.28@o2ib:/blue/hpg", "/group/ckpt"),
    ("ufl-hipergator-lustre.txt", "/cmsuf", "lustre", "10.13.136.148@o2ib:/cmsuf", "/"),
    ("cesga-login-nfs3.txt", "/mnt/netapp2/Store_usczanpp/models", "nfs", "10.117.49.202:/Store_usczanpp",
     "/models"),
    ("cesga-singularity-nfs3.txt", "/mnt/netapp1/ECOMT", "nfs", "10.117.49.102:/ECOMT", "/"),
    ("k8s-containerd-pod-nfs4.txt", "/kaiwudb/certs/ca.crt", "nfs4",
     "20.20.20.43:/data/k8s/nfs_share/pvc-2108ee90-b185-43f7-a95c-21d9a4d84a67", "/ca.crt"),
    ("util-linux-findmnt-cifs.txt", "/mnt/sounds", "cifs", "//foo.home/bar/", "/"),
    # a CSI volume mounted from a snapshot: the root inside the filesystem is part of where the path is
    ("weka-csi-node-wekafs.txt", "/var/lib/kubelet/pods/0ec9fa65-0b28-4b6b-8fd8-32242f4e9e44/volumes/kubernetes.io~csi/"
     "pvc-376dc1ee-c781-41bb-a20a-3fb16919280a/mount/data", "wekafs", "csivol-pvc-5580031e-MRECGMUDSRWQ",
     "/.snapshots/pvc-376dc1ee-NFYRYCJR4SBJ/data"),
])
def test_network_filesystems_are_found_where_the_path_lives(name, path, fstype, source, inside):
    got = mount_identity(table(name), path)
    assert got == MountIdentity(fstype, source, inside), got
    assert got.networked


def test_a_local_filesystem_is_never_proof_of_sharing():
    # a container's bind mount from the host's xfs disk: the same device name on two hosts is two disks
    got = mount_identity(table("docker-k8s-pod-overlay-xfs.txt"), "/etc/cockroach-env/x")
    assert got is not None and got.fstype == "xfs" and got.source == "/dev/nvme0n1p1" and not got.networked
    assert got.path == "/var/lib/kubelet/pods/1bf924dd-3f6f-11ea-983d-0abc95f90166/volumes/kubernetes.io~empty-dir/" \
                       "cockroach-env/x"
    assert mount_identity(table("docker-k8s-pod-overlay-xfs.txt"), "/srv/anything").fstype == "overlay"


def test_the_same_export_seen_from_two_hosts_is_one_identity_and_another_export_is_not():
    line = table("cesga-login-nfs3.txt").splitlines()
    nfs = next(x for x in line if " - nfs 10.117.49.202:/Store_usczanpp " in x)
    # another host mounts the same export under other mount and device numbers
    other_host = nfs.replace("1241 417 0:122", "77 25 0:48")
    a = mount_identity(nfs, "/mnt/netapp2/Store_usczanpp/run1")
    assert a == mount_identity(other_host, "/mnt/netapp2/Store_usczanpp/run1")
    b = mount_identity(next(x for x in line if "/Store_uvibglta " in x), "/mnt/netapp2/Store_uvibglta/run1")
    assert a != b


def test_the_mount_on_top_wins_and_escaped_paths_are_read():
    text = ("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
            "30 20 0:40 / /data\\040sets rw - nfs4 nas:/vol1 rw\n"
            "31 30 0:41 /sub /data\\040sets rw - nfs4 nas:/vol2 rw\n")
    assert mount_identity(text, "/data sets/x") == MountIdentity("nfs4", "nas:/vol2", "/sub/x")
    assert mount_identity(text, "/data setsX") == MountIdentity("ext4", "/dev/sda1", "/data setsX")
    assert mount_identity(text, "relative") is None
    assert mount_identity("no separator here\n", "/x") is None
    ro = mount_identity(text.replace("/sub /data\\040sets rw", "/sub /data\\040sets ro,relatime"), "/data sets/m")
    assert ro.read_only and ro == MountIdentity("nfs4", "nas:/vol2", "/sub/m")  # ro or rw: the same storage
    assert not mount_identity(text, "/data sets/m").read_only


def test_mounts_sh_answers_in_the_contract_and_reads_this_machines_table(tmp_path):
    """The real script under sh, here: a path with a space and a line break comes back whole (kv-encoded)."""
    odd = tmp_path / "a b\nc"
    odd.mkdir()
    missing = str(tmp_path / "missing" / "x")
    out = subprocess.run(["sh", "-c", script("mounts.sh"), "sh", str(odd), missing], capture_output=True,
                         text=True, check=True).stdout
    got = parse_mounts(out, [str(odd), missing])
    assert got[str(odd)] is not None and got[str(odd)].path.endswith("a b\nc")
    assert got[missing] is None  # its parent is missing: readlink -f resolves nothing
    with pytest.raises(keyvalue.Malformed):
        parse_mounts(out, [str(odd)])  # one real= per source, or the answer is refused
