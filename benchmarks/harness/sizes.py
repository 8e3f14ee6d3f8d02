"""Scale: the launcher against 8, 64, 256 hosts, each step the real CLI, against floors measured in the same run --
the method every scale question shares (benchmarks/scale_*.py each ask one; benchmarks/scale.py asks them all in
one run per size, for the growth table).

Hosts come from a light sim cluster (`harness.direct`), or from a cluster given with --config FILE --cluster NAME
(a regular sim: every node its own engine). For each size N, in one run (every launcher step is `.venv/bin/dockerlaunch
...` as a subprocess, sampled every 50 ms for peak RSS (VmHWM), threads and open fds, children included:
`harness.launcher`), the question's steps -- each in its script: doctor (scale_doctor.py), up_status_down
(scale_up.py), failfast (scale_failfast.py), hostloss (scale_hostloss.py), logs (scale_logs.py) -- and where the
question compares with one, the floor:
  floor      no launcher: N containers started concurrently with the docker CLI straight on the engines
             (`docker exec ENGINE docker run -d --network host ...`, one thread per host), then removed the same
             way (`docker rm -f`); measured before the launcher's steps and again after them, the faster of the two

Targets (judged at every size; the issue sets them at 256 hosts): up <= 1.5 x floor; fail-fast teardown <= 1.5 x
floor and <= 10 s after the rank's exit; the frozen host named within host_timeout + 5 s; launcher peak RSS
< 500 MB; open fds < 1024; no lost line and each rank's lines in order.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from harness import REPO, log, ratio, tail
from harness.direct import (
    ENGINE_TRUNCATED,
    JOB_LABEL,
    Cluster,
    containers_by_label,
    discover,
    on_engine,
    remove_by_label,
    start_cluster,
)
from harness.launcher import LAUNCHER, RUNNING, Launch

FLOOR_LABEL = "bsscale.floor"
HOST_TIMEOUT = 10.0

TARGETS = {  # (metric key, description)
    "up_ratio": "up <= 1.5 x floor",
    "failfast_ratio": "fail-fast teardown <= 1.5 x floor",
    "failfast_teardown": "fail-fast teardown <= 10 s after the rank's exit",
    "hostloss": f"frozen host named <= host_timeout + 5 s ({HOST_TIMEOUT + 5:g} s)",
    "rss": "launcher peak RSS < 500 MB",
    "fds": "launcher open fds < 1024",
    "logs": "no lost line, each rank's lines in order",
}


class StepFailed(Exception):
    """A step's own check failed: recorded with the step, and the next step goes on."""


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


def variant_config(ctx: Ctx, **sections) -> Path:
    data = yaml.safe_load(ctx.cluster.config.read_text())
    for key, value in sections.items():
        data[key] = {**(data.get(key) or {}), **value}
    path = ctx.scratch / f"cfg-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


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


Step = tuple[str, Callable[["Ctx"], dict]]
FLOOR_BEFORE: Step = ("floor1", lambda c: step_floor(c, "a"))  # before the launcher's steps ...
FLOOR_AFTER: Step = ("floor2", lambda c: step_floor(c, "b"))  # ... and after them: the faster of the two counts


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


def run_size(n: int | None, index: int, args, steps: list[Step]) -> dict:
    """One size: its cluster (started here unless --config), `steps` in order, each recorded (a failed step too:
    the next one goes on), then everything this run started taken down."""
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
        only = set(args.steps.split(",")) if getattr(args, "steps", None) else None
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
        f["up_ratio"] = ratio(f["up_all_running_s"], f["floor_up_s"])
    if f.get("failfast_teardown_s") is not None and f.get("floor_rm_s"):
        f["failfast_ratio"] = ratio(f["failfast_teardown_s"], f["floor_rm_s"])
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


def report(results: list[dict], only_run: bool = False) -> str:
    """The tables of each size (and the growth between sizes): every figure, or with `only_run` those of the steps
    that ran (a script that asks one question)."""
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
            ("doctor", "doctor", fmt(f.get("doctor_s")) + " s", "not PASS: " + (", ".join(
                f"{k} {dict(v)}" for k, v in (s.get("doctor", {}).get("not_pass") or {}).items()) or "none")),
            ("floor1", "floor: N x docker run -d, all running", fmt(f.get("floor_up_s")) + " s",
             f"docker runs returned {fmt(f.get('floor_up_wall_s'))} s; the faster of {f.get('floors')}"),
            ("up_status_down", "up --detach, all running", fmt(f.get("up_all_running_s")) + " s",
             f"{fmt(f.get('up_ratio'))} x floor; up exited {fmt(f.get('up_wall_s'))} s; up's phases: "
             f"{f.get('up_phases')}"),
            ("up_status_down", "status", fmt(f.get("status_s")) + " s", usd.get("status_problem", "N listed once each")
             if s.get("up_status_down") else "-"),
            ("up_status_down", "down", fmt(f.get("down_s")) + " s", usd.get("down_problem", "none left")
             if s.get("up_status_down") else "-"),
            ("floor1", "floor: N x docker rm -f", fmt(f.get("floor_rm_s")) + " s", ""),
            ("failfast", "fail-fast: rank exit -> none left", fmt(f.get("failfast_teardown_s")) + " s",
             f"{fmt(f.get('failfast_ratio'))} x floor rm; up exited {fmt(f.get('failfast_up_exit_s'))} s after the "
             f"rank, rc {(s.get('failfast', {}).get('up') or {}).get('rc')}"),
            ("hostloss", "host loss: pause -> named", fmt(f.get("hostloss_named_s")) + " s",
             (s.get("hostloss", {}).get("line") or s.get("hostloss", {}).get("problem") or "")[:160]),
            ("logs", "logs: up's stream", fmt(f.get("logs_up_s")) + " s",
             json.dumps({k: v for k, v in (s.get("logs", {}).get("up_stream") or {}).items()
                         if k in ("lost_total", "ranks_with_loss", "duplicates_total", "out_of_order_total",
                                  "wrong_rank")})
             + f"; the engines logged '{ENGINE_TRUNCATED}' {fmt(f.get('engine_truncated'))} times"),
            ("logs", "logs: `logs` afterwards", fmt(f.get("logs_cmd_s")) + " s",
             json.dumps({k: v for k, v in (s.get("logs", {}).get("logs_stream") or {}).items()
                         if k in ("lost_total", "duplicates_total", "out_of_order_total", "wrong_rank")})
             or s.get("logs", {}).get("logs_problem", "")),
        ]
        out.append("| measure | time | notes |")
        out.append("|---|---|---|")
        out += [f"| {a} | {b} | {c} |" for step, a, b, c in rows if not only_run or step in s]
        out.append("")
        out.append(f"targets at {res['hosts']} hosts (set for 256):")
        for k, v in res["verdicts"].items():
            if not only_run or not v.startswith("n/a"):
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
            if only_run and all(v is None for v in vals):
                continue
            ratios = [fmt(ratio(b, a)) for a, b in zip(vals, vals[1:])]
            out.append(f"| {key} | " + " | ".join(fmt(v) for v in vals) + " | " + " | ".join(ratios) + " |")
    return "\n".join(out)


class Arguments(argparse.ArgumentParser):
    def parse_args(self, *args, **kwargs):
        got = super().parse_args(*args, **kwargs)
        if bool(got.config) != bool(got.cluster):
            self.error("--config and --cluster go together")
        return got


def arguments(doc: str) -> Arguments:
    """The options every scale question takes (sizes, the cluster, timeouts, --json); a script adds its own."""
    ap = Arguments(description=doc.split("\n\n")[0])
    ap.add_argument("--hosts", default="8,64,256", help="sizes, one light sim cluster each")
    ap.add_argument("--engines", type=int, default=None, help="shared engines of the light sim (its default if unset)")
    ap.add_argument("--keep", action="store_true", help="leave the clusters (and a failed step's containers) up")
    ap.add_argument("--config", help="a cluster config of a sim cluster that is up (with --cluster)")
    ap.add_argument("--cluster", help="that cluster's name")
    ap.add_argument("--prefix", default=f"bs{secrets.token_hex(2)}-",
                    help="light cluster names: PREFIX<N> (default: bs + a random tag: dockerd may keep a removed "
                         "cluster's network, and with it the name)")
    ap.add_argument("--timeout-base", type=float, default=120.0)
    ap.add_argument("--timeout-per-host", type=float, default=3.0)
    ap.add_argument("--json", help="write every figure here")
    return ap


def main(args: argparse.Namespace, steps: list[Step], only_run: bool = False) -> int:
    """Every size in turn (`run_size`), its tables printed as it ends, the growth table at the end; --json
    rewritten after each size."""
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
            res = run_size(n, i, args, steps)
            res["figures"] = figures(res)
            res["verdicts"] = verdicts(res, res["figures"])
            results.append(res)
            print(report([res], only_run), flush=True)
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
        print(report(results, only_run).split("\n## growth\n", 1)[-1].join(["\n## growth\n", ""]))
    print(f"\n{meta['command']}; {meta['started']}; {meta['cpus']} CPUs, {meta['mem_gib']} GiB; "
          f"commit {meta['commit']}")
    return 0
