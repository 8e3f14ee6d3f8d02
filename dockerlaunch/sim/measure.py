"""What a push cost, read from outside the product: the bytes a host staged, the bytes a node's network interface
received, the bytes this machine's engine read, and the layer-cache fills a push left running in the background. The
integration tests assert on them and the benchmarks print them; written once here so both count alike."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator


def staged_bytes(remote) -> int:
    """Bytes the host has staged (every stage's size, by stat), polled while a push runs."""
    r = remote.run(["sh", "-c", 'for f in "$HOME"/.cache/dockerlaunch/push/*.tar; do [ -f "$f" ] && stat -c %s "$f"; '
                    'done; true'])
    return sum(int(x) for x in r.stdout.split())


def rx_bytes(client, node: str) -> int:
    """Bytes the sim node's eth0 has received, as the node's kernel counts them (read through the engine that runs
    the node, not over SSH: reading it adds nothing to it). A node has one interface on its cluster's network, so
    every byte a host is sent (SSH streams, chain relays) is in it, with its framing: Ethernet, IP and TCP headers
    per segment and, on SSH, the SSH packets' own."""
    code, out = client.containers.get(node).exec_run(["cat", "/sys/class/net/eth0/statistics/rx_bytes"])
    if code != 0:
        raise RuntimeError(f"cannot read node {node}'s eth0 counter: {out.decode(errors='replace')[:200]}")
    return int(out)


@contextlib.contextmanager
def received(client, nodes: list[str]) -> Iterator[list[int]]:
    """The bytes each node's eth0 received during the `with` (rx_bytes after less before), in `nodes`' order; the
    list is filled when the block ends without an error."""
    got: list[int] = []
    before = [rx_bytes(client, n) for n in nodes]
    yield got
    got.extend(rx_bytes(client, n) - b for n, b in zip(nodes, before, strict=True))


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


def background_fills(python: str | None = None) -> list[int]:
    """The pids of the layer-cache fills running in the background (`dockerlaunch cache fill ... --background`, as a
    push starts them after its hosts are done), by this Python (default: the one running here), read from /proc."""
    import sys

    python = python or sys.executable
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if words[:1] == [python] and words[1:5] == ["-m", "dockerlaunch", "cache", "fill"] and "--background" in words:
            out.append(int(pid))
    return out


def wait_fills(timeout: float = 600.0, pids: list[int] | None = None) -> list[int]:
    """Waits until the background fills (`pids`, default all of background_fills()) have ended; those still running
    after `timeout` seconds (none: an empty list)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in (background_fills() if pids is None else pids) if _alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended: its parent has not reaped it yet
