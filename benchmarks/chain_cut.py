"""A chain push to 4 hosts cut mid-link, and what resuming it sends again (issue 43, parts 3 and 4).

Topology: this machine (the launcher) and 4 sim nodes (real sshd, real dockerd) in a chain: the launcher sends
one copy to node1 over SSH, node1 relays to node2 over TCP, and so on. The links between nodes (each node's
egress) can be shaped to a rate (`--rate 200mbit`: the hand pipeline moves ~25 MB/s on 2 cores, so 1 Gbit/s
shaping limits nothing). The image is `--size-mb` of random bytes (incompressible: sent uncompressed).

Each repeat, interleaved:
  whole   the chain push to 4 empty hosts
  cut     the same, with the link into node `--cut-node` cut (its listener killed) once that node has staged
          `--at` of the stream: nodes before it load; it and those behind it get a second chain, headed by it
          and fed over SSH from where its stage ends. "Resent" is what that second chain's head was sent;
          "lacked" is the stream less what the cut node had staged. Goal: resent <= 1.1 x lacked.

"Resent" is counted twice: as the push reports it (the second chain head's bytes_sent) and on the wire, with no
help from dockerlaunch: the cut node's interface counter (eth0 rx_bytes, read by the engine from the node's
kernel) from just after the cut to the push's end. The wire figure holds everything that entered the node then:
the SSH feed with its SSH, TCP and IP framing, the ACKs of its own relay to the node behind it, the launcher's
commands; so it is an upper bound on what was resent, never below it.

Run (root, dockerd up, e.g. after scripts/install-docker):
  .venv/bin/python benchmarks/chain_cut.py [--size-mb 1024] [--runs 3] [--rate 200mbit]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import threading
import time

from harness import drop, random_image, rx_bytes, shape, sim_cluster, spread, staged_bytes

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import push, staging

NODES = 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", default="", help="each node's egress (the chain's links), e.g. 200mbit")
    ap.add_argument("--cut-node", type=int, default=3, help="the node whose incoming link is cut (2..4)")
    ap.add_argument("--at", type=float, default=0.4, help="cut once that node staged this share of the stream")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.250.0/24")
    args = ap.parse_args()
    os.environ[staging.STAGE_MIN_ENV] = "0"  # every chain host stages, whatever the image's size (a small --size-mb)
    client = engine()
    ref = f"dlbench/chain-{secrets.token_hex(4)}:1"
    k = args.cut_node - 1
    whole_s: list[float] = []
    cut_s: list[float] = []
    ratios: list[float] = []
    resent_mb: list[float] = []
    wire_ratios: list[float] = []
    wire_mb: list[float] = []
    lacked_mb: list[float] = []
    try:
        random_image(client, ref, args.size_mb)
        image = push.source_image(client, ref)
        with sim_cluster(args.cluster, nodes=NODES, subnet=args.subnet) as cfg_path:
            cfg = load_config(cfg_path)
            if args.rate:
                shape(args.cluster, args.rate)
            remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
            addresses = [r.target.hostname for r in remotes]
            cut_node = next(n.name for n in sim.node_layout(args.cluster, NODES, args.subnet) if n.ip == addresses[k])

            def chain() -> list:
                return push.push(client, remotes, ref, compress="none", strategy="chain", addresses=addresses)

            for run in range(args.runs):
                for r in remotes:
                    drop(r, ref)
                t0 = time.monotonic()
                results = chain()
                whole_s.append(time.monotonic() - t0)
                assert all(x.status == "pushed" for x in results), results
                stream = results[0].bytes_sent

                for r in remotes:
                    drop(r, ref)
                out: list = []
                t0 = time.monotonic()
                worker = threading.Thread(target=lambda got=out: got.append(chain()), daemon=True)
                worker.start()
                while staged_bytes(remotes[k]) < args.at * stream and worker.is_alive():
                    time.sleep(0.05)
                remotes[k].run(["sh", "-c", "pkill -f '^nc -l' || true"])
                rx0 = rx_bytes(client, cut_node)  # after the cut: the upstream relay's bytes are all in
                worker.join()
                wire = rx_bytes(client, cut_node) - rx0
                cut_s.append(time.monotonic() - t0)
                results = out[0]
                assert all(x.status == "pushed" for x in results), results
                detail = results[k].detail
                m = re.search(r"stopped after (\d+) bytes", detail)
                assert m and detail.startswith("chain again after a cut") and "star" not in detail, detail
                kept = int(m.group(1))
                resent, lacked = results[k].bytes_sent, stream - kept
                ratios.append(resent / lacked)
                resent_mb.append(resent / 1e6)
                lacked_mb.append(lacked / 1e6)
                wire_ratios.append(wire / lacked)
                wire_mb.append(wire / 1e6)
                print(f"run {run + 1}: whole {whole_s[-1]:.1f} s; cut at node{args.cut_node} after "
                      f"{kept / 1e6:.0f} MB of {stream / 1e6:.0f} MB, resent {resent / 1e6:.1f} MB (reported) / "
                      f"{wire / 1e6:.1f} MB into its eth0 (wire) for {lacked / 1e6:.1f} MB lacked "
                      f"({ratios[-1]:.3f} x / {wire_ratios[-1]:.3f} x), all pushed in {cut_s[-1]:.1f} s", flush=True)
            print(f"\n{NODES} hosts, {args.size_mb} MiB image ({image.size / 1e9:.2f} GB), links "
                  f"{args.rate or 'unshaped'}, {args.runs} interleaved runs; median (spread):")
            print("| figure | median (spread) |")
            print("|---|---|")
            print(f"| chain push, uncut | {spread(whole_s)} s |")
            print(f"| chain push cut into node{args.cut_node} at {args.at:.0%}, resumed by a second chain | "
                  f"{spread(cut_s)} s |")
            print(f"| bytes resent / bytes the hosts behind the cut lacked, as the push reports them | "
                  f"{spread(ratios, '{:.3f}')} x ({spread(resent_mb, '{:.0f}')} MB / "
                  f"{spread(lacked_mb, '{:.0f}')} MB) |")
            print(f"| bytes into node{args.cut_node}'s eth0 after the cut (its kernel's counter) / bytes lacked | "
                  f"{spread(wire_ratios, '{:.3f}')} x ({spread(wire_mb, '{:.0f}')} MB / "
                  f"{spread(lacked_mb, '{:.0f}')} MB) |")
            return 0
    finally:
        client.images.remove(ref, force=True)


if __name__ == "__main__":
    sys.exit(main())
