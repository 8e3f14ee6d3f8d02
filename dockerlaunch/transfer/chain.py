"""Chain push: one copy leaves the launcher; each host loads it and relays it to the next over TCP.

Relays start from the tail: OpenBSD `nc` connects as soon as its pipeline starts, so host i+1 must
listen before host i sends. Each relay (scripts/relay.sh) reports its own listener on stdout, so the
launcher starts the next sender without polling over SSH. A closed SSH channel does not end `nc -l`:
when the chain cannot start, the listeners already up are killed here.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

from dockerlaunch.cluster.session import each
from dockerlaunch.cluster.ssh import Remote
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.transfer import script
from dockerlaunch.transfer.plan import HostResult, HostTransfer, PushState
from dockerlaunch.transfer.streams import CountingReader, LocalImage, outgoing, stream_seconds

LISTEN_TIMEOUT = 15.0


def kill_listener(remote: Remote, port: int) -> None:
    remote.run(["sh", "-c", r'pkill -f "^nc -l [^ ]+ $1\$" || true', "sh", str(port)], timeout=30)


def push_chain(
    client, remotes: list[Remote], image: LocalImage, links: list[HostTransfer],
    on_bytes: Callable[[int], None] | None = None, port: int | None = None,
) -> list[HostResult]:
    """Stream one copy to `links[0]`; link i listens at `links[i].address` for link i-1.

    Compression and the layers left out come from the plan (the same for every link).
    """
    t0 = time.monotonic()
    if not remotes:
        return []
    head = links[0]
    mode = head.compression or "none"
    thin = f", thin: {head.layers_skipped} of {head.layers} layers already there" if head.layers_skipped else ""
    chunks = outgoing(client, image, set(head.skip_files), mode)
    port = port or 40000 + secrets.randbelow(20000)
    n = len(remotes)
    results: list[HostResult | None] = [None] * n
    threads: list[threading.Thread] = []
    stop = threading.Event()
    reader = CountingReader(chunks, on_bytes)
    listening = [threading.Event() for _ in remotes]
    relay = script("relay.sh")

    def run_host(i: int) -> None:
        listen = "-" if i == 0 else links[i].address
        nxt = links[i + 1].address if i + 1 < n else "-"
        out, err = bytearray(), bytearray()

        def on_out(data: bytes) -> None:
            out.extend(data)
            if b"listening\n" in out:
                listening[i].set()

        try:
            status = remotes[i].stream(
                ["sh", "-c", relay, "sh", image.id, image.ref, mode, listen, str(port), nxt],
                on_out, err.extend, stdin=reader if i == 0 else None, stop=stop)
        except DockerlaunchError as e:
            results[i] = HostResult(remotes[i].name, PushState.FAILED, str(e))
            return
        if status != 0:
            reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
            results[i] = HostResult(remotes[i].name, PushState.FAILED, reason[0][:300])
        else:
            role = "head of chain" if i == 0 else f"relayed from {remotes[i - 1].name}"
            results[i] = HostResult(remotes[i].name, PushState.PUSHED, f"chain ({role}), {mode}{thin}, "
                                    f"Image ID {image.id[7:19]} verified", reader.count if i == 0 else 0,
                                    time.monotonic() - t0, stream_seconds(reader, t0) if i == 0 else 0.0)

    # listeners first, from the tail, each one listening before its sender starts
    for i in reversed(range(1, n)):
        t = threading.Thread(target=run_host, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while not listening[i].wait(0.05) and t.is_alive() and time.monotonic() < deadline:
            pass
        if not listening[i].is_set():
            stop.set()
            each(lambda r: kill_listener(r, port), remotes[i:])  # a closed channel does not end `nc -l`
            for t in threads:
                t.join(timeout=10)
            why = results[i].detail if results[i] else f"no listener on port {port} after {LISTEN_TIMEOUT:g} s"
            return [HostResult(r.name, PushState.FAILED, f"chain could not start at {remotes[i].name}: {why}")
                    for r in remotes]
    first = threading.Thread(target=run_host, args=(0,), daemon=True)
    first.start()
    threads.append(first)
    for t in threads:
        t.join()
    return [r or HostResult(remotes[i].name, PushState.FAILED, "no result") for i, r in enumerate(results)]
