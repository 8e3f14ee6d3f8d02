"""Hosts that die, freeze or lose the launcher: heartbeats both ways, one conversation per host.

On every host of a running job, `scripts/watchdog.sh` reads heartbeats from the launcher over SSH and
answers each one. The launcher declares a host lost when its answers stop for `job.host_timeout`
seconds (a frozen or powered-off host, a cut network: TCP alone may never say so); the host removes
the run's containers itself when the launcher's session drops (after `job.orphan_grace` seconds) or
goes silent -- so a launcher killed with SIGKILL, or whose machine vanished, leaves nothing running.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import paramiko

from dockerlaunch.backends.docker import script
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.hosts.session import Host

INTERVAL = 2.0  # seconds between heartbeats
READY_TIMEOUT = 15.0  # for the first answer of every watchdog


@dataclass
class _Peer:
    host: Host
    chan: paramiko.Channel
    last_answer: float = field(default_factory=time.monotonic)


class Watchdogs:
    """Start with `start()`; `lost(timeout)` names hosts that stopped answering; `stand_down()` when the
    launcher itself has removed (or keeps, --keep) the containers; `abandon(host)` for a lost host."""

    def __init__(self, hosts: list[Host], run_id: str, grace: float, interval: float = INTERVAL):
        self.hosts, self.run_id, self.grace, self.interval = hosts, run_id, grace, interval
        self.peers: dict[int, _Peer] = {}
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
            for p in list(self.peers.values()):
                try:
                    while p.chan.recv_ready():
                        if p.chan.recv(64):
                            p.last_answer = time.monotonic()
                    if now >= next_beat and not p.chan.closed:
                        p.chan.send(b"h")
                except (OSError, EOFError, paramiko.SSHException):
                    pass  # a dead channel simply stops answering
            if now >= next_beat:
                next_beat = now + self.interval
            self._stop.wait(0.2)

    def lost(self, timeout: float) -> list[Host]:
        """Hosts whose watchdog has not answered for `timeout` seconds (or whose channel closed)."""
        now = time.monotonic()
        return [p.host for p in self.peers.values()
                if now - p.last_answer > timeout or (p.chan.closed and p.chan.exit_status_ready())]

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
