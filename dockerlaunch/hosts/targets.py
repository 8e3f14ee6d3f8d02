"""Where and how to reach each host over SSH: pure resolution, no connection.

Config + a parsed ~/.ssh/config in, `SSHTarget` out, so plans show it without touching a host.
Precedence, most specific first: the host entry, the `ssh:` section, ~/.ssh/config, then defaults
(local user, port 22).
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from dockerlaunch.errors import ConfigError, SSHError
from dockerlaunch.job.config import ClusterConfig, HostConfig, SSHSettings, parse_host_string

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
MAX_JUMPS = 8


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
        identity_files=identities,
        known_hosts=known,
        host_key_policy=settings.host_key_policy,
        connect_timeout=settings.connect_timeout,
        jumps=jumps,
    )




def resolve_all(config: ClusterConfig) -> list[SSHTarget]:
    """Every host's target, rank order; ~/.ssh/config (or `ssh.config_file`) is read once."""
    ssh_config = load_ssh_config(config.ssh.config_file)
    return [resolve_target(h, config.ssh, ssh_config) for h in config.hosts]
