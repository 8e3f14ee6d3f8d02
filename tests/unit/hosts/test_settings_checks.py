"""SSH settings that name a file or host that is not there: one line naming the field and the file, before any
connection (hosts/targets.setting_problems; issue 52)."""

import os

import paramiko
import pytest

from dockerlaunch.errors import ConfigError, SSHError
from dockerlaunch.hosts.ssh import connect
from dockerlaunch.hosts.targets import SSHTarget, check_settings, known_hosts_fix, setting_problems
from dockerlaunch.job.config import ClusterConfig


def cfg(**data) -> ClusterConfig:
    return ClusterConfig.model_validate({"hosts": ["10.0.0.1", "10.0.0.2"], **data})


def never(name):  # no name resolves
    return False


def test_a_missing_identity_file_names_the_field_and_the_file(tmp_path):
    key = tmp_path / "id_nosuch"
    (line,) = setting_problems(cfg(ssh={"identity_file": str(key)}), None, never)  # once, not once per host
    assert line.startswith(f"ssh.identity_file: key file {key} does not exist; ")
    assert "No such file" not in line


def test_a_host_entry_s_own_identity_file_is_named_by_its_index(tmp_path):
    good = tmp_path / "id_good"
    good.write_text("x")
    c = cfg(hosts=["10.0.0.1", {"address": "10.0.0.2", "identity_file": str(tmp_path / "gone")}],
            ssh={"identity_file": str(good)})
    (line,) = setting_problems(c, None, never)
    assert line.startswith(f"hosts[1].identity_file: key file {tmp_path / 'gone'} does not exist")


def test_an_existing_key_and_the_default_known_hosts_raise_nothing(tmp_path):
    key = tmp_path / "id"
    key.write_text("x")
    assert setting_problems(cfg(ssh={"identity_file": str(key)}), None, never) == []
    check_settings(cfg(ssh={"identity_file": str(key), "config_file": None}))  # nothing raised


def test_a_missing_explicit_known_hosts_says_how_to_add_the_keys_not_to_weaken_checking(tmp_path):
    kh = tmp_path / "kh"
    (line,) = setting_problems(cfg(ssh={"known_hosts": str(kh)}), None, never)
    assert line.startswith(f"ssh.known_hosts: known_hosts file {kh} does not exist; check the path")
    assert f"ssh-keyscan -H 10.0.0.1 >> {kh}" in line and "ssh-keygen -lf -" in line
    assert "(the same for the other 1 host(s))" in line
    assert f"-o UserKnownHostsFile={kh}" in line  # `ssh` once writes to that file, not ~/.ssh/known_hosts
    assert "accept-new" not in line
    # accept-new creates the file on first contact: nothing to refuse
    assert setting_problems(cfg(ssh={"known_hosts": str(kh), "host_key_policy": "accept-new"}), None, never) == []


def test_ssh_config_s_own_files_and_an_explicit_config_file(tmp_path):
    sc = paramiko.SSHConfig.from_text(f"Host 10.0.0.*\n  IdentityFile {tmp_path}/k\n"
                                      f"  UserKnownHostsFile {tmp_path}/kh\n")
    lines = setting_problems(cfg(ssh={"config_file": str(tmp_path / "cfg")}), sc, never)
    assert lines[0].startswith(f"ssh.config_file: SSH config {tmp_path / 'cfg'} does not exist")
    assert lines[1].startswith(f"IdentityFile of Host 10.0.0.1 in {tmp_path / 'cfg'}: key file {tmp_path}/k does "
                               "not exist")
    assert lines[2].startswith(f"UserKnownHostsFile of Host 10.0.0.1 in {tmp_path / 'cfg'}: known_hosts file "
                               f"{tmp_path}/kh does not exist")
    assert len(lines) == 3  # host 1 says the same: said once


def test_a_proxy_jump_alias_that_ssh_config_does_not_define():
    sc = paramiko.SSHConfig.from_text("Host 10.0.0.*\n  ProxyJump bastoin\nHost bastion\n  HostName 203.0.113.5\n")
    with pytest.raises(ConfigError) as e:
        check_settings(cfg(), sc, never)
    msg = str(e.value)
    assert msg.startswith("ProxyJump bastoin of Host 10.0.0.1 in ~/.ssh/config: ~/.ssh/config has no "
                          "`Host bastoin` entry and this machine cannot resolve 'bastoin'")
    assert "\n" not in msg and msg.count("ProxyJump bastoin") == 2  # once, not once per host
    # a defined alias, an IP, or a name DNS resolves are fine
    ok = paramiko.SSHConfig.from_text("Host 10.0.0.*\n  ProxyJump admin@bastion:2222\nHost bastion\n  HostName b\n")
    assert setting_problems(cfg(), ok, never) == []
    ip = paramiko.SSHConfig.from_text("Host 10.0.0.*\n  ProxyJump 203.0.113.5\n")
    assert setting_problems(cfg(), ip, never) == []
    assert setting_problems(cfg(), sc, lambda name: name == "bastoin") == []


def test_known_hosts_fix_uses_the_port_and_never_suggests_accept_new():
    text = known_hosts_fix(os.path.expanduser("~/.ssh/known_hosts"), [("h1", 2222, "root")])
    assert "ssh-keyscan -p 2222 -H h1 >> " in text and "`ssh -p 2222 root@h1`" in text
    assert "UserKnownHostsFile" not in text and "accept-new" not in text


def test_connect_names_a_missing_key_file_before_trying(tmp_path):
    kh = tmp_path / "kh"
    kh.write_text("")
    t = SSHTarget(alias="h", hostname="192.0.2.1", user="u", identity_files=(str(tmp_path / "k"),),
                  known_hosts=str(kh))
    with pytest.raises(SSHError, match=f"key file {tmp_path / 'k'} does not exist"):
        connect(t)


def test_connect_with_no_known_hosts_file_says_how_to_add_the_key(tmp_path):
    t = SSHTarget(alias="h", hostname="192.0.2.1", user="u", known_hosts=str(tmp_path / "kh"))
    with pytest.raises(SSHError) as e:
        connect(t)
    assert "does not exist: no host key is known yet; add the host's key" in str(e.value)
    assert "accept-new" not in str(e.value)


def test_a_refused_connection_names_the_port_and_where_it_was_set(tmp_path):
    """Quoted: a wrong SSH port said `cannot connect to 172.30.10.11:2222: Unable to connect to port 2222`, with no
    fix. (A real refusal: a port of this machine that nothing listens on.)"""
    import socket

    from dockerlaunch.hosts.targets import PORT_HOST, resolve_target
    from dockerlaunch.job.config import HostConfig, SSHSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    kh = tmp_path / "kh"
    kh.write_text("")
    t = resolve_target(HostConfig(address=f"127.0.0.1:{port}"), SSHSettings(known_hosts=str(kh), config_file=None),
                       local_user="root")
    assert t.port == port and t.port_from == PORT_HOST
    with pytest.raises(SSHError) as e:
        connect(t)
    assert str(e.value) == (f"host 127.0.0.1: cannot connect to 127.0.0.1:{port}: connection refused (the address "
                            f"answered, but nothing listens on port {port}); the port is {PORT_HOST}: give sshd's "
                            "port there (ssh -p PORT root@127.0.0.1 tries one), or start sshd on the host")
    assert resolve_target(HostConfig(address="h"), SSHSettings(port=2222, config_file=None)).port_from == \
        "ssh.port in the config"
