"""A full push against the hand pipeline on shaped links, repeated and interleaved (issue 43, parts 2 and 4).

Topology: this machine (the launcher) and one sim node (real sshd, real dockerd); the launcher's uplink (the sim
bridge) and the node's egress shaped to each --rates entry in turn (tc tbf). Image: --size-mb of random bytes.
Each repeat, at each rate, interleaved:

  hand   docker save IMG | zstd -q -T0 | ssh node 'zstd -dc | docker load'   (OpenSSH)
  push   dockerlaunch push (star, zstd, staged on the host: resumable)         goal <= 1.0 x hand

with wall time and the launcher's CPU seconds (this process and its children) per GB of image.

  .venv/bin/python benchmarks/full_push.py [--size-mb 1024 | --image REF] [--runs 3] [--rates 100mbit,200mbit]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import time

from harness import cpu, drop, random_image, ssh_argv, tc

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import image_facts, push, staging


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--image", default="", help="push this local image instead of a random one (kept after)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rates", default="100mbit,200mbit")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.248.0/24")
    args = ap.parse_args()
    os.environ[staging.STAGE_MIN_ENV] = "0"  # staged, as a big image's push is
    client = engine()
    ref = args.image or f"dlbench/full-{secrets.token_hex(4)}:1"
    rates = args.rates.split(",")
    got: dict[tuple[str, str], list[tuple[float, float]]] = {(w, r): [] for r in rates for w in ("hand", "push")}
    remote, bridge = None, ""
    try:
        if not args.image:
            random_image(client, ref, args.size_mb)
        image = image_facts.local_image(client, ref)
        free = shutil.disk_usage("/var/lib/docker").free
        if free < 2 * image.size:  # the node's copy, its stage (compressed) and the save's temporary copy
            raise SystemExit(f"{free / 1e9:.0f} GB free; this needs about {2 * image.size / 1e9:.0f} GB")
        cfg = load_config(sim.create(nodes=1, cluster=args.cluster, subnet=args.subnet))
        remote = Remote(resolve_target(cfg.hosts[0], cfg.ssh))
        hand = f"docker save {image.id} | zstd -q -T0 | {' '.join(ssh_argv(cfg, remote))} 'zstd -dc | docker load'"
        bridge = "br-" + client.networks.get(sim.network_name(args.cluster)).id[:12]

        def measured(fn) -> tuple[float, float]:
            c0, t0 = cpu(), time.monotonic()
            fn()
            return time.monotonic() - t0, cpu() - c0

        def by_push() -> None:
            r = push.push_to_host(client, remote, image, compress="zstd", thin=False)
            assert r.status == "pushed", r

        def by_hand() -> None:
            subprocess.run(["sh", "-c", hand], check=True, capture_output=True)

        for run in range(args.runs):
            for rate in rates:
                tc(bridge, rate)
                sim.shape(args.cluster, rate)
                steps = [("hand", by_hand), ("push", by_push)]
                for what, fn in steps if run % 2 == 0 else steps[::-1]:  # which goes first alternates
                    drop(remote, ref, image.id)
                    got[what, rate].append(measured(fn))
                print(f"run {run + 1} {rate}: hand {got['hand', rate][-1][0]:.1f} s, "
                      f"push {got['push', rate][-1][0]:.1f} s", flush=True)
    finally:
        if bridge:
            tc(bridge, None)
        if remote is not None:
            drop(remote, ref)
            remote.close()
        sim.remove(args.cluster, quiet=True)
        if not args.image:
            subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
    gb = image.size / 1e9
    what = args.image or f"{args.size_mb} MiB of random bytes"
    print(f"\nimage: {what} ({gb:.2f} GB); one sim node; {args.runs} interleaved repeats")
    print("| rate | hand pipeline | push (staged, zstd) | push / hand | launcher CPU-s per GB (hand / push) |")
    print("|---|---|---|---|---|")
    for rate in rates:
        h, p = got["hand", rate], got["push", rate]
        ratios = sorted(a[0] / b[0] for a, b in zip(p, h))

        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs):.1f} s ({min(xs):.1f}-{max(xs):.1f})"

        print(f"| {rate} | {med([t for t, _ in h])} | {med([t for t, _ in p])} | "
              f"{statistics.median(ratios):.2f} x ({', '.join(f'{x:.2f}' for x in ratios)}) | "
              f"{statistics.median(c for _, c in h) / gb:.1f} / {statistics.median(c for _, c in p) / gb:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
