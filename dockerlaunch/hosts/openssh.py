"""The system's OpenSSH client for bulk bytes (image streams), where it works with the session's own trust.

paramiko moves ~0.7-0.8 x what OpenSSH moves on the same link (its packets are built in Python, under the GIL,
in the thread that also reads `docker save` and compresses); `ssh` encrypts in a process of its own. Never
weaker than the paramiko session: only the session's known_hosts file is trusted (StrictHostKeyChecking=yes;
the key paramiko verified, or accepted as new, is in it), none of the user's ssh config (the target is already
resolved from it), BatchMode (nothing prompts), no forwarding, the session's identity files or else OpenSSH's
default keys and agent. A host is streamed to this way only after a probe command through the same argv
worked; otherwise paramiko carries the stream. DOCKERLAUNCH_SSH_BULK=paramiko turns it off.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from dockerlaunch.errors import SSHError
from dockerlaunch.hosts.targets import SSHTarget

MODE_ENV = "DOCKERLAUNCH_SSH_BULK"  # auto (default): OpenSSH where its probe works | paramiko | openssh (required)
# AEAD ciphers only, the one with AES instructions first (what OpenSSH itself prefers on such CPUs)
CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"
PROBE_TIMEOUT = 30.0

_probed: dict[SSHTarget, str | None] = {}
_lock = threading.Lock()


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto").strip().lower()
    return value if value in ("auto", "paramiko", "openssh") else "auto"


def argv(target: SSHTarget, command: str, ssh: str = "ssh") -> list[str] | None:
    """The `ssh` argv that runs `command` (one shell string, quoted by the caller) on the target, or None where
    OpenSSH cannot reproduce the session (this machine, or jump hosts: those streams stay on paramiko). (pure)"""
    if target.local or target.jumps or reinterpreted(target):
        return None
    a = [ssh, "-F", "/dev/null", "-T", "-x", "-a",
         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={os.path.expanduser(target.known_hosts)}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "CheckHostIP=no", "-o", "UpdateHostKeys=no",
         "-o", f"ConnectTimeout={max(1, int(target.connect_timeout))}",
         "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
         "-o", "Compression=no", "-o", "LogLevel=ERROR", "-c", CIPHERS,
         "-p", str(target.port), "-l", target.user]
    for f in target.identity_files:
        a += ["-i", os.path.expanduser(f)]
    if target.identity_files:
        a += ["-o", "IdentitiesOnly=yes"]
    return [*a, "--", target.hostname, command]


# What OpenSSH does to a path given as an option: splits UserKnownHostsFile's value on blanks and reads quotes and
# backslashes in it, expands %-tokens in both it and -i, and ~ at the start of -i: a path holding any of these
# would name other files than the session's (a second known_hosts relative to the working directory). Newer ones
# (8.4 on) also expand ${VAR} in both (`ssh -G` here shows it), and the config tokenizer before 8.7's rewrite split
# a value at `=` as at a blank. The launcher does not know the client's version: `=` is refused always.
REINTERPRETED = re.compile(r"[\s%\"'\\~=]|\$\{")
ODD = "a blank, %, ~, quote, backslash, ${ or ="


def reinterpreted(target: SSHTarget) -> str | None:
    """The first path OpenSSH would read as something else (None: all pass through as written). (pure)"""
    for path in (os.path.expanduser(target.known_hosts), *(os.path.expanduser(f) for f in target.identity_files)):
        if REINTERPRETED.search(path):
            return path
    return None


def unusable(target: SSHTarget) -> str | None:
    """Why bulk bytes to this target cannot go through OpenSSH (None: they can). Probed once per target."""
    m = mode()
    if m == "paramiko":
        return f"{MODE_ENV}=paramiko"
    with _lock:
        if target in _probed:
            return _probed[target]
    ssh = shutil.which("ssh")
    a = argv(target, "true", ssh) if ssh else None
    odd = reinterpreted(target)
    if odd is not None:
        why: str | None = f"the path {odd!r} holds {ODD}, which OpenSSH would read as something else"
    elif ssh is None:
        why = "no ssh client on this machine"
    elif a is None:
        why = "jump hosts" if target.jumps else "this machine"
    else:
        try:
            r = subprocess.run(a, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_TIMEOUT)
            why = None if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
    if why is not None and m == "openssh":
        raise SSHError(target.alias, f"{MODE_ENV}=openssh, but the ssh client cannot run a command there ({why}); "
                       f"unset {MODE_ENV} to let paramiko carry the stream")
    with _lock:
        _probed[target] = why
    return why


def stream(target: SSHTarget, command: str, on_stdout: Callable[[bytes], None] | None,
           on_stderr: Callable[[bytes], None] | None, stdin: BinaryIO, timeout: float | None = None,
           stop: threading.Event | None = None) -> int:
    """Like Remote.stream, through `ssh`: stdin is written from a thread, output goes to the callbacks as it
    arrives; `stop` ends it early (-1). A source that fails closes ssh's stdin, so the far end sees its input
    end (docker load fails on the truncated tar; nothing is tagged)."""
    a = argv(target, command, shutil.which("ssh") or "ssh")
    assert a is not None, "openssh.stream on a target it cannot reach (see unusable)"
    p = subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    errors: list[BaseException] = []
    source_failed = [False]

    def feed() -> None:
        try:
            while True:
                try:
                    chunk = stdin.read(1 << 20)
                except BaseException:
                    source_failed[0] = True
                    raise
                if not chunk:
                    break
                p.stdin.write(chunk)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            try:
                p.stdin.close()
            except OSError:
                pass

    def pump(src, sink) -> None:
        for data in iter(lambda: src.read(65536), b""):
            if sink:
                sink(data)

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=pump, args=(p.stdout, on_stdout), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, on_stderr), daemon=True)]
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while p.poll() is None:
            if stop is not None and stop.is_set():
                return -1
            if deadline is not None and time.monotonic() > deadline:
                raise SSHError(target.alias, f"command timed out after {timeout:g}s: {command[:120]}")
            time.sleep(0.05)
        for t in threads[1:]:
            t.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        threads[0].join(timeout=5)
    if errors and source_failed[0]:
        raise SSHError(target.alias, f"sending input failed: {errors[0]}")
    if p.returncode == 255:
        return -1  # ssh itself failed (the link, the host's sshd): the far end did not finish
    return p.returncode
