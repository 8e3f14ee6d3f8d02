"""Scale: the launcher against 8, 64, 256 hosts, each step the real CLI, against floors measured in the same run.

Hosts come from a light sim cluster (`sim.create(light=True)`: every host a container with only sshd -- its own IP,
its own host key, OpenSSH's default limits -- whose `docker` talks to one of E shared Docker-in-Docker engines),
or from a cluster given with --config FILE --cluster NAME (a regular sim: every node its own engine).

For each size N, in one run (every launcher step is `.venv/bin/dockerlaunch ...` as a subprocess, sampled every
50 ms for peak RSS (VmHWM), threads and open fds, children included):
  doctor     `doctor --output json`: wall time; checks that are not PASS, by check name
  floor      no launcher: N containers started concurrently with the docker CLI straight on the engines
             (`docker exec ENGINE docker run -d --network host ...`, one thread per host), then removed the same
             way (`docker rm -f`); measured before the launcher's steps and again after them, the faster of the two
  up         `up --skip-preflight --detach` of a job whose ranks print a line and sleep: until every container runs
             (the latest StartedAt on the engines), and up's own exit; `docker ps` on the engines must show N
  status     `status --output json`: wall; N containers, each once
  down       `down`: wall; no container of the job left on any engine
  fail-fast  `up` of a job whose rank N-1 exits 1 once every rank's first line has reached up's stream: from that
             rank's exit (docker events `die` on its engine) to the last job container's `destroy` on any engine,
             and to up's exit (non-zero expected)
  host loss  `up` with job.host_timeout 10, then `docker pause CLUSTER-nodeN` (freezes that host's sshd): time
             until up prints that the host stopped answering (target: host_timeout + 5 s); unpaused after, `down`
  logs       every rank prints --lines numbered lines; read from up's own stream (up --keep) and from `logs`
             afterwards: lines lost, duplicated, out of order or under the wrong rank, per rank

Targets (judged at every size; the issue sets them at 256 hosts): up <= 1.5 x floor; fail-fast teardown <= 1.5 x
floor and <= 10 s after the rank's exit; the frozen host named within host_timeout + 5 s; launcher peak RSS
< 500 MB; open fds < 1024; no lost line and each rank's lines in order.

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale.py --hosts 8,64,256 [--engines E] [--lines 20000] [--keep] [--json FILE]
  .venv/bin/python benchmarks/scale.py --config FILE --cluster NAME     # a cluster that is already up
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dockerlaunch import sim  # noqa: E402

DL = REPO / ".venv" / "bin" / "dockerlaunch"
LAUNCHER = [str(DL)] if DL.exists() else [sys.executable, "-m", "dockerlaunch"]
JOB_LABEL = "dockerlaunch.job"
FLOOR_LABEL = "bsscale.floor"
HOST_TIMEOUT = 10.0
SAMPLE_EVERY = 0.05

TARGETS = {  # (metric key, description)
    "up_ratio": "up <= 1.5 x floor",
    "failfast_ratio": "fail-fast teardown <= 1.5 x floor",
    "failfast_teardown": "fail-fast teardown <= 10 s after the rank's exit",
    "hostloss": f"frozen host named <= host_timeout + 5 s ({HOST_TIMEOUT + 5:g} s)",
    "rss": "launcher peak RSS < 500 MB",
    "fds": "launcher open fds < 1024",
    "logs": "no lost line, each rank's lines in order",
}


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def tail(text: str | bytes, n: int = 1500) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def docker_time(stamp: str) -> float | None:
    """'2026-11-23T17:24:52.682460183Z' -> epoch seconds (None for docker's zero time)."""
    if not stamp or stamp.startswith("0001-"):
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", stamp.strip())
    if not m:
        return None
    whole = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return whole + (float("0." + m[2]) if m[2] else 0.0)


# ---------------------------------------------------------------- the engines, asked straight (no launcher)


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


# ---------------------------------------------------------------- the launcher, run and sampled


class Sampler:
    """Peak RSS (VmHWM), threads and open fds of a process and its descendants, every SAMPLE_EVERY s."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak_rss_kb = 0
        self.children_rss_kb: dict[int, int] = {}
        self.peak_threads = 0
        self.peak_fds = 0
        self.peak_children = 0
        self.cpu_s = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _status(pid: int) -> dict[str, int]:
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "Threads"):
                    out[k] = int(v.split()[0])
        return out

    def _cpu(self) -> float:
        """utime + stime of the process and of its children it has waited for, in seconds."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def _descendants(self) -> list[int]:
        parents: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        parents[int(d)] = int(f.read().rpartition(")")[2].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            kids = [c for c, pp in parents.items() if pp == p]
            out += kids
            todo += kids
        return out

    def _run(self) -> None:
        kids: list[int] = []
        next_scan = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:  # a scan of /proc is costly: once a second
                kids = self._descendants()
                next_scan = now + 1.0
            threads = fds = 0
            for pid in [self.pid, *kids]:
                try:
                    st = self._status(pid)
                    n_fds = len(os.listdir(f"/proc/{pid}/fd"))
                except (OSError, ValueError):
                    continue
                if pid == self.pid:
                    self.peak_rss_kb = max(self.peak_rss_kb, st.get("VmHWM", 0))
                else:
                    self.children_rss_kb[pid] = max(self.children_rss_kb.get(pid, 0), st.get("VmHWM", 0))
                threads += st.get("Threads", 0)
                fds += n_fds
            self.peak_threads = max(self.peak_threads, threads)
            self.peak_fds = max(self.peak_fds, fds)
            self.peak_children = max(self.peak_children, len(kids))
            try:
                self.cpu_s = self._cpu()
            except (OSError, ValueError):
                pass
            self.samples += 1
            self._stop.wait(SAMPLE_EVERY)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return {"peak_rss_mb": round(self.peak_rss_kb / 1024, 1),
                "children_peak_rss_mb": round(sum(self.children_rss_kb.values()) / 1024, 1),
                "peak_children": self.peak_children,
                "peak_threads": self.peak_threads, "peak_fds": self.peak_fds, "cpu_s": round(self.cpu_s, 2),
                "samples": self.samples}


class Launch:
    """One CLI run in the background: stdout lines (with the time each arrived) go to `on_line`, a tail is kept."""

    def __init__(self, args: list[str], cwd: Path, on_line=None, keep_lines: int = 400):
        self.argv = [*LAUNCHER, *args]
        self.on_line = on_line
        self.out_tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.err_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.lines = 0
        self.t_start = time.time()
        self.p = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                  env={**os.environ, "COLUMNS": "400"})
        RUNNING.add(self)
        self.sampler = Sampler(self.p.pid)
        self.t_end: float | None = None
        self.timed_out = False
        self._out = threading.Thread(target=self._pump_out, daemon=True)
        self._err = threading.Thread(target=self._pump_err, daemon=True)
        self._out.start()
        self._err.start()

    def _pump_out(self) -> None:
        for raw in self.p.stdout:
            t = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines += 1
            self.out_tail.append(line)
            if self.on_line:
                try:
                    self.on_line(t, line)
                except Exception:  # noqa: BLE001 - a parser bug must not stall the pipe
                    traceback.print_exc()

    def _pump_err(self) -> None:
        for raw in self.p.stderr:
            self.err_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def wait(self, timeout: float) -> dict:
        try:
            self.p.wait(timeout=max(1.0, timeout - (time.time() - self.t_start)))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.p.send_signal(signal.SIGINT)  # up tears down on Ctrl-C
            try:
                self.p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t_end = time.time()
        stats = self.sampler.stop()
        self._out.join(30)
        self._err.join(10)
        RUNNING.discard(self)
        return {"argv": " ".join(self.argv[len(LAUNCHER):]), "rc": self.p.returncode, "timed_out": self.timed_out,
                "wall_s": round(self.t_end - self.t_start, 3), "t_start": self.t_start, "t_end": self.t_end,
                "stdout_lines": self.lines, **stats,
                # up's own account of where its time went ("started N container(s) in T (connect .., ...)")
                "phases": next((x.split(" in ", 1)[1].split(";")[0] for x in reversed(self.out_tail)
                                if "container(s) in " in x and "started " in x), None),
                "stderr_tail": "\n".join(self.err_tail)[-1500:]}

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()


RUNNING: set[Launch] = set()


class StepFailed(Exception):
    pass


# ---------------------------------------------------------------- one size


@dataclass
class Ctx:
    cluster: Cluster
    args: argparse.Namespace
    scratch: Path
    timeout: float
    jobs: list[str] = field(default_factory=list)
    floor_tokens: list[str] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)

    def job(self, what: str) -> str:
        name = f"bs{what}{secrets.token_hex(2)}"
        self.jobs.append(name)
        return name

    def dl(self, *args: str, on_line=None, config: Path | None = None) -> Launch:
        return Launch([args[0], "--config", str(config or self.cluster.config), *args[1:]], self.scratch, on_line)


def first_line_job(cluster: Cluster) -> str:
    return 'echo "rank $NODE_RANK up"; exec sleep 600'


def step_doctor(ctx: Ctx) -> dict:
    lines: list[str] = []
    launch = ctx.dl("doctor", "--output", "json", on_line=lambda t, line: lines.append(line))
    run = launch.wait(ctx.timeout)
    try:
        report = json.loads("\n".join(lines))
    except ValueError:
        raise StepFailed(f"doctor printed no JSON (rc {run['rc']}): {run['stderr_tail'][-600:]}") from None
    not_pass: dict[str, dict[str, int]] = {}
    reasons: dict[str, list[str]] = {}
    for c in report.get("checks", []):
        if c["verdict"] != "PASS":
            not_pass.setdefault(c["check"], collections.Counter())[c["verdict"]] += 1
            reasons.setdefault(f"{c['check']} {c['verdict']}", [])
            r = reasons[f"{c['check']} {c['verdict']}"]
            if c["reason"] not in r and len(r) < 3:
                r.append(c["reason"])
    hosts_seen = len({c["host"] for c in report.get("checks", [])})
    return {"launcher": run, "counts": report.get("counts"), "hosts_in_report": hosts_seen,
            "not_pass": {k: dict(v) for k, v in not_pass.items()}, "not_pass_reasons": reasons,
            "wall_s": run["wall_s"], "ok": run["rc"] == 0 and not run["timed_out"]}


def step_floor(ctx: Ctx, label: str) -> dict:
    """N containers started concurrently straight on the engines, then removed the same way."""
    c = ctx.cluster
    token = f"{label}{secrets.token_hex(2)}"
    ctx.floor_tokens.append(token)
    names = {r: f"bsfloor-{token}-{r}" for r in range(c.n)}
    cmd = 'echo "rank $NODE_RANK up"; exec sleep 600'

    def start(r: int) -> float:
        p = on_engine(c.engine_of(r), ["docker", "run", "-d", "--network", "host", "--name", names[r], "--label",
                                       f"{FLOOR_LABEL}={token}", "-e", f"NODE_RANK={r}", c.image, "sh", "-c", cmd],
                      timeout=ctx.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"rank {r}: docker run failed: {tail(p.stderr, 300)}")
        return time.time()

    def rm(r: int) -> float:
        p = on_engine(c.engine_of(r), ["docker", "rm", "-f", names[r]], timeout=ctx.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"rank {r}: docker rm failed: {tail(p.stderr, 300)}")
        return time.time()

    out: dict = {}
    with cf.ThreadPoolExecutor(max_workers=c.n) as pool:
        t0 = time.time()
        done = list(pool.map(start, range(c.n)))
        out["up_wall_s"] = round(max(done) - t0, 3)
        found = containers_by_label(c, f"{FLOOR_LABEL}={token}")
        running = [x for x in found if x["status"] == "running"]
        if len(running) != c.n:
            raise StepFailed(f"floor: {len(running)} of {c.n} containers running")
        out["up_all_running_s"] = round(max(x["started"] for x in running) - t0, 3)
        t0 = time.time()
        done = list(pool.map(rm, range(c.n)))
        out["rm_wall_s"] = round(max(done) - t0, 3)
    left = containers_by_label(c, f"{FLOOR_LABEL}={token}")
    if left:
        raise StepFailed(f"floor: {len(left)} container(s) left after docker rm -f")
    out["ok"] = True
    return out


def step_up_status_down(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("up")
    out: dict = {"job": job}
    run = ctx.dl("up", "--name", job, "--skip-preflight", "--detach", "--log-dir", str(ctx.scratch / "logs"),
                 "--", "sh", "-c", first_line_job(c)).wait(ctx.timeout)
    out["up"] = run
    found = job_containers(c, job)
    running = [x for x in found if x["status"] == "running"]
    names = collections.Counter(x["name"] for x in found)
    out["engines_running"] = len(running)
    out["engines_distinct_names"] = len(names)
    if running:
        out["up_all_running_s"] = round(max(x["started"] for x in running) - run["t_start"], 3)
    out["up_ok"] = run["rc"] == 0 and len(running) == c.n and len(names) == c.n
    if not out["up_ok"]:
        out["up_problem"] = (f"rc {run['rc']}, {len(running)} of {c.n} running on the engines "
                             f"({len(names)} distinct names): {run['stderr_tail'][-400:]}")

    lines: list[str] = []
    st = ctx.dl("status", "--name", job, "--output", "json", on_line=lambda t, line: lines.append(line))
    srun = st.wait(ctx.timeout)
    out["status"] = srun
    try:
        listed = json.loads("\n".join(lines)).get("containers", [])
    except ValueError:
        listed = None
    if listed is None:
        out["status_ok"] = False
        out["status_problem"] = f"no JSON (rc {srun['rc']}): {srun['stderr_tail'][-400:]}"
    else:
        per_name = collections.Counter(x["name"] for x in listed)
        ranks = collections.Counter(x.get("rank") for x in listed)
        dup = {k: v for k, v in per_name.items() if v > 1}
        out["status_listed"] = len(listed)
        out["status_distinct"] = len(per_name)
        out["status_ok"] = (srun["rc"] == 0 and len(listed) == c.n and not dup
                            and set(ranks) == set(range(c.n)))
        if not out["status_ok"]:
            some = sorted(dup.items())[:3]
            out["status_problem"] = (f"listed {len(listed)} for {c.n} hosts, {len(per_name)} distinct; "
                                     f"listed more than once: {len(dup)} e.g. {some}")

    drun = ctx.dl("down", "--name", job).wait(ctx.timeout)
    out["down"] = drun
    left = job_containers(c, job)
    out["down_left"] = len(left)
    out["down_ok"] = drun["rc"] == 0 and not left
    if not out["down_ok"]:
        out["down_problem"] = (f"rc {drun['rc']}, {len(left)} container(s) left on the engines: "
                               f"{[x['name'] for x in left][:5]} {drun['stderr_tail'][-400:]}")
        remove_by_label(c, f"{JOB_LABEL}={job}")
    out["ok"] = out["up_ok"] and out["status_ok"] and out["down_ok"]
    return out


class UpStream:
    """Watches up's stdout: `[rank host] text` lines per rank, dockerlaunch's own lines with their times."""

    RANK_LINE = re.compile(r"^\[(\d+) (\S+)\] (.*)$")

    def __init__(self, n: int, first_re: str = r"rank (\d+) up$"):
        self.n = n
        self.first = re.compile(first_re)
        self.ranks_up: set[int] = set()
        self.all_up = threading.Event()
        self.own: list[tuple[float, str]] = []
        self.rank_lines: list[tuple[float, int, str]] = []

    def __call__(self, t: float, line: str) -> None:
        m = self.RANK_LINE.match(line)
        if m:
            rank, text = int(m[1]), m[3]
            self.rank_lines.append((t, rank, text))
            if self.first.search(text):
                self.ranks_up.add(rank)
                if len(self.ranks_up) == self.n:
                    self.all_up.set()
        elif line.startswith("[dockerlaunch]"):
            self.own.append((t, line))

    def find(self, pattern: str) -> tuple[float, str] | None:
        rx = re.compile(pattern)
        return next(((t, s) for t, s in list(self.own) if rx.search(s)), None)


def wait_all_up(stream: UpStream, launch: Launch, timeout: float) -> bool:
    """Until every rank's first line reached up's stream; False if up exited first or the time ran out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if stream.all_up.wait(0.2):
            return True
        if launch.p.poll() is not None:
            return stream.all_up.wait(2)
    return False


def step_failfast(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("ff")
    last = c.n - 1
    max_wait = int(ctx.timeout * 10)  # tenths of a second: the rank fails by itself if never told to
    cmd = (f'echo "rank $NODE_RANK up"; if [ "$NODE_RANK" = "{last}" ]; then n=0; '
           f'while [ ! -e /tmp/fail ] && [ $n -lt {max_wait} ]; do sleep 0.1; n=$((n+1)); done; '
           'echo "rank $NODE_RANK exits 1 at $(date +%s.%N)"; exit 1; fi; exec sleep 600')
    out: dict = {"job": job}
    t0 = time.time()
    events = EngineEvents(c, job, since=t0 - 1, until=t0 + ctx.timeout + 120)
    stream = UpStream(c.n)
    launch = ctx.dl("up", "--name", job, "--skip-preflight", "--log-dir", str(ctx.scratch / "logs"), "--",
                    "sh", "-c", cmd, on_line=stream)
    try:
        if not wait_all_up(stream, launch, ctx.timeout):
            out["problem"] = f"only {len(stream.ranks_up)} of {c.n} ranks' first lines reached up's stream"
        out["all_first_lines_s"] = round(time.time() - t0, 3)
        name = f"{job}-{last}"
        trig = on_engine(c.engine_of(last), ["docker", "exec", name, "touch", "/tmp/fail"])
        out["triggered"] = trig.returncode == 0
        if trig.returncode != 0:
            out["trigger_error"] = tail(trig.stderr, 300)
        run = launch.wait(ctx.timeout)
        out["up"] = run
        time.sleep(2)  # the engines' last events reach the watchers
        left = job_containers(c, job)
        out["left"] = len(left)
        die = events.times("die", name)
        destroys = events.times("destroy")
        printed = next((float(m[1]) for _, r, s in stream.rank_lines if r == last
                        for m in [re.search(r"exits 1 at ([0-9.]+)", s)] if m), None)
        t_exit = min(die) if die else printed
        out["rank_exit_from"] = "docker events die" if die else ("the rank's printed time" if printed else None)
        out["destroyed"] = len(set(n for a, n, t in events.events if a == "destroy"))
        if t_exit is not None:
            if not left and len(set(n for a, n, t in events.events if a == "destroy")) >= c.n:
                out["teardown_s"] = round(max(destroys) - t_exit, 3)
            elif not left:  # some destroy events missed: up's exit is an upper bound
                out["teardown_s"] = round(launch.t_end - t_exit, 3)
                out["teardown_note"] = "upper bound (up's exit): not every destroy event was seen"
            out["up_exit_after_rank_s"] = round(launch.t_end - t_exit, 3)
        failed_line = stream.find(r"exited with|rank failed")
        out["up_said"] = failed_line[1] if failed_line else None
        out["up_lines"] = [f"+{t - t0:.1f}s {line}" for t, line in stream.own[-12:]]
        out["ok"] = (run["rc"] not in (0, None) and not run["timed_out"] and not left and "teardown_s" in out)
        if left:
            names = [x["name"] for x in left][:5]
            out["problem"] = f"{len(left)} container(s) of the job left after up exited: {names}"
        elif run["rc"] == 0:
            out["problem"] = "up exited 0 although a rank exited 1"
    finally:
        launch.kill()
        events.close()
        if job_containers(c, job):
            remove_by_label(c, f"{JOB_LABEL}={job}")
    return out


def variant_config(ctx: Ctx, **sections) -> Path:
    data = yaml.safe_load(ctx.cluster.config.read_text())
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value}
    path = ctx.scratch / f"cfg-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def freeze(node: str, tries: int = 5) -> list[str]:
    """`docker pause` with its error kept: at a load average of 300 runc's cgroup freeze can time out
    ("unable to freeze") and a second try lands. Returns what each failed try said."""
    said = []
    for _ in range(tries):
        r = subprocess.run(["docker", "pause", node], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return said
        said.append(tail(r.stderr or r.stdout, 300).strip())
        time.sleep(2)
    raise StepFailed(f"docker pause {node} failed {tries} times: {said[-1]}")


def step_hostloss(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("hl")
    last = c.n - 1
    node = c.node(last)
    cfg = variant_config(ctx, job={"host_timeout": HOST_TIMEOUT})
    out: dict = {"job": job, "paused": node, "host_timeout_s": HOST_TIMEOUT}
    stream = UpStream(c.n)
    t0 = time.time()
    launch = ctx.dl("up", "--name", job, "--skip-preflight", "--log-dir", str(ctx.scratch / "logs"), "--",
                    "sh", "-c", first_line_job(c), on_line=stream, config=cfg)
    try:
        if not wait_all_up(stream, launch, ctx.timeout):
            said = " | ".join(f"+{t - t0:.1f}s {line}" for t, line in stream.own[-4:])
            raise StepFailed(f"only {len(stream.ranks_up)} of {c.n} ranks' first lines reached up's stream "
                             f"(up {'exited ' + str(launch.p.returncode) if launch.p.poll() is not None else 'runs'}"
                             f"); up said: {said} {' | '.join(list(launch.err_tail)[-3:])}")
        out["all_first_lines_s"] = round(time.time() - t0, 3)
        time.sleep(3)  # a heartbeat or two after the start
        out["pause_tries"] = freeze(node)
        ctx.paused.add(node)
        t_pause = time.time()
        deadline = t_pause + HOST_TIMEOUT + 60
        said = None
        while time.time() < deadline and launch.p.poll() is None:
            said = stream.find(r"stopped answering|host lost")
            if said:
                break
            time.sleep(0.05)
        said = said or stream.find(r"stopped answering|host lost")
        if said:
            out["named_after_s"] = round(said[0] - t_pause, 3)
            out["line"] = said[1]
            out["names_rank"] = f"rank {last} " in said[1] and c.hosts[last] in said[1]
        run = launch.wait(max(60.0, ctx.timeout - (time.time() - t0)))
        out["up"] = run
        out["up_exit_after_pause_s"] = round(launch.t_end - t_pause, 3)
        out["up_lines"] = [f"+{t - t0:.1f}s {line}" for t, line in stream.own[-12:]]
    except BaseException:
        launch.kill()
        if node in ctx.paused:
            subprocess.run(["docker", "unpause", node], capture_output=True)
            ctx.paused.discard(node)
        remove_by_label(c, f"{JOB_LABEL}={job}")
        raise
    finally:
        launch.kill()
        if node in ctx.paused:
            subprocess.run(["docker", "unpause", node], capture_output=True)
            ctx.paused.discard(node)
    left_after_up = job_containers(c, job)
    out["left_after_up"] = sorted(x["name"] for x in left_after_up)
    drun = ctx.dl("down", "--name", job).wait(ctx.timeout)
    out["down"] = drun
    left = job_containers(c, job)
    out["left_after_down"] = len(left)
    if left:
        remove_by_label(c, f"{JOB_LABEL}={job}")
    out["ok"] = bool(said) and out.get("names_rank", False) and not left and out["up"]["rc"] != 0
    if not said:
        out["problem"] = f"up never said the host was lost (rc {out['up']['rc']}): {out['up']['stderr_tail'][-400:]}"
    return out


class LineCheck:
    """Numbered lines per rank: `r<rank> <i>` for i in 0..L-1."""

    LINE = re.compile(r"^\[(\d+) \S+\] r(\d+) (\d+)$")

    def __init__(self, n: int, lines: int):
        self.n, self.lines = n, lines
        self.last = [-1] * n
        self.seen = [bytearray(lines) for _ in range(n)]
        self.count = [0] * n
        self.out_of_order = [0] * n
        self.wrong_rank = 0
        self.other = 0
        self.odd: list[str] = []  # the first lines that are neither numbered lines nor dockerlaunch's (cut lines)
        self.own: collections.deque[str] = collections.deque(maxlen=12)  # dockerlaunch's last own lines

    def __call__(self, t: float, line: str) -> None:
        m = self.LINE.match(line)
        if not m:
            self.other += 1
            if line.startswith("[dockerlaunch]"):
                self.own.append(line[:300])
            elif len(self.odd) < 20:
                self.odd.append(line[:200])
            return
        rank, own, i = int(m[1]), int(m[2]), int(m[3])
        if rank != own or not 0 <= rank < self.n or i >= self.lines:
            self.wrong_rank += 1
            return
        self.count[rank] += 1
        if i < self.last[rank]:
            self.out_of_order[rank] += 1
        self.last[rank] = max(self.last[rank], i)
        self.seen[rank][i] = 1

    def missing(self, rank: int, most: int = 3) -> list[str]:
        """The first few runs of missing line numbers of a rank, e.g. ['11007-19999']."""
        runs, start = [], None
        seen = self.seen[rank]
        for i in range(self.lines + 1):
            gap = i < self.lines and not seen[i]
            if gap and start is None:
                start = i
            elif not gap and start is not None:
                runs.append(f"{start}-{i - 1}" if i - 1 > start else str(start))
                start = None
                if len(runs) >= most:
                    break
        return runs

    def summary(self) -> dict:
        lost = [self.lines - sum(s) for s in self.seen]
        where = {r: self.missing(r) for r in range(self.n) if lost[r]}
        dup = [self.count[r] - sum(self.seen[r]) for r in range(self.n)]
        return {"expected_per_rank": self.lines, "lost_total": sum(lost),
                "ranks_with_loss": sum(1 for x in lost if x), "worst_rank_lost": max(lost) if lost else 0,
                "duplicates_total": sum(dup), "out_of_order_total": sum(self.out_of_order),
                "ranks_out_of_order": sum(1 for x in self.out_of_order if x), "wrong_rank": self.wrong_rank,
                "other_lines": self.other,
                "odd_lines": self.odd, "own_last": list(self.own),
                "missing": {str(r): {"lost": lost[r], "runs": where[r]} for r in sorted(where)[:8]},
                "ok": not sum(lost) and not sum(dup) and not sum(self.out_of_order) and not self.wrong_rank}


def check_log_files(run_dir: Path | None, n: int, lines: int) -> dict:
    """up's per-rank log files (raw bytes each rank printed)."""
    if run_dir is None or not run_dir.is_dir():
        return {"ok": False, "problem": "no log folder"}
    check = LineCheck(n, lines)
    files = sorted(run_dir.rglob("rank*.log"))  # <run>/attempt-0/
    for f in files:
        r = int(re.match(r"rank(\d+)-", f.name)[1])
        with open(f, errors="replace") as fh:
            for line in fh:
                check(0.0, f"[{r} x] {line.rstrip(chr(10)).rstrip(chr(13))}")  # a tty ends lines with \r\n
    return {"files": len(files), **check.summary()}


def step_logs(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("lg")
    n_lines = ctx.args.lines
    cmd = f'i=0; while [ $i -lt {n_lines} ]; do echo "r$NODE_RANK $i"; i=$((i+1)); done'
    out: dict = {"job": job, "lines_per_rank": n_lines}
    log_dir = ctx.scratch / f"logs-{job}"
    check = LineCheck(c.n, n_lines)
    t0 = time.time()
    cfg = None
    if ctx.args.logs_tty != "config":  # container.tty for this step only
        cfg = variant_config(ctx, container={"tty": ctx.args.logs_tty == "on"})
        out["container_tty"] = ctx.args.logs_tty
    marks = engine_log_marks(c)
    launch = ctx.dl("up", "--name", job, "--skip-preflight", "--keep", "--log-dir", str(log_dir), "--",
                    "sh", "-c", cmd, on_line=check, config=cfg)
    try:
        run = launch.wait(ctx.timeout + c.n * n_lines / 2000)
        out["up"] = run
        cut = engine_log_count(c, marks, ENGINE_TRUNCATED)
        out["engine_truncated"] = {"total": sum(cut.values()), "per_engine": cut,
                                   "said": f"dockerd: Logger didn't exit in time: {ENGINE_TRUNCATED}"}
        out["up_stream"] = check.summary()
        out["lines_per_s_up"] = round(sum(check.count) / max(0.001, launch.t_end - t0))
        dirs = sorted(log_dir.glob(f"{job}-*")) if log_dir.is_dir() else []
        out["log_files"] = check_log_files(dirs[-1] if dirs else None, c.n, n_lines)
        kept = job_containers(c, job)
        out["kept"] = len(kept)
        if kept:
            lcheck = LineCheck(c.n, n_lines)
            lrun = ctx.dl("logs", "--name", job, on_line=lcheck).wait(ctx.timeout + c.n * n_lines / 2000)
            out["logs"] = lrun
            out["logs_stream"] = lcheck.summary()
        else:
            out["logs_problem"] = "no container kept after up --keep: `logs` not measured"
        drun = ctx.dl("down", "--name", job).wait(ctx.timeout)
        out["down"] = drun
    finally:
        launch.kill()
        if job_containers(c, job):
            remove_by_label(c, f"{JOB_LABEL}={job}")
        shutil.rmtree(log_dir, ignore_errors=True)
    out["ok"] = (run["rc"] == 0 and out["up_stream"]["ok"] and out.get("logs_stream", {}).get("ok", False))
    return out


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


def cleanup(ctx: Ctx | None, cluster: Cluster | None, keep: bool) -> str | None:
    for launch in list(RUNNING):
        launch.kill()
    if ctx is not None:
        for node in list(ctx.paused):
            subprocess.run(["docker", "unpause", node], capture_output=True)
        if not keep:
            for job in ctx.jobs:
                remove_by_label(ctx.cluster, f"{JOB_LABEL}={job}")
        for token in ctx.floor_tokens:
            remove_by_label(ctx.cluster, f"{FLOOR_LABEL}={token}")
    if cluster is not None and cluster.owned and not keep:
        log(f"sim down --name {cluster.name}")
        r = subprocess.run([*LAUNCHER, "sim", "down", "--name", cluster.name], capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            log(f"sim down --name {cluster.name} failed ({r.returncode}): {last}")
            return f"sim down failed ({r.returncode}): {last}"
    return None


def run_size(n: int | None, index: int, args) -> dict:
    res: dict = {"hosts": n, "steps": {}}
    cluster: Cluster | None = None
    ctx: Ctx | None = None
    scratch = Path(tempfile.mkdtemp(prefix="bsscale-"))
    try:
        if args.config:
            cluster = discover(args.cluster, Path(args.config), owned=False)
        else:
            try:
                cluster, took = start_cluster(n, args, index)
            except Exception as e:  # noqa: BLE001 - recorded; the next size goes on
                res["error"] = f"sim up failed: {type(e).__name__}: {e}"
                log(res["error"])
                return res
            res["sim_up_s"] = round(took, 1)
        res.update(hosts=cluster.n, cluster=cluster.name, light=cluster.light, engines=len(cluster.engines),
                   image=cluster.image)
        timeout = args.timeout_base + args.timeout_per_host * cluster.n
        ctx = Ctx(cluster, args, scratch, timeout)
        log(f"{cluster.n} hosts on {len(cluster.engines)} engine(s) ({'light' if cluster.light else 'regular'} "
            f"sim {cluster.name}); step timeout {timeout:.0f}s")
        steps = [("doctor", step_doctor), ("floor1", lambda c: step_floor(c, "a")),
                 ("up_status_down", step_up_status_down), ("failfast", step_failfast),
                 ("hostloss", step_hostloss), ("logs", step_logs), ("floor2", lambda c: step_floor(c, "b"))]
        only = set(args.steps.split(",")) if args.steps else None
        for name, fn in steps:
            if only and name not in only and not name.startswith("floor"):
                continue
            log(f"{cluster.n} hosts: {name}")
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            try:
                res["steps"][name] = fn(ctx)
            except (StepFailed, RuntimeError, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
                res["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            except Exception as e:  # noqa: BLE001 - recorded, the next step goes on
                res["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-2000:]}
            res["steps"][name]["step_s"] = round(time.monotonic() - t0, 1)
            res["steps"][name]["loadavg_1m"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
            st = res["steps"][name]
            log(f"{cluster.n} hosts: {name} {'ok' if st.get('ok') else 'FAILED'} in {st['step_s']}s"
                + ("" if st.get("ok") else f": {problems_of(st)[:400]}"))
    finally:
        problem = cleanup(ctx, cluster, args.keep)
        if problem:
            res["sim_down_problem"] = problem
        shutil.rmtree(scratch, ignore_errors=True)
    return res


def problems_of(st: dict) -> str:
    bits = [str(st[k]) for k in st if k.endswith("problem") or k == "error"]
    for k, v in st.items():
        if isinstance(v, dict) and v.get("rc") not in (0, None) and v.get("stderr_tail"):
            bits.append(f"{k}: rc {v['rc']}: {v['stderr_tail'][-300:]}")
    return "; ".join(bits)


# ---------------------------------------------------------------- figures


def launcher_runs(res: dict) -> list[tuple[str, dict]]:
    out = []
    for step, st in res["steps"].items():
        for k, v in st.items():
            if isinstance(v, dict) and "peak_rss_mb" in v:
                out.append((f"{step}.{k}", v))
    return out


def figures(res: dict) -> dict:
    s = res["steps"]
    f: dict = {}
    doc = s.get("doctor", {})
    f["doctor_s"] = doc.get("wall_s")
    floors = [s[k] for k in ("floor1", "floor2") if s.get(k, {}).get("ok")]
    f["floors"] = [k for k in ("floor1", "floor2") if s.get(k, {}).get("ok")]
    if floors:
        f["floor_up_s"] = min(x["up_all_running_s"] for x in floors)
        f["floor_up_wall_s"] = min(x["up_wall_s"] for x in floors)
        f["floor_rm_s"] = min(x["rm_wall_s"] for x in floors)
    usd = s.get("up_status_down", {})
    f["up_all_running_s"] = usd.get("up_all_running_s")
    f["up_wall_s"] = (usd.get("up") or {}).get("wall_s")
    f["up_phases"] = (usd.get("up") or {}).get("phases")
    f["status_s"] = (usd.get("status") or {}).get("wall_s")
    f["down_s"] = (usd.get("down") or {}).get("wall_s")
    ff = s.get("failfast", {})
    f["failfast_teardown_s"] = ff.get("teardown_s")
    f["failfast_up_exit_s"] = ff.get("up_exit_after_rank_s")
    hl = s.get("hostloss", {})
    f["hostloss_named_s"] = hl.get("named_after_s")
    lg = s.get("logs", {})
    f["logs_up_s"] = (lg.get("up") or {}).get("wall_s")
    f["logs_cmd_s"] = (lg.get("logs") or {}).get("wall_s")
    f["logs_lost"] = (lg.get("up_stream") or {}).get("lost_total")
    f["logs_out_of_order"] = (lg.get("up_stream") or {}).get("out_of_order_total")
    f["logs_cmd_lost"] = (lg.get("logs_stream") or {}).get("lost_total")
    f["logs_ranks_with_loss"] = (lg.get("up_stream") or {}).get("ranks_with_loss")
    f["engine_truncated"] = (lg.get("engine_truncated") or {}).get("total")
    if f.get("up_all_running_s") and f.get("floor_up_s"):
        f["up_ratio"] = round(f["up_all_running_s"] / f["floor_up_s"], 2)
    if f.get("failfast_teardown_s") is not None and f.get("floor_rm_s"):
        f["failfast_ratio"] = round(f["failfast_teardown_s"] / f["floor_rm_s"], 2)
    runs = launcher_runs(res)
    if runs:
        f["peak_rss_mb"] = max(v["peak_rss_mb"] for _, v in runs)
        f["peak_rss_step"] = max(runs, key=lambda x: x[1]["peak_rss_mb"])[0]
        f["peak_threads"] = max(v["peak_threads"] for _, v in runs)
        f["peak_fds"] = max(v["peak_fds"] for _, v in runs)
        f["peak_fds_step"] = max(runs, key=lambda x: x[1]["peak_fds"])[0]
    return f


def verdicts(res: dict, f: dict) -> dict[str, str]:
    s = res["steps"]
    v: dict[str, str] = {}

    def judge(key: str, ok: bool | None, value: str) -> None:
        v[key] = ("n/a" if ok is None else ("PASS" if ok else "MISS")) + f" ({value})"

    judge("up_ratio", None if f.get("up_ratio") is None else f["up_ratio"] <= 1.5, f"{f.get('up_ratio')} x")
    judge("failfast_ratio", None if f.get("failfast_ratio") is None else f["failfast_ratio"] <= 1.5,
          f"{f.get('failfast_ratio')} x")
    judge("failfast_teardown", None if f.get("failfast_teardown_s") is None else f["failfast_teardown_s"] <= 10,
          f"{f.get('failfast_teardown_s')} s")
    hl = s.get("hostloss", {})
    judge("hostloss", None if "hostloss" not in s else bool(
        f.get("hostloss_named_s") is not None and f["hostloss_named_s"] <= HOST_TIMEOUT + 5 and hl.get("names_rank")),
        f"{f.get('hostloss_named_s')} s")
    judge("rss", None if f.get("peak_rss_mb") is None else f["peak_rss_mb"] < 500, f"{f.get('peak_rss_mb')} MB")
    judge("fds", None if f.get("peak_fds") is None else f["peak_fds"] < 1024, f"{f.get('peak_fds')}")
    lg = s.get("logs", {})
    ls = lg.get("up_stream")
    lc = lg.get("logs_stream")
    judge("logs", None if ls is None else bool(ls["ok"] and (lc or {}).get("ok")),
          f"up: lost {ls and ls['lost_total']}, out of order {ls and ls['out_of_order_total']}; logs: lost "
          f"{lc and lc['lost_total']}, out of order {lc and lc['out_of_order_total']}; engines truncated "
          f"{f.get('engine_truncated')} containers' logs")
    return v


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def report(results: list[dict]) -> str:
    out = []
    for res in results:
        f, s = res["figures"], res["steps"]
        kind = "light" if res.get("light") else "regular"
        took = f", sim up {res['sim_up_s']} s" if "sim_up_s" in res else ""
        out.append(f"\n## {res['hosts']} hosts ({kind} sim {res.get('cluster')}, {res.get('engines')} "
                   f"engine(s){took})\n")
        for key in ("error", "sim_down_problem"):
            if res.get(key):
                out.append(f"{key}: {res[key]}\n")
        loads = ", ".join(f"{k} {v['loadavg_1m'][0]}-{v['loadavg_1m'][1]}" for k, v in s.items() if "loadavg_1m" in v)
        out.append(f"1-min load average at each step's start-end: {loads}\n")
        usd = s.get("up_status_down", {})
        out.append("| launcher run | wall | peak RSS | threads | fds | CPU | exit | notes |")
        out.append("|---|---|---|---|---|---|---|---|")
        for name, run in launcher_runs(res):
            step = name.split(".")[0]
            out.append(f"| {name} | {run['wall_s']:.2f} s | {run['peak_rss_mb']:.0f} MB"
                       f"{' + children ' + str(run['children_peak_rss_mb']) if run['children_peak_rss_mb'] else ''}"
                       f" | {run['peak_threads']} | {run['peak_fds']} | {run.get('cpu_s')} s | rc {run['rc']}"
                       f"{' TIMEOUT' if run['timed_out'] else ''} | {'' if s[step].get('ok') else 'step failed'} |")
        for name, st in s.items():
            if not st.get("ok") and "error" in st:
                out.append(f"| {name} | - | - | - | - | - | FAILED | {st['error'][:200]} |")
        out.append("")
        rows = [
            ("doctor", fmt(f.get("doctor_s")) + " s", "not PASS: " + (", ".join(
                f"{k} {dict(v)}" for k, v in (s.get("doctor", {}).get("not_pass") or {}).items()) or "none")),
            ("floor: N x docker run -d, all running", fmt(f.get("floor_up_s")) + " s",
             f"docker runs returned {fmt(f.get('floor_up_wall_s'))} s; the faster of {f.get('floors')}"),
            ("up --detach, all running", fmt(f.get("up_all_running_s")) + " s",
             f"{fmt(f.get('up_ratio'))} x floor; up exited {fmt(f.get('up_wall_s'))} s; up's phases: "
             f"{f.get('up_phases')}"),
            ("status", fmt(f.get("status_s")) + " s", usd.get("status_problem", "N listed once each")
             if s.get("up_status_down") else "-"),
            ("down", fmt(f.get("down_s")) + " s", usd.get("down_problem", "none left")
             if s.get("up_status_down") else "-"),
            ("floor: N x docker rm -f", fmt(f.get("floor_rm_s")) + " s", ""),
            ("fail-fast: rank exit -> none left", fmt(f.get("failfast_teardown_s")) + " s",
             f"{fmt(f.get('failfast_ratio'))} x floor rm; up exited {fmt(f.get('failfast_up_exit_s'))} s after the "
             f"rank, rc {(s.get('failfast', {}).get('up') or {}).get('rc')}"),
            ("host loss: pause -> named", fmt(f.get("hostloss_named_s")) + " s",
             (s.get("hostloss", {}).get("line") or s.get("hostloss", {}).get("problem") or "")[:160]),
            ("logs: up's stream", fmt(f.get("logs_up_s")) + " s",
             json.dumps({k: v for k, v in (s.get("logs", {}).get("up_stream") or {}).items()
                         if k in ("lost_total", "ranks_with_loss", "duplicates_total", "out_of_order_total",
                                  "wrong_rank")})
             + f"; the engines logged '{ENGINE_TRUNCATED}' {fmt(f.get('engine_truncated'))} times"),
            ("logs: `logs` afterwards", fmt(f.get("logs_cmd_s")) + " s",
             json.dumps({k: v for k, v in (s.get("logs", {}).get("logs_stream") or {}).items()
                         if k in ("lost_total", "duplicates_total", "out_of_order_total", "wrong_rank")})
             or s.get("logs", {}).get("logs_problem", "")),
        ]
        out.append("| measure | time | notes |")
        out.append("|---|---|---|")
        out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        out.append("")
        out.append(f"targets at {res['hosts']} hosts (set for 256):")
        for k, v in res["verdicts"].items():
            out.append(f"  {TARGETS[k]}: {v}")
    if len(results) > 1:
        out.append("\n## growth\n")
        sizes = [r["hosts"] for r in results]
        head = "| metric | " + " | ".join(f"{n} hosts" for n in sizes) + " | " + " | ".join(
            f"{b}/{a}" for a, b in zip(sizes, sizes[1:])) + " |"
        out.append(head)
        out.append("|---" * (1 + len(sizes) + len(sizes) - 1) + "|")
        for key in ("doctor_s", "floor_up_s", "up_all_running_s", "up_wall_s", "up_ratio", "status_s", "down_s",
                    "floor_rm_s", "failfast_teardown_s", "failfast_up_exit_s", "failfast_ratio", "hostloss_named_s",
                    "logs_up_s", "logs_cmd_s", "peak_rss_mb", "peak_threads", "peak_fds"):
            vals = [r["figures"].get(key) for r in results]
            ratios = [fmt(round(b / a, 2)) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a
                      else "-" for a, b in zip(vals, vals[1:])]
            out.append(f"| {key} | " + " | ".join(fmt(v) for v in vals) + " | " + " | ".join(ratios) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="8,64,256", help="sizes, one light sim cluster each")
    ap.add_argument("--engines", type=int, default=None, help="shared engines of the light sim (its default if unset)")
    ap.add_argument("--lines", type=int, default=20000, help="numbered lines per rank for the logs step")
    ap.add_argument("--keep", action="store_true", help="leave the clusters (and a failed step's containers) up")
    ap.add_argument("--config", help="a cluster config of a sim cluster that is up (with --cluster)")
    ap.add_argument("--cluster", help="that cluster's name")
    ap.add_argument("--prefix", default=f"bs{secrets.token_hex(2)}-",
                    help="light cluster names: PREFIX<N> (default: bs + a random tag: dockerd may keep a removed "
                         "cluster's network, and with it the name)")
    ap.add_argument("--steps", help="only these steps (doctor,up_status_down,failfast,hostloss,logs); floors always")
    ap.add_argument("--logs-tty", choices=["config", "on", "off"], default="config",
                    help="container.tty for the logs step (config: what the cluster config says)")
    ap.add_argument("--timeout-base", type=float, default=120.0)
    ap.add_argument("--timeout-per-host", type=float, default=3.0)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    if bool(args.config) != bool(args.cluster):
        ap.error("--config and --cluster go together")
    sizes = [None] if args.config else [int(x) for x in args.hosts.split(",")]

    def on_term(signum, frame):
        log(f"got signal {signal.Signals(signum).name}: cleaning up")
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = datetime.now().astimezone()
    results: list[dict] = []
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "started": started.isoformat(timespec="seconds"), "cpus": os.cpu_count(), "mem_gib": round(mem, 1),
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip()}
    try:
        for i, n in enumerate(sizes):
            res = run_size(n, i, args)
            res["figures"] = figures(res)
            res["verdicts"] = verdicts(res, res["figures"])
            results.append(res)
            print(report([res]), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    except KeyboardInterrupt:
        log("interrupted: cleaned up")
        return 130
    finally:
        meta["finished"] = datetime.now().astimezone().isoformat(timespec="seconds")
        meta["commit_at_end"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip()
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    if len(results) > 1:
        print(report(results).split("\n## growth\n", 1)[-1].join(["\n## growth\n", ""]))
    print(f"\n{meta['command']}; {meta['started']}; {meta['cpus']} CPUs, {meta['mem_gib']} GiB; "
          f"commit {meta['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
