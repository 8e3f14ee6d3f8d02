import os

import paramiko
import pytest

from dockerlaunch.errors import SSHError
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.config import HostConfig, SSHSettings

SSH_CONFIG = """
Host gpu*
  User ubuntu
  Port 2200
  IdentityFile ~/.ssh/gpu_key

Host gpu1
  HostName 10.0.0.11

Host inner
  HostName 192.168.9.9
  ProxyJump admin@bastion:2222

Host bastion
  HostName 203.0.113.5

Host loop1
  ProxyJump loop2
Host loop2
  ProxyJump loop1
"""


def resolve(address, settings=None, **host):
    sc = paramiko.SSHConfig.from_text(SSH_CONFIG)
    return resolve_target(HostConfig(address=address, **host), settings or SSHSettings(), sc, local_user="me")


def test_ssh_config_fills_gaps():
    t = resolve("gpu1")
    assert (t.hostname, t.user, t.port, t.identity_files) == (
        "10.0.0.11", "ubuntu", 2200, (os.path.expanduser("~/.ssh/gpu_key"),))


def test_precedence_host_then_settings_then_ssh_config_then_defaults():
    assert resolve("gpu1", SSHSettings(user="root", port=22)).user == "root"
    assert resolve("gpu1", SSHSettings(user="root"), user="alice").user == "alice"
    assert resolve("gpu1", SSHSettings(port=23), port=24).port == 24
    plain = resolve("10.1.1.1")
    assert (plain.user, plain.port, plain.identity_files) == ("me", 22, ())
    assert resolve("gpu1", SSHSettings(identity_file="/k")).identity_files == ("/k",)


def test_proxy_jump_is_resolved_through_ssh_config():
    t = resolve("inner")
    assert t.hostname == "192.168.9.9"
    assert len(t.jumps) == 1
    j = t.jumps[0]
    assert (j.hostname, j.user, j.port) == ("203.0.113.5", "admin", 2222)
    assert "via admin@203.0.113.5:2222" in t.describe()


def test_proxy_jump_loop_is_an_error():
    with pytest.raises(SSHError, match="ProxyJump chain"):
        resolve("loop1")


def test_policy_and_known_hosts_pass_through():
    t = resolve("10.1.1.1", SSHSettings(known_hosts="/kh", host_key_policy="accept-new", connect_timeout=3))
    assert (t.known_hosts, t.host_key_policy, t.connect_timeout) == ("/kh", "accept-new", 3)
    assert resolve("10.1.1.1").host_key_policy == "strict"


def test_jump_host_keeps_the_configured_key_but_not_the_user():
    t = resolve("inner", SSHSettings(user="root", identity_file="/k", known_hosts="/kh"))
    j = t.jumps[0]
    assert j.identity_files == ("/k",) and j.known_hosts == "/kh"
    assert j.user == "admin"  # from the ProxyJump spec, not ssh.user
    assert t.user == "root"


# ---------------------------------------------------------------- OpenSSH for bulk bytes: the same trust, never weaker

def test_the_openssh_argv_trusts_only_the_sessions_known_hosts_and_keys():
    from dockerlaunch.hosts.openssh import argv
    from dockerlaunch.hosts.targets import SSHTarget

    t = SSHTarget(alias="gpu1", hostname="-oProxyCommand=evil", user="ops", port=2222,
                  identity_files=("~/.ssh/id_train",), known_hosts="~/.ssh/known_hosts_dl",
                  host_key_policy="accept-new")
    a = argv(t, "docker load")
    opts = {a[i + 1] for i, x in enumerate(a) if x == "-o"}
    assert {"BatchMode=yes", "StrictHostKeyChecking=yes", "GlobalKnownHostsFile=/dev/null",
            f"UserKnownHostsFile={os.path.expanduser('~/.ssh/known_hosts_dl')}", "IdentitiesOnly=yes"} <= opts
    assert a[1:3] == ["-F", "/dev/null"]  # the user's ssh config was resolved already; none of it applies again
    assert "-A" not in a and "-a" in a and "-x" in a  # no agent or X11 forwarding
    assert a[a.index("-i") + 1] == os.path.expanduser("~/.ssh/id_train")
    assert a[-3:] == ["--", "-oProxyCommand=evil", "docker load"]  # a hostname is never read as an option
    assert a[a.index("-p") + 1] == "2222" and a[a.index("-l") + 1] == "ops"


def test_openssh_is_not_used_where_it_cannot_reproduce_the_session():
    from dockerlaunch.hosts.openssh import argv
    from dockerlaunch.hosts.targets import SSHTarget

    jump = SSHTarget(alias="bastion", hostname="10.0.0.1", user="ops")
    assert argv(SSHTarget(alias="n", hostname="10.0.0.2", user="ops", jumps=(jump,)), "true") is None
    assert argv(SSHTarget(alias="local", hostname="localhost", user="me", local=True), "true") is None
    # no identity files: OpenSSH's default keys and agent, as paramiko's look_for_keys; IdentitiesOnly not forced
    a = argv(SSHTarget(alias="n", hostname="10.0.0.2", user="ops"), "true")
    assert "-i" not in a and "IdentitiesOnly=yes" not in a


@pytest.mark.parametrize("known_hosts, identity", [
    ("/tmp/dl keys/known_hosts", "/tmp/id_ed25519"),  # OpenSSH splits UserKnownHostsFile on blanks
    ("/tmp/%u/known_hosts", "/tmp/id_ed25519"),  # ... and expands %-tokens in it
    ("/tmp/known_hosts", "/tmp/keys %d/id_ed25519"),  # -i keeps blanks but expands %d
])
def test_a_path_openssh_would_read_otherwise_keeps_the_stream_on_paramiko(known_hosts, identity):
    """issue 42, finding 9: `ssh -G` shows what OpenSSH makes of such a path (another file, or two); the launcher
    never hands it over, and says why."""
    import shutil
    import subprocess

    from dockerlaunch.hosts import openssh
    from dockerlaunch.hosts.targets import SSHTarget

    t = SSHTarget(alias="n", hostname="10.0.0.2", user="ops", identity_files=(identity,), known_hosts=known_hosts)
    assert openssh.argv(t, "true") is None
    assert openssh.reinterpreted(t) in (known_hosts, identity)
    if shutil.which("ssh"):  # the reason, as OpenSSH itself parses the options
        g = subprocess.run(["ssh", "-G", "-F", "/dev/null", "-o", f"UserKnownHostsFile={known_hosts}", "-i", identity,
                            "-l", "ops", "10.0.0.2"], capture_output=True, text=True, timeout=30)
        parsed = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in g.stdout.splitlines() if " " in line}
        assert parsed["userknownhostsfile"] != known_hosts or parsed["identityfile"] != identity, parsed
