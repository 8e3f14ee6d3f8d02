"""The OpenSSH bulk path never hands OpenSSH a known_hosts or key path it would read as other files (issue 50,
finding 9): `${VAR}` (expanded since OpenSSH 8.4) and `=` (a separator before 8.7) join issue 42's blank, %, ~,
quote and backslash."""

import os
import shutil
import subprocess

import pytest

from dockerlaunch.hosts import openssh
from dockerlaunch.hosts.targets import SSHTarget


def _ssh_reads(known_hosts: str) -> str | None:
    """What this machine's OpenSSH makes of UserKnownHostsFile=<known_hosts> (`ssh -G`); None without ssh."""
    if not shutil.which("ssh"):
        return None
    g = subprocess.run(["ssh", "-G", "-F", "/dev/null", "-o", f"UserKnownHostsFile={known_hosts}", "-l", "ops",
                        "10.0.0.2"], capture_output=True, text=True, timeout=30, env={**os.environ, "DL": "x"})
    return next((line.split(" ", 1)[1] for line in g.stdout.splitlines() if line.startswith("userknownhostsfile ")),
                g.stderr.strip())


@pytest.mark.parametrize("known_hosts, identity", [
    ("/tmp/${DL}/known_hosts", "/tmp/id_ed25519"),  # OpenSSH >= 8.4 expands ${VAR} in UserKnownHostsFile ...
    ("/tmp/known_hosts", "/tmp/${HOME}/id_ed25519"),  # ... and in -i
    ("/tmp/dl=keys/known_hosts", "/tmp/id_ed25519"),  # before 8.7, `=` splits a value in two like a blank
    ("/tmp/known_hosts", "/tmp/a=b/id_ed25519"),
    ("/tmp/dl~keys/known_hosts", "/tmp/id_ed25519"),  # issue 42's, each once more: ~ not at the start
    ("/tmp/dl'keys/known_hosts", "/tmp/id_ed25519"),
    ('/tmp/known_hosts', '/tmp/dl"keys/id_ed25519'),
    ("/tmp/dl\\keys/known_hosts", "/tmp/id_ed25519"),
])
def test_a_path_openssh_would_expand_or_split_keeps_the_stream_on_paramiko_and_says_why(known_hosts, identity,
                                                                                         monkeypatch):
    t = SSHTarget(alias="n", hostname="10.0.0.2", user="ops", identity_files=(identity,), known_hosts=known_hosts)
    assert openssh.argv(t, "true") is None
    odd = openssh.reinterpreted(t)
    assert odd in (known_hosts, identity)
    monkeypatch.setenv(openssh.MODE_ENV, "auto")
    openssh._probed.pop(t, None)
    why = openssh.unusable(t)  # no probe runs: the reason is the path, before anything is sent
    assert why is not None and why.startswith(f"the path {odd!r} holds "), why
    assert "${" in why and "=" in why and "\n" not in why, why


def test_ssh_itself_reads_a_dollar_brace_path_as_another_file():
    """The reason the launcher refuses `${`: this machine's ssh turns it into another path (=, on OpenSSH >= 8.7
    as here, it keeps; the launcher does not know the client's version and refuses it always)."""
    got = _ssh_reads("/tmp/${DL}/known_hosts")
    if got is None:
        pytest.skip("no ssh client on this machine")
    assert got == "/tmp/x/known_hosts"


@pytest.mark.parametrize("known_hosts", ["/tmp/$DL/known_hosts", "/tmp/{DL}/known_hosts", "/tmp/dl-keys+1/kh"])
def test_a_lone_dollar_or_brace_passes_as_written(known_hosts):
    """Only `${` expands: other paths keep the fast path (and ssh reads them as written)."""
    t = SSHTarget(alias="n", hostname="10.0.0.2", user="ops", known_hosts=known_hosts)
    assert openssh.reinterpreted(t) is None
    assert f"UserKnownHostsFile={known_hosts}" in openssh.argv(t, "true")
    got = _ssh_reads(known_hosts)
    assert got in (None, known_hosts)
