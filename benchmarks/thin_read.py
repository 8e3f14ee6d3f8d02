"""Issue 43, step 1: where a thin push's time goes on the launcher, and what a registry route would read instead.

A thin push today runs `docker save NEW` and keeps only the layers the hosts lack: the engine reads and tars the whole
image to hand over a few new layers. The candidate measured beside it: the engine's own `docker push` to a registry
the launcher runs (Debian's docker-registry, distribution 2.8.2, on 127.0.0.1) that already holds OLD's layers, which
reads and sends only the layers the registry lacks. For each, in one run: wall time and what the engine process
read (`rchar` of this machine's dockerd and containerd from /proc/PID/io, counted by the kernel, not by
dockerlaunch).

NEW is OLD plus one layer of --top-mb random bytes (an ms-swift bump's shape: the lower layers unchanged).

  .venv/bin/python benchmarks/thin_read.py --old IMAGE [--top-mb 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import engine_reads


def measured(argv: list[str], sink: bool = False) -> tuple[float, int]:
    """(seconds, bytes the engine read) of one command; its stdout to /dev/null when `sink`."""
    before = engine_reads()
    t0 = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL if sink else subprocess.PIPE, stderr=subprocess.PIPE,
                       text=not sink)
    took = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"thin_read: {' '.join(argv)} failed: {str(r.stderr)[-400:]}")
    return took, engine_reads() - before


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bumped(old: str, top_mb: int, tmp: Path) -> str:
    """OLD plus one layer of top_mb random bytes, as a new image."""
    tag = f"dlbench/thin-new:{secrets.token_hex(4)}"
    ctx = tmp / "ctx"
    ctx.mkdir(exist_ok=True)
    with open(ctx / "top.bin", "wb") as f:
        for _ in range(top_mb):
            f.write(os.urandom(1 << 20))
    (ctx / "Dockerfile").write_text(f"FROM {old}\nCOPY top.bin /opt/{tag[-8:]}.bin\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    (ctx / "top.bin").unlink()
    return tag


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--top-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not shutil.which("docker-registry"):
        sys.exit("thin_read: needs Debian's docker-registry (apt-get install docker-registry)")
    made: list[str] = []
    rows: dict[str, list[tuple[float, int]]] = {"docker save NEW": [], "docker push NEW (registry has OLD)": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        port = free_port()
        config = Path(tmp) / "registry.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp}/store\n"
                          f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
        reg = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            time.sleep(1)
            base = f"127.0.0.1:{port}/dl/img"
            subprocess.run(["docker", "tag", args.old, f"{base}:old"], check=True)
            made.append(f"{base}:old")
            t_first, r_first = measured(["docker", "push", "-q", f"{base}:old"])
            print(f"first push of OLD into the registry: {t_first:.1f} s, engine read {r_first / 1e9:.2f} GB",
                  flush=True)
            for i in range(args.runs):  # interleaved; each run a bump of its own (a new top layer)
                new = bumped(args.old, args.top_mb, Path(tmp))
                made.append(new)
                rows["docker save NEW"].append(measured(["docker", "save", new], sink=True))
                ref = f"{base}:new{i}"
                subprocess.run(["docker", "tag", new, ref], check=True)
                made.append(ref)
                rows["docker push NEW (registry has OLD)"].append(measured(["docker", "push", "-q", ref]))
                print("  ".join(f"{k}: {v[-1][0]:.1f} s, {v[-1][1] / 1e9:.2f} GB read" for k, v in rows.items()),
                      flush=True)
        finally:
            reg.terminate()
            reg.wait(30)
            for ref in made:
                subprocess.run(["docker", "rmi", ref], capture_output=True)
    print()
    for what, got in rows.items():
        secs = [t for t, _ in got]
        reads = [r for _, r in got]
        print(f"{what:40} median {statistics.median(secs):6.1f} s (spread {min(secs):.1f}-{max(secs):.1f}), "
              f"engine read {statistics.median(reads) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
