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
