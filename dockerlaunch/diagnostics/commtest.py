"""`dockerlaunch commtest`: an all_reduce sweep in the job's own image on the job's hosts, read like nccl-tests,
judged against what the links should carry (InfiniBand port rates, NIC speed), with NCCL's transport beside it.

It is an ordinary `up` of a short job (`<job>-commtest`): the same plan, containers, teardown and diagnostics
folder, so it measures exactly the path the training job will take. `--pairwise` runs every pair of hosts to
find the one slow host or cable.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from itertools import combinations

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker import up as launch
from dockerlaunch.backends.docker.session import Session
from dockerlaunch.container import Deferred
from dockerlaunch.diagnostics import script
from dockerlaunch.diagnostics.nccl_logs import TransportReport, read_transport
from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import JobPlan
from dockerlaunch.reporting import Reporter

MARK = "DLCOMMTEST "
PASS_RATIO = 0.6  # busbw / link speed: NCCL over a healthy link reaches 0.8-0.95 at large sizes
WARN_RATIO = 0.25
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_BYTES = 16 << 30

# torchrun's underscore flags: accepted by every torch 2.x
TORCHRUN = ('exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" '
            '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --no_python python3 -c "$0" "$@"')


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMGB]?)B?\s*", text.upper())
    if not m:
        raise ConfigError(f"--sizes: {text!r} is not a size like 1M, 256K or 1G")
    return int(m[1]) * _UNITS[m[2]]


def parse_sizes(text: str) -> tuple[int, int]:
    """'1M:1G' -> (1 MiB, 1 GiB); one size alone is both ends."""
    lo_text, _, hi_text = text.partition(":")
    lo, hi = parse_size(lo_text), parse_size(hi_text or lo_text)
    if lo < 4 or lo > hi or hi > MAX_BYTES:
        raise ConfigError(f"--sizes {text}: need 4 B <= MIN <= MAX <= 16G, e.g. --sizes 1M:1G")
    return lo, hi


def human(n: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"


def command(lo: int, hi: int, iters: int = 0) -> list[str]:
    return ["sh", "-c", TORCHRUN, script("commtest.py"), str(lo), str(hi), str(iters)]


@dataclass
class Link:
    """What one host's links should carry, from /sys."""

    nic: str | None
    nic_mbps: int | None  # /sys/class/net/NIC/speed (-1 or absent: unknown, e.g. virtual NICs)
    ib_gbps: float = 0.0  # the sum of the ACTIVE ports' rates NCCL may use
    ib_ports: list[str] = field(default_factory=list)


def parse_links(text: str, nic: str | None) -> Link:
    """linkspeed.sh output: `nic=SPEED` and `ib=HCA:PORT RATE...` lines."""
    link = Link(nic=nic, nic_mbps=None)
    try:
        kv = keyvalue.parse(text, ("nic",), ("ib",))
    except keyvalue.Malformed:
        return link  # the host's answer is not linkspeed.sh's: its links are unknown, never guessed
    v = (kv.get("nic") or [""])[0].strip()
    link.nic_mbps = int(v) if v.isdigit() and int(v) > 0 else None
    for line in kv.get("ib", []):
        port, _, rate = line.partition(" ")
        m = re.match(r"\s*([\d.]+)\s*Gb/sec", rate)
        if m:
            link.ib_gbps += float(m[1])
            link.ib_ports.append(f"{port} {rate.strip()}")
    return link


@dataclass
class Expectation:
    gbs: float  # GB/s the busbw should approach
    what: str


def expectation(links: list[Link], network: str) -> Expectation | None:
    """The slowest host's link is the ring's bottleneck. `network`: "IB" or "Socket" (NCCL's choice, or gloo's)."""
    if network == "IB":
        rates = [x.ib_gbps for x in links]
        if rates and all(rates):
            slow = min(range(len(links)), key=lambda i: rates[i])
            return Expectation(rates[slow] / 8, f"{rates[slow]:g} Gb/s InfiniBand ({', '.join(links[slow].ib_ports)})")
        return None
    speeds = [x.nic_mbps for x in links]
    if speeds and all(speeds):
        slow = min(range(len(links)), key=lambda i: speeds[i])
        return Expectation(speeds[slow] / 8000, f"{speeds[slow] / 1000:g} Gb/s {links[slow].nic}")
    return None


@dataclass
class SweepVerdict:
    """The sweep's one judgement. Not a verdict.Verdict: its INFO (one host, or no link speed to compare with) has no
    place there, and `commtest --output json` says `{"status", "reason"}`."""

    status: str  # PASS / WARN / FAIL / INFO
    reason: str


def judge(rows: list[dict], nhosts: int, backend: str, expected: Expectation | None,
          transport: TransportReport | None) -> SweepVerdict:
    if not rows:
        return SweepVerdict("FAIL", "no results (see the job's output above)")
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        return SweepVerdict("FAIL", f"{wrong} wrong element(s) in all_reduce results: a broken link, GPU or driver")
    fails = [f for f in (transport.findings if transport else []) if f.verdict == "FAIL"]
    if fails:
        return SweepVerdict("FAIL", fails[0].detail)
    top = max(rows, key=lambda r: r["bytes"])
    bus = top["busbw"]
    if nhosts < 2:
        return SweepVerdict("INFO", f"one host: busbw {bus:.2f} GB/s at {human(top['bytes'])} is intra-host "
                                    "(NVLink/PCIe/CPU); no network link to compare with")
    if expected is None:
        return SweepVerdict("INFO", f"busbw {bus:.2f} GB/s at {human(top['bytes'])}; link speed unknown "
                                    "(virtual NIC or no /sys speed), so no verdict")
    ratio = bus / expected.gbs
    status = "PASS" if ratio >= PASS_RATIO else "WARN" if ratio >= WARN_RATIO else "FAIL"
    note = " (gloo on CPU: the reduction's CPU time counts as much as the link)" if backend == "gloo" else ""
    return SweepVerdict(status, f"busbw {bus:.2f} GB/s at {human(top['bytes'])} is {ratio:.0%} of the "
                                f"{expected.gbs:.2f} GB/s that {expected.what} carries{note}")


@dataclass
class Result:
    hosts: list[str]
    header: dict
    rows: list[dict]
    transport: TransportReport | None
    links: list[Link]
    verdict: SweepVerdict
    exit_code: int
    output_tail: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"hosts": self.hosts, "header": self.header, "rows": self.rows, "exit_code": self.exit_code,
                "verdict": self.verdict.__dict__, "links": [x.__dict__ for x in self.links],
                "transport": self.transport.to_dict() if self.transport else None}


class MarkedLines(Reporter):
    """A short job's result lines (`MARK {json}`, from any rank) are data, each with `host_key` set to the host that
    printed it where asked; the rest of the job's output is kept for when it fails (commtest, smoke)."""

    def __init__(self, outer: Reporter, mark: str = MARK, host_key: str | None = None):
        self.outer, self.mark, self.host_key, self.records, self.tail = outer, mark, host_key, [], []
        self.lock = threading.Lock()

    def say(self, msg: str, style: str = "bold") -> None:
        self.outer.say(msg, style)

    def command(self, label: str, command: str) -> None:
        self.outer.command(label, command)

    def line(self, rank: int, host: str, text: str) -> None:
        with self.lock:
            if self.mark in text:
                try:
                    record = json.loads(text.split(self.mark, 1)[1])
                except ValueError:
                    return
                if isinstance(record, dict):
                    self.records.append({**record, self.host_key: host} if self.host_key else record)
            else:
                self.tail = (self.tail + [f"[{rank} {host}] {text}"])[-30:]


def _links_and_transport(holder: dict):
    """A monitor for `up`: once the run ends, NCCL's transport and each host's link speeds."""

    def monitor(session: Session, plan: JobPlan, reporter: Reporter, stop: threading.Event) -> None:
        stop.wait()
        try:
            if plan.diag_dir and session.config.diagnostics.nccl_log:
                doctor = session.config.invocation.command("doctor", hint="transport.doctor")
                holder["transport"] = read_transport(session.fleet.hosts, plan, plan.diag_dir, doctor=doctor)
            links = []
            for h, hp in zip(session.fleet.hosts, plan.hosts):
                nic = hp.container.env.get("NCCL_SOCKET_IFNAME")
                nic = None if nic is None or isinstance(nic, Deferred) else nic
                hca = hp.container.env.get("NCCL_IB_HCA")
                ports = [] if hca is None or isinstance(hca, Deferred) else [p for p in hca.split(",") if p]
                r = h.remote.run(["sh", "-c", script("linkspeed.sh"), "sh", nic or "", *ports], timeout=30)
                links.append(parse_links(r.stdout, nic))
            holder["links"] = links
        except Exception as e:  # noqa: BLE001 - reported as a missing verdict, never a crash
            holder["error"] = str(e)

    return monitor


def sub_config(config: ClusterConfig, hosts: list[int] | None, command_argv: list[str],
               suffix: str = "commtest") -> ClusterConfig:
    """The job's config for a short job of its own (`<job>-<suffix>`): same image, hosts, flags and mounts."""
    job = config.job
    name = f"{job.name[:54]}-{suffix}"
    data = config.model_dump(mode="json")
    data["job"] = {**data["job"], "name": name, "command": command_argv}
    if hosts is not None:
        data["hosts"] = [data["hosts"][i] for i in hosts]
    out = ClusterConfig.model_validate(data)
    out._invocation = config.invocation  # its hints are the user's own command line's
    return out


def run(config: ClusterConfig, lo: int, hi: int, iters: int = 0, hosts: list[int] | None = None,
        reporter: Reporter | None = None) -> Result:
    reporter = reporter or Reporter()
    cfg = sub_config(config, hosts, command(lo, hi, iters))
    capture = MarkedLines(reporter)
    holder: dict = {}
    code = launch.up(cfg, preflight=False, log_dir=None, reporter=capture, monitors=[_links_and_transport(holder)])
    header = next((r for r in capture.records if r.get("kind") == "header"), {})
    rows = [r for r in capture.records if r.get("kind") == "size"]
    transport = holder.get("transport")
    links = holder.get("links", [])
    backend = header.get("backend", "?")
    network = "IB" if transport and any("IB" in (t.network if t else []) for _, _, t, _ in transport.hosts) \
        else "Socket"
    expected = expectation(links, network) if links else None
    verdict = judge(rows, len(cfg.hosts), backend, expected, transport)
    if code != 0 and not rows:
        verdict = SweepVerdict("FAIL", f"the test job exited with {code}")
    return Result([h.address for h in cfg.hosts], header, rows, transport, links, verdict, code, capture.tail)


@dataclass
class PairResult:
    pair: tuple[int, int]
    result: Result

    @property
    def busbw(self) -> float | None:
        rows = self.result.rows
        return max(rows, key=lambda r: r["bytes"])["busbw"] if rows else None


def suspects(pairs: list[PairResult], n: int) -> list[int]:
    """Hosts in every slow pair: a pair is slow below 70% of the best pair's busbw."""
    speeds = [p.busbw or 0.0 for p in pairs]
    if not speeds or max(speeds) == 0:
        return []
    slow = [p for p, s in zip(pairs, speeds) if s < 0.7 * max(speeds)]
    if not slow:
        return []
    return [h for h in range(n) if all(h in p.pair for p in slow)]


def pairwise(config: ClusterConfig, size: int, iters: int = 0, reporter: Reporter | None = None) -> list[PairResult]:
    n = len(config.hosts)
    if n < 2:
        raise DockerlaunchError("--pairwise needs at least 2 hosts")
    out = []
    for i, j in combinations(range(n), 2):
        out.append(PairResult((i, j), run(config, size, size, iters, hosts=[i, j], reporter=reporter)))
    return out
