"""Chain push: one copy leaves the launcher; each host loads it and relays it to the next over TCP.

Relays start from the tail: OpenBSD `nc` connects as soon as its pipeline starts, so host i+1 must
listen before host i sends. Each relay (scripts/relay.sh) reports its listener, and the first bytes it
accepts, on stdout, so the launcher follows the chain without polling over SSH. Every connection must
start with its link's own random token (sent to each relay over SSH stdin), and a host fed over TCP loads the
stream only after it matches the sha256 the launcher sends it over SSH once the last byte has left: a stranger,
or a man in the middle who read a token off the wire, feeds nothing into `docker load` (the host then gets a
star push). A link that never receives data within RECEIVE_TIMEOUT
of its upstream finishing is given up, and a host whose stream stopped short says so (relay.sh exits 9): both
end as `Outcome.FAILED_CUT`, their stages keep what arrived, and push.apply_plan sends them a second chain
(push_plan.chain_again) that starts where each stage ends. A closed SSH
channel does not end `nc -l`, so every listener is killed, by the pid its relay reported, when the chain ends,
whatever happened. Links carry the image as plain TCP (the first hop is SSH): where that matters, push with
`--strategy star` (every byte over SSH).
"""

from __future__ import annotations

import hashlib
import io
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator

from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.hosts.fleet import each
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.transfer import script
from dockerlaunch.transfer.image_facts import LocalImage
from dockerlaunch.transfer.pipes import CountingReader, stream_seconds
from dockerlaunch.transfer.push_plan import HostResult, HostTransfer, Outcome, PushState, load_outcome
from dockerlaunch.transfer.streams import outgoing

LISTEN_TIMEOUT = 15.0  # for a relay's listener to come up
RECEIVE_TIMEOUT = 30.0  # for a relay to be sent data once the host before it has finished
LINK_GRACE = 600.0  # for a relay that is receiving to finish once the host before it has finished


class _Prefixed(io.RawIOBase):
    """`prefix`, then everything `reader` gives (the token lines before the image stream), hashing the stream
    (`sha`: the hash of what the hosts already have staged before it, if any)."""

    def __init__(self, prefix: bytes, reader, sha=None):
        self.prefix, self.reader = prefix, reader
        self.sha = sha or hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            out, self.prefix = self.prefix, b""
            return out
        data = self.reader.read(n)
        self.sha.update(data)
        return data


class _ThenChecksum(io.RawIOBase):
    """A relay's SSH stdin when its stream comes over TCP: its token lines now, the stream's sha256 once the
    launcher has sent the last byte (`done`), then the end; nothing more if the chain is stopped first."""

    def __init__(self, lines: bytes, done: threading.Event, checksum: list[str], stop: threading.Event):
        self.lines, self.done, self.checksum, self.stop = lines, done, checksum, stop
        self.sent = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.lines:
            out, self.lines = self.lines, b""
            return out
        if self.sent:
            return b""
        while not self.done.wait(0.2):
            if self.stop.is_set():
                return b""
        self.sent = True
        return f"{self.checksum[0]}\n".encode() if self.checksum else b""


# The relay's own `nc -l`, by the pid it reported: only if that process is still ours and still `nc -l` (never a
# pattern match, which as root would also end another user's nc).
KILL_LISTENER = ('p=$1; [ -r "/proc/$p/cmdline" ] || exit 0; [ "$(stat -c %u "/proc/$p")" = "$(id -u)" ] || exit 0\n'
                 'case "$(tr "\\0" " " < "/proc/$p/cmdline")" in "nc -l "*) kill "$p" 2>/dev/null;; esac; exit 0')


def kill_listener(remote: Remote, pid: int | None) -> None:
    if pid:
        remote.run(["sh", "-c", KILL_LISTENER, "sh", str(pid)], timeout=30)


# long on purpose: start relays from the tail, then the head, then wait, with one cleanup for every way out; the
# cleanup must see every listener started, which one function keeps in view.
def push_chain(
    client, remotes: list[Remote], image: LocalImage, links: list[HostTransfer],
    on_bytes: Callable[[int], None] | None = None, port: int | None = None,
    stages: list[tuple[str, int]] | None = None, chunks: Iterator[bytes] | None = None, sha=None,
) -> list[HostResult]:
    """Stream one copy to `links[0]`; link i listens at `links[i].address` for link i-1.

    Compression and the layers left out come from the plan (the same for every link). `stages`: per link, the
    key of its stage on the host ("-": none) and the prefix of the stream it keeps there (non-increasing along
    the chain); `chunks` is then the stream after the first link's prefix and `sha` the hash of that prefix
    (push.send_chain works them out). A host that fails because the stream was cut before it had it all ends as
    `Outcome.FAILED_CUT`: its stage holds what it got.
    """
    t0 = time.monotonic()
    if not remotes:
        return []
    head = links[0]
    mode = head.compression or "none"
    thin = f", thin: {head.layers_skipped} of {head.layers} layers already there" if head.layers_skipped else ""
    stages = stages or [("-", 0)] * len(remotes)
    if chunks is None:
        chunks = outgoing(client, image, set(head.skip_files), mode)
    port = port or 40000 + secrets.randbelow(20000)
    n = len(remotes)
    results: list[HostResult | None] = [None] * n
    stop = threading.Event()
    reader = CountingReader(chunks, on_bytes)
    listening = [threading.Event() for _ in remotes]
    listeners: list[int | None] = [None] * n  # each relay's `nc -l` pid, as it reported it
    receiving = [threading.Event() for _ in remotes]
    relay = script("relay.sh")
    # one token per link, never on a command line (SSH stdin only); the head's stream is SSH itself
    tokens = [b"-"] + [secrets.token_hex(16).encode() for _ in range(n - 1)] + [b"-"]
    sent_all, checksum = threading.Event(), []
    head_stdin = _Prefixed(tokens[0] + b"\n" + tokens[1] + b"\n", reader, sha)

    def run_host(i: int) -> None:
        listen = "-" if i == 0 else links[i].address
        nxt = links[i + 1].address if i + 1 < n else "-"
        out, err = bytearray(), bytearray()

        def on_out(data: bytes) -> None:
            out.extend(data)
            m = re.search(rb"^listener (\d+)$", bytes(out), re.M)
            if m:
                listeners[i] = int(m.group(1))
            if b"listening\n" in out:
                listening[i].set()
            if b"receiving\n" in out:
                receiving[i].set()

        try:
            status = remotes[i].stream(
                ["sh", "-c", relay, "sh", links[i].expect_id, image.ref, mode, listen, str(port), nxt,
                 stages[i][0], str(stages[i][1]), str(stages[i + 1][1] if i + 1 < n else 0)],
                on_out, err.extend, stop=stop,
                stdin=head_stdin if i == 0 else _ThenChecksum(tokens[i] + b"\n" + tokens[i + 1] + b"\n", sent_all,
                                                              checksum, stop))
        except DockerlaunchError as e:
            results[i] = HostResult.of(remotes[i].name, Outcome.FAILED_CUT, str(e))
            return
        if status != 0:
            reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
            # cut: a relay whose stream stopped short (9), the first host before its stream ended
            results[i] = HostResult.of(remotes[i].name, load_outcome(status, cut=i == 0 and reader.finished is None),
                                       reason[0][:300])
        else:
            role = "head of chain" if i == 0 else f"relayed from {remotes[i - 1].name}"
            results[i] = HostResult.of(remotes[i].name, Outcome.SENT, f"chain ({role}), {mode}{thin}, "
                                       f"Image ID {links[i].expect_id[7:19]} verified", reader.count if i == 0 else 0,
                                       time.monotonic() - t0, stream_seconds(reader, t0) if i == 0 else 0.0)

    # listeners first, from the tail, each one listening before its sender starts
    by_rank: dict[int, threading.Thread] = {}
    try:
        for i in reversed(range(1, n)):
            t = threading.Thread(target=run_host, args=(i,), daemon=True)
            t.start()
            by_rank[i] = t
            deadline = time.monotonic() + LISTEN_TIMEOUT
            while not listening[i].wait(0.05) and t.is_alive() and time.monotonic() < deadline:
                pass
            if not listening[i].is_set():
                stop.set()
                _kill_listeners(remotes[i:], listeners[i:])
                for t in by_rank.values():
                    t.join(timeout=10)
                why = results[i].detail if results[i] else f"no listener on port {port} after {LISTEN_TIMEOUT:g} s"
                return [HostResult.of(r.name, Outcome.FAILED, f"chain could not start at {remotes[i].name}: {why}")
                        for r in remotes]
        first = threading.Thread(target=run_host, args=(0,), daemon=True)
        first.start()
        first.join()
        # what every relay must have received, byte for byte, or that the stream broke before its end
        checksum.append(f"sha256 {head_stdin.sha.hexdigest()} {stages[0][1] + reader.count}"
                        if reader.finished is not None else "cut")
        sent_all.set()
        upstream_done = time.monotonic()
        for i in range(1, n):
            t = by_rank[i]
            while t.is_alive():
                waited = time.monotonic() - upstream_done
                if waited > LINK_GRACE or (not receiving[i].is_set() and waited > RECEIVE_TIMEOUT):
                    break
                t.join(0.2)
            if t.is_alive():  # the link is dead: give it (and those behind it) up, so they get a star push
                stop.set()
                _kill_listeners(remotes[i:], listeners[i:])
                why = (f"no data from {remotes[i - 1].name} within {RECEIVE_TIMEOUT:g}s after it finished "
                       "(can it reach this host?)" if not receiving[i].is_set()
                       else f"not finished {LINK_GRACE:g}s after {remotes[i - 1].name}")
                for j in range(i, n):
                    by_rank[j].join(timeout=10)
                    results[j] = results[j] if results[j] and results[j].status == PushState.PUSHED else \
                        HostResult.of(remotes[j].name, Outcome.FAILED_CUT, why)
                break
            upstream_done = time.monotonic()
    finally:
        stop.set()
        _kill_listeners(remotes[1:], listeners[1:])  # a closed SSH channel does not end `nc -l`
    return [r or HostResult.of(remotes[i].name, Outcome.FAILED, "no result") for i, r in enumerate(results)]


def _kill_listeners(remotes: list[Remote], pids: list[int | None]) -> None:
    each(lambda k: kill_listener(remotes[k], pids[k]), list(range(len(remotes))))
