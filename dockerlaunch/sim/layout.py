"""The sim's shape: labels, engine kinds, names, addresses of regular and light layouts, the written cluster
config -- pure and unit-tested without an engine -- and `containers_of`, what carries a cluster's labels."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from dockerlaunch.cache import cache_root as engine_cache_root
from dockerlaunch.container import NOFILE
from dockerlaunch.errors import DockerlaunchError

SIM_LABEL = "dockerlaunch.sim"


NODE_LABEL = "dockerlaunch.sim.node"


ENGINE_LABEL = "dockerlaunch.sim.engine"  # the engine kind a node runs (ENGINES)


SLURM_LABEL = "dockerlaunch.sim.slurm"  # on the nodes of a `--slurm` cluster: "slurmctld,slurmd" or "slurmd"


# Light clusters (`sim up --light`): ROLE_LABEL is "engine" on an engine container and "light" on a light host;
# SERVED_BY_LABEL on a light host names the engine container whose dockerd it uses; ENGINE_INDEX_LABEL is k.
ROLE_LABEL = "dockerlaunch.sim.role"


SERVED_BY_LABEL = "dockerlaunch.sim.served-by"


ENGINE_INDEX_LABEL = "dockerlaunch.sim.engine-index"


BASE_TAG = "dockerlaunch/debian:bookworm"


@dataclass(frozen=True)
class EngineKind:
    """A Docker engine users run, as one Debian suite packages it (measured 2026-11-23; docs/ENGINES.md)."""

    name: str
    suite: str  # the Debian suite whose docker.io the node image installs
    major: int  # docker.io's major version in that suite: a node image with another one is refused
    containerd_store: bool = False  # dockerd's "containerd-snapshotter" feature: images in containerd's store

    @property
    def base_tag(self) -> str:
        return f"dockerlaunch/debian:{self.suite}"

    @property
    def base_candidates(self) -> tuple[str, ...]:
        numbers = {"bookworm": ("debian:12",), "trixie": ("debian:13",)}.get(self.suite, ())
        return (f"debian:{self.suite}-slim", f"debian:{self.suite}", *numbers, self.base_tag)


# Debian 12 (bookworm): 20.10.24; Debian 13 (trixie): 26.1.5 + containerd 1.7; the development suite (sid):
# 28.5.2 + containerd 2.1 + runc 1.3. 28-containerd: the image store Docker 29 makes the default.
ENGINES = {
    "20.10": EngineKind("20.10", "bookworm", 20),
    "26": EngineKind("26", "trixie", 26),
    "28": EngineKind("28", "sid", 28),
    "28-containerd": EngineKind("28-containerd", "sid", 28, containerd_store=True),
}


DEFAULT_ENGINE = "20.10"


CONTAINERD_STORE_DAEMON_JSON = b'{"features": {"containerd-snapshotter": true}}\n'


def parse_engines(spec: str | None, nodes: int | None) -> list[EngineKind]:
    """Pure: `--engines 20.10,26,28` (one per node) or one kind for all -> the kind of each node."""
    names = [x.strip() for x in (spec or DEFAULT_ENGINE).split(",")]
    bad = [x for x in names if x not in ENGINES]
    if bad:
        raise SimError(f"engine {bad[0]!r}: use one of {', '.join(ENGINES)} (e.g. --engines 20.10,26,28,28-containerd)")
    if len(names) == 1 and nodes is not None:
        names = names * nodes
    elif nodes is not None and len(names) != nodes:
        raise SimError(f"--engines names {len(names)} engine(s) for {nodes} node(s): give one per node, "
                       "or leave --nodes out")
    return [ENGINES[x] for x in names]


DEFAULT_SUBNET = "172.30.0.0/24"


DEFAULT_LIGHT_SUBNET = "172.28.0.0/22"  # 1022 addresses: room for 512 light hosts and their engines


DEFAULT_NAME = "dlsim"


FIRST_HOST_OFFSET = 11  # node1 = .11, node2 = .12, ...


MAX_NODES = 64  # regular nodes: each runs a dockerd


MAX_LIGHT_NODES = 512  # light hosts: sshd only


MAX_LIGHT_ENGINES = 64


LIGHT_HOSTS_PER_ENGINE = 32  # the default engine count: one per 32 light hosts, at most LIGHT_DEFAULT_ENGINES_MAX


LIGHT_DEFAULT_ENGINES_MAX = 8


LIGHT_POOL = 16  # light hosts created, started and waited for this many at a time


LIGHT_SOCK_DIR = "/run/dlengine"  # where an engine's socket volume is mounted, in the engine and its hosts


# Every capability except SYS_RESOURCE: --privileged fails on VMs whose bounding set lacks it (docs/ARCHITECTURE.md,
# simulated cluster).
NODE_CAPS = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
    "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE "
    "AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ"
).split()


SEED_DIR_IN_NODE = "/var/cache/dockerlaunch-seed"


NODE_SHM = "2g"


# The open-files limit every sim container (and so its dockerd) runs with: without CAP_SYS_RESOURCE a node's engine
# cannot give a container more than its own hard limit, so the launcher's default (container.NOFILE) is refused at
# start, as on hosts whose dockerd runs with a low LimitNOFILE. Fixed, so that this case is the same on every machine
# the suite runs on, not only where the outer engine happens to run low (20000 on the test VMs); lowering a limit
# needs no capability.
NODE_NOFILE = 16384


# One volume mounted into every node: the cluster's shared storage (what NFS or Lustre is on real hosts), for
# models, datasets and checkpoints that every rank must see.
SHARED_DIR = "/shared"

# The non-root logins of every regular node (node.Dockerfile makes them): name -> uid, each in the docker group and
# given the cluster's key, as the seed users log in (no root on the hosts). `ssh: {user: alice}` in a config uses one.
SIM_USERS = {"alice": 1001, "bob": 1002}


SLURM_CONF = "/etc/slurm/slurm.conf"


MUNGE_KEY = "/etc/munge/munge.key"


SLURM_READY_TIMEOUT = 60.0


class SimError(DockerlaunchError):
    pass


_LOG = logging.getLogger(__name__)  # the CLI shows it (cli/main.py); library use and tests stay quiet


def _log(msg: str) -> None:
    _LOG.info("[sim] %s", msg)


def state_root() -> Path:
    return Path(os.environ.get("DOCKERLAUNCH_STATE_DIR", "~/.local/share/dockerlaunch")).expanduser() / "sim"


def cache_root() -> Path:
    """The simulator's own cache (seed tars, the demo wheelhouse)."""
    return engine_cache_root() / "sim"


@dataclass(frozen=True)
class SimNode:
    index: int  # 1-based
    name: str  # container name
    ip: str
    volume: str  # its /var/lib/docker ("" for a light host: it runs no dockerd)
    served_by: str | None = None  # a light host: the engine container whose dockerd it uses
    advertise_addr: str | None = None  # a light host: its engine's IP (job containers live in the engine's netns)


@dataclass(frozen=True)
class SimEngine:
    """An engine container of a light cluster: a node image running dockerd (no host of the config), shared by
    the light hosts it serves through its socket volume."""

    index: int  # 1-based
    name: str  # container name: {cluster}-engine{k}
    ip: str
    volume: str  # its /var/lib/docker
    sock_volume: str  # its dockerd socket, mounted at LIGHT_SOCK_DIR in it and in its hosts
    hosts: tuple[int, ...]  # the indexes of the light hosts it serves


_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,39}\Z")


def check_name(cluster: str) -> str:
    """A cluster name becomes container, network and volume names and a folder under the state dir."""
    if not _NAME.match(cluster or "") or ".." in cluster:
        raise SimError(f"--name {cluster!r}: use letters, digits, '_', '.', '-' (start with a letter or digit, "
                       "at most 40)")
    return cluster


def node_layout(cluster: str, nodes: int, subnet: str) -> list[SimNode]:
    """Pure: names and fixed IPs of the nodes."""
    check_name(cluster)
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    if nodes < 1:
        raise SimError("--nodes must be at least 1")
    if FIRST_HOST_OFFSET - 1 + nodes > len(hosts):
        raise SimError(f"subnet {subnet} is too small for {nodes} nodes")
    return [
        SimNode(
            index=i,
            name=f"{cluster}-node{i}",
            ip=str(hosts[FIRST_HOST_OFFSET - 2 + i]),
            volume=f"{cluster}-node{i}-docker",
        )
        for i in range(1, nodes + 1)
    ]


def default_light_engines(nodes: int) -> int:
    """Pure: one engine per LIGHT_HOSTS_PER_ENGINE light hosts, at least 1, at most LIGHT_DEFAULT_ENGINES_MAX."""
    return max(1, min(LIGHT_DEFAULT_ENGINES_MAX, -(-nodes // LIGHT_HOSTS_PER_ENGINE)))


def light_layout(cluster: str, nodes: int, subnet: str, engines: int | None = None
                 ) -> tuple[list[SimNode], list[SimEngine]]:
    """Pure: a light cluster's hosts and engines. Host i has the address a regular node i would (.11 for host 1);
    the engines take the addresses right after the last host; host i is served by engine ((i-1) % E) + 1."""
    check_name(cluster)
    if nodes < 1:
        raise SimError("--nodes must be at least 1")
    if nodes > MAX_LIGHT_NODES:
        raise SimError(f"--nodes {nodes}: a light cluster has at most {MAX_LIGHT_NODES} hosts")
    count = default_light_engines(nodes) if engines is None else engines
    if not 1 <= count <= min(nodes, MAX_LIGHT_ENGINES):
        raise SimError(f"--light-engines {count}: give 1 to {min(nodes, MAX_LIGHT_ENGINES)} for {nodes} light "
                       "host(s) (at most one engine per host)")
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as e:
        raise SimError(f"--subnet {subnet!r}: {e}") from None
    addresses = list(net.hosts())
    need = FIRST_HOST_OFFSET - 1 + nodes + count
    if need > len(addresses):
        raise SimError(f"subnet {subnet} is too small for {nodes} light hosts and {count} engine(s): they need "
                       f"{need} addresses (host 1 is the {FIRST_HOST_OFFSET}th), it has {len(addresses)}; "
                       f"give a larger one, e.g. --subnet {DEFAULT_LIGHT_SUBNET}")
    engine_list = [
        SimEngine(
            index=k,
            name=f"{cluster}-engine{k}",
            ip=str(addresses[FIRST_HOST_OFFSET - 2 + nodes + k]),
            volume=f"{cluster}-engine{k}-docker",
            sock_volume=f"{cluster}-engine{k}-sock",
            hosts=tuple(range(k, nodes + 1, count)),
        )
        for k in range(1, count + 1)
    ]
    hosts = []
    for i in range(1, nodes + 1):
        served = engine_list[(i - 1) % count]
        hosts.append(SimNode(index=i, name=f"{cluster}-node{i}", ip=str(addresses[FIRST_HOST_OFFSET - 2 + i]),
                             volume="", served_by=served.name, advertise_addr=served.ip))
    return hosts, engine_list


def network_name(cluster: str) -> str:
    return f"{cluster}-net"


def render_cluster_config(cluster: str, layout: list[SimNode], state: Path, image: str,
                          nofile: int | None = None) -> str:
    data = {
        # a light host: advertise_addr is its engine's IP, where its job containers (--network host) listen
        "hosts": [{"address": n.ip, **({"advertise_addr": n.advertise_addr} if n.advertise_addr else {})}
                  for n in layout],
        "ssh": {
            "user": "root",
            "identity_file": str(state / "id_ed25519"),
            "known_hosts": str(state / "known_hosts"),
            "host_key_policy": "strict",
            "config_file": None,
        },
        "image": image,
        # Sim nodes have no GPUs or InfiniBand, and these VMs refuse memlock=-1 (docs/ARCHITECTURE.md); /shared is one
        # volume in every node; no model hub answers from the nodes.
        "container": {"gpus": "none", "infiniband": "off",
                      "mounts": [{"source": SHARED_DIR, "target": SHARED_DIR, "shared": True}]},
        "job": {"name": f"{cluster}-job", "offline": True},
    }
    if nofile is not None and nofile < NOFILE.hard:  # the nodes' dockerd cannot raise its own open-files limit
        data["container"]["ulimits"] = {"nofile": str(nofile)}
    header = f"# Written by the sim (sim up) for sim cluster {cluster!r}; host keys pinned at creation.\n"
    engines = {n.served_by for n in layout if n.served_by}
    if engines:
        header += (f"# Light cluster: {len(layout)} hosts run sshd only; their docker CLI drives one of "
                   f"{len(engines)} shared engine(s), whose IP is each host's advertise_addr.\n")
    return header + yaml.safe_dump(data, sort_keys=False)


def parse_engine_info(text: str) -> tuple[str, str]:
    """Pure: `docker info` "VERSION|DRIVER|DRIVERSTATUS-JSON" -> (version, image store)."""
    version, _, rest = text.strip().partition("|")
    if not version:
        return "?", "?"
    driver, _, status = rest.partition("|")
    if "io.containerd.snapshotter" in status:  # the containerd image store reports its snapshotter as the driver
        return version or "?", f"containerd ({driver or '?'})"
    return version or "?", driver or "?"


def containers_of(client, cluster: str | None = None, sparse: bool = False):
    """The cluster's containers (every cluster's with None); `sparse`: ids and names only, without one inspect
    per container."""
    label = SIM_LABEL if cluster is None else f"{SIM_LABEL}={cluster}"
    return client.containers.list(all=True, filters={"label": label}, sparse=sparse)
