"""Hosts that die, freeze or lose the launcher: heartbeats both ways, one conversation per host.

On every host of a running job, `scripts/watchdog.sh` reads heartbeats from the launcher over SSH and
answers each one. The launcher declares a host lost when its answers stop for `job.host_timeout`
seconds (a frozen or powered-off host, a cut network: TCP alone may never say so); the host removes
the run's containers itself when the launcher's session drops (after `job.orphan_grace` seconds) or
goes silent -- so a launcher killed with SIGKILL, or whose machine vanished, leaves nothing running.

Silence is counted from the first beat a host has not answered, and time the launcher itself stood still
(a starved machine: hundreds of log streams, a swapping laptop) is not counted against any host: a 256-host
run whose starved launcher read the answers late once declared every host lost and so removed a healthy job.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import paramiko

from dockerlaunch import gang
from dockerlaunch.backends.docker import script
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.hosts.fleet import Host

INTERVAL = 2.0  # seconds between heartbeats
READY_TIMEOUT = 15.0  # for the first answer of every watchdog
TICK = 0.2  # the beat loop's period
STALL = 1.0  # a beat loop later than this stood still: that time is not a host's silence


@dataclass
class _Peer:
    host: Host
    chan: paramiko.Channel
    last_answer: float = field(default_factory=time.monotonic)
    unanswered_since: float | None = None  # when the oldest beat not yet answered went out


class Silence:
    """The bookkeeping of heartbeats, apart from the channels (so it is tested with a clock of its own)."""

    def __init__(self, now: float):
        self.last_tick = now

    def tick(self, now: float, peers: list[_Peer]) -> None:
        """Call once per loop, after reading answers: a late loop means the launcher stood still, so every
        silent host's count is pushed back by the time lost."""
        lost_time = now - self.last_tick - TICK
        self.last_tick = now
        if lost_time > STALL:
            for p in peers:
                if p.unanswered_since is not None:
                    p.unanswered_since = min(now, p.unanswered_since + lost_time)

    @staticmethod
    def answered(p: _Peer, now: float) -> None:
        p.last_answer, p.unanswered_since = now, None

    @staticmethod
    def sent(p: _Peer, now: float) -> None:
        if p.unanswered_since is None:
            p.unanswered_since = now

    def lost(self, now: float, peers: list[_Peer], timeout: float) -> list[_Peer]:
        """Peers silent for `timeout` seconds of the launcher's running time. Nothing while the beat loop
        itself is behind: that is the launcher's stall, not the hosts'."""
        if now - self.last_tick > STALL + TICK:
            return []
        quiet = set(gang.silent({i: p.unanswered_since for i, p in enumerate(peers) if p.unanswered_since is not None},
                                now, timeout))  # the gang supervisor's rule, as a detached job's hosts apply it
        return [p for i, p in enumerate(peers) if i in quiet]


class Watchdogs:
    """Start with `start()`; `lost(timeout)` names hosts that stopped answering; `stand_down()` when the
    launcher itself has removed (or keeps, --keep) the containers; `abandon(host)` for a lost host."""

    def __init__(self, hosts: list[Host], run_id: str, grace: float, interval: float = INTERVAL):
        self.hosts, self.run_id, self.grace, self.interval = hosts, run_id, grace, interval
        self.peers: dict[int, _Peer] = {}
        self.silence = Silence(time.monotonic())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for h in self.hosts:
            if h.remote is None:
                continue
            try:
                chan = h.remote.open_channel(["sh", "-c", script("watchdog.sh"), "dockerlaunch-watchdog",
                                              f"{self.grace:g}", self.run_id, h.address])
            except DockerlaunchError:
                continue  # the host is already unreachable; `lost` reports it
            self.peers[h.rank] = _Peer(h, chan)
        missing = [h for h in self.hosts if h.rank not in self.peers]
        if missing:
            self.stand_down()
            raise DockerlaunchError(f"host {missing[0].address}: cannot start its watchdog over SSH")
        started = time.monotonic()
        for p in self.peers.values():
            p.last_answer = 0.0  # until the first answer: proves the watchdog runs before anything starts
        self.silence = Silence(started)
        self._thread = threading.Thread(target=self._beat, daemon=True, name="dl-heartbeat")
        self._thread.start()
        deadline = started + READY_TIMEOUT
        while time.monotonic() < deadline and any(p.last_answer == 0.0 for p in self.peers.values()):
            time.sleep(0.05)
        silent = [p for p in self.peers.values() if p.last_answer == 0.0]
        if silent:
            p = silent[0]
            why = p.chan.recv_stderr(4096).decode(errors="replace").strip() if p.chan.recv_stderr_ready() else ""
            self.stand_down()
            raise DockerlaunchError(f"host {p.host.address}: the job's watchdog did not answer within "
                                    f"{READY_TIMEOUT:g}s{': ' + why if why else ''}")

    def _beat(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            peers = list(self.peers.values())
            for p in peers:
                try:
                    while p.chan.recv_ready():
                        if p.chan.recv(64):
                            Silence.answered(p, now)
                except (OSError, EOFError, paramiko.SSHException):
                    pass  # a dead channel simply stops answering
            self.silence.tick(now, peers)
            if now >= next_beat:
                next_beat = now + self.interval
                for p in peers:
                    try:
                        if not p.chan.closed:
                            p.chan.send(b"h")
                            Silence.sent(p, now)
                    except (OSError, EOFError, paramiko.SSHException):
                        pass
            self._stop.wait(TICK)

    def lost(self, timeout: float) -> list[Host]:
        """Hosts whose watchdog has not answered a beat for `timeout` seconds (or whose channel closed)."""
        peers = list(self.peers.values())
        silent = {id(p) for p in self.silence.lost(time.monotonic(), peers, timeout)}
        return [p.host for p in peers if id(p) in silent or (p.chan.closed and p.chan.exit_status_ready())]

    def abandon(self, host: Host) -> None:
        """Stop talking to a lost host without standing its watchdog down: when it comes back, it sees the
        session gone and removes the run's containers after the grace period."""
        p = self.peers.pop(host.rank, None)
        if p is not None:
            try:
                p.chan.close()
            except Exception:  # noqa: BLE001 - the host is gone anyway
                pass

    def stand_down(self) -> None:
        """The launcher takes over (it removed the containers, or keeps them): watchdogs exit quietly."""
        self._stop.set()
        for p in self.peers.values():
            try:
                p.chan.send(b"q")
                p.chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
        deadline = time.monotonic() + 5
        for p in self.peers.values():
            while not p.chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.05)
            p.chan.close()
        self.peers.clear()
