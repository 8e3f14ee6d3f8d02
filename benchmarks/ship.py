"""Big images to one host, measured side by side in one run (issue: ship): the push against the hand pipeline,
dockerlaunch's SSH stream against OpenSSH's, a push cut at 25/50/90% and resumed, a delta bundle after a
top-layer change, and `load` of a split bundle.

Topology: this machine (the launcher) and one sim node (real sshd, real dockerd) on the sim bridge, unshaped:
every figure is a ratio of two transfers over the same link in the same run, so the link's speed cancels out.

  hand pipeline   docker save IMG | zstd -T0 | ssh node 'zstd -dc | docker load'   (OpenSSH)
  push            dockerlaunch push (star, zstd, staged on the host)                  goal <= 1.0 x hand
                  (and again with DOCKERLAUNCH_SSH_BULK=paramiko, for reference)
  ssh stream      S bytes of zeros into `cat > /dev/null`: dockerlaunch's bulk stream (OpenSSH where its
                  probe works, else paramiko) and paramiko alone, vs OpenSSH       goal >= 0.8 x OpenSSH
  resume          the stream cut at 25/50/90% (its channel closed at that byte), pushed again: bytes sent
                  by the second push / the image's bytes                             goal <= 0.55 at 50%
  delta bundle    `save NEW --base OLD` where NEW adds a top layer: bundle bytes / full bundle bytes
  split bundle    `save --split` in parts of 1/4 of the bundle, `load` of the index vs of the whole file

Run (root, dockerd up, e.g. after scripts/install-docker):
  .venv/bin/python benchmarks/ship.py [--size-mb 1024] [--top-mb 64]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from harness import drop, random_image, save_bytes, ssh_argv, timed

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts import openssh
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import bundle as bundlelib
from dockerlaunch.transfer import bundle_parts, image_facts, pipes, push, staging


def cut_then_push(client, remote: Remote, image: image_facts.LocalImage, frac: float):
    """(the push cut when `frac` of the image's bytes were sent -- uncompressed, so the fraction is the image's --,
    whether the host had the image tagged right after the cut, the push run again)."""
    plan = push.Push(client, [remote], image, strategy="star", compress="none", thin=False).plan()
    cut, sent = threading.Event(), [0]

    def count(k: int) -> None:
        sent[0] += k
        if sent[0] >= frac * image.size:
            cut.set()

    first = push.send_star(client, remote, image, plan.hosts[0], on_bytes=count, stop=cut)
    tagged = remote.run(["docker", "image", "inspect", image.ref]).ok
    return first, tagged, push.push_to_host(client, remote, image, compress="none", thin=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="image size (random bytes, one layer)")
    ap.add_argument("--top-mb", type=int, default=64, help="the top layer a bump adds (delta bundle)")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.251.0/24")
    args = ap.parse_args()
    client = engine()
    tag = secrets.token_hex(4)
    old_ref, new_ref = f"dlbench/ship-{tag}:1", f"dlbench/ship-{tag}:2"
    work = Path(tempfile.mkdtemp(prefix="dlbench-ship-"))
    rows: list[tuple[str, str, str]] = []
    remote = None
    try:
        random_image(client, old_ref, args.size_mb)
        image = image_facts.local_image(client, old_ref)
        s_bytes = save_bytes(client, image.id)
        cfg = load_config(sim.create(nodes=1, cluster=args.cluster, subnet=args.subnet))
        remote = Remote(resolve_target(cfg.hosts[0], cfg.ssh))
        ssh = ssh_argv(cfg, remote)

        # the SSH stream itself: S bytes of zeros into cat, OpenSSH then paramiko
        zeros = b"\0" * (1 << 20)
        n = s_bytes >> 20

        def openssh_raw() -> None:
            p = subprocess.Popen([*ssh, "cat > /dev/null"], stdin=subprocess.PIPE)
            for _ in range(n):
                p.stdin.write(zeros)
            p.stdin.close()
            assert p.wait() == 0

        def stream(bulk: bool) -> None:
            status = remote.stream(["sh", "-c", "cat > /dev/null"], stdin=pipes.CountingReader(iter([zeros] * n)),
                                   bulk=bulk)
            assert status == 0, status

        t_ossh = timed(openssh_raw)
        t_bulk = timed(lambda: stream(True))
        t_para = timed(lambda: stream(False))
        carrier = "OpenSSH" if openssh.unusable(remote.target) is None else "paramiko"
        rows.append((f"ssh stream: bulk ({carrier}) / OpenSSH",
                     f"{t_bulk:.1f} s / {t_ossh:.1f} s",
                     f"{t_ossh / t_bulk:.2f} x OpenSSH's throughput (goal >= 0.8)"))
        rows.append(("ssh stream: paramiko / OpenSSH", f"{t_para:.1f} s / {t_ossh:.1f} s",
                     f"{t_ossh / t_para:.2f} x OpenSSH's throughput (paramiko alone, for reference)"))

        # the hand pipeline, then push (staged, zstd)
        hand = (f"docker save {image.id} | zstd -q -T0 | {' '.join(ssh)} 'zstd -dc | docker load'")
        drop(remote, old_ref, image.id)
        t_hand = timed(lambda: subprocess.run(["sh", "-c", hand], check=True, capture_output=True))
        drop(remote, old_ref, image.id)
        os.environ[staging.STAGE_MIN_ENV] = "0"

        def push_once(result: list) -> None:
            result.append(push.push_to_host(client, remote, image, compress="zstd", thin=False))
            assert result[-1].status == "pushed", result[-1]

        pushed: list = []
        t_push = timed(lambda: push_once(pushed))
        rows.append(("push / hand pipeline", f"{t_push:.1f} s / {t_hand:.1f} s",
                     f"{t_push / t_hand:.2f} x (goal <= 1.0; {pushed[-1].detail.rsplit(', ', 1)[-1]})"))
        drop(remote, old_ref, image.id)
        os.environ[staging.STAGE_MIN_ENV] = str(1 << 62)  # what staging costs: the same push, streamed straight in
        try:
            t_plain = timed(lambda: push_once(pushed))
        finally:
            os.environ[staging.STAGE_MIN_ENV] = "0"
        rows.append(("push, not staged / hand pipeline", f"{t_plain:.1f} s / {t_hand:.1f} s",
                     f"{t_plain / t_hand:.2f} x (staging's cost: the stream written to the host's disk once more)"))
        drop(remote, old_ref, image.id)
        os.environ[openssh.MODE_ENV] = "paramiko"
        try:
            t_para_push = timed(lambda: push_once(pushed))
        finally:
            del os.environ[openssh.MODE_ENV]
        rows.append(("push over paramiko / hand pipeline", f"{t_para_push:.1f} s / {t_hand:.1f} s",
                     f"{t_para_push / t_hand:.2f} x (DOCKERLAUNCH_SSH_BULK=paramiko, for reference)"))

        # resume after a cut at 25/50/90%
        for frac in (0.25, 0.5, 0.9):
            drop(remote, old_ref, image.id)
            first, _, again = cut_then_push(client, remote, image, frac)  # a small image may finish loading
            assert first.status == "failed" and again.status in ("pushed", "tagged"), (first, again)
            how = next((x for x in again.detail.split(", ") if x.startswith("resumed")), "not resumed") \
                if again.status == "pushed" else \
                "the whole stream had arrived before the cut: only tagged"  # a small image on a fast link
            rows.append((f"resume after a cut at {frac:.0%}", f"{again.bytes_sent / 1e6:.0f} MB sent again",
                         f"{again.bytes_sent / image.size:.2f} x the image ({how})"))

        # a delta bundle after a top-layer change, and a split bundle
        random_image(client, new_ref, args.top_mb, base=old_ref)
        full, delta = work / "old.dlb", work / "new.delta"
        bundlelib.save_bundle(client, [old_ref], full)
        bundlelib.save_bundle(client, [new_ref], delta, base=old_ref)
        rows.append(("delta bundle after a top-layer change", f"{delta.stat().st_size / 1e6:.0f} MB "
                     f"vs {full.stat().st_size / 1e6:.0f} MB", f"{delta.stat().st_size / full.stat().st_size:.3f} x "
                     f"(the new layer: {args.top_mb} MiB)"))
        whole = work / "whole.dlb"
        shutil.copy(full, whole)
        bundle_parts.split_bundle(full, -(-full.stat().st_size // 4))
        drop(remote, old_ref, image.id)
        runner, loader = bundlelib.remote_runner(remote), bundlelib.remote_loader(remote)
        t_whole = timed(lambda: bundlelib.load_bundle(whole, loader, runner))
        drop(remote, old_ref, image.id)
        t_split = timed(lambda: bundlelib.load_bundle(full, loader, runner))
        rows.append(("load of a split bundle (4 parts) / of the whole file", f"{t_split:.1f} s / {t_whole:.1f} s",
                     f"{t_split / t_whole:.2f} x"))
    finally:
        if remote is not None:
            drop(remote, old_ref, new_ref)
            remote.close()
        sim.remove(args.cluster, quiet=True)
        for ref in (new_ref, old_ref):
            subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"image: {args.size_mb} MiB of random bytes ({s_bytes / 1e6:.0f} MB saved); one sim node, unshaped")
    for what, took, ratio in rows:
        print(f"{what:<55} {took:<28} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
