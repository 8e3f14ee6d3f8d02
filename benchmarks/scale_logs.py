"""Scale, logs: is any line of N ranks lost, duplicated, out of order or under the wrong rank, in up's stream, in
its per-rank files, or in `logs` afterwards?

For each size N (`harness.sizes`): every rank prints --lines numbered lines (`r<rank> <i>`); read from up's own
stream (`up --keep`), from up's per-rank log files and from `logs` afterwards: lines lost, duplicated, out of order
or under the wrong rank, per rank; and how often the engines' dockerd logged "logs may be truncated" (moby's 10 s
log-copier timeout) meanwhile. Target: no lost line, each rank's lines in order (no floor: a count, not a time).

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale_logs.py --hosts 8,64,256 [--lines 20000] [--logs-tty config|on|off] [--json F]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import sys
import time
from pathlib import Path

from harness import sizes
from harness.direct import (
    ENGINE_TRUNCATED,
    JOB_LABEL,
    engine_log_count,
    engine_log_marks,
    job_containers,
    remove_by_label,
)
from harness.sizes import Ctx, variant_config


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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lines", type=int, default=20000, help="numbered lines per rank for the logs step")
    ap.add_argument("--logs-tty", choices=["config", "on", "off"], default="config",
                    help="container.tty for the logs step (config: what the cluster config says)")


if __name__ == "__main__":
    parser = sizes.arguments(__doc__)
    add_arguments(parser)
    sys.exit(sizes.main(parser.parse_args(), [("logs", step_logs)], only_run=True))
