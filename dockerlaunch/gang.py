"""The gang supervisor: a job's fate decided beside the job, so a detached job keeps every guarantee.

Every container of a supervised job runs this file as its entrypoint, docker-init's direct child (`up` copies it
into the job's folder on each host, mounted read-only at /.dockerlaunch; gang-entry.sh picks the image's python3).
It runs the image's ENTRYPOINT plus the command as its child, in a session of its own, and each rank's member talks
to rank 0's coordinator over the host network. The coordinator decides -- a rank failed, a host went silent, the
job hung, every rank finished -- and every member obeys: stop the attempt (SIGTERM to its session, SIGKILL after
STOP_GRACE), wait until every process of that session is gone (the barrier), then start the next attempt or end.
The container exits with the job's code; a SIGKILLed wrapper ends its container, so no rank outlives it.

Standard library only, Python >= 3.8 (FLOOR): it runs under the image's own python3. The launcher imports the
rules (`should_restart`, `hung`, `silent`, the causes and codes), so attached and detached runs decide alike.

The channel: a per-run secret reaches each container on `docker exec`'s stdin into a tmpfs (`take-secret`; never
argv, env, labels, mounts or a log); each connection proves the secret both ways by HMAC over fresh nonces of both
ends (a captured handshake replays into nothing), and every later message carries a sequence number and an HMAC
under the connection's own key. A stranger is logged once per source address.

What each host keeps, under the run's folder (RUNDIR = <job folder>/runs/<run id>, the same path inside):
events.jsonl (the gang's events), attempts.jsonl (one line per attempt, as the launcher's run folders), result.json
(how the job ended), attempt-N/rank<R>-<host>.log (that rank's output), attempt-N/stacks-rank<R>.txt (hang dumps).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

FLOOR = (3, 8)
PROTOCOL = "dockerlaunch-gang/1"

# causes, as the launcher's records name them (job/recovery.Cause has the same values)
SUCCEEDED = "succeeded"
RANK_FAILED = "rank failed"
HOST_LOST = "host lost"
HANG = "hang"
START_FAILED = "start failed"
INTERRUPTED = "interrupted"
RESTARTABLE = frozenset({RANK_FAILED, HOST_LOST, HANG, START_FAILED})

EXIT_HOST_LOST = 75  # EX_TEMPFAIL: try again later
EXIT_HANG = 124  # as timeout(1)
EXIT_START = 1  # the gang never formed
EXIT_TERM = 143  # stopped by a signal (docker stop, `down`)

BEAT = 1.0  # seconds between a member's beats (answered by the coordinator)
STOP_GRACE = 5.0  # SIGTERM to SIGKILL: a rank that ignores SIGTERM is gone within a fail-fast of 10 s
KILL_WAIT = 10.0  # after SIGKILL: processes still there (D state) end the gang instead of a restart beside them
DUMP_DEADLINE = 90.0  # a hang's stacks: every rank's py-spy together
HANDSHAKE_TIMEOUT = 5.0
SEND_TIMEOUT = 3.0
MAX_LINE = 1 << 16
SECRET_DIR = "/run/dockerlaunch/gang"  # in a tmpfs of the container (the plan mounts /run/dockerlaunch)
TAG = "[dockerlaunch] "


# ------------------------------------------------------------------------------------------------- the rules

def should_restart(cause: str, attempt: int, max_restarts: int) -> bool:
    """Another attempt only after a failure another start can fix, and only while restarts are left."""
    return cause in RESTARTABLE and attempt < max_restarts


def hung(progress_at: dict, now: float, timeout: float | None) -> bool:
    """No running rank made progress (a line, or a job.progress_regex match) for `timeout` seconds."""
    return timeout is not None and bool(progress_at) and now - max(progress_at.values()) > timeout


def silent(last_seen: dict, now: float, timeout: float) -> list:
    """Ranks not heard from for `timeout` seconds, in rank order."""
    return sorted(r for r, t in last_seen.items() if now - t > timeout)


def exit_code_of(cause: str, rank_code: int | None) -> int:
    """The job's exit code for how it ended: a failed rank's own code, else the cause's."""
    if cause == SUCCEEDED:
        return 0
    if cause == RANK_FAILED and rank_code:
        return rank_code
    return {HOST_LOST: EXIT_HOST_LOST, HANG: EXIT_HANG, INTERRUPTED: EXIT_TERM}.get(cause, EXIT_START)


def describe(result: dict) -> str:
    """One line for a result or an attempt record: `rank failed: rank 1 (10.0.0.2) exited with 3`."""
    what = str(result.get("cause", "?"))
    if result.get("rank") is not None:
        what += ": rank %s (%s)" % (result["rank"], result.get("host"))
        if result.get("exit_code") is not None:
            what += " exited with %s" % result["exit_code"]
    if result.get("detail"):
        what += "; " + str(result["detail"])
    return what


# ------------------------------------------------------------------------------------------------- the wire

def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


class Wire:
    """One authenticated connection: JSON lines, each `{"n": seq, "m": body, "a": hmac}` under the session key."""

    def __init__(self, sock: socket.socket, key: bytes, send_dir: str, recv_dir: str):
        self.sock, self.key, self.send_dir, self.recv_dir = sock, key, send_dir, recv_dir
        self.sent = self.received = 0
        self.buf = b""
        self.lock = threading.Lock()

    def send(self, body: dict) -> bool:
        """False when the peer does not take it within SEND_TIMEOUT (a frozen host never blocks the sender)."""
        with self.lock:
            self.sent += 1
            text = json.dumps(body, sort_keys=True)
            line = json.dumps({"n": self.sent, "m": text, "a": _mac(self.key, self.send_dir, str(self.sent), text)})
            data = line.encode() + b"\n"
            deadline = time.monotonic() + SEND_TIMEOUT
            try:
                while data:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                        self.close()
                        return False
                    try:
                        data = data[self.sock.send(data, socket.MSG_DONTWAIT):]
                    except BlockingIOError:
                        continue
                return True
            except (OSError, ValueError):
                return False

    def recv(self, timeout: float | None = None) -> dict | None:
        """The next message; None at the end of the connection. A forged or replayed message ends it too."""
        raw = read_line(self.sock, self, timeout)
        if raw is None:
            return None
        try:
            outer = json.loads(raw)
            n, text, mac = int(outer["n"]), str(outer["m"]), str(outer["a"])
        except (ValueError, KeyError, TypeError):
            return None
        if n != self.received + 1 or not hmac.compare_digest(mac, _mac(self.key, self.recv_dir, str(n), text)):
            return None
        self.received = n
        try:
            body = json.loads(text)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _Timeout(Exception):
    pass


def read_line(sock: socket.socket, holder, timeout: float | None) -> bytes | None:
    """A line from `sock` (bytes kept in holder.buf between calls); None at EOF or past MAX_LINE; _Timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in holder.buf:
        if len(holder.buf) > MAX_LINE:
            return None
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise _Timeout()
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise _Timeout() from None
        except OSError:
            return None
        if not chunk:
            return None
        holder.buf += chunk
    line, _, holder.buf = holder.buf.partition(b"\n")
    return line


def _plain(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _plain_recv(sock: socket.socket, holder, timeout: float) -> dict:
    raw = read_line(sock, holder, timeout)
    if raw is None:
        raise OSError("connection closed")
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    return obj


def server_handshake(sock: socket.socket, secret: bytes, run: str) -> tuple[Wire, int]:
    """The coordinator's side: the client proves the secret over our nonce, then we prove it over theirs.
    Raises ValueError (a stranger) or OSError/_Timeout (a broken connection)."""

    class H:
        buf = b""
    ns = secrets.token_hex(16)
    _plain(sock, {"hello": PROTOCOL, "run": run, "nonce": ns})
    msg = _plain_recv(sock, H, HANDSHAKE_TIMEOUT)
    try:
        rank, nc, mac = int(msg["rank"]), str(msg["nonce"]), str(msg["mac"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("a malformed hello") from None
    if len(nc) != 32 or not hmac.compare_digest(mac, _mac(secret, "client", run, ns, nc, str(rank))):
        raise ValueError("a wrong proof of the secret")
    _plain(sock, {"mac": _mac(secret, "server", run, nc, ns, str(rank))})
    wire = Wire(sock, bytes.fromhex(_mac(secret, "session", run, ns, nc)), "c2m", "m2c")
    wire.buf = H.buf
    return wire, rank


def client_handshake(sock: socket.socket, secret: bytes, run: str, rank: int) -> Wire:
    """A member's side; raises ValueError when the other end does not prove the secret (not our coordinator)."""

    class H:
        buf = b""
    hello = _plain_recv(sock, H, HANDSHAKE_TIMEOUT)
    if hello.get("hello") != PROTOCOL or hello.get("run") != run:
        raise ValueError("not this run's coordinator: %r" % str(hello)[:200])
    ns, nc = str(hello.get("nonce")), secrets.token_hex(16)
    _plain(sock, {"rank": rank, "nonce": nc, "mac": _mac(secret, "client", run, ns, nc, str(rank))})
    answer = _plain_recv(sock, H, HANDSHAKE_TIMEOUT)
    if not hmac.compare_digest(str(answer.get("mac")), _mac(secret, "server", run, nc, ns, str(rank))):
        raise ValueError("the coordinator did not prove the secret")
    wire = Wire(sock, bytes.fromhex(_mac(secret, "session", run, ns, nc)), "m2c", "c2m")
    wire.buf = H.buf
    return wire


# ------------------------------------------------------------------------------------------------- records

def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


class Records:
    """This host's files of the run (RUNDIR): appended lines and whole files replaced atomically."""

    def __init__(self, spec: dict):
        self.dir = spec["dir"]
        self.rank, self.host = spec["rank"], spec["host"]
        self.broken = ""  # why the folder could not be written (said once on stderr)

    def _write(self, name: str, text: str, append: bool) -> None:
        path = os.path.join(self.dir, name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if append:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "a") as f:
                    f.write(text)
                return
            # a name of this thread's own: the link's thread and the main one may replace one file at once
            tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as e:
            if not self.broken:
                self.broken = str(e)
                say("cannot write the run's records in %s: %s" % (self.dir, e))

    def event(self, event: dict) -> None:
        self._write("events.jsonl", json.dumps(event, sort_keys=True) + "\n", True)

    def attempt(self, record: dict) -> None:
        self._write("attempts.jsonl", json.dumps(record, sort_keys=True) + "\n", True)

    def result(self, result: dict) -> None:
        self._write("result.json", json.dumps(result, sort_keys=True, indent=1) + "\n", False)

    def run_info(self, spec: dict) -> None:
        self._write("run-rank%d.json" % self.rank, json.dumps(
            {k: v for k, v in spec.items() if k != "command"}, sort_keys=True) + "\n", False)

    def log_path(self, attempt: int) -> str:
        safe = str(self.host).replace("/", "_").replace(":", "_")
        return os.path.join(self.dir, "attempt-%d" % attempt, "rank%d-%s.log" % (self.rank, safe))

    def stacks_path(self, attempt: int) -> str:
        return os.path.join(self.dir, "attempt-%d" % attempt, "stacks-rank%d.txt" % self.rank)


def say(text: str) -> None:
    """A line of the wrapper's own on the container's output (docker logs), marked as dockerlaunch's."""
    try:
        os.write(1, (TAG + text + "\n").encode(errors="replace"))
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------- one attempt

def session_pids(sid: int) -> list:
    """(pid, state, comm) of every live process of session `sid` in this PID namespace (zombies are gone)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and fields[3] == str(sid) and fields[0] != "Z":
            out.append((int(name), fields[0], comm))
    return out


class Attempt:
    """The command's one run on this rank: its output to the container's and to the attempt's file, progress."""

    def __init__(self, spec: dict, attempt: int, records: Records):
        self.spec, self.attempt, self.records = spec, attempt, records
        self.regex = re.compile(spec["progress_regex"]) if spec.get("progress_regex") else None
        self.progress_at = time.monotonic()
        self.proc = None
        self.code = None
        self.pump = None

    def start(self) -> None:
        env = dict(os.environ)
        for k in ("DL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
            env[k] = str(self.attempt)
        path = self.records.log_path(self.attempt)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            log = open(path, "ab")
        except OSError as e:
            say("cannot keep attempt %d's output in %s: %s" % (self.attempt, path, e))
            log = None
        if self.spec.get("tty"):
            master, slave = os.openpty()
            _raw_output(slave)
            out = slave
        else:
            master, out = os.pipe()
        say("rank %d attempt %d starts (DL_RESTART_COUNT=%d)" % (self.spec["rank"], self.attempt, self.attempt))
        try:
            self.proc = subprocess.Popen(self.spec["command"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env=env, start_new_session=True, close_fds=True)
        except OSError as e:
            os.close(master)
            os.close(out)
            msg = "cannot run %s: %s\n" % (self.spec["command"][:1], e)
            os.write(1, msg.encode())
            if log:
                log.write(msg.encode())
                log.close()
            self.code = 127
            return
        os.close(out)
        self.pump = threading.Thread(target=self._pump, args=(master, log), daemon=True)
        self.pump.start()

    def _pump(self, fd: int, log) -> None:
        partial = b""
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                data = b""  # EIO: every writer of the pty is gone
            if not data:
                break
            try:
                os.write(1, data)
            except OSError:
                pass
            if log:
                try:
                    log.write(data)
                    log.flush()
                except OSError:
                    pass
            if self.regex is None:
                self.progress_at = time.monotonic()
                continue
            partial += data
            *lines, partial = partial.split(b"\n")
            partial = partial[-MAX_LINE:]
            if any(self.regex.search(x.decode(errors="replace").rstrip("\r")) for x in lines):
                self.progress_at = time.monotonic()
        os.close(fd)
        if log:
            log.close()

    def poll(self) -> int | None:
        if self.code is None and self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                if self.pump is not None:
                    self.pump.join(2.0)  # its last lines before the exit is reported
                self.code = rc if rc >= 0 else 128 - rc
        return self.code

    def stop(self) -> list:
        """Every process of the attempt's session gone: SIGTERM, SIGKILL after STOP_GRACE; what is left after
        KILL_WAIT (pid, state, comm) would not die."""
        if self.proc is None:
            return []
        sid = self.proc.pid
        self._signal(sid, signal.SIGTERM)
        deadline = time.monotonic() + float(self.spec.get("stop_grace", STOP_GRACE))
        while time.monotonic() < deadline:
            self.poll()
            if not session_pids(sid):
                return []
            time.sleep(0.1)
        self._signal(sid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT
        while time.monotonic() < deadline:
            self.poll()
            left = session_pids(sid)
            if not left:
                return []
            self._signal(sid, signal.SIGKILL)
            time.sleep(0.2)
        self.poll()
        return session_pids(sid)

    @staticmethod
    def _signal(sid: int, sig: int) -> None:
        try:
            os.killpg(sid, sig)
        except OSError:
            pass
        for pid, _, _ in session_pids(sid):  # those that moved to a group of their own
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def dump(self) -> tuple[str, str]:
        """Every Python process of the attempt's stacks into stacks-rank<R>.txt: (path, note)."""
        path = self.records.stacks_path(self.attempt)
        spy = _pyspy()
        if spy is None:
            return "", "no py-spy in the image or the job's folder"
        pids = [p for p, state, comm in session_pids(self.proc.pid)] if self.proc else []
        chunks, notes = [], []
        for pid in pids:
            try:
                r = subprocess.run([spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=30)
                text = r.stdout.decode(errors="replace")
            except (OSError, subprocess.TimeoutExpired) as e:
                text, r = str(e), None
            if r is None or r.returncode != 0:
                if "Permission denied" in text or "Operation not permitted" in text:
                    notes.append(_ptrace_note())
                if "Failed to find python version" in text or "not a python" in text.lower():
                    continue  # not a Python process (sh, torchrun's shell wrapper)
            chunks.append("=== pid %d\n%s" % (pid, text))
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("\n".join(chunks) or "no Python process to dump\n")
        except OSError as e:
            return "", "cannot write %s: %s" % (path, e)
        return path, "; ".join(dict.fromkeys(notes))


def _raw_output(fd: int) -> None:
    """The child's terminal writes `\\n` as it is (no CR added): the container's own terminal adds it once. Its
    size is the container's terminal's (else 50 x 200): a 0 x 0 terminal breaks progress bars that ask."""
    try:
        import fcntl
        import struct
        import termios
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        try:
            rows, cols = struct.unpack("HHHH", fcntl.ioctl(1, termios.TIOCGWINSZ, b"\0" * 8))[:2]
        except OSError:
            rows = cols = 0
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows or 50, cols or 200, 0, 0))
    except (ImportError, OSError):
        pass
    except Exception:  # termios.error
        pass


def _pyspy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    staged = sorted(n for n in os.listdir(here) if n.startswith("py-spy")) if os.path.isdir(here) else []
    return os.path.join(here, staged[-1]) if staged else None


def _ptrace_note(scope_file: str = "/proc/sys/kernel/yama/ptrace_scope", uid: int | None = None) -> str:
    """Why py-spy may not trace the ranks, for the hang's event (the restart goes ahead without the stacks)."""
    try:
        with open(scope_file) as f:
            scope = f.read().strip()
    except OSError:
        scope = ""
    uid = os.getuid() if uid is None else uid
    who = "uid %d" % uid
    if scope and scope != "0" and uid != 0:
        return ("py-spy was refused: Yama's ptrace_scope is %s and the container's user (%s) is not root, so it may "
                "not trace the ranks (run the container as root, or set kernel.yama.ptrace_scope=0 on the host)"
                % (scope, who))
    return "py-spy was refused (%s): is SYS_PTRACE off (diagnostics.ptrace)?" % who


# ------------------------------------------------------------------------------------------------- coordinator

class Coordinator:
    """Rank 0's: the gang's one decider. Runs in threads of rank 0's wrapper; `done` is set once every member
    was told how the job ended."""

    def __init__(self, spec: dict, secret: bytes):
        self.spec, self.secret = spec, secret
        self.n = spec["nnodes"]
        self.wires = {}  # rank -> Wire
        self.seen = {}  # rank -> monotonic time of its last message
        self.inbox = queue.Queue()
        self.strangers = set()
        self.done = threading.Event()
        self.listener = None

    def listen(self) -> None:
        family = socket.AF_INET6 if ":" in self.spec["addr"] else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.spec["addr"], self.spec["port"]))
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:  # MASTER_ADDR is not this host's own (NAT, advertise_addr)
                raise
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", self.spec["port"]))
        s.listen(256)
        self.listener = s
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, peer[0]), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        try:
            wire, rank = server_handshake(sock, self.secret, self.spec["run"])
            if not 0 <= rank < self.n:
                raise ValueError("rank %d out of range" % rank)
        except (ValueError, OSError, _Timeout) as e:
            if peer not in self.strangers:
                self.strangers.add(peer)
                self.inbox.put((None, {"t": "stranger", "peer": peer, "why": str(e)[:200]}))
            sock.close()
            return
        old = self.wires.get(rank)
        self.wires[rank] = wire
        if old is not None:
            old.close()
        while True:
            try:
                msg = wire.recv()
            except _Timeout:
                continue
            if msg is None:
                break
            self.inbox.put((rank, msg))
        if self.wires.get(rank) is wire:
            self.wires.pop(rank, None)

    def send(self, rank: int, body: dict) -> None:
        w = self.wires.get(rank)
        if w is not None:
            w.send(body)

    def broadcast(self, body: dict, ranks=None) -> None:
        for r in list(self.wires) if ranks is None else ranks:
            self.send(r, body)

    def event(self, what: str, **fields) -> None:
        e = dict(fields, t=time.time(), when=now_iso(), event=what)
        e.setdefault("text", what)
        self.broadcast({"t": "event", "e": e})

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.done.set()
            try:
                self.listener.close()
            except OSError:
                pass

    def _messages(self, until: float):
        """(rank, msg) until the deadline; beats are answered and counted, strangers logged."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                rank, msg = self.inbox.get(timeout=min(left, 0.2))
            except queue.Empty:
                yield None, None
                continue
            if rank is None:
                self.event("stranger", text="a connection from %s that did not prove the run's secret (%s): "
                           "ignored; further ones from there are not logged" % (msg["peer"], msg["why"]),
                           peer=msg["peer"])
                continue
            self.seen[rank] = time.monotonic()
            if msg.get("t") == "beat":
                self.send(rank, {"t": "ack"})
            yield rank, msg

    def _run(self) -> None:
        spec, n = self.spec, self.n
        t0 = time.monotonic()
        hellos = set()
        for rank, msg in self._messages(t0 + spec["start_timeout"]):
            if rank is not None and msg.get("t") == "hello":
                hellos.add(rank)
            if len(hellos) == n:
                break
        if len(hellos) < n:
            missing = sorted(set(range(n)) - hellos)
            hosts = ", ".join("rank %d (%s)" % (r, spec["hosts"][r]) for r in missing)
            self._end(START_FAILED, detail="the gang did not form within %gs: %s never joined (container not "
                      "started, or port %d on %s blocked?)" % (spec["start_timeout"], hosts, spec["port"],
                                                              spec["addr"]), attempt=0, attempts=0)
            return
        self.event("formed", text="the gang formed: %d rank(s)" % n)
        attempt = 0
        while True:
            started, t_start = now_iso(), time.monotonic()
            ending = self._attempt(attempt)
            cause, rank, code = ending["cause"], ending.get("rank"), ending.get("exit_code")
            record = {"attempt": attempt, "cause": cause, "code": exit_code_of(cause, code), "started": started,
                      "seconds": round(time.monotonic() - t_start, 1), "hosts": list(spec["hosts"]), "rank": rank,
                      "host": spec["hosts"][rank] if rank is not None else None, "exit_code": code, "swaps": [],
                      "detail": ending.get("detail", "")}
            if cause == SUCCEEDED:
                self.broadcast({"t": "attempt", "r": record})
                self._end(SUCCEEDED, attempt=attempt)
                return
            if cause == INTERRUPTED:  # docker stop / `down`: stopping is under way everywhere; nothing restarts
                self.broadcast({"t": "stop", "attempt": attempt, "why": cause})
                self.broadcast({"t": "attempt", "r": record})
                self._end(cause, rank=rank, exit_code=code, detail=ending.get("detail", ""), attempt=attempt)
                return
            stuck = self._stop_all(attempt, ending)
            if stuck:
                record["detail"] = (record["detail"] + "; " if record["detail"] else "") + stuck
            self.broadcast({"t": "attempt", "r": record})
            if stuck or not should_restart(cause, attempt, spec["max_restarts"]):
                detail = record["detail"]
                if not stuck and cause in RESTARTABLE and spec["max_restarts"]:
                    detail = (detail + "; " if detail else "") + "no restart left (job.max_restarts %d)" % \
                        spec["max_restarts"]
                self._end(cause, rank=rank, exit_code=code, detail=detail, attempt=attempt)
                return
            attempt += 1
            self.event("restart", attempt=attempt, text="restarting every rank in %gs: attempt %d of at most %d "
                       "restart(s) (DL_RESTART_COUNT=%d)" % (spec["backoff"], attempt, spec["max_restarts"], attempt))
            for _ in self._messages(time.monotonic() + spec["backoff"]):
                pass

    def _attempt(self, attempt: int) -> dict:
        """Start every rank, then watch until the attempt ends; returns how (cause, rank, exit_code, detail)."""
        spec, n = self.spec, self.n
        now = time.monotonic()
        for r in range(n):
            self.seen[r] = max(self.seen.get(r, now), now)
        self.broadcast({"t": "start", "attempt": attempt}, range(n))
        self.event("started", attempt=attempt, text="attempt %d started on %d rank(s)" % (attempt, n))
        codes, progress = {}, {r: time.monotonic() for r in range(n)}
        while True:
            for rank, msg in self._messages(time.monotonic() + 0.5):
                now = time.monotonic()
                kind = msg.get("t") if rank is not None else None
                if kind == "hello" and msg.get("attempt") == attempt and msg.get("code") is not None:
                    kind = "exit"  # its exit was sent while the connection was down
                elif kind == "hello" and msg.get("attempt") != attempt:
                    self.send(rank, {"t": "start", "attempt": attempt})  # it joined again without this attempt
                if kind in ("exit", "beat") and msg.get("attempt") == attempt:
                    if kind == "beat" and rank not in codes:
                        progress[rank] = now - max(0.0, float(msg.get("age", 0)))
                    elif kind == "exit":
                        code = int(msg.get("code", 1))
                        codes[rank] = code
                        progress.pop(rank, None)
                        if msg.get("signal"):
                            return {"cause": INTERRUPTED, "rank": rank, "exit_code": code, "lost": [rank],
                                    "detail": "rank %d was stopped by a signal (docker stop, `down`)" % rank}
                        if code != 0:
                            self.event("rank-exit", attempt=attempt, rank=rank, code=code,
                                       text="rank %d (%s) exited with %d: stopping every rank" % (
                                           rank, spec["hosts"][rank], code))
                            return {"cause": RANK_FAILED, "rank": rank, "exit_code": code}
                        self.event("rank-exit", attempt=attempt, rank=rank, code=0,
                                   text="rank %d (%s) finished" % (rank, spec["hosts"][rank]))
                        if len(codes) == n:
                            return {"cause": SUCCEEDED}
                gone = silent(self.seen, now, spec["host_timeout"])
                if gone:
                    r = gone[0]
                    self.event("host-lost", attempt=attempt, rank=r, text="rank %d (%s) silent for %gs: host lost"
                               % (r, spec["hosts"][r], spec["host_timeout"]))
                    return {"cause": HOST_LOST, "rank": r, "lost": gone, "detail": "silent for %gs" %
                            spec["host_timeout"]}
                if hung(progress, now, spec.get("hang_timeout")):
                    return self._hang(attempt, progress, now)

    def _hang(self, attempt: int, progress: dict, now: float) -> dict:
        spec = self.spec
        quiet = min(progress, key=progress.get)
        what = "matched job.progress_regex" if spec.get("progress_regex") else "printed a line"
        self.event("hang", attempt=attempt, rank=quiet, text="no rank %s for %gs: the job hangs (quietest: rank %d "
                   "(%s), silent for %.0fs); dumping every rank's stacks" % (
                       what, spec["hang_timeout"], quiet, spec["hosts"][quiet], now - progress[quiet]))
        live = [r for r in range(self.n) if r in self.wires]
        self.broadcast({"t": "dump", "attempt": attempt}, live)
        answered = {}
        for rank, msg in self._messages(time.monotonic() + DUMP_DEADLINE):
            if rank is not None and msg.get("t") == "dumped" and msg.get("attempt") == attempt:
                answered[rank] = msg
                where = msg.get("path") or "no stacks"
                note = msg.get("note") or ""
                self.event("dump", attempt=attempt, rank=rank, path=where, note=note,
                           text="rank %d's stacks: %s%s" % (rank, where, "; " + note if note else ""))
            if len(answered) >= len(live):
                break
        for r in live:
            if r not in answered:
                self.event("dump", attempt=attempt, rank=r, text="rank %d's stacks: no answer within %gs" % (
                    r, DUMP_DEADLINE))
        return {"cause": HANG, "rank": quiet, "detail": "quietest rank %d; stacks in %s/attempt-%d/" % (
            quiet, spec["dir"], attempt)}

    def _stop_all(self, attempt: int, ending: dict) -> str:
        """Stop the attempt on every rank still heard from and wait for each to say it is gone (the barrier);
        returns what would not die ('' when every rank is clean)."""
        lost = set(ending.get("lost", ()))
        ranks = [r for r in range(self.n) if r not in lost]
        self.broadcast({"t": "stop", "attempt": attempt, "why": ending["cause"]}, ranks)
        answered, stuck = set(), []
        for rank, msg in self._messages(time.monotonic() + STOP_GRACE + KILL_WAIT + 2 * self.spec["host_timeout"]):
            if rank is not None and msg.get("t") == "stopped" and msg.get("attempt") == attempt:
                answered.add(rank)
                if msg.get("left"):
                    stuck.append("rank %d: %s" % (rank, ", ".join("pid %s %s (%s)" % tuple(p)
                                                                  for p in msg["left"][:5])))
            now = time.monotonic()
            for r in silent({r: self.seen.get(r, now) for r in ranks if r not in answered}, now,
                            self.spec["host_timeout"]):
                answered.add(r)
                stuck.append("rank %d: silent while stopping" % r)
            if answered >= set(ranks):
                break
        else:
            stuck += ["rank %d: did not say it stopped" % r for r in ranks if r not in answered]
        if stuck:
            text = "attempt %d's processes would not die (%s): the gang ends rather than restart beside them" % (
                attempt, "; ".join(stuck))
            self.event("stuck", attempt=attempt, text=text)
            return text
        self.event("stopped", attempt=attempt, text="attempt %d stopped on every rank" % attempt)
        return ""

    def _end(self, cause: str, rank=None, exit_code=None, detail: str = "", attempt: int = 0, attempts=None) -> None:
        spec = self.spec
        result = {"job": spec["job"], "run": spec["run"], "cause": cause, "code": exit_code_of(cause, exit_code),
                  "rank": rank, "host": spec["hosts"][rank] if rank is not None else None, "exit_code": exit_code,
                  "attempt": attempt, "attempts": attempt + 1 if attempts is None else attempts, "ended": now_iso(),
                  "detail": detail}
        self.event("ended", code=result["code"], text="the job ended: %s; exit code %d" % (
            describe(result), result["code"]))
        self.broadcast({"t": "end", "result": result})
        # members say goodbye by closing; a lost one is not waited for: a frozen host's connection stays open,
        # and waiting for it would keep rank 0 (and the launcher's fail-fast) another 5 s
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            now, wires = time.monotonic(), list(self.wires)  # a copy: the members' threads remove theirs
            if not set(wires) - set(silent({r: self.seen.get(r, now) for r in wires}, now, spec["host_timeout"])):
                break
            time.sleep(0.05)


# ------------------------------------------------------------------------------------------------- member

class Member:
    """One rank's wrapper: runs the attempts the coordinator starts, reports exits, beats and progress, obeys.

    The network never blocks its loop: a link thread keeps the connection (reconnecting while the coordinator is
    silent), a beat thread beats, a reader thread queues messages and marks when the coordinator was last heard."""

    def __init__(self, spec: dict, secret: bytes, records: Records, coordinator: Coordinator | None):
        self.spec, self.secret, self.records, self.coordinator = spec, secret, records, coordinator
        self.rank = spec["rank"]
        self.wire = None
        self.inbox = queue.Queue()
        self.heard = time.monotonic()
        self.joined = threading.Event()
        self.quit = threading.Event()
        self.attempt = None
        self.terminated = False

    def _state(self) -> dict:
        a = self.attempt
        return {"attempt": a.attempt if a else None, "code": a.code if a else None}

    def _link(self) -> None:
        spec = self.spec
        while not self.quit.is_set():
            if self.wire is None:
                try:
                    sock = socket.create_connection((spec["addr"], spec["port"]), timeout=2.0)
                    wire = client_handshake(sock, self.secret, spec["run"], self.rank)
                except (OSError, ValueError, _Timeout):
                    self.quit.wait(0.5)
                    continue
                self.wire = wire
                self.heard = time.monotonic()
                wire.send(dict(self._state(), t="hello"))
                self.joined.set()
                self._read(wire)
                if self.wire is wire:
                    self.wire = None
            self.quit.wait(0.2)

    def _read(self, wire: Wire) -> None:
        while not self.quit.is_set():
            try:
                msg = wire.recv()
            except _Timeout:
                continue
            if msg is None:
                return
            self.heard = time.monotonic()
            self.inbox.put(msg)

    def _beat(self) -> None:
        while not self.quit.wait(BEAT):
            a = self.attempt
            age = time.monotonic() - a.progress_at if a is not None and a.code is None else 0.0
            self.send(dict(self._state(), t="beat", age=round(age, 1)))

    def send(self, body: dict) -> None:
        w = self.wire
        if w is not None:
            w.send(body)

    def on_term(self, *_):
        self.terminated = True

    def run(self) -> int:
        spec = self.spec
        threading.Thread(target=self._link, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()
        if not self.joined.wait(spec["start_timeout"]):
            self._finish({"cause": START_FAILED, "code": EXIT_START, "rank": None, "detail": "rank %d could not "
                          "join the gang at %s:%d within %gs" % (self.rank, spec["addr"], spec["port"],
                                                                  spec["start_timeout"])}, local=True)
            return EXIT_START
        formed = False
        while True:
            if self.terminated:
                return self._terminated()
            limit = spec["host_timeout"] if formed else spec["start_timeout"]
            if time.monotonic() - self.heard > limit:
                return self._lost()
            a = self.attempt
            if a is not None and a.code is None and a.poll() is not None:
                self.send({"t": "exit", "attempt": a.attempt, "code": a.code})
            try:
                msg = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            kind = msg.get("t")
            if kind == "start":
                formed = True
                n = int(msg["attempt"])
                if self.attempt is None or self.attempt.attempt != n:
                    self.attempt = Attempt(spec, n, self.records)
                    self.attempt.start()
            elif kind == "stop" and self.attempt is not None:
                left = self.attempt.stop()
                self.send({"t": "stopped", "attempt": self.attempt.attempt, "left": left})
            elif kind == "stop":
                self.send({"t": "stopped", "attempt": msg.get("attempt"), "left": []})
            elif kind == "dump" and self.attempt is not None:
                att = self.attempt

                def dump(att=att):
                    path, note = att.dump()
                    self.send({"t": "dumped", "attempt": att.attempt, "path": path, "note": note})
                threading.Thread(target=dump, daemon=True).start()
            elif kind == "event":
                e = msg.get("e") or {}
                self.records.event(e)
                if self.rank == 0:
                    say(str(e.get("text", ""))[:2000])
            elif kind == "attempt":
                self.records.attempt(msg.get("r") or {})
            elif kind == "end":
                result = msg.get("result") or {}
                self._finish(result)
                return int(result.get("code", 1))

    def _stop_child(self) -> list:
        return self.attempt.stop() if self.attempt is not None and self.attempt.proc is not None else []

    def _finish(self, result: dict, local: bool = False) -> None:
        if self.attempt is not None and self.attempt.code is None:
            self._stop_child()
        if local:
            result = dict(result, job=self.spec["job"], run=self.spec["run"], ended=now_iso(), by_rank=self.rank)
            e = {"t": time.time(), "when": now_iso(), "event": "ended", "rank": self.rank, "code": result["code"],
                 "text": "the job ended on rank %d: %s; exit code %d" % (self.rank, describe(result), result["code"])}
            self.records.event(e)
            say(e["text"])
        self.records.result(result)
        self.quit.set()
        w = self.wire
        if w is not None:
            w.close()
        if self.coordinator is not None:
            self.coordinator.done.wait(15)

    def _lost(self) -> int:
        spec = self.spec
        left = self._stop_child()
        detail = "rank %d heard nothing from the coordinator (rank 0 at %s:%d) for %gs and stopped its own " \
                 "processes" % (self.rank, spec["addr"], spec["port"], spec["host_timeout"])
        if left:
            detail += "; processes that would not die: %s" % left[:5]
        self._finish({"cause": HOST_LOST, "code": EXIT_HOST_LOST, "rank": 0 if self.rank else None,
                      "host": spec["hosts"][0] if self.rank else None, "detail": detail}, local=True)
        return EXIT_HOST_LOST

    def _terminated(self) -> int:
        """docker stop / `down`: the coordinator hears it first (the others stop meanwhile: nothing restarts), then
        this rank's processes stop; the job's result is kept here too, the coordinator's when it came in time."""
        n = self.attempt.attempt if self.attempt else None
        self.send({"t": "exit", "attempt": n, "code": EXIT_TERM, "signal": True})
        self._stop_child()
        result = None
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and result is None:
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg.get("t") == "end":
                result = msg.get("result") or {}
            elif msg.get("t") == "event":
                self.records.event(msg.get("e") or {})
        if result is None:
            self._finish({"cause": INTERRUPTED, "code": EXIT_TERM, "rank": self.rank, "host": self.spec["host"],
                          "exit_code": EXIT_TERM, "detail": "rank %d was stopped by a signal (docker stop, `down`)"
                          % self.rank}, local=True)
        else:
            self._finish(result)
        return EXIT_TERM


# ------------------------------------------------------------------------------------------------- entry points

def take_secret(folder: str = SECRET_DIR) -> int:
    """`docker exec -i` of the start: the secret from stdin into the container's tmpfs, 0600, never elsewhere."""
    data = sys.stdin.buffer.read(4096).strip()
    if not re.fullmatch(rb"[0-9a-f]{64}", data):
        sys.stderr.write("take-secret: not a secret on stdin\n")
        return 2
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        sys.stderr.write("take-secret: %s is not this user's own 0700 folder\n" % folder)
        return 2
    tmp = os.path.join(folder, "secret.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(folder, "secret"))
    return 0


def wait_secret(folder: str, timeout: float) -> bytes | None:
    path = os.path.join(folder, "secret")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                data = f.read().strip()
            os.unlink(path)  # kept in this process only: the ranks' own processes never find it
            return data
        except FileNotFoundError:
            time.sleep(0.1)
        except OSError:
            return None
    return None


def run(spec: dict) -> int:
    records = Records(spec)
    records.run_info(spec)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    secret = wait_secret(spec.get("secret_dir") or SECRET_DIR, spec["start_timeout"])
    if not secret:
        result = {"cause": START_FAILED, "code": EXIT_START, "rank": None, "job": spec["job"], "run": spec["run"],
                  "ended": now_iso(), "by_rank": spec["rank"],
                  "detail": "rank %d got no gang secret within %gs (the launcher stopped during the start?)" % (
                      spec["rank"], spec["start_timeout"])}
        records.result(result)
        say(result["detail"])
        return EXIT_START
    coordinator = None
    if spec["rank"] == 0:
        coordinator = Coordinator(spec, secret)
        try:
            coordinator.listen()
        except OSError as e:
            result = {"cause": START_FAILED, "code": EXIT_START, "rank": 0, "host": spec["hosts"][0],
                      "job": spec["job"], "run": spec["run"], "ended": now_iso(), "by_rank": 0,
                      "detail": "the coordinator cannot listen on %s:%d: %s (job.gang_port)" % (
                          spec["addr"], spec["port"], e)}
            records.result(result)
            say(result["detail"])
            return EXIT_START
        threading.Thread(target=coordinator.run, daemon=True).start()
    member = Member(spec, secret, records, coordinator)
    signal.signal(signal.SIGTERM, member.on_term)
    signal.signal(signal.SIGINT, member.on_term)
    return member.run()


def main(argv: list) -> int:
    if len(argv) >= 1 and argv[0] == "take-secret":
        return take_secret(*argv[1:2])
    if len(argv) >= 2 and argv[0] == "run":
        spec = json.loads(argv[1])
        command = argv[3:] if argv[2:3] == ["--"] else argv[2:]
        if not command:
            sys.stderr.write("gang: no command to run\n")
            return 2
        spec["command"] = command
        return run(spec)
    sys.stderr.write("usage: gang.py run SPEC_JSON -- COMMAND... | take-secret\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
