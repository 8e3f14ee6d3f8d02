"""The `local` host: this machine, through its own Docker engine, without SSH.

`LocalRemote` is a `Remote` whose channels are local `sh -c` processes instead of SSH sessions, so every
layer above (DockerHost, watchdogs, doctor, push, diagnostics) runs unchanged. Like SSH sessions, the
processes get a session of their own: a Ctrl-C in the launcher's terminal reaches the launcher, which then
cleans up, and never kills a `docker run` or a watchdog half-way. A launcher that dies closes their stdin,
which is what a dropped SSH session looks like to the watchdog.
"""

from __future__ import annotations

import collections
import subprocess
import threading

from dockerlaunch.errors import SSHError
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import SSHTarget


class LocalChannel:
    """The part of paramiko.Channel that Remote and the watchdogs use, over a local process."""

    def __init__(self, command: str, name: str):
        try:
            self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise SSHError(name, f"cannot start a local command: {e}") from None
        self.closed = False
        self._out: collections.deque[bytes] = collections.deque()
        self._err: collections.deque[bytes] = collections.deque()
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
                         threading.Thread(target=self._pump, args=(self.proc.stderr, self._err), daemon=True)]
        for t in self._readers:
            t.start()

    def _pump(self, stream, into: collections.deque) -> None:
        try:
            while True:
                data = stream.read1(65536)
                if not data:
                    return
                with self._lock:
                    into.append(data)
        except (OSError, ValueError):
            return

    @staticmethod
    def _take(q: collections.deque, n: int) -> bytes:
        out = bytearray()
        while q and len(out) < n:
            chunk = q.popleft()
            room = n - len(out)
            out += chunk[:room]
            if len(chunk) > room:
                q.appendleft(chunk[room:])
        return bytes(out)

    def recv_ready(self) -> bool:
        return bool(self._out)

    def recv_stderr_ready(self) -> bool:
        return bool(self._err)

    def recv(self, n: int) -> bytes:
        with self._lock:
            return self._take(self._out, n)

    def recv_stderr(self, n: int) -> bytes:
        with self._lock:
            return self._take(self._err, n)

    def exit_status_ready(self) -> bool:
        # only once its output is all read in: the caller stops reading when this says the command is done
        return self.proc.poll() is not None and not any(t.is_alive() for t in self._readers)

    def recv_exit_status(self) -> int:
        return self.proc.wait()

    def send(self, data: bytes) -> int:
        if self.proc.stdin is None or self.proc.stdin.closed:
            raise OSError("Socket is closed")
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise OSError(f"Socket is closed ({e})") from None
        return len(data)

    def sendall(self, data) -> None:
        self.send(bytes(data))

    def shutdown_write(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        """Like closing an SSH channel: the command loses its input and output but is not killed."""
        self.closed = True
        self.shutdown_write()
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


class LocalRemote(Remote):
    def __init__(self, target: SSHTarget):
        self.target = target
        self.client = None

    @property
    def peer_ip(self) -> str | None:
        return None

    def close(self) -> None:
        pass

    def _channel(self, command: str) -> LocalChannel:
        return LocalChannel(command, self.name)


def open_remote(target: SSHTarget) -> Remote:
    """A connection to the host: SSH, or for `local` this machine's own processes."""
    return LocalRemote(target) if target.local else Remote(target)
