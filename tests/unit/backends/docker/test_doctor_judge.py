"""doctor.judge on hand-built facts (as observe would record them) and parse_observation on recorded output.

judge is pure: every verdict branch is driven here by the facts alone, with no SSH, no docker and no mocks.
"""

import json

import pytest

from dockerlaunch.backends.docker.doctor.judge import judge
from dockerlaunch.backends.docker.doctor.observations import (
    ContainerFacts,
    HostObservation,
    Observations,
    Shared,
    parse_observation,
)
from dockerlaunch.backends.docker.doctor.observe import _check_spec
from dockerlaunch.backends.docker.doctor.report import CHECK_ORDER, ERROR, FAIL, PASS, SKIP, WARN, Report
from dockerlaunch.backends.docker.probe import Probe, nic_problem
from dockerlaunch.docker_run import run_argv
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import make_plan
from dockerlaunch.verdict import Finding

H0, H1 = "10.0.0.1", "10.0.0.2"
MASTER = H0
IMAGE = "img:tag"
IMAGE_ID = "sha256:ab12cd34ef56" + "0" * 52
OTHER_ID = "sha256:99ff88ee77dd" + "1" * 52
GB = 1024 * 1024  # KiB
HIGH_PORT = 45678


# ---------------------------------------------------------------- builders


def cfg(hosts=(H0, H1), job=None, **container) -> ClusterConfig:
    """Two hosts, no GPUs, no InfiniBand unless a test says otherwise."""
    data = {"hosts": list(hosts), "image": IMAGE, "ssh": {"config_file": None},
            "container": {"gpus": "none", "infiniband": "off", **container}}
    if job:
        data["job"] = job
    return ClusterConfig.model_validate(data)


def probe(interface="eth0", source=None, problem=None, ib=False, active=(), seen=None, gpus=None, selinux=False,
          selinux_mode=None) -> Probe:
    """`selinux`: the host's engine labels containers (False: a kernel without SELinux, as most hosts)."""
    return Probe(interface=interface, source=source, problem=problem, ib_device=ib, ib_active=list(active),
                 ib_seen=list(seen if seen is not None else [f"{p} ACTIVE" for p in active]), gpu_count=gpus,
                 selinux=selinux, selinux_mode=selinux_mode)


def host(rank: int, **kw) -> HostObservation:
    """A healthy host as observe records it; keyword arguments replace single facts."""
    address = kw.pop("address", f"10.0.0.{rank + 1}")
    facts = dict(
        ssh=f"root@{address}:22", docker="24.0.7", image_id=IMAGE_ID,
        probe=probe(source=address), disk=(200 * GB, 80 * GB), mounts_missing=[], listening={22},
        clock_offset=0.0, shm=ContainerFacts(shm_kb=64 * GB, memlock="unlimited", nofile="1048576"),
        reach=None if rank == 0 else [],
    )
    facts.update(kw)
    return HostObservation(rank, address, **facts)


def unreachable(rank: int, why="connection refused", address: str | None = None) -> HostObservation:
    """A host SSH could not reach: observe fills nothing else."""
    address = address or f"10.0.0.{rank + 1}"
    return HostObservation(rank, address, ssh=f"root@{address}:22", ssh_error=why)


def run(config: ClusterConfig, *hosts: HostObservation, reach_ports=(29500, HIGH_PORT), reach_error=None,
        supervised: bool = False) -> Report:
    plan = make_plan(config, supervised=supervised)
    targets = [resolve_target(h, config.ssh, None, "root") for h in config.hosts]
    return judge(config, plan, targets,
                 Observations(MASTER, list(hosts), reach_ports=reach_ports, reach_error=reach_error))


def row(report: Report, address: str, name: str, verdict, *words: str) -> Finding:
    """The one row for (address, check), with the expected verdict and key words in its reason."""
    rows = [c for c in report.checks if c.host == address and c.check == name]
    assert len(rows) == 1, f"{address} {name}: {rows} in {report.checks}"
    c = rows[0]
    assert c.verdict == verdict, c
    for w in words:
        assert w in c.detail, (w, c)
    return c


def names(report: Report, address: str) -> list[str]:
    return [c.check for c in report.checks if c.host == address]


# ---------------------------------------------------------------- ssh, docker


def test_all_healthy_passes():
    report = run(cfg(), host(0), host(1))
    assert not report.failed
    row(report, H0, "ssh", PASS, "root@10.0.0.1:22")
    row(report, H0, "docker", PASS, "engine 24.0.7")
    row(report, H0, "image", PASS, "ab12cd34ef56")
    row(report, H0, "master port", PASS, "29500 is free")
    row(report, H1, "reachability", PASS, f"reaches {MASTER}:29500 and :{HIGH_PORT}")


def test_ssh_fail_judges_nothing_else_on_that_host():
    report = run(cfg(), host(0), unreachable(1, "connect to 10.0.0.2:22: Connection refused"))
    row(report, H1, "ssh", FAIL, "Connection refused")
    assert names(report, H1) == ["ssh"]
    assert names(report, H0) == ["ssh", "docker", "image", "route", "master port", "shm", "nofile", "gpus",
                                 "infiniband", "disk"]  # one timed host: no clock row


def test_observation_round_trip_failed():
    broken = HostObservation(1, H1, ssh="root@10.0.0.2:22", error="Timeout opening channel.")
    report = run(cfg(), host(0), broken)
    row(report, H1, "ssh", PASS, "root@10.0.0.2:22")
    row(report, H1, "docker", FAIL, "could not check the host: Timeout opening channel.")
    assert names(report, H1) == ["ssh", "docker"]
    assert report.get(H0, "reachability") is None  # host 1 is not usable: no probe to judge


def test_docker_permission_denied_hints_the_docker_group():
    config = cfg(hosts=[H0, "alice@10.0.0.2"])
    why = ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
           'Get "http://%252Fvar%252Frun%252Fdocker.sock/v1.24/version": dial unix /var/run/docker.sock: connect: '
           "permission denied")
    report = run(config, host(0), host(1, docker=None, docker_error=why, image_id=None, disk=None))
    c = row(report, H1, "docker", FAIL, "docker not usable by alice", "permission denied")
    assert c.detail.endswith("(add the user to the docker group)")
    # the host itself still answers: route, InfiniBand and clock are judged, nothing that needs docker is
    assert names(report, H1) == ["ssh", "docker", "route", "infiniband", "clock"]


def test_docker_not_installed_has_no_group_hint():
    report = run(cfg(), host(0), host(1, docker=None, docker_error="sh: 1: docker: not found", image_id=None))
    c = row(report, H1, "docker", FAIL, "docker not usable by root: sh: 1: docker: not found")
    assert "docker group" not in c.detail


def test_docker_without_answer():
    row(run(cfg(), host(0), host(1, docker=None, image_id=None)), H1, "docker", FAIL, "no answer")


# ---------------------------------------------------------------- image


def test_image_missing_fails_with_the_push_hint():
    report = run(cfg(), host(0), host(1, image_id="", shm=None))
    row(report, H1, "image", FAIL, "img:tag is missing here; fix: dockerlaunch push img:tag")
    row(report, H0, "image", PASS, "ab12cd34ef56")
    # no container could run there: no shm/gpus rows, and reachability is skipped instead of failed
    assert report.get(H1, "shm") is None and report.get(H1, "gpus") is None
    row(report, H1, "reachability", SKIP, "image missing here")


def test_image_missing_everywhere():
    report = run(cfg(), host(0, image_id="", shm=None), host(1, image_id="", shm=None))
    row(report, H0, "image", FAIL, "missing")
    row(report, H1, "image", FAIL, "missing")


def test_an_image_this_machine_lacks_too_is_built_or_pulled_first():
    """A push hint for an image that is not here would fail when pasted: build or pull it first, then push."""
    from dockerlaunch.backends.docker.doctor.judge import _judge_image
    from dockerlaunch.backends.docker.doctor.report import Report

    config = cfg()
    report = Report()
    _judge_image(report, config, make_plan(config), [host(0, image_id="")], image_here=False)
    got = report.get(H0, "image")
    assert got.verdict == FAIL and "not on this machine either: build or pull it first" in got.detail
    assert "docker pull img:tag" in got.detail and got.detail.endswith("then fix: dockerlaunch push img:tag")


def test_the_push_hint_repeats_the_users_own_config_and_hosts():
    from dockerlaunch.backends.docker.doctor.judge import _judge_image
    from dockerlaunch.backends.docker.doctor.report import Report
    from dockerlaunch.job.invocation import Invocation

    config = cfg()
    config._invocation = Invocation(config="c.yaml", hosts=("10.0.0.1", "10.0.0.2"), name="ux2")
    report = Report()
    _judge_image(report, config, make_plan(config), [host(0, image_id="")], image_here=True)
    assert report.get(H0, "image").detail == ("img:tag is missing here; fix: dockerlaunch push img:tag --config "
                                              "c.yaml --hosts 10.0.0.1,10.0.0.2")


def test_a_different_image_id_on_one_host_fails():
    report = run(cfg(), host(0), host(1, image_id=OTHER_ID))
    row(report, H0, "image", PASS, "ab12cd34ef56")
    row(report, H1, "image", FAIL, "img:tag is 99ff88ee77dd here but ab12cd34ef56 on another host",
        "on another host; fix: dockerlaunch push img:tag")


# ---------------------------------------------------------------- route, infiniband


def test_route_pass_names_the_interface():
    row(run(cfg(), host(0), host(1, probe=probe("ens5f0"))), H1, "route", PASS, f"{MASTER} via ens5f0")


def test_route_through_docker_bridge_fails():
    bad = probe("docker0", "172.17.0.1", problem=nic_problem("docker0", "172.17.0.1"))
    row(run(cfg(), host(0), host(1, probe=bad)), H1, "route", FAIL, f"toward {MASTER}", "docker0")


def test_no_route_fails():
    bad = probe(None, problem="no route: RTNETLINK answers: Network is unreachable")
    row(run(cfg(), host(0), host(1, probe=bad)), H1, "route", FAIL, "no route", "Network is unreachable")


def test_route_problem_only_warns_when_the_user_set_nccl_socket_ifname():
    bad = probe("docker0", "172.17.0.1", problem=nic_problem("docker0", "172.17.0.1"))
    report = run(cfg(env={"NCCL_SOCKET_IFNAME": "ib0"}), host(0), host(1, probe=bad))
    row(report, H1, "route", WARN, f"toward {MASTER}: route goes through docker0", "; using your NCCL_SOCKET_IFNAME")


def test_no_probe_no_route_or_infiniband_rows():
    report = run(cfg(), host(0), host(1, probe=None))
    assert report.get(H1, "route") is None and report.get(H1, "infiniband") is None


@pytest.mark.parametrize(
    "mode,p,verdict,words",
    [
        ("on", probe(), FAIL, ["infiniband: on", "no /dev/infiniband"]),
        ("auto", probe(), SKIP, ["no /dev/infiniband on the host"]),
        ("off", probe(), SKIP, ["no /dev/infiniband on the host"]),
        ("off", probe(ib=True, active=["mlx5_0:1"]), WARN,
         ["the host has InfiniBand but infiniband: off: NCCL will use TCP"]),
        ("on", probe(ib=True, seen=["mlx5_0:1 DOWN", "mlx5_1:1 INIT"]), FAIL,
         ["no ACTIVE IB port (mlx5_0:1 DOWN, mlx5_1:1 INIT)"]),
        ("auto", probe(ib=True), FAIL, ["no ACTIVE IB port (none listed)"]),
        ("on", probe(ib=True, active=["mlx5_0:1", "mlx5_1:1"]), PASS, ["NCCL_IB_HCA=mlx5_0:1,mlx5_1:1"]),
        ("auto", probe(ib=True, active=["mlx5_2:1"]), PASS, ["NCCL_IB_HCA=mlx5_2:1"]),
    ],
)
def test_infiniband(mode, p, verdict, words):
    c = row(run(cfg(infiniband=mode), host(0), host(1, probe=p)), H1, "infiniband", verdict, *words)
    assert c.detail.startswith(words[0]), c


# ---------------------------------------------------------------- shm, memlock


@pytest.mark.parametrize(
    "shm,verdict,words",
    [
        (ContainerFacts(shm_kb=65536, memlock="8192"), FAIL, ["/dev/shm is 64 MB in the container",
                                                                "ipc: host or shm_size"]),
        (ContainerFacts(shm_kb=32768, memlock="8192"), FAIL, ["/dev/shm is 32 MB"]),
        (ContainerFacts(shm_kb=64 * GB, memlock="8192"), PASS, ["/dev/shm 64 GB"]),
        (ContainerFacts(shm_kb=None, memlock="8192"), WARN, ["could not read /dev/shm size"]),
        (ContainerFacts(error="docker: Error response from daemon: invalid shm size"), FAIL,
         ["a container with the job's flags did not start", "invalid shm size"]),
        (None, FAIL, ["could not check: no container was run"]),
    ],
)
def test_shm(shm, verdict, words):
    report = run(cfg(), host(0), host(1, shm=shm))
    row(report, H1, "shm", verdict, *words)
    assert report.get(H1, "memlock") is None  # infiniband: off


def test_shm_pass_reason_shows_sizes_under_a_gigabyte():
    # shm_size: 512m is above docker's 64 MB default, so PASS; the reason must not claim "0 GB"
    c = row(run(cfg(), host(0), host(1, shm=ContainerFacts(shm_kb=512 * 1024, memlock="8192"))), H1, "shm", PASS)
    assert "0 GB" not in c.detail, c.detail


@pytest.mark.parametrize("memlock,verdict", [("unlimited", PASS), ("8192", FAIL), ("64", FAIL)])
def test_memlock_when_infiniband_is_used(memlock, verdict):
    ib = probe(ib=True, active=["mlx5_0:1"])
    shm = ContainerFacts(shm_kb=64 * GB, memlock=memlock)
    report = run(cfg(infiniband="on"), host(0, probe=ib), host(1, probe=ib, shm=shm))
    row(report, H1, "memlock", verdict, f"ulimit -l in the container: {memlock}")


def test_memlock_judged_in_auto_mode_only_where_the_host_has_infiniband():
    ib = probe(ib=True, active=["mlx5_0:1"])
    low = ContainerFacts(shm_kb=64 * GB, memlock="8192")
    report = run(cfg(infiniband="auto"), host(0, shm=low), host(1, probe=ib, shm=low))
    assert report.get(H0, "memlock") is None
    row(report, H1, "memlock", FAIL, "8192")


def test_no_memlock_row_when_the_probe_container_failed():
    ib = probe(ib=True, active=["mlx5_0:1"])
    report = run(cfg(infiniband="on"), host(0, probe=ib), host(1, probe=ib, shm=ContainerFacts(error="no such device")))
    row(report, H1, "shm", FAIL, "no such device")
    assert report.get(H1, "memlock") is None


def test_probe_container_in_auto_mode_gets_the_memlock_it_will_run_with():
    """On an IB host with infiniband: auto (the default), the job runs with --ulimit memlock=-1:-1 (make_plan with
    facts turns auto into on); the shm/memlock probe container must get it too, or memlock FAILs falsely."""
    plan = make_plan(cfg(infiniband="auto"))  # the plan doctor.check() judges: no facts
    spec = _check_spec(plan.hosts[0], IMAGE, ["sh", "-c", "ulimit -l"], "dlprobe-shm-x", ib=True)
    argv = run_argv(spec)
    assert "memlock=-1:-1" in argv, argv
    assert "/dev/infiniband" in argv, argv


# ---------------------------------------------------------------- gpus


def test_gpus_skipped_when_the_job_asks_for_none():
    row(run(cfg(), host(0), host(1)), H1, "gpus", SKIP, "the job asks for no GPUs")


@pytest.mark.parametrize(
    "container,gpus,verdict,words",
    [
        ({"gpus": "all"}, ContainerFacts(error='could not select device driver "" with capabilities: [[gpu]]',
                                         gpu_mode="gpus", gpu_why="set in the config"), FAIL,
         ["GPU container failed", "could not select device driver", "mode gpus", "check nvidia-container-toolkit"]),
        ({"gpus": "all"}, ContainerFacts(error="libnvidia-ml.so.1: cannot open shared object file", gpu_mode="devices",
                                         gpu_why="no toolkit runtime or CDI spec"), FAIL,
         ["GPU container failed", "mode devices: no toolkit runtime", "check device nodes and driver libraries"]),
        ({"gpus": "all"}, ContainerFacts(gpus=2, gpu_mode="devices", gpu_why="no toolkit runtime or CDI spec"), PASS,
         ["2 GPU(s) visible in the container (mode devices: no toolkit runtime or CDI spec)"]),
        ({"gpus": 4}, ContainerFacts(gpus=2), FAIL, ["2 GPU(s) visible in the container, nproc_per_node is 4"]),
        ({"gpus": 4}, ContainerFacts(gpus=4), PASS, ["4 GPU(s) visible in the container"]),
        ({"gpus": ["0", "3"]}, ContainerFacts(gpus=2), PASS, ["2 GPU(s)"]),
        ({"gpus": "all"}, ContainerFacts(gpus=8), PASS, ["8 GPU(s)"]),  # nproc resolved at launch: no count check
        ({"gpus": "all", "gpu_mode": "cdi"}, ContainerFacts(gpus=8), PASS, ["8 GPU(s)"]),
    ],
)
def test_gpus(container, gpus, verdict, words):
    report = run(cfg(**container), host(0, gpus=ContainerFacts(gpus=8)), host(1, gpus=gpus))
    row(report, H1, "gpus", verdict, *words)


def test_gpus_fewer_than_job_nproc_per_node():
    report = run(cfg(job={"nproc_per_node": 8}, gpus="all"), host(0, gpus=ContainerFacts(gpus=8)),
                 host(1, gpus=ContainerFacts(gpus=7)))
    row(report, H0, "gpus", PASS, "8 GPU(s)")
    row(report, H1, "gpus", FAIL, "7 GPU(s) visible", "nproc_per_node is 8")


# ---------------------------------------------------------------- mounts, shared


def test_mounts():
    config = cfg(mounts=["/data:/data", "/nope:/nope:ro"])
    report = run(config, host(0), host(1, mounts_missing=["/nope"]))
    row(report, H0, "mounts", PASS, "2 host path(s) exist")
    row(report, H1, "mounts", FAIL, "missing on the host: /nope")


def test_no_mounts_row_without_mounts():
    assert "mounts" not in names(run(cfg(), host(0), host(1)), H1)


def test_shared_storage():
    config = cfg(mounts=[{"source": "/shared", "target": "/shared", "shared": True},
                         {"source": "/scratch", "target": "/scratch", "shared": True}])
    report = run(config, host(0), host(1, shared={"/shared": Shared(True, "nfs4 nas:/export on both (mount table)"),
                                                   "/scratch": Shared(False, "the file written there on host 0 is "
                                                                             "not here")}))
    rows = [c for c in report.checks if c.check == "shared"]
    assert [(c.verdict, c.detail) for c in rows] == [
        (PASS, "/shared is shared with host 0 (nfs4 nas:/export on both (mount table))"),
        (FAIL, "/scratch is not the same storage as on host 0 (marked shared: true; the file written there on host "
               "0 is not here)"),
    ]


def test_a_shared_check_that_could_not_run_is_an_error():
    config = cfg(mounts=[{"source": "/shared", "target": "/shared", "shared": True}])
    report = run(config, host(0, shared={"/shared": Shared(None, "could not check: alice cannot write to /shared "
                                                                 "(Permission denied), nor the job's user in a "
                                                                 "container (Permission denied)")}), host(1))
    row(report, H0, "shared", ERROR, "could not check: alice cannot write to /shared")
    assert report.get(H1, "shared") is None and report.failed


# ---------------------------------------------------------------- master port, reachability


def test_master_port_in_use_fails_and_skips_reachability():
    report = run(cfg(), host(0, listening={22, 29500}), host(1, reach=None), reach_ports=None)
    row(report, H0, "master port", FAIL, "port 29500 is already in use on host 0", "--master-port")
    assert report.get(H1, "reachability") is None


def test_a_detached_job_checks_the_gang_port_as_it_checks_the_master_port():
    """`up --detach`'s pre-flight: host 0's gang supervisor listens on job.gang_port; in use there fails it (and
    the reachability rows, which then could not bind it); free, the others must reach it."""
    busy = run(cfg(), host(0, listening={22, 29499}), host(1, reach=None), reach_ports=None, supervised=True)
    row(busy, H0, "gang port", FAIL, "port 29499 is already in use on host 0", "job.gang_port")
    assert busy.get(H1, "reachability") is None
    free = run(cfg(job={"gang_port": 31000}), host(0, listening={22}), host(1), reach_ports=(29500, 31000),
               supervised=True)
    row(free, H0, "gang port", PASS, "31000 is free")
    row(free, H1, "reachability", PASS, f"reaches {MASTER}:29500 and :31000")
    assert run(cfg(), host(0, listening={22, 29499}), host(1)).get(H0, "gang port") is None  # attached: no gang


def test_master_port_is_the_configured_one():
    report = run(cfg(job={"master_port": 12345}), host(0, listening={22, 29500}), host(1),
                 reach_ports=(12345, HIGH_PORT))
    row(report, H0, "master port", PASS, "12345 is free")
    row(report, H1, "reachability", PASS, f"reaches {MASTER}:12345 and :{HIGH_PORT}")


@pytest.mark.parametrize(
    "h0,h1,kw,verdict,words",
    [
        ({}, {"reach": []}, {}, PASS, [f"reaches {MASTER}:29500 and :{HIGH_PORT}"]),
        ({}, {"reach": [f"{MASTER}:29500 nc: connect to {MASTER} port 29500 (tcp) timed out"]}, {}, FAIL,
         [f"cannot reach {MASTER}:29500 nc: connect", "(firewall?)"]),
        ({}, {"reach": [f"{MASTER}:29500 refused", f"{MASTER}:{HIGH_PORT} refused"]}, {}, FAIL,
         [f"{MASTER}:29500 refused; {MASTER}:{HIGH_PORT} refused"]),
        ({}, {"reach": "could not check: Timeout opening channel."}, {}, FAIL,
         ["could not check: Timeout opening channel."]),
        ({}, {"reach": None}, {}, FAIL, ["could not check: no probe ran"]),
        ({}, {"reach": None}, {"reach_error": "docker: Error response from daemon: pull access denied"}, FAIL,
         ["cannot start a listener on host 0", "pull access denied"]),
        ({}, {"reach": "image missing here", "image_id": ""}, {}, SKIP, ["image missing here"]),
        ({}, {"reach": None, "image_id": ""}, {}, SKIP, ["image missing here"]),
        ({"image_id": "", "shm": None}, {"reach": None}, {"reach_ports": None}, SKIP, ["host 0"]),
        ({"docker": None, "docker_error": "sh: 1: docker: not found", "image_id": None}, {"reach": None},
         {"reach_ports": None}, SKIP, ["host 0 is not usable"]),
    ],
)
def test_reachability(h0, h1, kw, verdict, words):
    row(run(cfg(), host(0, **h0), host(1, **h1), **kw), H1, "reachability", verdict, *words)


def test_reachability_skipped_when_host_0_is_unreachable():
    report = run(cfg(), unreachable(0), host(1, reach=None), reach_ports=None)
    row(report, H1, "reachability", SKIP, "host 0 is not usable")
    assert report.get(H0, "master port") is None


def test_passing_reach_without_recorded_ports_names_the_master_port():
    row(run(cfg(), host(0), host(1), reach_ports=None), H1, "reachability", PASS, f"reaches {MASTER}:29500")


# ---------------------------------------------------------------- disk, clock


@pytest.mark.parametrize(
    "disk,verdict,words",
    [
        ((200 * GB, 80 * GB), PASS, ["80 GB free under the docker root"]),
        ((200 * GB, 20 * GB), PASS, ["20 GB free"]),
        ((200 * GB, 19 * GB), WARN, ["19 GB free"]),
        ((103081248, 2000000), WARN, ["2 GB free"]),
        (None, WARN, ["could not read free space under the docker root"]),
    ],
)
def test_disk(disk, verdict, words):
    row(run(cfg(), host(0), host(1, disk=disk)), H1, "disk", verdict, *words)


@pytest.mark.parametrize(
    "h0,h1,verdict,words",
    [
        (0.25, 0.5, PASS, ["0.25s from host 0"]),
        (0.0, -0.99, PASS, ["0.99s"]),
        (0.0, 1.0, WARN, ["1.00s from host 0"]),
        (0.0, 3.5, WARN, ["3.50s from host 0"]),
        (0.0, -9.5, WARN, ["9.50s"]),
        (0.0, 10.0, FAIL, ["10.00s from host 0"]),
        (0.0, 12.0, FAIL, ["12.00s from host 0"]),
        (100.0, 80.0, FAIL, ["20.00s"]),
    ],
)
def test_clock(h0, h1, verdict, words):
    report = run(cfg(), host(0, clock_offset=h0), host(1, clock_offset=h1))
    row(report, H0, "clock", PASS, "0.00s from host 0")
    row(report, H1, "clock", verdict, *words)


def test_no_clock_rows_with_one_timed_host():
    report = run(cfg(), host(0), host(1, clock_offset=None))
    assert all(c.check != "clock" for c in report.checks)


def test_clock_reference_is_named_when_host_0_is_not_timed():
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    report = run(cfg(hosts=hosts), unreachable(0), host(1, clock_offset=0.0), host(2, clock_offset=0.2))
    c = row(report, "10.0.0.3", "clock", PASS, "0.20s")
    assert "host 0" not in c.detail, c.detail  # host 0 was never timed: the skew is measured from 10.0.0.2


# ---------------------------------------------------------------- the report


def test_report_is_sorted_by_host_rank_then_check_order():
    config = cfg(mounts=[{"source": "/shared", "target": "/shared", "shared": True}], infiniband="auto")
    report = run(config, host(0, clock_offset=0.1),
                 host(1, shared={"/shared": Shared(True, "a test")}, clock_offset=0.2))
    keys = [(c.host, c.check) for c in report.checks]
    assert keys == sorted(keys, key=lambda k: ((H0, H1).index(k[0]), CHECK_ORDER.index(k[1])))
    # rows judged last (image, master port, reachability, shared, clock) are in place, not appended
    assert names(report, H0) == ["ssh", "docker", "image", "route", "master port", "shm", "nofile", "gpus",
                                 "infiniband", "mounts", "disk", "clock"]
    assert names(report, H1) == ["ssh", "docker", "image", "route", "reachability", "shm", "nofile", "gpus",
                                 "infiniband", "mounts", "shared", "disk", "clock"]
    assert keys.index((H0, "clock")) < keys.index((H1, "ssh"))


def test_report_rows_of_hosts_sharing_an_address_are_told_apart():
    # two hosts behind one gateway, by port: the config accepts it (hosts are unique by address and port)
    config = cfg(hosts=[{"address": "gw:2201", "advertise_addr": "10.0.0.1"}, "gw:2202"])
    report = run(config, host(0, address="gw", ssh="root@gw:2201"), unreachable(1, address="gw"))
    ssh_rows = [c for c in report.checks if c.check == "ssh"]
    assert [c.verdict for c in ssh_rows] == [PASS, FAIL]  # sorted by rank: rank 0 first
    assert len({c.host for c in ssh_rows}) == 2, ssh_rows  # a reader must tell which host failed


def test_report_dict_json_and_summary():
    report = run(cfg(), host(0, disk=(200 * GB, 5 * GB)), host(1, image_id=OTHER_ID))
    d = report.to_dict()
    assert d["ok"] is False
    assert d["counts"] == {"PASS": 16, "WARN": 1, "FAIL": 1, "SKIP": 4, "ERROR": 0}
    assert sum(d["counts"].values()) == len(d["checks"]) == len(report.checks)
    assert d["checks"][0] == {"host": H0, "check": "ssh", "verdict": "PASS", "reason": "root@10.0.0.1:22"}
    failed = [c for c in d["checks"] if c["verdict"] == "FAIL"]
    assert [(c["host"], c["check"]) for c in failed] == [(H1, "image")]
    assert json.loads(report.to_json()) == d
    assert report.summary() == "doctor: 16 PASS, 1 FAIL, 1 WARN, 4 SKIP"
    assert [c.check for c in report.failed] == ["image"]


def test_report_of_warnings_only_is_ok():
    report = run(cfg(), host(0, disk=None), host(1))
    assert report.to_dict()["ok"] is True and report.counts()[WARN] == 1
    assert Report().summary() == "doctor: 0 PASS, 0 FAIL, 0 WARN, 0 SKIP"
    assert Report().to_dict() == {"ok": True, "counts": {"PASS": 0, "WARN": 0, "FAIL": 0, "SKIP": 0, "ERROR": 0},
                                  "checks": []}


# ---------------------------------------------------------------- parse_observation on recorded output

TCP = """\
tcp=  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
tcp=   0: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 21310 1 0 100 0 0 10 0
tcp=   1: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000   101        0 18220 1 0 100 0 0 10 5
tcp=   2: 0200000A:0016 0100000A:D6A2 01 00000000:00000000 02:0009A5D3 00000000     0        0 30125 2 0 20 4 30 10 -1
tcp=  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when
tcp=   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000
"""

# observe.sh + probe.sh on a Debian 12 worker (rank 1) with docker.io, no GPU, no InfiniBand
DEBIAN_WORKER = f"""\
clock=1763800000.123456789
docker=20.10.24+dfsg1
image={IMAGE_ID}
disk=Filesystem 1024-blocks Used Available Capacity Mounted on
disk=/dev/sda1 103081248 40000000 58000000 41%25 /
mount_ok=/data
mount_missing=/nope
{TCP}route=10.0.0.1 dev eth0 src 10.0.0.2 uid 0 \\    cache
owner=
ib_dev=0
gpus=none
has_ip=1
selinuxfs=
"""

# the same scripts on host 0 itself: the route to its own address is local, the owning NIC is named
DEBIAN_MASTER = f"""\
clock=1763800000.200000000
docker=20.10.24+dfsg1
image={IMAGE_ID}
disk=Filesystem 1024-blocks Used Available Capacity Mounted on
disk=/dev/nvme0n1p2 490691512 450000000 15691512 97%25 /
mount_ok=/data
mount_ok=/nope
{TCP}route=local 10.0.0.1 dev lo table local src 10.0.0.1 uid 0 \\    cache <local>
owner=2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever preferred_lft forever
ib_dev=0
gpus=none
has_ip=1
selinuxfs=
"""

# a user outside the docker group: docker version fails, everything else is still printed
NO_DOCKER = """\
clock=1763800000.300000000
docker_error=permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: \
Get "http://%252Fvar%252Frun%252Fdocker.sock/v1.24/version": dial unix /var/run/docker.sock: connect: permission denied
mount_ok=/data
mount_missing=/nope
tcp=  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
tcp=   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
route=10.0.0.1 dev eth0 src 10.0.0.2 uid 0 \\    cache
owner=
ib_dev=0
gpus=none
has_ip=1
selinuxfs=
"""


def test_parse_observation_on_a_debian_host_with_docker():
    o = parse_observation(HostObservation(1, H1, ssh="root@10.0.0.2:22"), DEBIAN_WORKER)
    assert (o.docker, o.docker_error, o.image_id) == ("20.10.24+dfsg1", None, IMAGE_ID)
    assert o.disk == (103081248, 58000000)
    assert o.mounts_missing == ["/nope"]
    assert o.listening == {0x7531, 0x35, 22}  # the ESTABLISHED ssh connection (st 01) is not listening
    p = o.probe
    assert (p.interface, p.source, p.problem, p.ib_device, p.ib_active, p.gpu_count) == (
        "eth0", "10.0.0.2", None, False, [], None)
    assert o.usable and o.ssh == "root@10.0.0.2:22" and o.clock_offset is None  # the clock is observe's job


def test_parse_observation_reads_the_answer_once(monkeypatch):
    """observe.sh and probe.sh answer in one round trip: their answer is parsed once, with both scripts' keys (no
    key is both's), and gives the same facts as probe.sh's answer parsed alone."""
    from dockerlaunch import keyvalue
    from dockerlaunch.backends.docker import probe as probelib
    from dockerlaunch.backends.docker.doctor import observations

    observe_keys = set(observations.OBSERVE_SINGLE + observations.OBSERVE_LISTS)
    assert not observe_keys & set(probelib.PROBE_SINGLE + probelib.PROBE_LISTS)
    calls = []
    parse = keyvalue.parse
    monkeypatch.setattr(keyvalue, "parse", lambda *a, **k: calls.append(a[1:]) or parse(*a, **k))
    o = parse_observation(HostObservation(1, H1, ssh="root@10.0.0.2:22"), DEBIAN_WORKER)
    assert len(calls) == 1, calls
    monkeypatch.setattr(keyvalue, "parse", parse)
    assert o.probe == probelib.parse_probe(DEBIAN_WORKER, H1)


def test_parse_observation_on_the_master():
    o = parse_observation(HostObservation(0, H0), DEBIAN_MASTER)
    assert o.probe.interface == "eth0" and o.probe.problem is None
    assert o.disk == (490691512, 15691512) and o.mounts_missing == []


def test_parse_observation_when_docker_is_not_usable():
    o = parse_observation(HostObservation(1, H1, ssh="root@10.0.0.2:22"), NO_DOCKER)
    assert o.docker is None and not o.usable
    assert o.docker_error.startswith("permission denied while trying to connect")
    assert o.docker_error.endswith("connect: permission denied")
    assert (o.image_id, o.disk) == (None, None)
    assert o.mounts_missing == ["/nope"] and o.listening == {22}
    assert o.probe.interface == "eth0" and o.probe.problem is None


def test_parse_observation_of_a_missing_image():
    text = DEBIAN_WORKER.replace(f"image={IMAGE_ID}", "image=")
    assert parse_observation(HostObservation(1, H1), text).image_id == ""


def test_judge_on_parsed_observations():
    config = cfg(mounts=["/data:/data", "/nope:/nope"])
    h0 = parse_observation(HostObservation(0, H0, ssh="root@10.0.0.1:22"), DEBIAN_MASTER)
    h0.shm = ContainerFacts(shm_kb=16 * GB, memlock="8192")
    h1 = parse_observation(HostObservation(1, H1, ssh="root@10.0.0.2:22"), DEBIAN_WORKER)
    h1.shm, h1.reach = ContainerFacts(shm_kb=65536, memlock="8192"), []
    report = run(config, h0, h1)
    row(report, H0, "docker", PASS, "engine 20.10.24+dfsg1")
    row(report, H0, "route", PASS, f"{MASTER} via eth0")
    row(report, H0, "disk", WARN, "15 GB free")
    row(report, H0, "mounts", PASS, "2 host path(s) exist")
    row(report, H0, "master port", PASS, "29500 is free")
    row(report, H1, "disk", PASS, "55 GB free")
    row(report, H1, "mounts", FAIL, "/nope")
    row(report, H1, "shm", FAIL, "64 MB")
    row(report, H1, "infiniband", SKIP, "no /dev/infiniband")
    row(report, H1, "reachability", PASS)
    assert sorted((c.host, c.check) for c in report.failed) == [(H1, "mounts"), (H1, "shm")]

    config2 = cfg()
    busy = parse_observation(HostObservation(0, H0), DEBIAN_MASTER.replace(":7531 ", ":733C "))
    row(run(config2, busy, h1), H0, "master port", FAIL, "29500")

    nod = parse_observation(HostObservation(1, H1, ssh="root@10.0.0.2:22"), NO_DOCKER)
    report = run(config, h0, nod)
    row(report, H1, "docker", FAIL, "permission denied", "docker group")
    assert names(report, H1) == ["ssh", "docker", "route", "infiniband"]


# ---------------------------------------------------------------- InfiniBand inside the container, model caches

# what the probe container printed on a host with IB (IN_CONTAINER_IB + SHM_AND_MEMLOCK), and on one whose image
# lacks rdma-core; the `ldconfig -p` lines are Ubuntu's
IB_OK = """ibdev=rdma_cm uverbs0 uverbs1
ibverbs=2
ibprovider=1
shm=Filesystem     1024-blocks  Used Available Capacity Mounted on
shm=tmpfs             67108864     0  67108864       0%25 /dev/shm
memlock=unlimited
"""
IB_NO_VERBS = IB_OK.replace("ibverbs=2", "ibverbs=0").replace("ibprovider=1", "ibprovider=0")


def test_parse_container_facts_reads_ib_shm_and_memlock():
    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts

    f = parse_container_facts(IB_OK)
    assert f.ib_devices == ["rdma_cm", "uverbs0", "uverbs1"] and f.ibverbs and f.ib_provider
    assert f.shm_kb == 67108864 and f.memlock == "unlimited"
    plain = parse_container_facts("shm=Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                                  "shm=tmpfs 65536 0 65536 0%25 /dev/shm\nmemlock=8192\n")
    assert plain.ib_devices is None and plain.shm_kb == 65536 and plain.memlock == "8192"


def test_in_container_probe_finds_libibverbs_in_ldconfig_output():
    import subprocess

    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts
    from dockerlaunch.backends.docker.doctor.observe import container_probe

    # the probe's own program (hubs not asked, IB looked at), with `ldconfig -p` answering as on an image with
    # rdma-core, then as on one without
    fake = ("ls() { :; }; ldconfig() { printf '"
            "\\tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1\\n"
            "\\tlibmlx5.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libmlx5.so.1\\n'; }; ")
    sh, c, program, *args = container_probe(hubs=False, ib=True)
    out = subprocess.run([sh, c, fake + program, *args], capture_output=True, text=True, check=True).stdout
    f = parse_container_facts(out)
    assert f.ibverbs and f.ib_provider and f.ib_devices == [] and f.shm_kb, out
    bare = subprocess.run([sh, c, "ls() { :; }; ldconfig() { :; }; " + program, *args],
                          capture_output=True, text=True, check=True).stdout
    assert parse_container_facts(bare).ibverbs is False, bare


@pytest.mark.parametrize("out,dev,verbs", [
    (IB_OK, (PASS, "uverbs0"), (PASS, "libibverbs and a verbs provider")),
    (IB_NO_VERBS, (PASS, "uverbs0"), (FAIL, "no libibverbs", "rdma-core")),
    (IB_OK.replace("ibprovider=1", "ibprovider=0"), (PASS, "uverbs0"), (WARN, "no verbs provider")),
    (IB_OK.replace("ibdev=rdma_cm uverbs0 uverbs1", "ibdev="), (FAIL, "sees no /dev/infiniband"),
     (PASS, "libibverbs")),
])
def test_infiniband_inside_the_job_container(out, dev, verbs):
    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts

    ib = probe(ib=True, active=["mlx5_0:1"])
    report = run(cfg(infiniband="on"), host(0, probe=ib), host(1, probe=ib, shm=parse_container_facts(out)))
    row(report, H1, "ib in container", dev[0], *dev[1:])
    row(report, H1, "image ibverbs", verbs[0], *verbs[1:])


def test_no_ib_rows_where_infiniband_is_not_used():
    report = run(cfg(), host(0), host(1))
    assert report.get(H1, "ib in container") is None and report.get(H1, "image ibverbs") is None


@pytest.mark.parametrize("env,mounts,verdict,words", [
    ({"MODELSCOPE_CACHE": "/root/.cache/modelscope"}, [], WARN, ["inside the container", "shared: true"]),
    ({"HF_HOME": "/ckpt/hf"}, ["/nfs/ckpt:/ckpt"], WARN, ["on /nfs/ckpt, not marked shared"]),
    ({"HF_HOME": "/ckpt/hf"}, [{"source": "/nfs/ckpt", "target": "/ckpt", "shared": True}], PASS,
     ["on shared storage (/nfs/ckpt)"]),
    ({"MODELSCOPE_CACHE": "/ckpt"}, [{"source": "/nfs/ckpt", "target": "/ckpt", "shared": True}], PASS, ["/nfs/ckpt"]),
    # /ckpt2 is not under the /ckpt mount
    ({"HF_HOME": "/ckpt2/hf"}, [{"source": "/nfs/ckpt", "target": "/ckpt", "shared": True}], WARN,
     ["inside the container"]),
])
def test_model_cache_on_a_multi_host_job_belongs_on_shared_storage(env, mounts, verdict, words):
    report = run(cfg(env=env, mounts=mounts), host(0), host(1))
    row(report, H0, "model cache", verdict, *words)


def test_model_cache_is_not_judged_on_one_host_or_when_unset():
    one = run(cfg(hosts=(H0,), env={"MODELSCOPE_CACHE": "/root/.cache"}), host(0))
    assert one.get(H0, "model cache") is None
    assert run(cfg(), host(0), host(1)).get(H0, "model cache") is None


def test_gpu_access_the_host_cannot_give_is_a_fail_with_the_reason():
    """The GPU probe is planned from what the host reported; an impossible request never reaches docker."""
    from dockerlaunch.backends.docker.doctor.observations import host_gpu_access
    from dockerlaunch.errors import ConfigError
    from dockerlaunch.gpu.access import HostGpuAccess

    config = cfg(gpus=["3"], gpu_mode="auto")
    plan = make_plan(config)
    bare = HostGpuAccess(device_nodes=("/dev/nvidiactl", "/dev/nvidia0"), libs=(("libcuda.so.1", "/lib/libcuda.so.1"),))
    with pytest.raises(ConfigError, match=r"asks for GPUs \['3'\] but the host has GPU device nodes: /dev/nvidia0"):
        host_gpu_access(config, plan.hosts[1], Probe("eth0", None, None, False, [], [], 1, access=bare))
    with pytest.raises(ConfigError, match="could not check: the host's GPU facts were not gathered"):
        host_gpu_access(config, plan.hosts[1], None)
    ok = host_gpu_access(cfg(gpus=["0"], gpu_mode="auto"), plan.hosts[1],
                         Probe("eth0", None, None, False, [], [], 1, access=bare))
    assert ok.mode == "devices" and "/dev/nvidia0" in ok.devices


# ---------------------------------------------------------------- hubs (job.offline)

HUBS_DOWN = ("hub.huggingface.co=ConnectionError: Failed to resolve 'huggingface.co' ([Errno -2] Name or service "
             "not known)\nhub.modelscope.cn=no answer in 8 s\n"
             "shm=Filesystem 1024-blocks Used Available Capacity Mounted on\n"
             "shm=tmpfs 67108864 0 67108864 0%25 /dev/shm\n"
             "memlock=unlimited\n")


def test_parse_container_facts_reads_the_hub_lines():
    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts

    f = parse_container_facts(HUBS_DOWN)
    assert f.hubs == {"huggingface.co": "ConnectionError: Failed to resolve 'huggingface.co' ([Errno -2] Name or "
                                        "service not known)", "modelscope.cn": "no answer in 8 s"}
    assert f.shm_kb == 67108864 and f.memlock == "unlimited"
    assert parse_container_facts("hub=nopython\n" + HUBS_DOWN.split("\n", 2)[2]).hubs == {}
    assert parse_container_facts(HUBS_DOWN.split("\n", 2)[2]).hubs is None  # not asked (offline)


@pytest.mark.parametrize("hubs,offline,verdict,words", [
    ({"huggingface.co": "ok", "modelscope.cn": "ok"}, False, PASS, ["huggingface.co and modelscope.cn answer"]),
    ({"huggingface.co": "ok", "modelscope.cn": "no answer in 8 s"}, False, WARN,
     ["modelscope.cn unreachable", "(no answer in 8 s)", "job.offline: true (up --offline)"]),
    ({}, False, SKIP, ["the image has no python3"]),
    (None, True, PASS, ["job.offline", "HF_HUB_OFFLINE=1"]),
])
def test_hubs_verdict(hubs, offline, verdict, words):
    shm = ContainerFacts(shm_kb=64 * GB, memlock="unlimited", hubs=hubs)
    report = run(cfg(job={"offline": offline}), host(0, shm=shm), host(1, shm=shm))
    row(report, H1, "hubs", verdict, *words)


def test_no_hubs_row_when_the_probe_container_failed_or_hubs_were_not_asked():
    failed = ContainerFacts(error="no such image")
    report = run(cfg(), host(0), host(1, shm=failed))
    assert report.get(H1, "hubs") is None and report.get(H0, "hubs") is None  # host(0): hubs None


def test_hub_probe_asks_for_real_and_names_the_failure(tmp_path):
    """The probe's own Python against a port where nothing listens (urllib path: no requests here) and against
    a local HTTP server answering 404 (any answer counts)."""
    import http.server
    import subprocess
    import sys
    import threading

    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts
    from dockerlaunch.backends.docker.doctor.observe import HUB_CHECK

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
               "MODELSCOPE_ENDPOINT": "http://127.0.0.1:9"}
        out = subprocess.run([sys.executable, "-S", "-c", HUB_CHECK, "8"], capture_output=True, text=True, env=env,
                             timeout=30).stdout
    finally:
        server.shutdown()
    hubs = parse_container_facts(out + "memlock=1\n").hubs
    assert hubs["huggingface.co"] == "ok", out
    assert "refused" in hubs["modelscope.cn"].lower(), out


# ---------------------------------------------------------------- images without nc, python3, bash or /bin/sh

# what `docker run` says (exit 127) when the image lacks the command, as Docker 20.10 (runc) and crun write it
RUNC_NO_SH = ('docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create '
              'failed: unable to start container process: exec: "sh": executable file not found in $PATH: unknown.')
RUNC_NO_PATH = ('docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc '
                'create failed: unable to start container process: exec: "/bin/sh": stat /bin/sh: no such file or '
                'directory: unknown.')
CRUN_NO_NC = "Error: crun: executable file `nc` not found in $PATH: No such file or directory: OCI runtime attempted"
RLIMIT_7 = ("docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
            "failed: unable to start container process: error during container init: error setting rlimits for ready "
            "process: error setting rlimit type 7: operation not permitted: unknown.")


@pytest.mark.parametrize("status,text,missing", [
    (127, RUNC_NO_SH, "sh"),
    (127, RUNC_NO_PATH, "/bin/sh"),
    (127, CRUN_NO_NC, "nc"),
    (127, "sh: 1: nc: not found", None),  # a shell inside the container: the image has a shell, nc is its business
    (125, RLIMIT_7, None),  # a real refusal, not a missing tool
    (1, RUNC_NO_SH, None),  # only docker's own 127 says "not found"
])
def test_missing_executable_is_told_from_a_real_failure(status, text, missing):
    from dockerlaunch.backends.docker.doctor.observations import missing_executable

    assert missing_executable(status, text) == missing


def test_refused_rlimit_names_the_limit():
    from dockerlaunch.backends.docker.doctor.observations import refused_rlimit

    assert refused_rlimit(RLIMIT_7) == "nofile"
    assert refused_rlimit(RLIMIT_7.replace("type 7", "type 8")) == "memlock"
    assert refused_rlimit(RLIMIT_7.replace("type 7", "type 12")) == "rlimit type 12"
    assert refused_rlimit("invalid shm size") is None


def test_parse_container_facts_reads_the_tools_and_nofile():
    from dockerlaunch.backends.docker.doctor.observations import can_connect, can_listen, parse_container_facts

    out = ("tools=bash timeout\nshm=Filesystem 1024-blocks Used Available Capacity Mounted on\n"
           "shm=shm 65536 0 65536 0%25 /dev/shm\nnofile=1048576\nmemlock=8192\n")
    f = parse_container_facts(out)
    assert f.tools == ["bash", "timeout"] and f.nofile == "1048576" and f.memlock == "8192" and f.shm_kb == 65536
    assert can_connect(f.tools) and not can_listen(f.tools)  # bash's /dev/tcp connects, it cannot listen
    bare = parse_container_facts(out.replace("tools=bash timeout", "tools="))
    assert bare.tools == [] and not can_connect(bare.tools) and not can_listen(bare.tools)
    assert can_connect(["nc"]) and can_listen(["python3"]) and not can_connect(None) and not can_connect(["bash"])
    old = parse_container_facts("shm 65536 0 65536 0% /dev/shm\nmemlock=8192\n")  # an older probe's output
    assert old.tools is None and old.nofile is None


def test_container_probe_needs_only_a_shell_and_lists_the_tools(tmp_path):
    """The probe's own program in a shell whose PATH holds only what a bare image has (no nc, python3, bash)."""
    import shutil
    import subprocess

    from dockerlaunch.backends.docker.doctor.observations import parse_container_facts
    from dockerlaunch.backends.docker.doctor.observe import container_probe

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("df", "ls", "tr", "grep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    sh, c, program, *args = container_probe(hubs=True, ib=False)
    r = subprocess.run(["/bin/sh", c, program, *args], capture_output=True, text=True, timeout=30,
                       env={"PATH": str(bin_dir)})
    f = parse_container_facts(r.stdout)
    assert f.tools == [] and f.hubs == {} and f.shm_kb and f.nofile and f.memlock, r.stdout + r.stderr


@pytest.mark.parametrize("text,want", [
    ("reach=29500 ok nc\nreach=45678 ok nc\n", {"29500": ("ok", "nc", ""), "45678": ("ok", "nc", "")}),
    ("reach=29500 fail python3 [Errno 111] Connection refused\n",
     {"29500": ("fail", "python3", "[Errno 111] Connection refused")}),
    ("reach=29500 error nc nc: invalid option -- 'z'\n", {"29500": ("error", "nc", "nc: invalid option -- 'z'")}),
    ("reach=none\n", {}),
    ("docker: Error response from daemon: ...\n", None),
])
def test_parse_reach(text, want):
    from dockerlaunch.backends.docker.doctor.observations import parse_reach

    assert parse_reach(text) == want


NO_SH = ContainerFacts(missing="sh")


@pytest.mark.parametrize("shm,verdict,words", [
    (NO_SH, WARN, ["the image has no /bin/sh: shm/memlock/nofile not checked inside it",
                   "docker applied its ulimits", "add a shell to the image"]),
    (ContainerFacts(missing="sh", host_shm_kb=64 * GB), WARN,
     ["the image has no /bin/sh: shm/memlock/nofile not checked inside it",
      "/dev/shm is the host's (ipc: host): 64 GB"]),
    (ContainerFacts(missing="sh", host_shm_kb=65536), FAIL, ["/dev/shm is 64 MB on the host"]),
])
def test_an_image_without_a_shell_is_a_warning_naming_the_fix(shm, verdict, words):
    report = run(cfg(), host(0), host(1, shm=shm))
    row(report, H1, "shm", verdict, *words)
    assert report.get(H1, "memlock") is None and report.get(H1, "nofile") is None  # said once, in the shm row


def test_an_image_without_a_shell_where_infiniband_is_used():
    ib = probe(ib=True, active=["mlx5_0:1"])
    report = run(cfg(infiniband="on"), host(0, probe=ib), host(1, probe=ib, shm=NO_SH))
    row(report, H1, "ib in container", WARN, "the image has no /bin/sh: /dev/infiniband and libibverbs not checked")
    assert report.get(H1, "memlock") is None and report.get(H1, "image ibverbs") is None
    assert not [c for c in report.checks if c.host == H1 and c.verdict == FAIL]


def test_hubs_row_of_an_image_without_a_shell():
    report = run(cfg(job={"offline": False}), host(0), host(1, shm=NO_SH))
    row(report, H1, "hubs", SKIP, "the image has no /bin/sh: the hubs were not asked")


NOTE = "checked from the host: the image has no nc or python3"


@pytest.mark.parametrize("h1,kw,verdict,words", [
    ({"reach": [], "reach_note": NOTE}, {}, PASS, [f"reaches {MASTER}:29500 and :{HIGH_PORT}", f"({NOTE})"]),
    ({"reach": [f"{MASTER}:29500 (nc: nc: connect to {MASTER} port 29500 (tcp) failed: Connection refused)"],
      "reach_note": NOTE}, {}, FAIL, ["cannot reach", "Connection refused", "(firewall?)", NOTE]),
    ({"reach": None, "reach_missing": "not checked: the image has no nc or python3 and the host has no nc, python3 "
      "or bash with timeout either: add netcat-openbsd to the image"}, {}, WARN,
     ["not checked: the image has no nc or python3", "add netcat-openbsd"]),
    ({"reach": None, "reach_missing": "not checked: nc failed (nc: invalid option -- 'z')"}, {}, WARN,
     ["nc failed", "invalid option"]),
    ({"reach": None}, {"reach_missing": "no listener on host 0: the image has no /bin/sh and the host has no "
                                        "python3 or nc to listen with"}, WARN, ["no listener on host 0"]),
    ({"reach": None}, {"reach_missing": "not checked: the listener (nc on host 0's host) did not bind ports 29500 and "
                                        "45678 within 15 s"}, WARN, ["did not bind"]),
])
def test_reachability_never_blames_the_network_for_a_missing_tool(h1, kw, verdict, words):
    report = run(cfg(), host(0), host(1, **h1))
    if "reach_missing" in kw:
        report = judge(cfg(), make_plan(cfg()), [resolve_target(h, cfg().ssh, None, "root") for h in cfg().hosts],
                       Observations(MASTER, [host(0), host(1, **h1)], reach_ports=(29500, HIGH_PORT), **kw))
    c = row(report, H1, "reachability", verdict, *words)
    assert ("firewall" in c.detail) == (verdict == FAIL), c


# ---------------------------------------------------------------- nofile


@pytest.mark.parametrize("ulimits,seen,verdict,words", [
    ({}, "1048576", PASS, ["ulimit -n in the container: 1048576"]),
    ({}, "unlimited", PASS, ["unlimited"]),
    ({}, "1024", FAIL, ["ulimit -n in the container: 1024, below the 1048576 the job asks for",
                        "--ulimit nofile=1048576:1048576", "Too many open files"]),
    ({"nofile": "20000"}, "20000", PASS, ["20000"]),  # the user's own (lower) value is what the plan asks
    ({"nofile": "65536"}, "20000", FAIL, ["below the 65536 the job asks for"]),
    ({}, None, WARN, ["could not read ulimit -n"]),
])
def test_nofile_is_judged_against_what_the_plan_asks(ulimits, seen, verdict, words):
    shm = ContainerFacts(shm_kb=64 * GB, memlock="8192", nofile=seen)
    report = run(cfg(ulimits=ulimits), host(0), host(1, shm=shm))
    c = row(report, H1, "nofile", verdict, *words)
    assert "firewall" not in c.detail


def test_an_engine_that_refuses_the_open_files_limit_is_named_with_the_fix():
    """Rootless Docker and Docker in a container (the sim's nodes) cannot raise their own hard limit: runc fails the
    start with 'error setting rlimit type 7', which says nothing to a user."""
    report = run(cfg(), host(0), host(1, shm=ContainerFacts(error=RLIMIT_7.removeprefix("docker: "))))
    row(report, H1, "shm", FAIL, "did not start", "rlimit type 7")
    row(report, H1, "nofile", FAIL, "the engine refused --ulimit nofile=1048576:1048576",
        "rootless Docker, Docker inside a container", "set container.ulimits.nofile",
        "`ulimit -Hn` where dockerd runs")
    assert report.get(H1, "memlock") is None  # not an InfiniBand job


def test_an_engine_that_refuses_memlock_where_infiniband_is_used():
    ib = probe(ib=True, active=["mlx5_0:1"])
    refused = ContainerFacts(error=RLIMIT_7.replace("type 7", "type 8"))
    report = run(cfg(infiniband="on"), host(0, probe=ib), host(1, probe=ib, shm=refused))
    row(report, H1, "memlock", FAIL, "the engine refused the memlock ulimit InfiniBand needs", "LimitMEMLOCK")
    assert report.get(H1, "nofile") is None


def test_probe_container_gets_the_jobs_open_files_limit():
    plan = make_plan(cfg(ulimits={"nofile": "20000"}))
    spec = _check_spec(plan.hosts[1], IMAGE, ["sh", "-c", "ulimit -n"], "dlprobe-shm-x")
    assert "nofile=20000:20000" in run_argv(spec)
    default = _check_spec(make_plan(cfg()).hosts[0], IMAGE, ["true"], "dlprobe-shm-y")
    assert "nofile=1048576:1048576" in run_argv(default)


# ---------------------------------------------------------------- SELinux (container.selinux, issue 58 item 5)

LABELLING = {"selinux": True, "selinux_mode": "enforcing"}


def test_selinux_row_only_where_the_engine_labels_containers():
    report = run(cfg(), host(0), host(1, probe=probe(source=H1, **LABELLING)))
    assert report.get(H0, "selinux") is None  # nothing labels there: no row
    row(report, H1, "selinux", PASS, "the engine labels containers (SELinux enforcing)", "label=disable",
        "container.selinux auto", "SELinux does not confine them")


@pytest.mark.parametrize("container, verdict, words", [
    ({"selinux": "disable"}, PASS, ("label=disable", "container.selinux disable")),
    ({"selinux": "keep"}, PASS, ("Docker turns the labels off itself for --ipc host",)),  # the default ipc
    ({"selinux": "keep", "shm_size": "16g"}, WARN, ("container.selinux keep", "/data", "chcon -R -t container_file_t",
                                                     "Permission denied", "container.selinux auto")),
    ({"selinux": "keep", "privileged": True}, PASS, ("--privileged",)),
])
def test_keep_warns_where_the_jobs_own_container_is_labelled_and_mounts_host_folders(container, verdict, words):
    config = cfg(mounts=["/data:/data"], **container)
    report = run(config, host(0, probe=probe(source=H0, **LABELLING)), host(1))
    row(report, H0, "selinux", verdict, *words)


def test_keep_on_a_permissive_host_says_denials_are_only_logged():
    config = cfg(mounts=["/data:/data"], selinux="keep", shm_size="16g")
    report = run(config, host(0, probe=probe(source=H0, selinux=True, selinux_mode="permissive")), host(1))
    row(report, H0, "selinux", WARN, "SELinux permissive", "only logged")


def test_an_engine_that_did_not_say_is_an_error_under_auto_only():
    unknown = probe(source=H1, selinux=None, selinux_mode="enforcing")
    report = run(cfg(), host(0), host(1, probe=unknown))
    row(report, H1, "selinux", ERROR, "could not tell whether the engine labels containers", "container.selinux")
    assert report.failed  # an ERROR stops `up` as a FAIL does
    assert run(cfg(selinux="keep"), host(0), host(1, probe=unknown)).get(H1, "selinux") is None


@pytest.mark.parametrize("mode, engine_labels, expected", [
    ("auto", True, True), ("auto", False, False), ("auto", None, False), ("disable", False, True),
    ("keep", True, False)])
def test_doctors_containers_get_the_labels_the_jobs_get(mode, engine_labels, expected):
    from dockerlaunch.backends.docker.doctor.observations import host_label_disable
    from dockerlaunch.backends.docker.doctor.observe import CheckContainers, _observe_containers

    config = cfg(selinux=mode)
    said = probe(selinux=engine_labels)
    assert host_label_disable(config, said) is expected
    argvs = []

    class Remote:
        def run(self, argv, timeout=None):
            argvs.append(argv)
            return type("R", (), {"ok": True, "stdout": "shm=\n", "stderr": "", "exit_status": 0})()

    h = type("H", (), {"remote": Remote(), "rank": 0})()
    obs = HostObservation(0, H0, probe=said)
    _observe_containers(h, make_plan(config).hosts[0], obs, config, IMAGE, CheckContainers())
    [shm] = argvs
    assert any(shm[i:i + 2] == ["--security-opt", "label=disable"] for i in range(len(shm))) is expected


def test_the_real_observe_script_with_a_stand_in_engine_of_each_saved_docker_info(tmp_path):
    """observe.sh + probe.sh as doctor runs them, against a stand-in `docker` answering with each saved real `docker
    info` (both forms) on a host whose kernel runs SELinux (enforcing): the row doctor prints from it."""
    import subprocess

    from dockerlaunch.backends.docker.doctor.observe import observe_argv
    from tests import docker_standin

    config = cfg(mounts=["/data:/data"])
    for i, saved in enumerate(docker_standin.SAVED):
        folder = tmp_path / str(i)
        docker_standin.install(folder / "bin", docker_standin.security_options(saved))
        table = docker_standin.mounts(folder, "1")
        r = subprocess.run(observe_argv(H0, IMAGE, config), capture_output=True, text=True, timeout=60,
                           env={"PATH": f"{folder / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
                                "DL_PROBE_MOUNTS": str(table)})
        assert r.returncode == 0, r.stderr
        o = parse_observation(HostObservation(0, H0, ssh="root@10.0.0.1:22"), r.stdout)
        assert o.docker == "28.5.2" and o.image_id == docker_standin.IMAGE_ID and o.probe_error is None, saved
        o.shm, o.listening = ContainerFacts(shm_kb=64 * GB, memlock="unlimited", nofile="1048576"), {22}
        report = run(config, o, host(1))
        if "-no-selinux" in saved:
            assert report.get(H0, "selinux") is None, saved
        else:
            row(report, H0, "selinux", PASS, "the engine labels containers (SELinux enforcing)", "label=disable")
        # doctor asks the engine one `docker info` for everything it reads of it (and the docker root's path)
        info = [c for c in docker_standin.asked(folder / "bin") if c.startswith("info")]
        assert info == ["info --format {{.DockerRootDir}}", "info --format {{json .}}"], info
