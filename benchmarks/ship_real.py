"""The real CUDA image to a host, and an ms-swift bump after it (issue: ship), measured in one run.

  hand pipeline   docker save OLD | zstd -T0 | ssh node 'zstd -dc | docker load'   (OpenSSH)
  push            dockerlaunch's star push of OLD (zstd, staged on the host, over OpenSSH)  goal <= 1.0 x hand
  delta bundle    `save NEW --base OLD` / `save NEW`: bytes; the delta loaded onto the host that has OLD
  thin push       NEW (OLD + an ms-swift bump) onto the host that has OLD: bytes sent / NEW's bytes
  resume          a push of OLD cut at 50% of its bytes, pushed again: bytes sent again / OLD's

NEW is what `benchmarks/build_cuda.py --scenarios bump` builds (the stack with ms-swift 4.5.3, transformers 5.16.1,
peft 0.20.0, locked again and built: only the top layers change). One sim node on the sim bridge, unshaped; the
node holds OLD, then NEW's new layers, and during each load the engine's temporary copy and the staged stream:
the script checks for 3.5 x OLD's size free first.

Run (root, dockerd up, both images built):
  .venv/bin/python benchmarks/ship_real.py --old dockerlaunch/train:cu130-... --new dockerlaunch/train:cu130-...
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import drop, ssh_argv, timed
from ship import cut_then_push

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import bundle as bundlelib
from dockerlaunch.transfer import image_facts, push, staging


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the image the host has (e.g. the built CUDA stack)")
    ap.add_argument("--new", required=True, help="the same stack after an ms-swift bump")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.253.0/24")
    args = ap.parse_args()
    client = engine()
    old, new = image_facts.local_image(client, args.old), image_facts.local_image(client, args.new)
    free = shutil.disk_usage("/var/lib/docker").free
    if free < 3.5 * old.size:
        raise SystemExit(f"{free / 1e9:.0f} GB free under /var/lib/docker; this needs about "
                         f"{3.5 * old.size / 1e9:.0f} GB (the node's copy, its load's temporary copy, the stage)")
    work = Path(tempfile.mkdtemp(prefix="dlbench-ship-real-"))
    rows: list[tuple[str, str, str]] = []
    remote = None
    try:
        cfg = load_config(sim.create(nodes=1, cluster=args.cluster, subnet=args.subnet))
        remote = Remote(resolve_target(cfg.hosts[0], cfg.ssh))
        ssh = ssh_argv(cfg, remote)
        hand = f"docker save {old.id} | zstd -q -T0 | {' '.join(ssh)} 'zstd -dc | docker load'"
        t_hand = timed(lambda: subprocess.run(["sh", "-c", hand], check=True, capture_output=True))
        drop(remote, args.old, old.id)
        os.environ.pop(staging.STAGE_MIN_ENV, None)  # the real threshold: a 7.7 GB image is staged
        pushed = []
        t_push = timed(lambda: pushed.append(push.push_to_host(client, remote, old, compress="zstd", thin=False)))
        r = pushed[0]
        assert r.status == "pushed", r
        rows.append(("push of OLD / hand pipeline", f"{t_push:.0f} s / {t_hand:.0f} s",
                     f"{t_push / t_hand:.2f} x (goal <= 1.0); {r.bytes_sent / 1e9:.2f} GB sent for a "
                     f"{old.size / 1e9:.2f} GB image; {r.detail}"))
        full, delta = work / "new.dlb", work / "new.delta"
        t_full = timed(lambda: bundlelib.save_bundle(client, [args.new], full))
        t_delta = timed(lambda: bundlelib.save_bundle(client, [args.new], delta, base=args.old))
        rows.append(("delta bundle NEW --base OLD / full bundle of NEW",
                     f"{delta.stat().st_size / 1e6:.0f} MB / {full.stat().st_size / 1e6:.0f} MB",
                     f"{delta.stat().st_size / full.stat().st_size:.3f} x (written in {t_delta:.0f} s / "
                     f"{t_full:.0f} s)"))
        loader, runner = bundlelib.remote_loader(remote), bundlelib.remote_runner(remote)
        t_load = timed(lambda: bundlelib.load_bundle(delta, loader, runner))
        got = remote.run(["docker", "image", "inspect", "--format", "{{.Id}}", args.new]).stdout.strip()
        assert got == new.id, (got, new.id)
        rows.append(("load of the delta onto the host that has OLD", f"{t_load:.0f} s",
                     f"NEW's Image ID {new.id[7:19]} checked on the host"))
        remote.run(["docker", "rmi", args.new], timeout=300)  # OLD keeps the shared layers
        full.unlink()
        delta.unlink()  # their GBs are the stage's, below
        thin = []
        t_thin = timed(lambda: thin.append(push.push_to_host(client, remote, new, compress="zstd", thin=True)))
        r = thin[0]
        assert r.status == "pushed", r
        rows.append(("thin push of NEW onto OLD", f"{r.bytes_sent / 1e6:.0f} MB in {t_thin:.0f} s",
                     f"{r.bytes_sent / new.size:.3f} x NEW's {new.size / 1e9:.2f} GB; {r.detail}"))
        # a push of OLD cut at 50% of its bytes (uncompressed, so the fraction is the image's), then again
        drop(remote, args.old, args.new, old.id, new.id)
        first, tagged, again = cut_then_push(client, remote, old, 0.5)
        got = remote.run(["docker", "image", "inspect", "--format", "{{.Id}}", args.old]).stdout.strip()
        assert first.status == "failed" and not tagged and again.status == "pushed" and got == old.id, \
            (first, tagged, again, got)
        how = next((x for x in again.detail.split(", ") if x.startswith("resumed")), "not resumed")
        rows.append(("push of OLD cut at 50%, then again", f"{again.bytes_sent / 1e9:.2f} GB sent again",
                     f"{again.bytes_sent / old.size:.2f} x the image ({how}; nothing tagged after the cut; "
                     f"Image ID checked)"))
    finally:
        if remote is not None:
            drop(remote, args.old, args.new)
            remote.close()
        sim.remove(args.cluster, quiet=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"OLD {args.old} ({old.size / 1e9:.2f} GB), NEW {args.new} ({new.size / 1e9:.2f} GB); one sim node")
    for what, took, ratio in rows:
        print(f"{what:<50} {took:<26} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
