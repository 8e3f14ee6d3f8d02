"""Parsing of what hosts print, on fixture text from real machines' output formats."""

import json

import pytest

from dockerlaunch.backends.docker.dockerhost import parse_inspect
from dockerlaunch.backends.docker.doctor.observations import listening_ports, local_ports, parse_df_kb
from dockerlaunch.backends.docker.probe import (
    nic_problem,
    parse_addr_owner,
    parse_ib_ports,
    parse_probe,
    parse_route_get,
)
from dockerlaunch.gpu.smi import count_gpus
from tests import docker_standin


def test_route_via_gateway():
    r = parse_route_get("10.0.0.1 via 10.0.0.254 dev ens5f0 src 10.0.0.5 uid 0 \\    cache ")
    assert (r.interface, r.source, r.local) == ("ens5f0", "10.0.0.5", False)


def test_route_to_own_address_is_local():
    r = parse_route_get("local 172.30.0.11 dev lo table local src 172.30.0.11 uid 0 \\    cache <local> ")
    assert r.local and r.interface == "lo"


def test_addr_owner():
    text = ("6: eth0    inet 172.30.0.11/24 brd 172.30.0.255 scope global eth0\\"
            "       valid_lft forever preferred_lft forever")
    assert parse_addr_owner(text) == "eth0"
    assert parse_addr_owner("7: bond0.100@bond0    inet 10.1.1.1/16 scope global bond0.100") == "bond0.100"
    assert parse_addr_owner("") is None


@pytest.mark.parametrize(
    "iface,src,bad",
    [("eth0", "10.0.0.5", None), ("ib0", "192.168.1.2", None), ("lo", "127.0.0.1", "loopback"),
     ("docker0", "172.17.0.1", "docker0"), ("virbr0", "192.168.122.1", "virbr0"), ("br-1a2b3c", "172.18.0.1", "br-"),
     ("eth0", "172.17.0.5", "172.17.0.5"), (None, None, "no route")],
)
def test_nic_problem(iface, src, bad):
    problem = nic_problem(iface, src)
    assert (problem is None) if bad is None else (bad in problem)


def test_ib_ports_only_active():
    lines = [
        "/sys/class/infiniband/mlx5_0/ports/1 4: ACTIVE InfiniBand",
        "/sys/class/infiniband/mlx5_1/ports/1 1: DOWN InfiniBand",
        "/sys/class/infiniband/mlx5_2/ports/1 4: ACTIVE Ethernet",
        "garbage",
    ]
    active, seen = parse_ib_ports(lines)
    assert active == ["mlx5_0:1", "mlx5_2:1"]
    assert "mlx5_1:1 DOWN" in seen


def test_probe_on_a_gpu_ib_host():
    text = """route=10.0.0.1 via 10.0.0.254 dev ens5f0 src 10.0.0.5 uid 0
owner=
ib_dev=1
ib_port=/sys/class/infiniband/mlx5_0/ports/1 4: ACTIVE InfiniBand
ib_port=/sys/class/infiniband/mlx5_1/ports/1 4: ACTIVE InfiniBand
gpus=8
has_ip=1
"""
    p = parse_probe(text)
    assert (p.interface, p.problem, p.ib_device, p.ib_active, p.gpu_count) == (
        "ens5f0", None, True, ["mlx5_0:1", "mlx5_1:1"], 8)


def test_probe_on_the_master_uses_the_owning_nic():
    text = """route=local 172.30.0.11 dev lo table local src 172.30.0.11 uid 0
owner=6: eth0    inet 172.30.0.11/24 brd 172.30.0.255 scope global eth0
ib_dev=0
gpus=none
has_ip=1
"""
    p = parse_probe(text)
    assert (p.interface, p.problem, p.ib_device, p.gpu_count) == ("eth0", None, False, None)


def test_probe_problems():
    assert "no route" in parse_probe("route=RTNETLINK answers: Network is unreachable\nhas_ip=1\n").problem
    assert "iproute2" in parse_probe("route=\nhas_ip=0\n").problem
    assert "docker0" in parse_probe("route=10.9.9.9 dev docker0 src 172.17.0.1 uid 0\nhas_ip=1\n").problem


def test_listening_ports():
    text = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0B001EAC:9C40 0C001EAC:7531 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 0 0 4 1
"""
    assert listening_ports(text) == {0x7531, 0x35, 22}  # 0x9C40 is an ESTABLISHED connection
    assert local_ports(text, "01") == {0x9C40}


def test_df_and_gpus():
    assert parse_df_kb("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                       "shm 2097152 0 2097152 0% /dev/shm\n") == (2097152, 2097152)
    assert parse_df_kb("nonsense") is None
    assert count_gpus("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n") == 2
    assert count_gpus("") == 0


def test_parse_inspect():
    text = json.dumps([
        {"Name": "/job-1", "State": {"Status": "exited", "ExitCode": 3, "StartedAt": "2026-11-21T07:00:00Z",
                                     "FinishedAt": "2026-11-21T07:01:00Z"},
         "Config": {"Labels": {"dockerlaunch.rank": "1"}}},
        {"Name": "/job-0", "State": {"Status": "running", "ExitCode": 0, "StartedAt": "x", "FinishedAt": ""},
         "Config": {"Labels": {"dockerlaunch.rank": "0"}}},
    ])
    states = parse_inspect(text)
    assert [(s.name, s.rank, s.status, s.exit_code) for s in states] == [
        ("job-0", 0, "running", 0), ("job-1", 1, "exited", 3)]
    assert parse_inspect("") == []


def test_hosts_sharing_an_engine_each_own_their_containers():
    """Several hosts of one engine (`local` entries, the sim's light hosts) all see every container: each is
    listed once, under the host its label names; a container no host of the config names goes to the first."""
    from dockerlaunch.backends.docker.session import own_containers

    def c(id_, rank, host):
        labels = {"dockerlaunch.rank": str(rank), **({"dockerlaunch.host": host} if host else {})}
        return {"Id": id_, "Name": f"/job-{rank}", "State": {"Status": "running"}, "Config": {"Labels": labels}}

    engine = parse_inspect(json.dumps([c("a", 0, "h1"), c("b", 1, "h2"), c("old", 5, None), c("gone", 7, "h9")]))
    other = parse_inspect(json.dumps([c("x", 2, "h3")]))
    found = own_containers(["h1", "h2", "h3"], [engine, engine, other])
    assert [(host, s.name) for host, s in found] == [("h1", "job-0"), ("h2", "job-1"), ("h3", "job-2"),
                                                       ("h1", "job-5"), ("h1", "job-7")]
    # hosts on engines of their own: each sees only its own, as before
    assert [(h, s.name) for h, s in own_containers(["h1", "h3"], [engine[:1], other])] == [("h1", "job-0"),
                                                                                          ("h3", "job-2")]


def test_one_docker_info_gives_the_engine_cdi_dirs_and_runtimes():
    """probe.sh asks the engine once (`docker info --format '{{json .}}'`): Docker 20.10 has no CDISpecDirs field
    (no CDI), 26.1 lists none (off), 28.5 its dirs; the toolkit shows as a runtime."""
    from dockerlaunch.backends.docker.probe import parse_probe

    def gpu(info):
        return parse_probe("has_ip=0\ndocker_info=" + json.dumps(info) + "\n").access

    old = gpu({"ServerVersion": "20.10.24", "Runtimes": {"runc": {}, "nvidia": {"path": "x"}}})
    assert (old.engine, old.cdi_dirs, old.nvidia_runtime) == ("20.10.24", None, True)
    off = gpu({"ServerVersion": "26.1.5", "CDISpecDirs": [], "Runtimes": {"runc": {}}})
    assert (off.engine, off.cdi_dirs, off.nvidia_runtime) == ("26.1.5", (), False)
    on = gpu({"ServerVersion": "28.5.2", "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]})
    assert (on.engine, on.cdi_dirs) == ("28.5.2", ("/etc/cdi", "/var/run/cdi"))
    silent = parse_probe("has_ip=0\ndocker_info=\n").access  # no engine answered
    assert (silent.engine, silent.cdi_dirs) == (None, None)


def test_the_engine_is_read_only_from_its_docker_info():
    """engine=, cdi_dirs= and runtimes= lines (what probe.sh printed before it asked `docker info` once) are no
    key of probe.sh's: a host that prints them is not read, and docker_info= is decoded once, for the GPU access
    and the SELinux fact alike."""
    from dockerlaunch.backends.docker.probe import parse_probe

    old = parse_probe('has_ip=0\nengine=20.10.24\ncdi_dirs=["/etc/cdi"]\nruntimes={"nvidia":{}}\n').access
    assert (old.engine, old.cdi_dirs, old.nvidia_runtime) == (None, None, False)
    both = parse_probe('has_ip=0\nselinuxfs=/sys/fs/selinux\nselinux_enforce=0\n'
                       'docker_info={"ServerVersion": "28.5.2", "Runtimes": {"nvidia": {}}, '
                       '"SecurityOptions": ["name=selinux"]}\n')
    assert (both.access.engine, both.access.nvidia_runtime, both.selinux, both.selinux_mode) == (
        "28.5.2", True, True, "permissive")


@pytest.mark.parametrize("gpu", [True, False])
def test_the_probe_asks_the_engine_for_gpu_facts_only_for_hosts_that_get_gpus(tmp_path, gpu):
    """`docker info` is the costliest question to an engine that many hosts may share: not asked for gpus: none."""
    import subprocess

    from dockerlaunch.backends.docker.probe import parse_probe, probe_argv

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    docker = bin_dir / "docker"  # a stand-in engine CLI that records what it was asked
    docker.write_text(f'#!/bin/sh\necho "$1" >> {calls}\n[ "$1" = info ] && echo \'{{"ServerVersion": "28.5.2"}}\'\n'
                      'exit 0\n')
    docker.chmod(0o755)
    r = subprocess.run(probe_argv("127.0.0.1", "img:1", gpu=gpu), capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    assert r.returncode == 0, r.stderr
    asked = calls.read_text().split()
    assert ("info" in asked) is gpu and "image" in asked, asked
    p = parse_probe(r.stdout)
    assert (p.access.engine == "28.5.2") is gpu


# ---------------------------------------------------------------- SELinux (issue 58, item 5)


def run_probe(tmp_path, options, enforce, gpu=True):
    """The real probe.sh against a stand-in `docker` answering with `options` (a saved real output's list) on a
    host whose mounts table has selinuxfs (its enforce file says `enforce`) or not (`enforce` None)."""
    import subprocess

    from dockerlaunch.backends.docker.probe import probe_argv

    bin_dir = tmp_path / "bin"
    docker_standin.install(bin_dir, options)
    table = docker_standin.mounts(tmp_path / "host", enforce)
    r = subprocess.run(probe_argv("127.0.0.1", "img:1", gpu=gpu), capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "DL_PROBE_MOUNTS": str(table)})
    assert r.returncode == 0, r.stderr
    return parse_probe(r.stdout), [c for c in docker_standin.asked(bin_dir) if c.startswith("info")]


@pytest.mark.parametrize("gpu", [True, False], ids=["gets-gpus", "cpu-host"])
@pytest.mark.parametrize("saved", docker_standin.SAVED)
def test_the_probe_reads_whether_the_engine_labels_containers_from_real_docker_info_outputs(tmp_path, saved, gpu):
    """Each saved real `docker info` (both forms) through the real probe.sh on a host with selinuxfs (enforcing):
    a host that gets GPUs reads it from its one `docker info`, a CPU host asks the engine for the list alone."""
    probe, asked = run_probe(tmp_path, docker_standin.security_options(saved), "1", gpu=gpu)
    assert probe.selinux is ("-no-selinux" not in saved) and probe.selinux_mode == "enforcing", saved
    assert asked == (["info --format {{json .}}"] if gpu else ["info --format {{json .SecurityOptions}}"]), asked


def test_a_cpu_host_without_selinuxfs_asks_its_engine_nothing_and_cannot_label(tmp_path):
    """Hosts may share an engine (the sim's light hosts, several `local` entries): a host that gets no GPUs asks no
    `docker info` unless its kernel runs SELinux, whose absence already says the engine cannot label."""
    probe, asked = run_probe(tmp_path, ["name=seccomp,profile=default", "name=selinux"], None, gpu=False)
    assert asked == [] and probe.selinux is False and probe.selinux_mode is None


def test_permissive_and_an_engine_that_does_not_answer(tmp_path):
    probe, _ = run_probe(tmp_path, ["name=seccomp,profile=default", "name=selinux"], "0", gpu=False)
    assert (probe.selinux, probe.selinux_mode) == (True, "permissive")
    silent, asked = run_probe(tmp_path / "2", None, "1", gpu=False)  # `docker info` fails: not known, not a guess
    assert asked and (silent.selinux, silent.selinux_mode) == (None, "enforcing")
    silent, _ = run_probe(tmp_path / "3", None, "1", gpu=True)
    assert silent.selinux is None


@pytest.mark.parametrize("text, selinux", [
    ('docker_info={"SecurityOptions": ["name=selinux"]}\nselinuxfs=\n', True),  # the engine's word decides
    ('docker_info={"ServerVersion": "1.10.3"}\nselinuxfs=/sys/fs/selinux\n', None),  # no SecurityOptions field
    ('docker_info={"ServerVersion": "1.10.3"}\nselinuxfs=\n', False),
    ('security_options=null\nselinuxfs=/sys/fs/selinux\n', False),  # an engine with no options at all
    ('security_options=not json\nselinuxfs=/sys/fs/selinux\n', None),
    ("has_ip=0\n", None),  # said nothing (an answer of an older probe.sh)
])
def test_selinux_facts_from_probe_lines(text, selinux):
    assert parse_probe("has_ip=0\n" + text if "has_ip" not in text else text).selinux is selinux
