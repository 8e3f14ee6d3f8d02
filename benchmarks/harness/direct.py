"""The sim's engines asked straight, without the launcher: the scale benchmarks' floors (N containers started or
removed with the docker CLI on the engines) and their ground truth (which containers of a job exist, when each
started, what the engines logged). A light sim cluster (`sim.create(light=True)`: every host a container with only
sshd -- its own IP, its own host key, OpenSSH's default limits -- whose `docker` talks to one of E shared
Docker-in-Docker engines) or a regular one (every node its own engine)."""

from __future__ import annotations

import concurrent.futures as cf
import ipaddress
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from dockerlaunch import sim
from harness import log, tail

JOB_LABEL = "dockerlaunch.job"


def docker_time(stamp: str) -> float | None:
    """'2026-11-23T17:24:52.682460183Z' -> epoch seconds (None for docker's zero time)."""
    if not stamp or stamp.startswith("0001-"):
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", stamp.strip())
    if not m:
        return None
    whole = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return whole + (float("0." + m[2]) if m[2] else 0.0)




@dataclass
class Engine:
    container: str  # a container on this machine whose `docker` is the engine
    ip: str
    ranks: list[int]


@dataclass
class Cluster:
    name: str
    config: Path
    hosts: list[str]  # addresses, rank order
    engines: list[Engine]
    light: bool
    owned: bool  # started by this script: taken down at the end unless --keep
    image: str = ""

    @property
    def n(self) -> int:
        return len(self.hosts)

    def engine_of(self, rank: int) -> Engine:
        for e in self.engines:
            if rank in e.ranks:
                return e
        raise KeyError(rank)

    def node(self, rank: int) -> str:
        return f"{self.name}-node{rank + 1}"


def on_engine(engine: Engine, argv: list[str], timeout: float = 120, stdin: bytes | None = None
              ) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", *(["-i"] if stdin is not None else []), engine.container, *argv],
                          input=stdin, capture_output=True, timeout=timeout)


def each_engine(cluster: Cluster, fn) -> list:
    with cf.ThreadPoolExecutor(max_workers=max(1, len(cluster.engines))) as pool:
        return list(pool.map(fn, cluster.engines))


def containers_by_label(cluster: Cluster, label: str) -> list[dict]:
    """Every container with `label` on every engine: engine, name, status, started/finished (epoch)."""
    script = ('ids=$(docker ps -aq --filter "label=$1") && [ -n "$ids" ] || exit 0; '
              "docker inspect --format '{{.Name}} {{.State.Status}} {{.State.StartedAt}} {{.State.FinishedAt}}' "
              "$ids 2>/dev/null; exit 0")

    def one(e: Engine) -> list[dict]:
        r = on_engine(e, ["sh", "-c", script, "sh", label])
        if r.returncode != 0:
            raise RuntimeError(f"{e.container}: docker ps/inspect failed: {tail(r.stderr, 300)}")
        out = []
        for line in r.stdout.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append({"engine": e.container, "name": parts[0].lstrip("/"), "status": parts[1],
                            "started": docker_time(parts[2]), "finished": docker_time(parts[3])})
        return out

    return [c for found in each_engine(cluster, one) for c in found]


def job_containers(cluster: Cluster, job: str) -> list[dict]:
    return containers_by_label(cluster, f"{JOB_LABEL}={job}")


def remove_by_label(cluster: Cluster, label: str) -> int:
    """`docker rm -f` of every container with `label` on every engine (cleanup, not measured)."""
    script = 'ids=$(docker ps -aq --filter "label=$1"); [ -z "$ids" ] || docker rm -f $ids >/dev/null; echo $ids'

    def one(e: Engine) -> int:
        try:
            r = on_engine(e, ["sh", "-c", script, "sh", label], timeout=300)
            return len(r.stdout.split())
        except Exception:  # noqa: BLE001 - best effort
            return 0

    return sum(each_engine(cluster, one))


# Docker closes a stopped container's log copier after 10 s (loggerCloseTimeout in moby's container.Reset /
# resetLogging) whether or not it has read the container's output to the end, and says so in its own log.
ENGINE_TRUNCATED = "logs may be truncated"
ENGINE_LOG = "/var/log/dockerd.log"  # where the sim's entrypoint.sh sends each engine's dockerd output


def engine_log_marks(cluster: Cluster) -> dict[str, int]:
    """Each engine's dockerd log size now, so that engine_log_count reads only what a step added."""
    def one(e: Engine) -> tuple[str, int]:
        r = on_engine(e, ["wc", "-c", ENGINE_LOG])
        if r.returncode != 0:  # a count of 0 from no log would say "nothing truncated"
            raise RuntimeError(f"{e.container}: no dockerd log at {ENGINE_LOG}: {tail(r.stderr, 200)}")
        return e.container, int(r.stdout.split()[0])

    return dict(each_engine(cluster, one))


def engine_log_count(cluster: Cluster, marks: dict[str, int], text: str) -> dict[str, int]:
    """How many lines each engine's dockerd logged with `text` since `marks`."""
    def one(e: Engine) -> tuple[str, int]:
        start = marks.get(e.container, 0) + 1
        r = on_engine(e, ["sh", "-c", f'tail -c +{start} {ENGINE_LOG} | grep -c -F -e "$1"; exit 0', "sh", text])
        return e.container, int((r.stdout.split() or [b"0"])[0])

    return dict(each_engine(cluster, one))


class EngineEvents:
    """`docker events` of a job's containers on every engine, from `since` on (so nothing is missed between
    starting the watchers and the step): (action, container name, epoch seconds)."""

    def __init__(self, cluster: Cluster, job: str, since: float, until: float):
        self.events: list[tuple[str, str, float]] = []
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        fmt = "{{.Action}} {{.Actor.Attributes.name}} {{.TimeNano}}"
        for e in cluster.engines:
            p = subprocess.Popen(
                ["docker", "exec", e.container, "docker", "events", "--since", f"{since:.3f}", "--until",
                 f"{until:.0f}", "--filter", "type=container", "--filter", f"label={JOB_LABEL}={job}",
                 "--format", fmt], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p: subprocess.Popen) -> None:
        for raw in p.stdout:
            parts = raw.decode(errors="replace").split()
            if len(parts) == 3 and parts[2].isdigit():
                with self.lock:
                    self.events.append((parts[0], parts[1], int(parts[2]) / 1e9))

    def times(self, action: str, name: str | None = None) -> list[float]:
        with self.lock:
            return [t for a, n, t in self.events if a == action and (name is None or n == name)]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()  # the `docker events` inside the engine ends by itself at --until
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


# ---------------------------------------------------------------- clusters


def discover(name: str, config: Path, owned: bool) -> Cluster:
    data = yaml.safe_load(config.read_text())
    hosts = [h["address"] if isinstance(h, dict) else str(h) for h in data["hosts"]]
    engines: list[Engine] = []
    light = False
    if hasattr(sim, "light_engines"):
        try:
            found = sim.light_engines(name)
        except Exception:  # noqa: BLE001 - not a light cluster
            found = []
        for ename, ip, indexes in found or []:
            engines.append(Engine(ename, ip, [i - 1 for i in indexes]))  # node{i} is rank i-1
        light = bool(engines)
    if not engines:  # a regular sim: every node is its own engine
        engines = [Engine(f"{name}-node{i}", h, [i - 1]) for i, h in enumerate(hosts, 1)]
    served = sorted(r for e in engines for r in e.ranks)
    if served != list(range(len(hosts))):
        raise SystemExit(f"cluster {name}: the engines serve ranks {served[:10]}..., not 0..{len(hosts) - 1}")
    return Cluster(name, config, hosts, engines, light, owned, image=data.get("image") or "")


def free_subnet(first: int = 32) -> str:
    """The first 172.27.X.0/22 (X >= first) that no network of this dockerd overlaps (a network whose stale
    endpoints dockerd refuses to remove keeps its pool)."""
    ids = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True, text=True).stdout.split()
    taken = []
    if ids:
        out = subprocess.run(["docker", "network", "inspect", "--format",
                              "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids], capture_output=True, text=True)
        for word in out.stdout.split():
            try:
                taken.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
    for x in range(first, 256, 4):
        net = ipaddress.ip_network(f"172.27.{x}.0/22")
        if not any(net.overlaps(t) for t in taken if t.version == 4):
            return str(net)
    raise SystemExit("no free /22 left in 172.27.0.0/16")


def start_cluster(n: int, args, index: int) -> tuple[Cluster, float]:
    name = f"{args.prefix}{n}"
    subnet = free_subnet()
    if not hasattr(sim, "light_engines"):
        raise SystemExit("this checkout has no light sim mode (dockerlaunch.sim.cluster.light_engines): "
                         "pass --config FILE --cluster NAME of a cluster that is up")
    kw = {"light": True, "subnet": subnet}
    if args.engines:
        kw["light_engines"] = args.engines
    log(f"sim up --light --nodes {n} --name {name} --subnet {subnet}")
    t0 = time.monotonic()
    try:
        cfg = sim.create(nodes=n, cluster=name, **kw)
    except BaseException:
        sim.remove(name, quiet=True)
        raise
    took = time.monotonic() - t0
    return discover(name, Path(cfg), owned=True), took
