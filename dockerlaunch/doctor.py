"""Pre-flight checks: every failure users lose days to, caught before a container starts.

Each check is a small function returning `Check`s with a one-line reason; hosts are checked
concurrently; parsing of what hosts print lives in pure helpers tested on fixture text.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from dockerlaunch import facts as factslib
from dockerlaunch.config import ClusterConfig
from dockerlaunch.dockerhost import DockerHost
from dockerlaunch.plan import ClusterPlan, HostPlan, make_plan
from dockerlaunch.spec import ContainerSpec, Deferred
from dockerlaunch.ssh import Remote, connect_each, load_ssh_config, map_hosts

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}
SHM_DEFAULT_KB = 65536
MIN_FREE_GB = 20
SKEW_WARN_S, SKEW_FAIL_S = 1.0, 10.0
CHECK_ORDER = ["ssh", "docker", "image", "route", "master port", "reachability", "shm", "memlock", "gpus",
               "infiniband", "mounts", "shared", "disk", "clock"]


@dataclass
class Check:
    host: str
    name: str
    status: str
    reason: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def add(self, host: str, name: str, status: str, reason: str) -> None:
        self.checks.append(Check(host, name, status, reason))


# ---------------------------------------------------------------- pure parsing


def local_ports(proc_net_tcp: str, state: str) -> set[int]:
    """Local ports of the sockets in `state` (0A listen, 01 established) from /proc/net/tcp and tcp6 text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3] == state and ":" in parts[1]:
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def listening_ports(proc_net_tcp: str) -> set[int]:
    return local_ports(proc_net_tcp, "0A")


def parse_df_kb(text: str) -> tuple[int, int] | None:
    """`df -Pk PATH` -> (size KiB, available KiB)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    parts = lines[-1].split()
    try:
        return int(parts[1]), int(parts[3])
    except (IndexError, ValueError):
        return None


def count_gpus(nvidia_smi_l: str) -> int:
    return sum(1 for line in nvidia_smi_l.splitlines() if line.startswith("GPU "))


# ---------------------------------------------------------------- checks


def _probe_spec(hp: HostPlan, image: str, command: list[str], name: str, *, gpus: bool = False,
                ib: bool = False) -> ContainerSpec:
    """A short-lived container with the job's runtime flags that matter for the check."""
    c = hp.container
    return ContainerSpec(
        name=name, image=image, command=command, network="host", ipc=c.ipc, shm_size=c.shm_size,
        gpus=c.gpus if gpus else None,
        devices=[d for d in c.devices if gpus and d.startswith("nvidia.com/") or ib and d == "/dev/infiniband"],
        ulimits={k: v for k, v in c.ulimits.items() if ib or k != "memlock"},
        cap_add=[x for x in c.cap_add if ib or x != "IPC_LOCK"],
        detach=False, remove=True, init=False, labels={"dockerlaunch.probe": "1"},
    )


def _check_docker(report: Report, hp: HostPlan, host: DockerHost) -> bool:
    r = host.docker("version", "--format", "{{.Server.Version}}", timeout=30)
    if r.ok:
        report.add(hp.address, "docker", PASS, f"engine {r.stdout.strip()}")
        return True
    why = r.last_line()
    hint = " (add the user to the docker group)" if "permission denied" in why.lower() else ""
    report.add(hp.address, "docker", FAIL, f"docker not usable by {hp.ssh.user}: {why}{hint}")
    return False


def _check_image(report: Report, plan: ClusterPlan, hosts: dict[int, DockerHost]) -> dict[int, bool]:
    ids = dict(zip(hosts, map_hosts(lambda i: hosts[i].image_id(plan.image), list(hosts))))
    present = {i: isinstance(v, str) and bool(v) for i, v in ids.items()}
    reference = next((v for i, v in sorted(ids.items()) if present[i]), None)
    all_hosts = ",".join(h.address for h in plan.hosts)
    for i, v in ids.items():
        addr = plan.hosts[i].address
        if not present[i]:
            report.add(addr, "image", FAIL, f"{plan.image} is missing; copy it: dockerlaunch push {plan.image} --hosts {all_hosts}")
        elif v != reference:
            report.add(addr, "image", FAIL, f"{plan.image} is {v[7:19]} here but {reference[7:19]} on another host; "
                       f"dockerlaunch push {plan.image} --hosts {all_hosts}")
        else:
            report.add(addr, "image", PASS, v[7:19])
    return present


def _check_route(report: Report, hp: HostPlan, probe: factslib.Probe, master: str, user_env: dict) -> None:
    if probe.problem:
        if "NCCL_SOCKET_IFNAME" in user_env:
            report.add(hp.address, "route", WARN, f"toward {master}: {probe.problem}; using your NCCL_SOCKET_IFNAME")
        else:
            report.add(hp.address, "route", FAIL, f"toward {master}: {probe.problem}")
    else:
        report.add(hp.address, "route", PASS, f"{master} via {probe.interface} (NCCL/GLOO_SOCKET_IFNAME)")


def _check_ib(report: Report, hp: HostPlan, probe: factslib.Probe, mode: str) -> None:
    if not probe.ib_device:
        if mode == "on":
            report.add(hp.address, "infiniband", FAIL, "infiniband: on but the host has no /dev/infiniband")
        else:
            report.add(hp.address, "infiniband", SKIP, "no /dev/infiniband on the host")
        return
    if mode == "off":
        report.add(hp.address, "infiniband", WARN, "the host has InfiniBand but infiniband: off: NCCL will use TCP")
    elif not probe.ib_active:
        report.add(hp.address, "infiniband", FAIL, f"no ACTIVE IB port ({', '.join(probe.ib_seen) or 'none listed'})")
    else:
        report.add(hp.address, "infiniband", PASS, f"NCCL_IB_HCA={','.join(probe.ib_active)}")


def _check_gpus(report: Report, hp: HostPlan, host: DockerHost, image: str) -> None:
    if hp.container.gpus is None and not any(d.startswith("nvidia.com/") for d in hp.container.devices):
        report.add(hp.address, "gpus", SKIP, "the job asks for no GPUs")
        return
    spec = _probe_spec(hp, image, ["nvidia-smi", "-L"], f"dlprobe-gpu-{secrets.token_hex(3)}", gpus=True)
    r = host.remote.run(spec.run_argv(), timeout=120)
    if not r.ok:
        report.add(hp.address, "gpus", FAIL, f"GPU container failed: {r.last_line()} (nvidia-container-toolkit / CDI?)")
        return
    n = count_gpus(r.stdout)
    want = hp.nproc_per_node
    if isinstance(want, int) and n < want:
        report.add(hp.address, "gpus", FAIL, f"{n} GPU(s) visible in the container, nproc_per_node is {want}")
    else:
        report.add(hp.address, "gpus", PASS, f"{n} GPU(s) visible in the container")


def _check_shm_memlock(report: Report, hp: HostPlan, host: DockerHost, image: str, ib: bool) -> None:
    script = "df -Pk /dev/shm; echo memlock=$(ulimit -l)"
    spec = _probe_spec(hp, image, ["sh", "-c", script], f"dlprobe-shm-{secrets.token_hex(3)}", ib=ib)
    r = host.remote.run(spec.run_argv(), timeout=120)
    if not r.ok:
        report.add(hp.address, "shm", FAIL, f"a container with the job's flags did not start: {r.last_line()}")
        return
    df = parse_df_kb(r.stdout.split("memlock=")[0])
    if df is None:
        report.add(hp.address, "shm", WARN, "could not read /dev/shm size")
    elif df[0] <= SHM_DEFAULT_KB:
        report.add(hp.address, "shm", FAIL, f"/dev/shm is {df[0] // 1024} MB in the container: use ipc: host or shm_size")
    else:
        report.add(hp.address, "shm", PASS, f"/dev/shm {df[0] // 1024 // 1024} GB")
    if ib:
        memlock = r.stdout.split("memlock=")[-1].strip()
        status = PASS if memlock == "unlimited" else FAIL
        report.add(hp.address, "memlock", status, f"ulimit -l in the container: {memlock}")


def _check_disk(report: Report, hp: HostPlan, host: DockerHost) -> None:
    r = host.remote.run('df -Pk "$(docker info --format "{{.DockerRootDir}}")"', timeout=30)
    df = parse_df_kb(r.stdout) if r.ok else None
    if df is None:
        report.add(hp.address, "disk", WARN, f"could not read free space under the docker root: {r.last_line()}")
        return
    free_gb = df[1] / 1024 / 1024
    status = PASS if free_gb >= MIN_FREE_GB else WARN
    report.add(hp.address, "disk", status, f"{free_gb:.0f} GB free under the docker root")


def _check_mounts(report: Report, config: ClusterConfig, hp: HostPlan, remote: Remote) -> None:
    mounts = config.container.mounts
    if not mounts:
        return
    missing = [m.source for m in mounts if not remote.run(["test", "-e", m.source], timeout=30).ok]
    if missing:
        report.add(hp.address, "mounts", FAIL, f"missing on the host: {', '.join(missing)}")
    else:
        report.add(hp.address, "mounts", PASS, f"{len(mounts)} host path(s) exist")


def _check_shared(report: Report, config: ClusterConfig, plan: ClusterPlan, remotes: dict[int, Remote]) -> None:
    shared = [m for m in config.container.mounts if m.shared]
    if not shared or 0 not in remotes:
        return
    for m in shared:
        token = secrets.token_hex(8)
        path = f"{m.source.rstrip('/')}/.dockerlaunch-shared-{token}"
        w = remotes[0].run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", token, path], timeout=30)
        if not w.ok:
            report.add(plan.hosts[0].address, "shared", FAIL, f"cannot write to {m.source}: {w.last_line()}")
            continue
        try:
            reads = map_hosts(lambda i, path=path: remotes[i].run(["cat", path], timeout=30), [i for i in remotes if i != 0])
            for i, r in zip([i for i in remotes if i != 0], reads):
                ok = not isinstance(r, BaseException) and r.ok and r.stdout == token
                report.add(plan.hosts[i].address, "shared", PASS if ok else FAIL,
                           f"{m.source} is shared with host 0" if ok else
                           f"{m.source} is not the same storage as on host 0 (marked shared: true)")
        finally:
            remotes[0].run(["rm", "-f", path], timeout=30)


def _check_port_free(report: Report, plan: ClusterPlan, remote: Remote) -> bool:
    r = remote.run(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"], timeout=30)
    ports = listening_ports(r.stdout)
    if plan.master_port in ports:
        report.add(plan.hosts[0].address, "master port", FAIL,
                   f"port {plan.master_port} is already in use on host 0: pick another with --master-port")
        return False
    report.add(plan.hosts[0].address, "master port", PASS, f"{plan.master_port} is free")
    return True


def _check_reachability(report: Report, plan: ClusterPlan, hosts: dict[int, DockerHost], master: str,
                        have_image: dict[int, bool]) -> None:
    """Listeners in a --network host container on host 0 (master port + a random high port); nc from the others."""
    others = [i for i in hosts if i != 0]
    if not others:
        return
    if 0 not in hosts or not have_image.get(0):
        for i in others:
            report.add(plan.hosts[i].address, "reachability", SKIP, "host 0 is not usable")
        return
    high = 40000 + secrets.randbelow(20000)
    ports = [plan.master_port, high]
    name = f"dlprobe-listen-{secrets.token_hex(4)}"
    script = " & ".join(f"nc -lk {p} >/dev/null" for p in ports) + " & wait"
    listener = ContainerSpec(name=name, image=plan.image, command=["sh", "-c", script], network="host",
                             init=True, remove=True, labels={"dockerlaunch.probe": "1"})
    started = hosts[0].remote.run(listener.run_argv(), timeout=60)
    if not started.ok:
        for i in others:
            report.add(plan.hosts[i].address, "reachability", FAIL, f"cannot start a listener on host 0: {started.last_line()}")
        return
    try:
        time.sleep(0.5)

        def probe(i: int) -> list[str]:
            if not have_image.get(i):
                return ["image missing"]
            bad = []
            for p in ports:
                spec = ContainerSpec(name=f"dlprobe-nc-{secrets.token_hex(4)}", image=plan.image, network="host",
                                     command=["nc", "-vz", "-w3", master, str(p)], detach=False, remove=True,
                                     init=False, labels={"dockerlaunch.probe": "1"})
                r = None
                for _ in range(3):
                    r = hosts[i].remote.run(spec.run_argv(), timeout=60)
                    if r.ok:
                        break
                    time.sleep(0.5)
                if not r.ok:
                    bad.append(f"{master}:{p} {r.last_line()}")
            return bad

        results = map_hosts(probe, others)
        for i, bad in zip(others, results):
            addr = plan.hosts[i].address
            if isinstance(bad, BaseException):
                report.add(addr, "reachability", FAIL, str(bad))
            elif bad == ["image missing"]:
                report.add(addr, "reachability", SKIP, "image missing here")
            elif bad:
                report.add(addr, "reachability", FAIL, "cannot reach " + "; ".join(bad) + " (firewall?)")
            else:
                report.add(addr, "reachability", PASS, f"reaches {master}:{ports[0]} and :{ports[1]}")
    finally:
        hosts[0].remote.run(["docker", "rm", "-f", name], timeout=60)


def _check_clock(report: Report, plan: ClusterPlan, remotes: dict[int, Remote]) -> None:
    def sample(i: int) -> float:
        t0 = time.time()
        r = remotes[i].run(["date", "+%s.%N"], timeout=30)
        t1 = time.time()
        return float(r.stdout.strip()) - (t0 + t1) / 2

    offsets = dict(zip(remotes, map_hosts(sample, list(remotes))))
    good = {i: v for i, v in offsets.items() if isinstance(v, float)}
    if len(good) < 2:
        return
    ref = good.get(0, next(iter(good.values())))
    for i, v in good.items():
        skew = abs(v - ref)
        status = PASS if skew < SKEW_WARN_S else WARN if skew < SKEW_FAIL_S else FAIL
        report.add(plan.hosts[i].address, "clock", status, f"{skew:.2f}s from host 0")


# ---------------------------------------------------------------- orchestration


def check(config: ClusterConfig, remotes: list[Remote | BaseException], plan: ClusterPlan | None = None) -> Report:
    """Run every check; `remotes[i]` is host i's connection or why it could not be made."""
    plan = plan or make_plan(config, ssh_config=load_ssh_config(config.ssh.config_file))
    report = Report()
    live: dict[int, Remote] = {}
    for hp, r in zip(plan.hosts, remotes):
        if isinstance(r, BaseException):
            report.add(hp.address, "ssh", FAIL, str(r).removeprefix(f"host {hp.address}: "))
        else:
            report.add(hp.address, "ssh", PASS, hp.ssh.describe())
            live[hp.rank] = r
    hosts = {i: DockerHost(r) for i, r in live.items()}
    docker_ok = dict(zip(hosts, map_hosts(lambda i: _check_docker(report, plan.hosts[i], hosts[i]), list(hosts))))
    hosts = {i: h for i, h in hosts.items() if docker_ok.get(i) is True}
    master = plan.master_addr
    if isinstance(master, Deferred) and 0 in live:
        master = live[0].peer_ip or master

    have_image = _check_image(report, plan, hosts) if hosts else {}
    probes = dict(zip(live, map_hosts(lambda i: factslib.probe(live[i], master), list(live))))
    for i, p in probes.items():
        hp = plan.hosts[i]
        if isinstance(p, BaseException):
            report.add(hp.address, "route", FAIL, str(p))
            continue
        _check_route(report, hp, p, master, config.container.env)
        _check_ib(report, hp, p, config.container.infiniband)

    def per_host(i: int) -> None:
        hp = plan.hosts[i]
        _check_disk(report, hp, hosts[i])
        _check_mounts(report, config, hp, hosts[i].remote)
        if have_image.get(i):
            p = probes.get(i)
            ib = config.container.infiniband == "on" or (
                config.container.infiniband == "auto" and isinstance(p, factslib.Probe) and p.ib_device)
            _check_shm_memlock(report, hp, hosts[i], plan.image, ib)
            _check_gpus(report, hp, hosts[i], plan.image)

    map_hosts(per_host, list(hosts))
    _check_shared(report, config, plan, live)
    port_free = 0 in live and _check_port_free(report, plan, live[0])
    if port_free:
        _check_reachability(report, plan, hosts, master, have_image)
    _check_clock(report, plan, live)
    order = {hp.address: hp.rank for hp in plan.hosts}
    report.checks.sort(key=lambda c: (order.get(c.host, 99), CHECK_ORDER.index(c.name)))
    return report


def run_checks(session) -> Report:
    """For `up`: the session's hosts are connected already."""
    return check(session.config, list(session.remotes), session.plan)


def doctor(config: ClusterConfig) -> Report:
    plan = make_plan(config, ssh_config=load_ssh_config(config.ssh.config_file))
    remotes = connect_each([hp.ssh for hp in plan.hosts])
    try:
        return check(config, remotes, plan)
    finally:
        for r in remotes:
            if isinstance(r, Remote):
                r.close()


def print_report(report: Report, console) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table("host", "check", "verdict", "reason", box=None, pad_edge=False)
    for c in report.checks:
        table.add_row(c.host, c.name, Text(c.status, style=STYLE[c.status]), Text(c.reason))
    console.print(table)
    n = {s: sum(1 for c in report.checks if c.status == s) for s in (PASS, WARN, FAIL, SKIP)}
    console.print(f"doctor: {n[PASS]} PASS, {n[FAIL]} FAIL, {n[WARN]} WARN, {n[SKIP]} SKIP", highlight=False)
