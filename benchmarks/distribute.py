"""Image distribution against the physical limit, on a sim cluster with shaped links.

Topology: this machine is the head (the launcher; the image lives in its engine) and N sim nodes are the
targets. Every egress is shaped to the same rate B with a tc token bucket: the head's uplink (the host side
of the sim bridge) and each node's eth0. The head's uplink must carry at least one copy of the image, so
S/B is the floor for getting an image of S bytes anywhere.

Measured, in one run:
  star          the launcher streams to every node at once: the uplink carries N copies (expect ~N x S/B)
  chain         one copy leaves the launcher, each node relays to the next (goal <= 1.25 x S/B)
  thin re-push  an image that differs only in a new top layer, pushed to nodes that have the old one:
                bytes sent per host / bytes of the changed layer (goal <= 1.1)
  references    S bytes of `cat > /dev/null` over one SSH channel through the shaped uplink (the link's own
                overhead), and `docker load -i` of the image from a local file on every node at once (the work
                left after the last byte arrives: docker load unpacks the whole tar, then applies the layers)

Run (root, dockerd up, e.g. after scripts/install-docker):
  .venv/bin/python benchmarks/distribute.py [--nodes 4] [--rate 200mbit] [--size-mb 256] [--top-mb 32]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tarfile
import time

from harness import random_image, rate_bytes_per_s, save_bytes, tc

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts import fleet as session
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import image_facts, pipes
from dockerlaunch.transfer import push as distribute


def layer_tar_bytes(client, image: image_facts.LocalImage, index: int) -> int:
    """Bytes of one layer's tar inside `docker save` (what a thin push must send for it)."""
    want = image_facts.layer_files(client, image)[index]
    with tarfile.open(fileobj=pipes.CountingReader(image_facts.save_stream(client, image.id)), mode="r|") as tar:
        for m in tar:
            if m.name == want:
                return m.size
    raise SystemExit(f"layer {want} not in docker save of {image.ref}")


def each(fn, remotes: list[Remote]) -> list:
    """fn on every host at once; the first failure stops the benchmark."""
    out = session.each(fn, remotes)
    for o in out.failed:
        raise SystemExit(f"benchmark step failed: {o.error}")
    return out


def drop_image(remotes: list[Remote], refs: list[str]) -> None:
    """Remove refs (tags or IDs) from every node, so the next push has to send the image."""
    script = ('docker rmi -f "$@" >/dev/null 2>&1; '
              'for ref; do ! docker image inspect "$ref" >/dev/null 2>&1 || exit 1; done')
    each(lambda r: r.check(["sh", "-c", script, "sh", *refs], "removing the image", timeout=120), remotes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4, help="targets (the head is this machine)")
    ap.add_argument("--rate", default="200mbit", help="B: every egress is shaped to this (tc tbf)")
    ap.add_argument("--size-mb", type=int, default=256, help="image size S in MiB (random bytes, one layer)")
    ap.add_argument("--top-mb", type=int, default=32, help="size of the changed top layer for the thin re-push")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.250.0/24")
    args = ap.parse_args()

    client = engine()
    bps = rate_bytes_per_s(args.rate)
    tag = secrets.token_hex(4)
    img_ref, top_ref = f"dlbench/s{args.size_mb}-{tag}:1", f"dlbench/s{args.size_mb}-top-{tag}:1"
    rows: list[tuple[str, str, str, str]] = []
    bridge = None
    remotes: list[Remote] = []
    try:
        print(f"# building a {args.size_mb} MiB image of random bytes ...", file=sys.stderr)
        random_image(client, img_ref, args.size_mb)
        image = image_facts.local_image(client, img_ref)
        s_bytes = save_bytes(client, image.id)
        floor = s_bytes / bps

        cfg_path = sim.create(nodes=args.nodes, cluster=args.cluster, subnet=args.subnet)
        cfg = load_config(cfg_path)
        cluster = session.Fleet.connect(cfg)
        remotes = [h.remote for h in cluster.hosts]
        addresses = [h.address for h in cfg.hosts]

        # reference, links not shaped yet: docker load of the image from a local file on every node at once --
        # the work each host still does after the last byte arrives (docker load applies layers after EOF)
        tar_bytes = b"".join(image_facts.save_stream(client, image.id))
        each(lambda r: r.check(["sh", "-c", "cat > /tmp/dlbench.tar"], "copy", stdin=tar_bytes), remotes)
        t0 = time.monotonic()
        each(lambda r: r.check(["docker", "load", "-i", "/tmp/dlbench.tar"], "load", timeout=600), remotes)
        load_alone = time.monotonic() - t0
        each(lambda r: r.check(["sh", "-c", "rm -f /tmp/dlbench.tar"], "rm"), remotes)
        rows.append((f"docker load from a local file, {args.nodes} nodes at once (reference)",
                     f"{load_alone:.1f} s", "", f"{load_alone / floor:.2f} x S/B"))

        bridge = "br-" + client.networks.get(sim.network_name(args.cluster)).id[:12]
        tc(bridge, args.rate)
        sim.shape(args.cluster, args.rate)
        print(f"# head uplink {bridge} and {args.nodes} nodes' eth0 shaped to {args.rate} "
              f"(B = {bps / 1e6:.1f} MB/s); S = {s_bytes / 1e6:.1f} MB; S/B = {floor:.1f} s", file=sys.stderr)

        t0 = time.monotonic()
        remotes[0].check(["sh", "-c", "cat > /dev/null"], "raw copy",
                         stdin=pipes.CountingReader(iter([b"\0" * (1 << 20)] * (s_bytes >> 20))))
        raw = time.monotonic() - t0
        rows.append(("raw copy over SSH, 1 host (reference)", f"{raw:.1f} s", "", f"{raw / floor:.2f} x S/B"))

        for strategy in ("star", "chain"):
            drop_image(remotes, [img_ref, image.id])
            t0 = time.monotonic()
            results = distribute.push(client, remotes, img_ref, compress="none", thin=False, strategy=strategy,
                                      addresses=addresses)
            took = time.monotonic() - t0
            bad = [r for r in results if r.status != "pushed"]
            if bad:
                raise SystemExit(f"{strategy} push failed: {bad}")
            streamed = max(r.stream_seconds for r in results)
            rows.append((strategy, f"{took:.1f} s", f"{streamed:.1f} s ({streamed / floor:.2f} x S/B)",
                         f"{took / floor:.2f} x S/B"))

        # thin: every node has img_ref (from the chain push); top_ref adds one layer
        random_image(client, top_ref, args.top_mb, base=img_ref)
        top = image_facts.local_image(client, top_ref)
        changed = layer_tar_bytes(client, top, -1)
        t0 = time.monotonic()
        results = distribute.push(client, remotes, top_ref, compress="none", thin=True, strategy="star",
                                  addresses=addresses)
        took = time.monotonic() - t0
        bad = [r for r in results if r.status != "pushed" or "thin: 1 of 2" not in r.detail]
        if bad:
            raise SystemExit(f"thin re-push did not go thin: {bad}")
        worst = max(r.bytes_sent for r in results)
        rows.append(("thin re-push", f"{took:.1f} s", "",
                     f"{worst / 1e6:.1f} MB sent per host for a {changed / 1e6:.1f} MB layer: "
                     f"{worst / changed:.3f} x layer"))
    finally:
        for r in remotes:
            r.close()
        if bridge:
            tc(bridge, None)
        sim.remove(args.cluster, quiet=True)
        for ref in (top_ref, img_ref):
            try:
                client.images.remove(ref, force=True)
            except Exception:
                pass

    print(f"\nnodes={args.nodes} B={args.rate} ({bps / 1e6:.1f} MB/s) S={s_bytes / 1e6:.1f} MB "
          f"S/B={floor:.1f} s top layer={args.top_mb} MiB\n")
    print("| measure | time (all hosts verified) | stream (last byte sent) | ratio |")
    print("|---|---|---|---|")
    for name, took, streamed, ratio in rows:
        print(f"| {name} | {took} | {streamed} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
