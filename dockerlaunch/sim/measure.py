"""What a push cost, read from outside the product: the bytes a host staged and the bytes this machine's engine
read. The integration tests assert on them and the benchmarks print them; written once here so both count alike."""

from __future__ import annotations

import os
import subprocess


def staged_bytes(remote) -> int:
    """Bytes the host has staged (every stage's size, by stat), polled while a push runs."""
    r = remote.run(["sh", "-c", 'for f in "$HOME"/.cache/dockerlaunch/push/*.tar; do [ -f "$f" ] && stat -c %s "$f"; '
                    'done; true'])
    return sum(int(x) for x in r.stdout.split())


def engine_reads() -> int:
    """Bytes the launcher's own dockerd and containerd have read (rchar, counted by the kernel): the processes of
    this machine's pid namespace only, not the sim nodes' engines."""
    mine = os.readlink("/proc/self/ns/pid")
    total = 0
    for name in ("dockerd", "containerd"):
        pids = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != mine:
                    continue
                io_text = open(f"/proc/{pid}/io").read()
            except OSError:
                continue
            total += int(next(x.split()[1] for x in io_text.splitlines() if x.startswith("rchar:")))
    return total
