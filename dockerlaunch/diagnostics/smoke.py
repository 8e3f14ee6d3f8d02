"""`doctor --smoke` and `up --smoke`: the job's image on the hosts' GPUs, for real, in about a minute.

An ordinary `up` of a short job (`<job>-smoke`, like commtest): scripts/smoke.py under torchrun, one rank per GPU,
in the job's own containers. Its lines are judged here (pure): a wrong result or an error is a FAIL naming the rank,
host and GPU; a GPU or host slower than the median of its peers by more than 20% is named as a straggler; the
transport NCCL chose is read as `transport` reads it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from dockerlaunch import hints
from dockerlaunch.backends.docker import up as launch
from dockerlaunch.backends.docker.doctor.report import FAIL, PASS, SKIP, WARN, Report
from dockerlaunch.diagnostics import script
from dockerlaunch.diagnostics.commtest import TORCHRUN, MarkedLines, sub_config
from dockerlaunch.diagnostics.nccl_logs import TransportReport, read_transport
from dockerlaunch.diagnostics.transport import describe
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.reporting import Reporter
from dockerlaunch.verdict import Finding

MARK = "DLSMOKE "
SILENT_S = 180  # the smoke prints within seconds on any machine; this long without a line is a hang
STRAGGLER = 0.8  # slower than 80% of the median of its peers (20%): named
TIMED = {"matmul": True, "te linear": False, "flash-attn": False, "apex norm": False}  # True: higher is better


def command() -> list[str]:
    return ["sh", "-c", TORCHRUN, script("smoke.py")]


@dataclass
class SmokeResult:
    rows: list[Finding]  # each with its host; its rank is the doctor report's (add_to)
    records: list[dict]
    exit_code: int
    output_tail: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(r.verdict == FAIL for r in self.rows)


def _who(r: dict) -> str:
    gpu = f" GPU {r.get('local_rank')} ({r['gpu']})" if r.get("gpu") and r.get("gpu") != "cpu" else " (CPU)"
    return f"rank {r['rank']}{gpu}"


def stragglers(steps: list[dict], higher_is_better: bool) -> list[tuple[dict, float]]:
    """(record, ratio to the median of its peers) of every rank more than 20% slower than its peers."""
    out = []
    timed = [r for r in steps if r.get("ok") and isinstance(r.get("value"), (int, float)) and r["value"] > 0]
    for r in timed:
        peers = [p["value"] for p in timed if p is not r]
        if not peers:
            continue
        median = statistics.median(peers)
        ratio = r["value"] / median if higher_is_better else median / r["value"]
        if ratio < STRAGGLER:
            out.append((r, ratio))
    return out


def judge(records: list[dict], hosts: list[str], transport: TransportReport | None, exit_code: int,
          transport_cmd: str = hints.dockerlaunch("transport", hint="smoke.transport")) -> list[Finding]:
    """The smoke lines -> rows per host (pure). Each record carries `addr`, the host whose container printed it."""
    rows: list[Finding] = []
    steps = [r for r in records if r.get("kind") == "step"]
    where = lambda r: r.get("addr", "?")  # noqa: E731
    if not steps:
        for h in hosts:
            rows.append(Finding("smoke", FAIL, f"the smoke job printed no results (exit {exit_code}); its output is "
                                               "above", h))
        return rows
    seen_hosts = {where(r) for r in steps}
    for h in hosts:
        if h not in seen_hosts:
            rows.append(Finding("smoke", FAIL, "no rank on this host reported (the smoke job's output is above)", h))
    for name in dict.fromkeys(r["step"] for r in steps):
        these = [r for r in steps if r["step"] == name]
        for h in hosts:
            mine = [r for r in these if where(r) == h]
            if not mine:
                continue
            bad = [r for r in mine if not r.get("ok")]
            skipped = [r for r in mine if r.get("skip")]
            if bad:
                detail = "; ".join(
                    f"{_who(r)}: " + (r.get("error") or f"error {r.get('err'):.3g} above {r.get('tol')} against "
                                                          "the reference") for r in bad[:4])
                rows.append(Finding(f"smoke {name}", FAIL, detail, h))
            elif len(skipped) == len(mine):
                rows.append(Finding(f"smoke {name}", SKIP, mine[0]["skip"], h))
            else:
                vals = [r["value"] for r in mine if isinstance(r.get("value"), (int, float))]
                unit = mine[0].get("unit", "")
                span = f"{min(vals):g}" if len(set(vals)) <= 1 else f"{min(vals):g}..{max(vals):g}"
                errs = [r["err"] for r in mine if isinstance(r.get("err"), (int, float))]
                rows.append(Finding(f"smoke {name}", PASS, f"{span} {unit} on {len(mine)} rank(s)"
                                    + (f", max error {max(errs):.2g} (tolerance {mine[0].get('tol')})" if errs else ""),
                                    h))
        if name in TIMED:
            for r, ratio in stragglers(these, TIMED[name]):
                rows.append(Finding("straggler", WARN,
                                    f"{_who(r)} is {1 - ratio:.0%} slower than the median of its peers at {name} "
                                    f"({r['value']:g} {r.get('unit', '')}): every rank of the job waits for it",
                                    where(r)))
    header = next((r for r in records if r.get("kind") == "header"), {})
    if header.get("backend") == "gloo":
        rows.append(Finding("smoke transport", SKIP, "gloo over TCP (the CPU path): NCCL's transport is read where "
                                                     "the smoke runs on GPUs", hosts[0]))
    elif transport is not None:
        fails = [f.detail for f in transport.findings if f.verdict == FAIL]
        for _, address, t, error in transport.hosts:
            if fails:
                continue
            if t is None or not t.network:
                why = error or "no NCCL INFO log"
                rows.append(Finding("smoke transport", WARN, f"NCCL's transport was not read here ({why}): "
                                                             f"run `{transport_cmd}`", address))
            else:
                rows.append(Finding("smoke transport", PASS, describe(t), address))
        for message in fails:
            rows.append(Finding("smoke transport", FAIL, message, hosts[0]))
    return rows


def add_to(report: Report, result: SmokeResult, hosts: list[str]) -> None:
    """The smoke's rows into a doctor report, after its own, with each host's rank."""
    report.checks += [replace(r, rank=hosts.index(r.host) if r.host in hosts else -1) for r in result.rows]


def dry_run_text() -> str:
    """What the smoke runs on GPUs, in the script's own words (its --dry-run needs no torch)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", script("smoke.py"), "--dry-run"], capture_output=True, text=True,
                       timeout=60)
    return r.stdout.rstrip() if r.returncode == 0 else f"smoke: --dry-run failed: {r.stderr.strip()[-300:]}"


def run(config: ClusterConfig, reporter: Reporter | None = None) -> SmokeResult:
    reporter = reporter or Reporter()
    cfg = sub_config(config, None, command(), suffix="smoke")
    # a short job of its own: no restarts or spares, and a rank that says nothing for SILENT_S ends it (a hung
    # collective must not hang doctor)
    data = cfg.model_dump(mode="json")
    data["job"].update({"max_restarts": 0, "hang_timeout": SILENT_S, "progress_regex": None})
    data["spares"] = []
    cfg, invocation = ClusterConfig.model_validate(data), cfg.invocation
    cfg._invocation = invocation
    capture = MarkedLines(reporter, MARK, host_key="addr")
    holder: dict = {}

    def monitor(session, plan, rep, stop) -> None:
        """NCCL's transport, once the run ends (as `transport` reads it)."""
        stop.wait()
        try:
            if plan.diag_dir and session.config.diagnostics.nccl_log:
                doctor = session.config.invocation.command("doctor", hint="transport.doctor")
                holder["transport"] = read_transport(session.fleet.hosts, plan, plan.diag_dir, doctor=doctor)
        except Exception as e:  # noqa: BLE001 - a missing transport verdict, never a crash
            holder["error"] = str(e)

    code = launch.up(cfg, preflight=False, log_dir=None, reporter=capture, monitors=[monitor])
    hosts = [h.address for h in cfg.hosts]
    transport = config.invocation.command("transport", hint="smoke.transport")
    rows = judge(capture.records, hosts, holder.get("transport"), code, transport)
    return SmokeResult(rows, capture.records, code, capture.tail)
