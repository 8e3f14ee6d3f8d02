"""Issue 43's first goal on the real image: a thin push after a bump costs about what its new layers cost.

One sim node holds OLD (the real CUDA image, pushed to it once, unstaged). Each repeat makes NEW = OLD + one layer
of --top-mb random bytes (an ms-swift bump's shape), and measures, interleaved (in --routes' order, reversed
every other repeat, so no route always runs first):

  registry   thin push of NEW onto the node, the new layer read through the launcher's registry
             (DOCKERLAUNCH_LAYER_SOURCE=cache: the route the default takes once the registry holds OLD, issue 58)
  save       the same push with DOCKERLAUNCH_LAYER_SOURCE=save (docker save reads the whole image; today's route)
  alone      a full push of an image made of exactly that new layer (FROM scratch, the same bytes): the goal's basis
  pull       the anchor: the engine's own push of NEW into the launcher's registry, then `docker pull` on the node
             through an SSH port forward (registry_pull.py); NEW of its own, so the registry lacks its layer

each with wall time, the launcher engine's reads (rchar of this machine's dockerd and containerd) and the
launcher's CPU seconds (this process and its children). Before the repeats, the first thin push of the lineage
fills the launcher's registry with OLD's layers (once per base; reported on its own); with the pull route, the
node's first pull after OLD's `docker load` is reported on its own too (moby#46664: a classic engine downloads
every layer again). zstd, star; with --rates
the launcher's uplink (the sim bridge) and the node's egress are shaped (tc tbf) once OLD is on the node, each
repeat measuring every route at every rate in turn.

  .venv/bin/python benchmarks/thin_push.py --old IMAGE [--top-mb 256] [--runs 3] [--rates 100mbit,200mbit]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import cpu, drop, engine_reads, tc
from registry_pull import into_registry, launcher_registry, pull

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import cache_server, image_facts, push, staging


@dataclass
class Pulled:
    bytes_sent: int  # what the registry served
    detail: str


def measured(fn) -> tuple[float, int, float, object]:
    """(seconds, engine bytes read, launcher CPU seconds, what fn returned)."""
    r0, c0, t0 = engine_reads(), cpu(), time.monotonic()
    out = fn()
    return time.monotonic() - t0, engine_reads() - r0, cpu() - c0, out


def layer_file(tmp: Path, mb: int) -> Path:
    path = tmp / "top.bin"
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    return path


def build(tmp: Path, base: str, nonce: str) -> str:
    tag = f"dlbench/thin-{nonce}:{'alone' if base == 'scratch' else 'new'}"
    (tmp / "Dockerfile").write_text(f"FROM {base}\nCOPY top.bin /opt/top-{nonce}.bin\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp)], check=True, capture_output=True)
    return tag


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--top-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--routes", default="registry,save,alone",
                    help="which to measure (save needs the image's size again free: 20.10's docker save writes "
                         "a temporary copy under /var/lib/docker)")
    ap.add_argument("--rates", default="", help="shape the launcher's uplink and the node's egress to each in turn, "
                    "e.g. 100mbit,200mbit (default: unshaped)")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.252.0/24")
    args = ap.parse_args()
    if cache_server.unavailable(image_facts.local_image(engine(), args.old)):
        raise SystemExit(f"thin_push: {cache_server.unavailable(image_facts.local_image(engine(), args.old))}")
    client = engine()
    old = image_facts.local_image(client, args.old)
    free = shutil.disk_usage("/var/lib/docker").free
    # the node's copy and its load's, the registry (and the download of a first pull after a load)
    need = ((3.6 if "save" in args.routes else 2.6) + (0.5 if "pull" in args.routes else 0)) * old.size
    if free < need:
        raise SystemExit(f"{free / 1e9:.0f} GB free; this needs about {need / 1e9:.0f} GB")
    os.environ["DOCKERLAUNCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="dlbench-thin-cache-")  # an empty registry
    tmp = Path(tempfile.mkdtemp(prefix="dlbench-thin-"))
    made: list[str] = []
    routes = args.routes.split(",")
    unknown = sorted(set(routes) - {"registry", "save", "alone", "pull"})
    if unknown:
        raise SystemExit(f"thin_push: --routes {','.join(unknown)}: not a route (registry, save, alone, pull)")
    rates = args.rates.split(",") if args.rates else [""]
    rows: dict[str, list[tuple[float, int, float, object]]] = {f"{k} {r}".strip(): [] for r in rates for k in routes}
    remote = None
    bridge = ""
    try:
        cfg = load_config(sim.create(nodes=1, cluster=args.cluster, subnet=args.subnet))
        remote = Remote(resolve_target(cfg.hosts[0], cfg.ssh))
        os.environ[staging.STAGE_MIN_ENV] = str(1 << 50)  # OLD unstaged: the disk holds no second copy
        r = push.push_to_host(client, remote, old, compress="zstd", thin=False)
        assert r.status == "pushed", r
        os.environ.pop(staging.STAGE_MIN_ENV)
        bridge = "br-" + client.networks.get(sim.network_name(args.cluster)).id[:12]

        def shape(rate: str) -> None:
            tc(bridge, rate or None)
            sim.shape(args.cluster, rate or None)

        def thin(ref: str, source: str):
            os.environ[cache_server.MODE_ENV] = source
            try:
                res = push.push_to_host(client, remote, image_facts.local_image(client, ref), compress="zstd")
            finally:
                os.environ.pop(cache_server.MODE_ENV)
            assert res.status == "pushed" and "thin:" in res.detail, res
            return res

        def by_pull(ref: str) -> Pulled:
            with launcher_registry() as reg:
                seconds, served = pull(cfg, remote, reg.port, reg.password, into_registry(client, reg, ref), ref)
            return Pulled(served, f"pulled in {seconds:.1f} s")

        layer_file(tmp, args.top_mb)
        first = build(tmp, args.old, secrets.token_hex(3))
        made.append(first)
        t, rd, c, res = measured(lambda: thin(first, "cache"))
        print(f"first thin push of the lineage (fills the launcher's registry with OLD): {t:.0f} s, engine read "
              f"{rd / 1e9:.2f} GB, {c:.0f} CPU-s; {res.detail}", flush=True)
        drop(remote, first)
        if "pull" in routes:
            t, rd, c, res = measured(lambda: by_pull(first))
            print(f"first pull after OLD's docker load (unshaped; moby#46664): {t:.0f} s, {res.bytes_sent / 1e9:.2f}"
                  f" GB served, engine read {rd / 1e9:.2f} GB, {c:.0f} CPU-s", flush=True)
            drop(remote, first)
        for run in range(args.runs):
            # the routes in turn, the order reversed every other repeat: none always goes first (a cold page
            # cache, a registry or disk the route before it left busy) or last
            order = routes if run % 2 == 0 else routes[::-1]
            for rate in rates:  # a NEW of its own for each: the registry would hold an earlier NEW's layer
                layer_file(tmp, args.top_mb)
                nonce = secrets.token_hex(3)
                new, alone = build(tmp, args.old, nonce), build(tmp, "scratch", nonce)
                made += [new, alone]
                shape(rate)
                at = f" {rate}".rstrip()
                for route in order:
                    if route == "registry":
                        rows["registry" + at].append(measured(lambda new=new: thin(new, "cache")))
                        drop(remote, new)
                    elif route == "save":
                        rows["save" + at].append(measured(lambda new=new: thin(new, "save")))
                        drop(remote, new)
                    elif route == "alone":
                        rows["alone" + at].append(measured(lambda alone=alone: push.push_to_host(
                            client, remote, image_facts.local_image(client, alone), compress="zstd")))
                        drop(remote, alone)
                    elif route == "pull":
                        pnew = build(tmp, args.old, nonce + "p")  # its own layer: the registry holds NEW's
                        made.append(pnew)
                        rows["pull" + at].append(measured(lambda pnew=pnew: by_pull(pnew)))
                        drop(remote, pnew)
            print(f"repeat {run + 1} ({', '.join(order)}): " +
                  "  ".join(f"{k}: {v[-1][0]:.1f} s, read {v[-1][1] / 1e9:.2f} GB, {v[-1][2]:.1f} CPU-s"
                            for k, v in rows.items()), flush=True)
    finally:
        if bridge:
            tc(bridge, None)  # the node's egress goes with the cluster
        if remote is not None:
            drop(remote, args.old, *made)
            remote.close()
        sim.remove(args.cluster, quiet=True)
        for ref in made:
            subprocess.run(["docker", "rmi", ref], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.environ["DOCKERLAUNCH_CACHE_DIR"], ignore_errors=True)
    med = {k: statistics.median(t for t, _, _, _ in v) for k, v in rows.items()}
    print(f"\nOLD {args.old} ({old.size / 1e9:.2f} GB); NEW = OLD + {args.top_mb} MiB; links "
          f"{args.rates or 'unshaped'}; median of {args.runs}")
    for k, v in rows.items():
        times = [t for t, _, _, _ in v]
        sent = statistics.median(res.bytes_sent for _, _, _, res in v) / 1e9
        print(f"{k:9} {med[k]:6.1f} s (spread {min(times):.1f}-{max(times):.1f}), engine read "
              f"{statistics.median(r for _, r, _, _ in v) / 1e9:.2f} GB, "
              f"{statistics.median(c for _, _, c, _ in v):.1f} CPU-s, {sent:.2f} GB sent, "
              f"{statistics.median(c / max(res.bytes_sent / 1e9, 1e-9) for _, _, c, res in v):.1f} CPU-s per GB sent")
    for rate in rates:
        at = f" {rate}".rstrip()
        for a, b, goal in (("registry", "alone", " (goal <= 1.3)"), ("save", "alone", ""), ("registry", "save", ""),
                           ("pull", "alone", ""), ("registry", "pull", "")):
            if a + at in med and b + at in med:
                ratios = sorted(x[0] / y[0] for x, y in zip(rows[a + at], rows[b + at]))
                print(f"{a} / {b}{at or ' unshaped'} {med[a + at] / med[b + at]:.2f} x{goal} "
                      f"(per repeat {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
