"""Thin re-push between every pair of engine kinds, both directions, on one mixed sim cluster.

One node per kind (20.10, 26, 28, 28 with the containerd image store). A parent image (random layer of
--parent-mb) and a child that adds --top-mb are made on this machine and pushed everywhere. Then, for every
ordered pair (source kind, target kind), the target forgets the child (keeps the parent) and the source's engine
-- reached as the launcher's local engine with DOCKER_HOST=ssh://node, as a user whose laptop runs that engine
would -- pushes the child to the target with `dockerlaunch push` (thin, star, no compression). Printed per pair:
bytes sent / bytes of the changed layer (goal <= 1.1), whether push had to fall back to a full stream, and the
checks that the tag points at the ID the target's store gives the image and that the image runs.

Run (root, dockerd up, e.g. after scripts/install-docker):
  .venv/bin/python benchmarks/engines.py [--parent-mb 32] [--top-mb 8]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.engine import engine  # noqa: E402
from dockerlaunch.transfer import image_facts  # noqa: E402

KINDS = ["20.10", "26", "28", "28-containerd"]


def dl(env: dict, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockerlaunch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def host_config(cluster_cfg: Path, index: int, out: Path) -> str:
    import yaml

    data = yaml.safe_load(cluster_cfg.read_text())
    data["hosts"] = [data["hosts"][index]]
    out.write_text(yaml.safe_dump(data))
    return str(out)


def launcher_env(node: sim.SimNode, state: Path, scratch: Path) -> dict:
    """The CLI's local engine is `node`'s dockerd, over ssh:// (the SDK reads ~/.ssh/config and known_hosts)."""
    home = scratch / f"home-{node.index}"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(f"Host {node.ip}\n  User root\n  IdentityFile {state / 'id_ed25519'}\n"
                                          f"  UserKnownHostsFile {home / '.ssh' / 'known_hosts'}\n")
    known = [x for x in (state / "known_hosts").read_text().splitlines() if x.startswith(node.ip + " ")]
    (home / ".ssh" / "known_hosts").write_text("\n".join(known) + "\n")
    return {**os.environ, "HOME": str(home), "DOCKER_HOST": f"ssh://root@{node.ip}",
            "DOCKERLAUNCH_CACHE_DIR": str(scratch / f"cache-{node.index}")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parent-mb", type=int, default=32)
    ap.add_argument("--top-mb", type=int, default=8)
    ap.add_argument("--cluster", default="dlbench-eng")
    ap.add_argument("--subnet", default="172.30.252.0/24")
    args = ap.parse_args()

    client = engine()
    scratch = Path(tempfile.mkdtemp(prefix="dlbench-eng-"))
    os.environ["DOCKERLAUNCH_STATE_DIR"] = str(scratch / "state")
    repo = f"dlbench-eng/{secrets.token_hex(3)}"
    parent, child = f"{repo}:parent", f"{repo}:child"
    cfg = scratch / "cluster.yaml"
    rows, failures = [], 0
    try:
        cfg = sim.create(cluster=args.cluster, subnet=args.subnet, config_out=str(cfg), engines=",".join(KINDS))
        layout = sim.node_layout(args.cluster, len(KINDS), args.subnet)
        state = sim.state_root() / args.cluster
        tools = client.images.list(name="dockerlaunch/sim-tools")[0].tags[0]
        for tag, base, mb in ((parent, tools, args.parent_mb), (child, parent, args.top_mb)):
            text = f"FROM {base}\nRUN head -c {mb}M /dev/urandom > /layer-{mb} && echo {tag} > /which\n"
            client.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, network_mode="host", rm=True)
        local_env = {**os.environ}
        for ref in (parent, child):
            r = dl(local_env, "push", ref, "--config", str(cfg), "--strategy", "star", "--compress", "none")
            if r.returncode != 0:
                raise SystemExit(f"seeding {ref}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
        layer = image_facts.with_facts(client, image_facts.local_image(client, child)).facts.layers[-1].size

        print(f"# thin re-push of a {layer / 1e6:.1f} MB layer between engine kinds ({len(KINDS)} nodes)")
        print("| from \\ to | to | bytes sent | x layer | full fallback | time | tag -> its store's ID, runs |")
        print("|---|---|---|---|---|---|---|")
        for s, src in enumerate(layout):
            env = launcher_env(src, state, scratch)
            for t, dst in enumerate(layout):
                if s == t:
                    continue
                node = client.containers.get(dst.name)
                node.exec_run(["docker", "rmi", "-f", child])
                one = host_config(cfg, t, scratch / f"to-{t}.yaml")
                t0 = time.monotonic()
                r = dl(env, "push", child, "--config", one, "--strategy", "star", "--compress", "none",
                       "--output", "json")
                took = time.monotonic() - t0
                try:
                    [res] = json.loads(r.stdout)["hosts"]
                except (ValueError, KeyError):
                    res = {"status": "failed", "detail": (r.stderr or r.stdout)[-300:], "bytes_sent": 0}
                code, out = node.exec_run(["docker", "run", "--rm", child, "cat", "/which"])
                runs = code == 0 and out.decode().strip() == child
                verified = res["status"] == "pushed" and "verified" in res["detail"]
                ok = verified and runs
                failures += not ok
                ratio = res["bytes_sent"] / layer if layer else 0.0
                fallback = "yes" if "sent in full" in res["detail"] else "no"
                print(f"| {KINDS[s]} | {KINDS[t]} | {res['bytes_sent'] / 1e6:.2f} MB | {ratio:.3f} | {fallback} | "
                      f"{took:.1f} s | {'yes' if ok else 'NO: ' + res['detail'][:120]} |", flush=True)
                rows.append((KINDS[s], KINDS[t], ratio, ok))
        worst = max(r[2] for r in rows)
        print(f"\nworst ratio {worst:.3f} x layer over {len(rows)} pairs; {failures} pair(s) failed a check")
    finally:
        sim.remove(args.cluster, quiet=True)
        for ref in (child, parent):
            try:
                client.images.remove(ref, force=True)
            except Exception:
                pass
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
