"""SSH connections with paramiko: strict host keys, actionable errors, one reused connection per host.

`Remote` is the command runner everything else sits on (Ray's SSHCommandRunner): an argv is quoted
here, once, so no caller builds a remote shell line by hand; output streams to callbacks; stdin
streams from a file; every command has a deadline.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import paramiko

from dockerlaunch.errors import HostError, SSHError
from dockerlaunch.hosts.targets import SSHTarget, known_hosts_fix

WRITE_FAILURE_GRACE = 5.0  # seconds a command may take to exit after its input failed


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def _add_key(target: SSHTarget, known: Path) -> str:
    """How to add the host's key to `known` (fingerprint first, every value quoted), never a weaker policy."""
    return known_hosts_fix(str(known), [(target.hostname, target.port, target.user)])


def _known_hosts_name(target: SSHTarget) -> str:
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


# OpenSSH's sshd drops unauthenticated connections at random once 10 are pending (MaxStartups 10:30:100): a
# handshake cut before the banner is tried again, after a growing, jittered pause, within the connect timeout.
HANDSHAKE_TRIES = 12
HANDSHAKE_BACKOFF = 0.25  # seconds before the second try; doubled each time, up to HANDSHAKE_BACKOFF_MAX
HANDSHAKE_BACKOFF_MAX = 3.0
# Sessions (commands) at once on one connection: below sshd's default MaxSessions (10), which counts them
SESSIONS_PER_CONNECTION = 8
SESSION_WAIT = 120.0  # seconds a command waits for a free session before it is an error
# sshd frees a closed session only after it has handled every message that arrived with the close (its loop reads
# all that is there, handles it, then collects closed channels): commands that end together and the ones that take
# their places can find sshd still counting the old sessions, and it refuses the new ones ("open failed"). Refused
# opens are tried again for this long, from SESSION_RETRY_FIRST seconds apart, doubled up to 1 s.
SESSION_RETRY = 10.0
SESSION_RETRY_FIRST = 0.02
# Handshakes at once through one jump host's connection (each is a direct-tcpip channel of that connection)
HANDSHAKES_PER_JUMP = 8


def _dropped(e: BaseException) -> bool:
    """A handshake the far end cut before it began (sshd's MaxStartups, a busy bastion): worth another try."""
    if isinstance(e, (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return True
    if isinstance(e, paramiko.SSHException) and not isinstance(e, (paramiko.AuthenticationException,
                                                                   paramiko.BadHostKeyException)):
        msg = str(e)
        return "protocol banner" in msg or "Connection reset" in msg or isinstance(e.__cause__, (EOFError, OSError))
    return False


def _refused(e: BaseException) -> bool:
    """A connection refused at every address of the host (paramiko says `Unable to connect to port N`)."""
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return bool(e.errors) and all(isinstance(x, ConnectionRefusedError) or getattr(x, "errno", None) ==
                                      errno.ECONNREFUSED for x in e.errors.values())
    return isinstance(e, ConnectionRefusedError)


class _Jump:
    """One shared connection to a jump host (ProxyJump): every target behind it tunnels through it, so a bastion
    sees one handshake per launcher, not one per host (its own MaxStartups)."""

    def __init__(self, client: paramiko.SSHClient):
        self.client = client
        self.users = 0
        self.handshakes = threading.BoundedSemaphore(HANDSHAKES_PER_JUMP)

    @property
    def alive(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()


_jumps: dict[tuple, _Jump] = {}
_jumps_lock = threading.Lock()
_jump_locks: dict[tuple, threading.Lock] = {}


def _jump_key(chain: tuple[SSHTarget, ...]) -> tuple:
    return tuple((t.hostname, t.port, t.user, t.identity_files, t.known_hosts, t.host_key_policy) for t in chain)


def _acquire_jump(chain: tuple[SSHTarget, ...], for_target: SSHTarget) -> _Jump:
    """The shared connection to the last hop of `chain` (made through the hops before it), one user more."""
    key = _jump_key(chain)
    with _jumps_lock:
        lock = _jump_locks.setdefault(key, threading.Lock())
    with lock:  # one handshake per jump host; the others wait for it
        with _jumps_lock:
            jump = _jumps.get(key)
            if jump is not None and jump.alive:
                jump.users += 1
                return jump
        if len(chain) == 1:
            client = connect(chain[0])
        else:
            before = _acquire_jump(chain[:-1], for_target)  # held while this hop lives: _release_jump lets go
            try:
                with before.handshakes:
                    client = connect(chain[-1], _sock=lambda: _open_tunnel(before.client, chain[-1], for_target))
            except BaseException:
                _release_jump(chain[:-1])
                raise
        jump = _Jump(client)
        jump.users = 1
        with _jumps_lock:
            _jumps[key] = jump
        return jump


def _release_jump(chain: tuple[SSHTarget, ...]) -> None:
    key = _jump_key(chain)
    with _jumps_lock:
        jump = _jumps.get(key)
        if jump is None:
            return
        jump.users -= 1
        if jump.users > 0:
            return
        del _jumps[key]
    jump.client.close()
    if len(chain) > 1:
        _release_jump(chain[:-1])


def connect(target: SSHTarget, _sock=None) -> paramiko.SSHClient:
    """An authenticated client, or an SSHError that says what failed and how to fix it. `_sock`: a function that
    opens the transport's socket (a tunnel through a jump host), called once per try."""
    if target.jumps and _sock is None:
        jump = _acquire_jump(target.jumps, target)
        try:
            with jump.handshakes:
                client = connect(target, _sock=lambda: _open_tunnel(jump.client, target, target))
        except BaseException:
            _release_jump(target.jumps)
            raise
        client._dockerlaunch_jumps = target.jumps  # type: ignore[attr-defined] # released on close
        return client

    known = Path(os.path.expanduser(target.known_hosts))
    client = paramiko.SSHClient()
    if known.is_file():
        try:
            client.load_host_keys(str(known))
        except Exception as e:
            raise SSHError(target.alias, f"cannot read known_hosts {known}: {e}") from None
    elif target.host_key_policy == "strict":
        raise SSHError(target.alias, f"known_hosts file {known} does not exist: no host key is known yet; "
                       + _add_key(target, known))
    if target.host_key_policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(known))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())

    key_filenames = [os.path.expanduser(p) for p in target.identity_files]
    for f in key_filenames:  # paramiko's own error would be `No such file or directory`, naming neither
        if not os.path.isfile(f):
            raise SSHError(target.alias, f"key file {f} does not exist (ssh.identity_file, the host's identity_file or "
                           "~/.ssh/config's IdentityFile); give an existing private key, or leave it unset to use the "
                           "agent and ~/.ssh/id_*")
    deadline = time.monotonic() + max(target.connect_timeout, 1.0) * 3
    for attempt in range(HANDSHAKE_TRIES):
        try:
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                key_filename=key_filenames or None,
                timeout=target.connect_timeout,
                banner_timeout=target.connect_timeout,
                auth_timeout=target.connect_timeout,
                sock=_sock() if _sock is not None else None,
                allow_agent=True,
                look_for_keys=not key_filenames,
            )
            return client
        except SSHError:
            raise
        except Exception as e:  # noqa: BLE001 - sorted below; anything else is a one-line error too
            pause = min(HANDSHAKE_BACKOFF * (2 ** attempt), HANDSHAKE_BACKOFF_MAX) * random.uniform(0.5, 1.5)
            if _dropped(e) and attempt + 1 < HANDSHAKE_TRIES and time.monotonic() + pause < deadline:
                client.close()
                time.sleep(pause)
                continue
            raise _connect_error(target, known, key_filenames, e, attempt + 1) from None
    raise AssertionError("unreachable")


def _connect_error(target: SSHTarget, known: Path, key_filenames: list[str], e: Exception, tries: int) -> SSHError:
    if isinstance(e, paramiko.BadHostKeyException):
        return SSHError(
            target.alias,
            f"HOST KEY CHANGED ({e.key.get_name()} offered, known_hosts {known} has another). "
            f"If the host was reinstalled, check the new key and run: "
            f"ssh-keygen -R {shlex.quote(_known_hosts_name(target))} -f {shlex.quote(str(known))}"
        )
    if isinstance(e, paramiko.SSHException):
        msg = str(e)
        if "not found in known_hosts" in msg:
            return SSHError(target.alias, f"host key unknown ({_known_hosts_name(target)} is not in {known}); "
                            + _add_key(target, known))
        if isinstance(e, paramiko.AuthenticationException):
            keys = ", ".join(target.identity_files) or "agent and ~/.ssh/id_*"
            return SSHError(
                target.alias,
                f"authentication failed for user {target.user} (keys tried: {keys}); "
                "set ssh.identity_file or the host's user"
            )
    if _dropped(e):
        return SSHError(
            target.alias,
            f"{target.hostname}:{target.port} closed the connection before the SSH handshake, {tries} time(s) "
            "(sshd's MaxStartups dropping connections from many launchers at once, or sshd refusing this client: "
            "check its log and sshd_config)"
        )
    if isinstance(e, paramiko.SSHException):
        return SSHError(target.alias, f"SSH failed: {e}")
    if isinstance(e, TimeoutError):
        return SSHError(
            target.alias,
            f"no answer from {target.hostname}:{target.port} within {target.connect_timeout:g}s "
            "(host down, wrong address, or a firewall)"
        )
    if _refused(e):
        return SSHError(
            target.alias,
            f"cannot connect to {target.hostname}:{target.port}: connection refused (the address answered, but "
            f"nothing listens on port {target.port}); the port is {target.port_from}: give sshd's port there "
            f"(ssh -p PORT {shlex.quote(target.user)}@{shlex.quote(target.hostname)} tries one), or start sshd on "
            "the host"
        )
    if isinstance(e, OSError):
        return SSHError(target.alias, f"cannot connect to {target.hostname}:{target.port}: {e.strerror or e}")
    return SSHError(target.alias, f"SSH failed: {type(e).__name__}: {e}")


def _open_tunnel(via: paramiko.SSHClient, dest: SSHTarget, for_target: SSHTarget):
    transport = via.get_transport()
    if transport is None or not transport.is_active():
        raise SSHError(for_target.alias, "the connection to the jump host was lost")
    try:
        return transport.open_channel("direct-tcpip", (dest.hostname, dest.port), ("127.0.0.1", 0),
                                      timeout=for_target.connect_timeout)
    except paramiko.ChannelException as e:
        raise SSHError(
            for_target.alias,
            f"the jump host cannot reach {dest.hostname}:{dest.port} ({e.text})"
        ) from None
    except (paramiko.SSHException, EOFError, OSError) as e:
        raise SSHError(for_target.alias, f"cannot open a tunnel through the jump host: {e}") from None


@dataclass
class Result:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def last_line(self) -> str:
        """The line that says what went wrong: the last one, except the docker CLI's trailing usage hint and its
        logrus lines (`docker run` may print `ERRO[0000] error waiting for container: context canceled` after the
        daemon's real error, at random)."""
        lines = [x for x in (self.stderr.strip() or self.stdout.strip()).splitlines() if x.strip()]
        said = [x for x in lines if not x.startswith("See 'docker") and not _LOGRUS.match(x)]
        lines = said or lines
        return lines[-1][:300] if lines else f"exit status {self.exit_status}"


_LOGRUS = re.compile(r"(ERRO|WARN|INFO|DEBU)\[\d+\] ")


def _quote(command: str | Sequence[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


class Remote:
    """One SSH connection to a host, reused for every step; channels may run concurrently from threads.

    Commands given as lists are shell-quoted here, so no caller builds a remote shell line by hand.
    """

    def __init__(self, target: SSHTarget, client: paramiko.SSHClient | None = None):
        self.target = target
        self.client = client or connect(target)
        self._sessions = threading.BoundedSemaphore(SESSIONS_PER_CONNECTION)
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)

    @property
    def name(self) -> str:
        return self.target.alias

    @property
    def peer_ip(self) -> str | None:
        """The IP this connection reached (the host's address on our route), or None."""
        transport = self.client.get_transport()
        try:
            return transport.getpeername()[0] if transport else None
        except OSError:
            return None

    def close(self) -> None:
        self.client.close()
        chain = getattr(self.client, "_dockerlaunch_jumps", None)
        if chain:
            self.client._dockerlaunch_jumps = None  # type: ignore[attr-defined] # once
            _release_jump(chain)

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open_channel(self, command: str | Sequence[str]) -> paramiko.Channel:
        """A started command whose stdin/stdout the caller drives (a long-lived conversation, e.g. heartbeats)."""
        return self._channel(_quote(command))

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise SSHError(self.name, "the SSH connection was lost")
        if not self._sessions.acquire(timeout=SESSION_WAIT):
            raise SSHError(self.name, f"{SESSIONS_PER_CONNECTION} commands have been running on this connection for "
                           f"{SESSION_WAIT:g}s: no session free for another (sshd's MaxSessions allows 10)")
        try:
            chan = _open_session(transport, self.target.connect_timeout)
            chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._sessions.release()
            hint = (f", asked for {SESSION_RETRY:g}s (is sshd's MaxSessions below {SESSIONS_PER_CONNECTION + 2}? "
                    f"dockerlaunch keeps at most {SESSIONS_PER_CONNECTION} at once)") \
                if isinstance(e, paramiko.SSHException) and _session_refused(e) and transport.is_active() else ""
            raise SSHError(self.name, f"cannot start a command over SSH: {e}{hint}") from None
        return _Session(chan, self._sessions)  # type: ignore[return-value]

    # long on purpose: one polling loop whose order of reads and checks is what makes it correct (see the
    # comments in it); split, that order would be spread over helpers.
    def stream(
        self,
        command: str | Sequence[str],
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        stdin: bytes | BinaryIO | None = None,
        timeout: float | None = None,
        stop: threading.Event | None = None,
        bulk: bool = False,
    ) -> int:
        """Run a command, handing its output to callbacks as it arrives; returns the exit status.

        `stdin` (bytes or a binary file) is written from a thread while output is read, so large
        streams cannot deadlock. `timeout` bounds the whole command; `stop` ends it early (-1).
        `bulk`: stdin is many bytes (an image): the system's OpenSSH client carries it where it can (openssh.py).
        """
        cmd = _quote(command)
        if bulk and stdin is not None and not isinstance(stdin, (bytes, bytearray)):
            from dockerlaunch.hosts import openssh

            if openssh.unusable(self.target) is None:
                return openssh.stream(self.target, cmd, on_stdout, on_stderr, stdin, timeout, stop)
        chan = self._channel(cmd)
        writer = None
        write_error: list[BaseException] = []
        source_failed: list[bool] = []
        if stdin is None:
            chan.shutdown_write()
        else:
            writer = threading.Thread(target=_feed, args=(chan, stdin, write_error, source_failed), daemon=True)
            writer.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at: float | None = None
        quiet_since: float | None = None
        # an SSH channel wakes this thread when output (or the end) arrives, instead of it polling: with a
        # stream per host at hundreds of hosts, polling alone would keep a core busy
        wake = _wake_on_data(chan)
        try:
            while True:
                if wake is not None:
                    wake.clear()
                busy = False
                if chan.recv_ready():
                    data = chan.recv(65536)
                    busy = True
                    if data and on_stdout:
                        on_stdout(data)
                if chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    busy = True
                    if data and on_stderr:
                        on_stderr(data)
                # read before the buffers: output arrives before EOF, so once EOF is seen, empty buffers mean
                # all of it was read (looked at the other way round, the last output could land in between)
                eof = getattr(chan, "eof_received", True)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last of the output (which waits for window
                    # space): the output ends at EOF. A command whose background child keeps its stdout open
                    # never sends EOF: after EXIT_DRAIN quiet seconds, its output is over too.
                    if eof:
                        break
                    if busy:
                        quiet_since = None
                    elif quiet_since is None:
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > EXIT_DRAIN:
                        break
                if write_error and not busy:
                    # the input failed (or the far end stopped reading): give the command a moment to report
                    # its own status, then give up -- the channel is closed, so it cannot wait for more input
                    failed_at = failed_at or time.monotonic()
                    if time.monotonic() - failed_at > WRITE_FAILURE_GRACE:
                        break
                if stop is not None and stop.is_set():
                    return -1
                if deadline is not None and time.monotonic() > deadline:
                    raise HostError(self.name, f"command timed out after {timeout:g}s: {cmd[:120]}")
                if not busy:
                    if wake is not None:
                        wake.wait(IDLE_WAIT)
                    else:
                        time.sleep(0.01)
            status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        finally:
            chan.close()
            if writer is not None:
                writer.join(timeout=5)
        # input whose own source failed (docker save died) is the cause, whatever status the far end gave on
        # seeing it end early (load.sh: 3), and whether that status won the race with the close (as openssh.py);
        # a write the far end stopped reading is explained by its status, where it gave one
        if write_error and (source_failed or status in (0, -1)):
            raise SSHError(self.name, f"sending input failed: {write_error[0]}")
        return status

    def run(
        self, command: str | Sequence[str], timeout: float | None = 120.0, stdin: bytes | BinaryIO | None = None
    ) -> Result:
        """Run a command and collect its output."""
        out, err = bytearray(), bytearray()
        status = self.stream(command, out.extend, err.extend, stdin=stdin, timeout=timeout)
        return Result(status, out.decode(errors="replace"), err.decode(errors="replace"))

    def run_steps(self, steps: Sequence[str | Sequence[str]], timeout: float | None = 120.0) -> list[Result | None]:
        """Several commands in one round trip, in order, each with its own exit status, stdout and stderr; the
        first that fails ends the batch (the rest are None). At scale every round trip costs a channel, a shell
        and a wait for the slowest host, so the steps a host needs before its start go as one."""
        body = [STEPS_PROLOGUE]
        for step in steps:
            body.append(f"(\n{_quote(step)}\n) >\"$d/o\" 2>\"$d/e\" </dev/null; r=$?\n"
                        'printf \'%s %d %d %d\\n\' "$m" "$r" "$(($(wc -c <"$d/o")))" "$(($(wc -c <"$d/e")))"\n'
                        'cat "$d/o" "$d/e"; [ "$r" -eq 0 ] || exit 0\n')
        out, err = bytearray(), bytearray()
        status = self.stream(["sh", "-c", "".join(body), "sh", STEPS_MARK], out.extend, err.extend, timeout=timeout)
        results = parse_steps(bytes(out), len(steps))
        if results[0] is None:  # the batch itself could not run (no /tmp, a timeout, ...) or its answer is unreadable
            results[0] = Result(status or 1, "", err.decode(errors="replace") or (
                f"exit status {status}" if status else "its answer held no step's frame"))
        return results

    def check(self, command: str | Sequence[str], what: str, timeout: float | None = 120.0,
              stdin: bytes | BinaryIO | None = None) -> Result:
        """run(), raising a one-line error that names the host and the step when it fails."""
        r = self.run(command, timeout=timeout, stdin=stdin)
        if not r.ok:
            raise HostError(self.name, r.last_line(), step=what, exit_status=r.exit_status)
        return r


STEPS_MARK = "@dl-step"
STEPS_PROLOGUE = ('m=$1; d=$(mktemp -d "${TMPDIR:-/tmp}/dl-steps.XXXXXX") || exit 125\n'
                  'trap \'rm -rf "$d"\' EXIT; trap \'exit 129\' HUP INT TERM\n')


def parse_steps(out: bytes, count: int) -> list[Result | None]:
    """`run_steps`' output: per step a line `MARK status out_len err_len`, then exactly those bytes."""
    results: list[Result | None] = [None] * count
    # what a login's rc file prints (Debian's bash reads ~/.bashrc for an SSH command) comes before the first frame
    mark = STEPS_MARK.encode() + b" "
    pos = 0 if out.startswith(mark) else out.find(b"\n" + mark) + 1
    for k in range(count):
        nl = out.find(b"\n", pos)
        head = out[pos:nl].split() if nl >= 0 else []
        if len(head) != 4 or head[0] != STEPS_MARK.encode():
            break
        status, n_out, n_err = (int(x) for x in head[1:])
        start = nl + 1
        if start + n_out + n_err > len(out):
            break  # cut short (the connection dropped): not a result
        results[k] = Result(status, out[start:start + n_out].decode(errors="replace"),
                            out[start + n_out:start + n_out + n_err].decode(errors="replace"))
        pos = start + n_out + n_err
    return results


EXIT_DRAIN = 2.0  # seconds without output, after the exit status, before a stream without EOF counts as over
IDLE_WAIT = 0.25  # seconds an idle stream sleeps between looks at its deadline, `stop` and failed input


def _wake_on_data(chan) -> threading.Event | None:
    """An event paramiko sets when stdout or stderr data arrives or the channel closes (None: a local channel)."""
    buffers = [getattr(chan, "in_buffer", None), getattr(chan, "in_stderr_buffer", None)]
    if any(b is None or not hasattr(b, "set_event") for b in buffers):
        return None
    wake = threading.Event()
    for b in buffers:
        b.set_event(wake)
    wake.set()
    return wake


class _Session:
    """A paramiko channel that gives its connection's session slot back when closed (once)."""

    def __init__(self, chan: paramiko.Channel, slots: threading.BoundedSemaphore):
        self._chan, self._slots = chan, slots
        self._held = True
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self._chan, name)

    def close(self) -> None:
        try:
            self._chan.close()
        finally:
            with self._lock:
                held, self._held = self._held, False
            if held:
                self._slots.release()


def _open_session(transport: paramiko.Transport, timeout: float) -> paramiko.Channel:
    """A session channel; one sshd refused is asked for again while SESSION_RETRY lasts: sshd may still count
    sessions that have just closed (see there). Never a timeout (sshd did not answer: asking again would only
    wait longer, and leave more channels it may open late)."""
    deadline = time.monotonic() + SESSION_RETRY
    pause = SESSION_RETRY_FIRST
    while True:
        try:
            return transport.open_session(timeout=timeout)
        except paramiko.SSHException as e:
            if not _session_refused(e) or time.monotonic() + pause > deadline or not transport.is_active():
                raise
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _session_refused(e: paramiko.SSHException) -> bool:
    """sshd answered a session open with a refusal: a ChannelException ("open failed"), or, where another thread's
    open took the transport's one saved error first, the bare error paramiko raises in its place (it has no type
    of its own: its text is all that tells it)."""
    return isinstance(e, paramiko.ChannelException) or str(e) == "Unable to open channel."


def _feed(chan: paramiko.Channel, stdin: bytes | BinaryIO, errors: list[BaseException],
          source_failed: list[bool]) -> None:
    try:
        # memoryview: sendall slices what is left after each packet, and slicing bytes copies it
        if isinstance(stdin, (bytes, bytearray)):
            chan.sendall(memoryview(stdin))
        else:
            while True:
                try:
                    chunk = stdin.read(1 << 20)
                except BaseException:
                    source_failed.append(True)  # before the error is appended: who sees it sees this
                    raise
                if not chunk:
                    break
                chan.sendall(memoryview(chunk))
        chan.shutdown_write()
    except BaseException as e:  # noqa: BLE001 - reported by the reader
        errors.append(e)
        if source_failed:
            # never leave the far end waiting for input that will not come: close the channel, so the remote
            # command sees its input end (a `docker load` fails on the truncated tar and nothing is tagged)
            try:
                chan.close()
            except Exception:  # noqa: BLE001 - already closed
                pass
