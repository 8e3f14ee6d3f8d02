"""Where and how to reach each host over SSH: pure resolution, no connection.

Config + a parsed ~/.ssh/config in, `SSHTarget` out, so plans show it without touching a host.
Precedence, most specific first: the host entry, the `ssh:` section, ~/.ssh/config, then defaults
(local user, port 22).
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from dockerlaunch.errors import ConfigError, SSHError
from dockerlaunch.job.config import ClusterConfig, HostConfig, SSHSettings, parse_host_string

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_CONFIG = "~/.ssh/config"
MAX_JUMPS = 8
DNS_WAIT = 5.0  # seconds for a ProxyJump name that ~/.ssh/config does not define to resolve
# where a host's SSH port came from, most specific first (resolve_target)
PORT_HOST = "the host's entry (host:PORT in --hosts or hosts:, or its port:)"
PORT_SSH = "ssh.port in the config"
PORT_SSH_CONFIG = "Port in ~/.ssh/config (or ssh.config_file) for this host"
PORT_DEFAULT = "the default (no port set anywhere)"


@dataclass(frozen=True)
class SSHTarget:
    alias: str  # what the user wrote
    hostname: str  # what we connect to
    user: str
    port: int = 22
    identity_files: tuple[str, ...] = ()
    known_hosts: str = DEFAULT_KNOWN_HOSTS
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    jumps: tuple[SSHTarget, ...] = field(default=())
    local: bool = False  # this machine, no SSH (`local` in the host list)
    port_from: str = PORT_DEFAULT  # which setting gave `port` (a refused connection names it)

    def describe(self) -> str:
        if self.local:
            return "local (no SSH)"
        s = f"{self.user}@{self.hostname}:{self.port}"
        if self.jumps:
            s += " via " + " -> ".join(f"{j.user}@{j.hostname}:{j.port}" for j in self.jumps)
        return s


def load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except Exception as e:  # paramiko raises assorted errors on malformed files
        raise ConfigError(f"cannot parse SSH config {p}: {e}") from None


def resolve_target(
    host: HostConfig,
    settings: SSHSettings,
    ssh_config: paramiko.SSHConfig | None = None,
    local_user: str | None = None,
    _depth: int = 0,
) -> SSHTarget:
    local_user = local_user or getpass.getuser()
    if host.local:
        return SSHTarget(alias=host.address, hostname="127.0.0.1", user=local_user, port=0, local=True)
    looked = ssh_config.lookup(host.address) if ssh_config else {}
    identity = host.identity_file or settings.identity_file
    identities = (identity,) if identity else tuple(looked.get("identityfile", ()))
    known = settings.known_hosts or looked.get("userknownhostsfile", "").split(" ")[0] or DEFAULT_KNOWN_HOSTS
    jumps: tuple[SSHTarget, ...] = ()
    proxy_jump = looked.get("proxyjump")
    if proxy_jump and proxy_jump.lower() != "none":
        if _depth >= MAX_JUMPS:
            raise SSHError(host.address, f"ProxyJump chain deeper than {MAX_JUMPS} (a loop in ~/.ssh/config?)")
        chain: list[SSHTarget] = []
        for hop in proxy_jump.split(","):
            parsed = parse_host_string(hop.removeprefix("ssh://"))
            hop_target = resolve_target(
                # a jump host's user/port come from the ProxyJump spec or its own ~/.ssh/config entry;
                # the ssh: section's key and known_hosts still apply to it
                HostConfig(**parsed), settings.model_copy(update={"user": None, "port": None}),
                ssh_config, local_user, _depth + 1,
            )
            chain.extend(hop_target.jumps)
            chain.append(SSHTarget(**{**hop_target.__dict__, "jumps": ()}))
        jumps = tuple(chain)
    return SSHTarget(
        alias=host.address,
        hostname=looked.get("hostname", host.address),
        user=host.user or settings.user or looked.get("user") or local_user,
        port=host.port or settings.port or int(looked.get("port", 22)),
        port_from=PORT_HOST if host.port else PORT_SSH if settings.port else PORT_SSH_CONFIG if "port" in looked
        else PORT_DEFAULT,
        identity_files=identities,
        known_hosts=known,
        host_key_policy=settings.host_key_policy,
        connect_timeout=settings.connect_timeout,
        jumps=jumps,
    )




def resolve_all(config: ClusterConfig, ssh_config: paramiko.SSHConfig | None = None) -> list[SSHTarget]:
    """Every host's target, rank order; ~/.ssh/config (or `ssh.config_file`) is read once (here, unless given).
    A command resolves its hosts once: what it plans from is what it connects to (Fleet.connect's `targets`)."""
    if ssh_config is None:
        ssh_config = load_ssh_config(config.ssh.config_file)
    return [resolve_target(h, config.ssh, ssh_config) for h in config.hosts]


# ---------------------------------------------------------------- settings checked before any connection


def _resolves(name: str, wait: float = DNS_WAIT) -> bool:
    """Whether this machine resolves `name` (within `wait` seconds: getaddrinfo itself has no timeout)."""
    answer: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            answer.append(True)
        except (OSError, UnicodeError):
            answer.append(False)

    t = threading.Thread(target=lookup, daemon=True, name="dl-dns")
    t.start()
    t.join(wait)
    return bool(answer and answer[0])


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _defines(ssh_config: paramiko.SSHConfig | None, alias: str) -> bool:
    """Whether ~/.ssh/config says anything of its own about `alias`: a `Host` line naming it, or a HostName for it
    (a pattern that only sets User or Port for `*` does not make a typo a host)."""
    if ssh_config is None:
        return False
    if alias in ssh_config.get_hostnames():
        return True
    return ssh_config.lookup(alias).get("hostname", alias) != alias


def _file_problem(field: str, path: str, what: str, fix: str) -> str | None:
    """One line naming the setting and the file when the file is missing or unreadable, else None."""
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        return f"{field}: {what} {full} does not exist; {fix}"
    if not os.path.isfile(full):
        return f"{field}: {what} {full} is not a file; {fix}"
    if not os.access(full, os.R_OK):
        return (f"{field}: {what} {full} is not readable by {getpass.getuser()}; fix its permissions (chmod 600) "
                f"or {fix}")
    return None


KEY_FIX = "give the path of an existing private key (ls ~/.ssh), or leave it unset to use the agent and ~/.ssh/id_*"


def known_hosts_fix(path: str, hosts: list[tuple[str, int, str]]) -> str:
    """How to put a host's key into `path` without weakening host-key checking: fetch it and compare its fingerprint
    with the host's own, then append it; or `ssh` once and accept it. `hosts`: (hostname, port, user) of the hosts
    it lacks (the first is named). (pure)"""
    import shlex

    host, port, user = hosts[0]
    port_flag = f"-p {port} " if port != 22 else ""
    scan = f"ssh-keyscan {port_flag}-H {shlex.quote(host)}"
    more = f" (the same for the other {len(hosts) - 1} host(s))" if len(hosts) > 1 else ""
    if os.path.expanduser(path) != os.path.expanduser(DEFAULT_KNOWN_HOSTS):
        port_flag += f"-o UserKnownHostsFile={shlex.quote(path)} "
    return (f"add the host's key once its fingerprint (`{scan} | ssh-keygen -lf -`) matches the host's own "
            f"(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there): `{scan} >> {shlex.quote(path)}`{more}; "
            f"or connect once with `ssh {port_flag}{shlex.quote(user)}@{shlex.quote(host)}` and accept the key")


def setting_problems(config: ClusterConfig, ssh_config: paramiko.SSHConfig | None,
                     resolves: Callable[[str], bool] = _resolves) -> list[str]:
    """What in the SSH settings names a file or host that is not there, one line each (the field, the file, the
    fix), before any connection: a missing key file otherwise reads `cannot connect to H:22: No such file or
    directory`. Checked: `ssh.config_file` (when not the default), each host's key files (`hosts[i].identity_file`,
    `ssh.identity_file`, an IdentityFile of ~/.ssh/config), an explicit known_hosts file under the strict policy
    (accept-new creates it), and the first hop of a ProxyJump that ~/.ssh/config does not define and this machine
    cannot resolve. The default ~/.ssh/known_hosts is left to `connect` (its message names the host)."""
    out: list[str] = []

    def add(line: str | None) -> None:
        if line and line not in out:
            out.append(line)

    s = config.ssh
    source = s.config_file or DEFAULT_SSH_CONFIG
    lacking: dict[str, tuple[str, list[tuple[str, int, str]]]] = {}  # known_hosts file -> its field, its hosts
    said: set[str] = set()
    if s.config_file and os.path.expanduser(s.config_file) != os.path.expanduser(DEFAULT_SSH_CONFIG):
        add(_file_problem("ssh.config_file", s.config_file, "SSH config",
                          f"fix the path, or leave ssh.config_file unset to read {DEFAULT_SSH_CONFIG}"))
    for i, h in enumerate([*config.hosts, *config.spares]):
        if h.local:
            continue
        where = f"hosts[{i}]" if i < len(config.hosts) else f"spares[{i - len(config.hosts)}]"
        looked = ssh_config.lookup(h.address) if ssh_config else {}
        if h.identity_file:
            add(_file_problem(f"{where}.identity_file", h.identity_file, "key file", KEY_FIX))
        elif s.identity_file:
            add(_file_problem("ssh.identity_file", s.identity_file, "key file", KEY_FIX))
        else:
            for f in looked.get("identityfile", ()):
                if f in said:
                    continue  # one line per file, naming the first host whose entry uses it
                said.add(f)
                add(_file_problem(f"IdentityFile of Host {h.address} in {source}", f, "key file",
                                  f"fix that line of {source}, or set ssh.identity_file"))
        if s.host_key_policy == "strict":
            kh_field = ("ssh.known_hosts" if s.known_hosts else f"UserKnownHostsFile of Host {h.address} in {source}"
                        if looked.get("userknownhostsfile") else None)
            if kh_field is not None:
                kh = s.known_hosts or looked["userknownhostsfile"].split(" ")[0]
                lacking.setdefault(os.path.expanduser(kh), (kh_field, []))[1].append(
                    (looked.get("hostname", h.address), h.port or s.port or int(looked.get("port", 22)),
                     h.user or s.user or looked.get("user") or getpass.getuser()))
        jump = looked.get("proxyjump")
        if jump and jump.lower() != "none":
            first = jump.split(",")[0].removeprefix("ssh://")
            try:
                name = parse_host_string(first)["address"]
            except ValueError as e:
                add(f"ProxyJump {first!r} of Host {h.address} in {source}: {e}")
                continue
            if not _is_ip(name) and not _defines(ssh_config, name) and not resolves(name):
                add(f"ProxyJump {name} of Host {h.address} in {source}: {source} has no `Host {name}` entry and "
                    f"this machine cannot resolve {name!r}: add `Host {name}` with its HostName (and User) to "
                    f"{source}, or fix the ProxyJump line")
    for path, (kh_field, hosts) in lacking.items():
        add(_file_problem(kh_field, path, "known_hosts file", "check the path, or " + known_hosts_fix(path, hosts)))
    return out


def check_settings(config: ClusterConfig, ssh_config: paramiko.SSHConfig | None = None,
                   resolves: Callable[[str], bool] = _resolves) -> None:
    """`setting_problems` as one ConfigError (nothing connected yet)."""
    if ssh_config is None:
        ssh_config = load_ssh_config(config.ssh.config_file)
    problems = setting_problems(config, ssh_config, resolves)
    if problems:
        raise ConfigError("; ".join(problems))
