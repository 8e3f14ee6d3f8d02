"""Plan: config (+ facts gathered from hosts, when there are any) -> one exact container per host.

Pure: no SSH, no Docker, no clock. `--dry-run` prints the plan made without facts, where
host-dependent values are `Deferred`; the apply layer gathers `HostFacts` and plans again, and
only a plan without placeholders can start containers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import paramiko

from dockerlaunch import __version__
from dockerlaunch.cluster.config import ClusterConfig, HostConfig, is_ip, is_loopback
from dockerlaunch.cluster.spec import ContainerSpec, Deferred
from dockerlaunch.cluster.targets import SSHTarget, resolve_target
from dockerlaunch.errors import ConfigError

RANK_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE")
LABEL_JOB = "dockerlaunch.job"
LABEL_RANK = "dockerlaunch.rank"
LABEL_NNODES = "dockerlaunch.nnodes"
LABEL_VERSION = "dockerlaunch.version"
LABEL_RUN = "dockerlaunch.run"  # one launch of the job: what a host's watchdog removes
IB_FLAGS = ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}
FR_ENTRIES = "2000"  # flight-recorder ring size: collectives remembered per rank
# the per-job diagnostics folder (same path on the host and in the container); `up` empties them before a start
DIAG_SUBDIRS = ("nccl", "fr", "fr-pipe")


@dataclass(frozen=True)
class HostFacts:
    """What the apply layer learns on a host before planning for real (None = not known)."""

    interface: str | None = None  # from `ip route get MASTER_ADDR`
    gpu_count: int | None = None
    infiniband: bool | None = None  # /dev/infiniband present
    ib_hca: str | None = None  # ACTIVE ports, NCCL_IB_HCA syntax
    master_addr: str | None = None  # host 0 only: the address the others reach
    env_files: tuple[str, ...] | None = None  # remote paths of the uploaded secret env files


@dataclass
class HostPlan:
    rank: int
    host: HostConfig
    ssh: SSHTarget
    nproc_per_node: int | Deferred
    container: ContainerSpec

    @property
    def address(self) -> str:
        return self.host.address


@dataclass
class ClusterPlan:
    job: str
    image: str
    nnodes: int
    master_addr: str
    master_port: int
    hosts: list[HostPlan] = field(default_factory=list)
    diag_dir: str | None = None  # DIR/<job> on every host, when any diagnostics are on

    def unresolved(self) -> list[str]:
        return [f"rank {h.rank} ({h.address}) {u}" for h in self.hosts for u in h.container.unresolved()]

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "image": self.image,
            "nnodes": self.nnodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "diag_dir": self.diag_dir,
            "hosts": [
                {
                    "rank": h.rank,
                    "address": h.address,
                    "ssh": h.ssh.describe(),
                    "nproc_per_node": (
                        str(h.nproc_per_node) if isinstance(h.nproc_per_node, Deferred) else h.nproc_per_node
                    ),
                    "container": h.container.name,
                    "env": dict(h.container.env),
                    "argv": h.container.argv(),
                    "unresolved": h.container.unresolved(),
                }
                for h in self.hosts
            ],
        }


def container_name(job: str, rank: int) -> str:
    return f"{job}-{rank}"


def _master_addr(config: ClusterConfig, target0: SSHTarget, facts0: HostFacts | None) -> str:
    host0 = config.hosts[0]
    many = len(config.hosts) > 1
    candidates = [host0.advertise_addr, facts0.master_addr if facts0 else None, target0.hostname, host0.address]
    for c in candidates:
        if c and many and is_loopback(c):
            raise ConfigError(
                f"hosts[0] {host0.address}: MASTER_ADDR would be the loopback address {c}, so each of the "
                f"{len(config.hosts)} hosts would form its own world; list host 0 by an address the others reach "
                "or set hosts[0].advertise_addr"
            )
    if host0.advertise_addr:
        return host0.advertise_addr
    if facts0 and facts0.master_addr:
        return facts0.master_addr
    if is_ip(target0.hostname):
        return target0.hostname
    return Deferred(f"address of {host0.address} that the other hosts reach")


def _gpu_flags(gpus, mode: str) -> tuple[str | None, list[str]]:
    if gpus == "none":
        return None, []
    if mode == "cdi":
        devs = ["all"] if gpus == "all" else list(gpus)
        return None, [f"nvidia.com/gpu={d}" for d in devs]
    if gpus == "all":
        return "all", []
    if isinstance(gpus, int):
        return str(gpus), []
    # docker parses --gpus as CSV: a device list must be quoted inside the value
    return '"device=' + ",".join(gpus) + '"', []


def _nproc(config: ClusterConfig, host: HostConfig, gpus, facts: HostFacts | None) -> int | Deferred:
    if host.nproc_per_node:
        return host.nproc_per_node
    if config.job.nproc_per_node:
        return config.job.nproc_per_node
    if gpus == "none":
        return 1
    if isinstance(gpus, int):
        return gpus
    if isinstance(gpus, list):
        return len(gpus)
    if facts and facts.gpu_count:
        return facts.gpu_count
    return Deferred("GPU count of the host")


def diag_dir(config: ClusterConfig) -> str:
    return f"{config.diagnostics.dir}/{config.job.name}"


def diagnostics_env(config: ClusterConfig) -> dict[str, str]:
    """Flight recorder and NCCL logging into the job's diagnostics folder (the user's own values win)."""
    d, where = config.diagnostics, diag_dir(config)
    env: dict[str, str] = {}
    if d.nccl_log:
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=f"{where}/nccl/nccl.%h.%p.log")
    if d.flight_recorder:
        # both names: torch >= 2.7 reads TORCH_FR_*, older ones TORCH_NCCL_*; files are <stem><rank>
        env.update(
            TORCH_NCCL_TRACE_BUFFER_SIZE=FR_ENTRIES, TORCH_FR_BUFFER_SIZE=FR_ENTRIES, TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=f"{where}/fr/rank_", TORCH_FR_DUMP_TEMP_FILE=f"{where}/fr/rank_",
            TORCH_NCCL_DEBUG_INFO_PIPE_FILE=f"{where}/fr-pipe/rank_",
        )
    return env


def _command(config: ClusterConfig) -> list[str]:
    cmd = config.job.command
    if cmd is None:
        return []
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    return list(cmd)


def make_plan(
    config: ClusterConfig,
    facts: dict[int, HostFacts] | None = None,
    ssh_config: paramiko.SSHConfig | None = None,
    local_user: str | None = None,
    targets: list[SSHTarget] | None = None,
    run_id: str | None = None,
) -> ClusterPlan:
    """Per-host plan; `facts` is keyed by rank. `targets` (already resolved, e.g. by a `Cluster`) spare
    resolving them again from `ssh_config`."""
    facts = facts or {}
    if not config.image:
        raise ConfigError("no image: pass --image IMAGE or set image: in the config")
    reserved = sorted(set(RANK_ENV) & set(config.container.env))
    if reserved:
        raise ConfigError(
            f"container.env.{reserved[0]} is set per rank by dockerlaunch; remove it "
            "(use --master-port, --nproc-per-node or the host list instead)"
        )
    if targets is None:
        targets = [resolve_target(h, config.ssh, ssh_config, local_user) for h in config.hosts]
    master_addr = _master_addr(config, targets[0], facts.get(0))
    c = config.container
    nnodes = len(config.hosts)
    plan = ClusterPlan(
        job=config.job.name, image=config.image, nnodes=nnodes, master_addr=master_addr,
        master_port=config.job.master_port,
        diag_dir=diag_dir(config) if config.diagnostics.enabled else None,
    )
    for rank, (host, target) in enumerate(zip(config.hosts, targets)):
        f = facts.get(rank)
        gpus = host.gpus if host.gpus is not None else c.gpus
        gpu_value, gpu_devices = _gpu_flags(gpus, c.gpu_mode)
        nproc = _nproc(config, host, gpus, f)

        env: dict[str, str] = {
            "NNODES": str(nnodes),
            "NODE_RANK": str(rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(config.job.master_port),
            "NPROC_PER_NODE": nproc if isinstance(nproc, Deferred) else str(nproc),
        }
        iface = f.interface if f and f.interface else Deferred(f"NIC of the route to {master_addr}")
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface

        devices = list(gpu_devices)
        caps = list(c.cap_add)
        ulimits: dict[str, str] = {}
        deferred_flags: list[Deferred] = []
        ib = c.infiniband
        if ib == "auto" and f is not None and f.infiniband is not None:
            ib = "on" if f.infiniband else "off"
        if ib == "on":
            devices.append("/dev/infiniband")
            if "IPC_LOCK" not in caps:
                caps.append("IPC_LOCK")
            ulimits["memlock"] = "-1:-1"
            if f is not None and f.ib_hca is not None:
                if f.ib_hca:
                    env["NCCL_IB_HCA"] = f.ib_hca
            else:
                env["NCCL_IB_HCA"] = Deferred("ACTIVE InfiniBand ports of the host")
        elif ib == "auto":
            deferred_flags.append(Deferred("if the host has /dev/infiniband: " + " ".join(IB_FLAGS)))
            env["NCCL_IB_HCA"] = Deferred("ACTIVE InfiniBand ports of the host, if any")
        ulimits.update(c.ulimits)  # the user's values win
        if config.diagnostics.ptrace and "SYS_PTRACE" not in caps:
            caps.append("SYS_PTRACE")  # py-spy; cannot be added once the container runs
        env.update(DEFAULT_ENV)
        env.update(diagnostics_env(config))
        env.update(c.env)  # the user's values win over the launcher's NCCL/GLOO guesses

        if c.env_files:
            if f is not None and f.env_files is not None:
                env_files = list(f.env_files)
            else:
                env_files = [Deferred(f"0600 copy of {p} on the host, removed after start") for p in c.env_files]
        else:
            env_files = []

        spec = ContainerSpec(
            name=container_name(config.job.name, rank),
            image=config.image,
            command=_command(config),
            env=env,
            env_files=env_files,
            labels={
                LABEL_JOB: config.job.name,
                LABEL_RANK: str(rank),
                LABEL_NNODES: str(nnodes),
                LABEL_VERSION: __version__,
                LABEL_RUN: run_id or Deferred("a random id of this launch"),
            },
            mounts=[m.render() for m in c.mounts] + ([f"{plan.diag_dir}:{plan.diag_dir}"] if plan.diag_dir else []),
            network="host",
            ipc=c.effective_ipc,
            shm_size=c.shm_size,
            gpus=gpu_value,
            devices=devices,
            cap_add=caps,
            ulimits=ulimits,
            workdir=c.workdir,
            user=c.user,
            privileged=c.privileged,
            extra_args=list(c.extra_args),
            deferred_flags=deferred_flags,
        )
        plan.hosts.append(HostPlan(rank=rank, host=host, ssh=target, nproc_per_node=nproc, container=spec))
    return plan
