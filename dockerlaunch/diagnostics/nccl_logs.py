"""Reading a job's NCCL logs off its hosts: the transport table of `transport`, and the watcher `up` runs.

The logs sit in each host's diagnostics folder (plan.diag_dir, mounted into the job's containers), so they
outlive the containers: `transport` works for a finished job until the next `up` of that job empties them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dockerlaunch import hints
from dockerlaunch.backends.docker.session import Session, open_session
from dockerlaunch.container import Deferred
from dockerlaunch.diagnostics import script
from dockerlaunch.diagnostics.transport import HostTransport, describe, judge, parse_hosts
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.hosts.fleet import Host, each
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import JobPlan, diag_dir
from dockerlaunch.reporting import Reporter
from dockerlaunch.verdict import Finding, Verdict

WATCH_WINDOW = 60.0  # `up` prints the transport table within this long of the start
WATCH_EVERY = 5.0
MAX_NCCL_WARNINGS = 3  # per host


def split_files(text: str) -> list[str]:
    """nccl_logs.sh output -> one text per log file."""
    files: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("==> "):
            files.append([])
        elif files:
            files[-1].append(line)
    return ["\n".join(f) for f in files]


def read_host(h: Host, where: str) -> list[str]:
    r = h.remote.check(["sh", "-c", script("nccl_logs.sh"), "sh", where, str(h.rank)], "reading NCCL logs",
                       timeout=60)
    return split_files(r.stdout)


@dataclass
class TransportReport:
    hosts: list[tuple[int, str, HostTransport | None, str | None]]  # rank, address, transport, error
    findings: list[Finding]

    def to_dict(self) -> dict:
        return {
            "hosts": [{"rank": r, "host": a, "summary": describe(t) if t else None, "error": e,
                       **({"transport": t.to_dict()} if t else {})} for r, a, t, e in self.hosts],
            "findings": [{"level": str(f.verdict), "host": f.host, "message": f.detail} for f in self.findings],
        }


def ib_ports(plan: JobPlan, rank: int) -> list[str] | None:
    """The ACTIVE InfiniBand ports the launcher saw on a host (NCCL_IB_HCA it set), None when not known."""
    value = plan.hosts[rank].container.env.get("NCCL_IB_HCA")
    if value is None or isinstance(value, Deferred):
        return None
    return [p for p in value.split(",") if p]


def read_transport(cluster_hosts: list[Host], plan: JobPlan, where: str,
                   ib_active: dict[int, list[str] | None] | None = None,
                   doctor: str = hints.dockerlaunch("doctor", hint="transport.doctor")) -> TransportReport:
    """`doctor`: the user's own `dockerlaunch doctor` (same --config), which a finding asks to run again."""
    ipc = plan.hosts[0].container.ipc
    results = each(lambda h: read_host(h, where), cluster_hosts)
    texts: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for h, o in zip(cluster_hosts, results):
        key = f"{h.rank}"
        texts[key] = o.value if o.ok else []
        if not o.ok:
            errors[key] = str(o.error)
    parsed = parse_hosts(texts)
    rows, findings = [], []
    multi = plan.nnodes > 1 and not all(hp.host.local for hp in plan.hosts)  # `local` "hosts" share one machine
    for h, t in zip(cluster_hosts, parsed):
        address = plan.hosts[h.rank].address
        t.host = address
        ports = (ib_active or {}).get(h.rank) if ib_active is not None else ib_ports(plan, h.rank)
        rows.append((h.rank, address, t, errors.get(f"{h.rank}")))
        # said once per machine: `local` "hosts" share one, and each would name its own example channel
        findings += [f for f in judge(t, ports, multi_host=multi, ipc=ipc, doctor=doctor)
                     if not any((g.verdict, g.host) == (f.verdict, f.host) for g in findings)]
    return TransportReport(rows, findings)


def unreadable(config: ClusterConfig) -> str | None:
    """Why NCCL's transport lines cannot be in the job's folder, from the config alone."""
    env = config.container.env
    if not config.diagnostics.nccl_log:
        return "diagnostics.nccl_log is off"
    level = env.get("NCCL_DEBUG")
    if level is not None and level.upper() not in ("INFO", "TRACE"):
        return f"container.env NCCL_DEBUG={level} hides NCCL's transport lines (remove it: INFO goes to files)"
    where = env.get("NCCL_DEBUG_FILE")
    if where is not None and not where.startswith(diag_dir(config) + "/nccl/"):
        return f"container.env NCCL_DEBUG_FILE={where} is not in the job's diagnostics folder (remove it)"
    return None


def transport(config: ClusterConfig) -> TransportReport:
    """`dockerlaunch transport`: the table for a running or finished job."""
    from dockerlaunch.backends.docker import probe as probelib
    from dockerlaunch.backends.docker.session import master_addr_of

    session = open_session(config)
    try:
        master = master_addr_of(session)
        probes = session.fleet.each(lambda h: probelib.probe(h.remote, master))
        ib = {h.rank: (o.value.ib_active if o.ok else None) for h, o in zip(session.fleet.hosts, probes)}
        report = read_transport(session.fleet.hosts, session.plan, diag_dir(session.plan.config), ib,
                                config.invocation.command("doctor", hint="transport.doctor"))
        why = unreadable(session.plan.config)
        if why and not any(t and t.seen for _, _, t, _ in report.hosts):
            raise DockerlaunchError(f"no NCCL transport lines: {why}; then start the job again")
        return report
    finally:
        session.close()


def report_to(reporter: Reporter, report: TransportReport, prefix: str = "transport") -> None:
    for rank, address, t, err in report.hosts:
        if err:
            reporter.say(f"{prefix} rank {rank} ({address}): could not read NCCL logs: {err}", "bold yellow")
        elif t is not None:
            reporter.say(f"{prefix} rank {rank} ({address}): {describe(t)}")
            # NCCL's own warnings now go to the log files, not the console: the first few are said here
            for w in t.nccl_warnings[:MAX_NCCL_WARNINGS]:
                reporter.say(f"{prefix} rank {rank} ({address}): NCCL WARN {w}", "bold yellow")
    for f in report.findings:
        reporter.say(f"{f.verdict}: {f.host}: {f.detail}", "bold red" if f.verdict == Verdict.FAIL else "bold yellow")


def watch_transport(session: Session, plan: JobPlan, reporter: Reporter, stop: threading.Event,
                    window: float = WATCH_WINDOW, every: float = WATCH_EVERY) -> None:
    """Run by `up` beside the job: one transport line per host as soon as every host's NCCL has connected
    (or at `window`), warnings with them. Silent for jobs without NCCL (gloo, CPU)."""
    if plan.diag_dir is None:
        return
    why = unreadable(session.plan.config)
    if why:
        reporter.say(f"transport: not watched: {why}", "dim")
        return
    deadline = time.monotonic() + window
    while True:
        last = stop.wait(every) or time.monotonic() >= deadline
        try:
            report = read_transport(session.fleet.hosts, plan, plan.diag_dir,
                                    doctor=session.config.invocation.command("doctor", hint="transport.doctor"))
        except Exception:  # noqa: BLE001 - a watcher must never disturb the job
            return
        seen = [t for _, _, t, _ in report.hosts if t is not None and t.seen]
        connected = all(t is not None and (t.intra or t.inter) for _, _, t, _ in report.hosts)
        if seen and (connected or last):
            report_to(reporter, report)
            return
        if last:
            return
