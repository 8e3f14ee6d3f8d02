"""Issue 58, item 6: the first push of a new image must not cost more than a full push of the same image.

Topology (the issue's demo): this machine is the launcher; --nodes sim nodes (default 2, star) are seeded with BASE
(default: the sim's demo image, torch CPU, 1.2 GB). NEW = BASE + --top-kb of random bytes (default 2 kB: the demo's
change). Every push is the CLI as a user runs it (`dockerlaunch push NEW --config CFG --output json`), the hosts
made to lack NEW again before each. Each repeat measures, in one run:

  thin, cold cache   the default: a layer cache that never saw BASE. push_plan.choose_route takes docker save (one
                     read of the image per stream and one for its layer map) and the push starts a fill of the
                     cache in the background once its hosts are done; that fill is timed on its own, after
  thin, forced fill  the route before issue 58, on a cache that never saw BASE (DOCKERLAUNCH_LAYER_SOURCE=cache):
                     the engine reads and gzips the whole image into the cache before the stream starts
  full               push --full: every layer, one docker save per stream
  thin, warm cache   the default on the cache the background fill left: a NEW of its own (another --top-kb), whose
                     new layer is all the engine reads

each with wall time, the bytes this machine's engine read (`engine_reads`: rchar of its dockerd and containerd,
counted by the kernel), what each host got (the push's bytes_sent, and the most `staged_bytes` showed while it
ran, polled over SSH: a host stages images of 512 MB and more) and the route the plan gave, with its reason. The
forced fill, the full push and the warm push run in turn after the cold one, their order reversed every other
repeat; the ratios are against the full push of the same repeat. Beside them, the unit of choose_route's rule: one
`docker save NEW > /dev/null`, and the background fill's time over it (the rule takes 5, push_plan.FILL_COST).
Figures in benchmarks/RESULTS.md ("Issue 58").

  .venv/bin/python benchmarks/first_push.py [--base IMAGE] [--top-kb 2] [--nodes 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import drop, engine_reads, log, sim_cluster, spread, staged_bytes, tail

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.sim.measure import wait_fills
from dockerlaunch.transfer import image_facts

COLD, FORCED, FULL, WARM = "thin, cold cache", "thin, forced fill", "full", "thin, warm cache"


def bumped(base: str, top_kb: int, work: Path) -> str:
    tag = f"dlbench/first-{secrets.token_hex(4)}:1"
    ctx = work / tag.split("/")[1].replace(":", "-")
    ctx.mkdir()
    (ctx / "top.bin").write_bytes(os.urandom(top_kb << 10))
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY top.bin /opt/{tag[-10:-2]}.bin\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    return tag


class StagePoll:
    """The most each host showed staged while a push ran (staged_bytes over SSH, every 0.2 s)."""

    def __init__(self, remotes: list[Remote]):
        self.remotes, self.most = remotes, [0] * len(remotes)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for i, r in enumerate(self.remotes):
                self.most[i] = max(self.most[i], staged_bytes(r))
            self.stop.wait(0.2)

    def __enter__(self) -> StagePoll:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def push(cfg: Path, ref: str, remotes: list[Remote], cache: Path, *args: str, **env: str) -> dict:
    """One `dockerlaunch push` through the CLI: its wall time, what the launcher's engine read meanwhile, what each
    host got and staged, and the JSON it printed."""
    for r in remotes:
        drop(r, ref)
    e = {**os.environ, "DOCKERLAUNCH_CACHE_DIR": str(cache), **env}
    with StagePoll(remotes) as staged:
        r0, t0 = engine_reads(), time.monotonic()
        p = subprocess.run([sys.executable, "-m", "dockerlaunch", "push", ref, "--config", str(cfg), "--output",
                            "json", *args], capture_output=True, text=True, env=e)
        took, read = time.monotonic() - t0, engine_reads() - r0
    if p.returncode != 0:
        raise SystemExit(f"first_push: push {ref} {' '.join(args)} failed: {tail(p.stdout + p.stderr)}")
    out = json.loads(p.stdout)
    return {"seconds": took, "read": read, "sent": [h["bytes_sent"] for h in out["hosts"]], "staged": staged.most,
            "route": out["layer_route"], "fill": out["cache_fill"], "hosts": out["hosts"]}


def waited_fill(pid: int) -> tuple[float, int]:
    """(seconds, engine bytes read) until the background fill `pid` ended."""
    r0, t0 = engine_reads(), time.monotonic()
    left = wait_fills(timeout=1800, pids=[pid])
    if left:
        raise SystemExit(f"first_push: the background fill (pid {pid}) still runs after 30 min")
    return time.monotonic() - t0, engine_reads() - r0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="", help="the image the hosts have (default: the sim's demo image)")
    ap.add_argument("--top-kb", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.246.0/24")
    args = ap.parse_args()
    client = engine()
    base = args.base or sim.build_demo_image()
    size = image_facts.local_image(client, base, facts=False).size
    work = Path(tempfile.mkdtemp(prefix="dlbench-first-"))
    made: list[str] = []
    rows: dict[str, list[dict]] = {COLD: [], FORCED: [], FULL: [], WARM: []}
    fills: list[tuple[float, int]] = []
    saves: list[tuple[float, int]] = []
    remotes: list[Remote] = []
    try:
        log(f"a {args.nodes}-node sim seeded with {base} ({size / 1e9:.2f} GB)")
        with sim_cluster(args.cluster, nodes=args.nodes, subnet=args.subnet, seed_images=(base,)) as cfg_path:
            cfg = load_config(str(cfg_path))
            remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
            for run in range(args.runs):
                new = bumped(base, args.top_kb, work)
                made.append(new)
                warm_cache = work / f"cache-{run}-cold"  # the cold push's, which its background fill fills
                got = push(cfg_path, new, remotes, warm_cache)
                rows[COLD].append(got)
                if not got["fill"]:
                    raise SystemExit(f"first_push: the cold push started no fill: {got['route']}")
                fills.append(waited_fill(got["fill"]["pid"]))
                r0, t0 = engine_reads(), time.monotonic()
                subprocess.run(["docker", "save", new], check=True, stdout=subprocess.DEVNULL)
                saves.append((time.monotonic() - t0, engine_reads() - r0))
                log(f"repeat {run + 1}: {COLD} {got['seconds']:.1f} s ({got['route']['route']}), then its fill "
                    f"{fills[-1][0]:.1f} s")
                steps = [FORCED, FULL, WARM] if run % 2 == 0 else [WARM, FULL, FORCED]
                for step in steps:
                    if step == FORCED:
                        got = push(cfg_path, new, remotes, work / f"cache-{run}-forced",
                                   DOCKERLAUNCH_LAYER_SOURCE="cache")
                    elif step == FULL:
                        got = push(cfg_path, new, remotes, work / f"cache-{run}-full", "--full")
                    else:
                        newer = bumped(base, args.top_kb, work)
                        made.append(newer)
                        got = push(cfg_path, newer, remotes, warm_cache)
                    rows[step].append(got)
                    log(f"repeat {run + 1}: {step} {got['seconds']:.1f} s ({got['route']['route']})")
                for ref in made[-2:]:
                    for r in remotes:
                        drop(r, ref)
    finally:
        for r in remotes:
            r.close()
        for ref in made:
            subprocess.run(["docker", "rmi", ref], capture_output=True)
        wait_fills(timeout=600)
        shutil.rmtree(work, ignore_errors=True)
    mb = 1e6
    print(f"\nBASE {base} ({size / 1e9:.2f} GB) on {args.nodes} sim node(s), star; NEW = BASE + {args.top_kb} kB; "
          f"{args.runs} repeat(s), median (spread)")
    print("| push | wall time | engine read | sent per host | staged per host (most) | route | / full |")
    print("|---|---|---|---|---|---|---|")
    full = [r["seconds"] for r in rows[FULL]]
    for step in (COLD, FORCED, FULL, WARM):
        got = rows[step]
        ratios = sorted(r["seconds"] / f for r, f in zip(got, full))
        print(f"| {step} | {spread([r['seconds'] for r in got])} s | "
              f"{spread([r['read'] / mb for r in got], '{:.0f}')} MB | "
              f"{statistics.median(s for r in got for s in r['sent']) / mb:.3f} MB | "
              f"{statistics.median(s for r in got for s in r['staged']) / mb:.3f} MB | {got[0]['route']['route']} | "
              f"{statistics.median(ratios):.2f} x ({', '.join(f'{x:.2f}' for x in ratios)}) |")
    print(f"| the background fill after the cold push (no one waits for it) | {spread([f for f, _ in fills])} s | "
          f"{spread([r / mb for _, r in fills], '{:.0f}')} MB | | | | |")
    print(f"| one docker save of NEW (the rule's unit) | {spread([t for t, _ in saves])} s | "
          f"{spread([r / mb for _, r in saves], '{:.0f}')} MB | | | | |")
    per = sorted(f / t for (f, _), (t, _) in zip(fills, saves))
    print(f"\nthe fill / one docker save: {statistics.median(per):.1f} x ({', '.join(f'{x:.1f}' for x in per)}); "
          "choose_route takes 5 (push_plan.FILL_COST)")
    print(f"route of the cold push: {rows[COLD][0]['route']['reason']}")
    print(f"route of the warm push: {rows[WARM][0]['route']['reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
