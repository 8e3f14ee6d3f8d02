"""Plan: config (+ facts gathered from hosts, when there are any) -> one exact container per host.

Pure: no SSH, no Docker, no clock. `--dry-run` prints the plan made without facts, where
host-dependent values are `Deferred`; the apply layer gathers `HostFacts` and plans again, and
only a plan without placeholders can start containers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import paramiko

from dockerlaunch import __version__
from dockerlaunch.cluster.config import ClusterConfig, HostConfig, is_ip, is_loopback
from dockerlaunch.cluster.facts import GpuHost
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
NVIDIA_DIR = "/usr/local/nvidia"  # where nvidia/cuda images look for the driver (their PATH and LD_LIBRARY_PATH)
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# job.offline: the hubs' own offline switches (huggingface_hub, transformers, datasets). ModelScope has none
# (modelscope 1.40.2 / modelscope-hub 0.5.1, the cpu stack's): in an ms-swift job its one hub call with local paths
# is the trainer's `check_model`, an ms-swift argument (see offline_advice).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SWIFT_TRAINERS = {"sft", "pt", "rlhf"}  # `swift X` / `megatron X` that build a trainer, which asks ModelScope
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
    gpu: GpuHost | None = None  # how containers there reach the GPUs
    torch: str | None = None  # the image's torch, where its labels say (dockerlaunch-built images do)


@dataclass
class HostPlan:
    rank: int
    host: HostConfig
    ssh: SSHTarget
    nproc_per_node: int | Deferred
    container: ContainerSpec
    gpu_mode: str | Deferred = "none"  # gpus / cdi / devices, as resolved for this host
    gpu_why: str = ""

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
    advice: list[str] = field(default_factory=list)  # what the user should change; printed by --dry-run and `up`

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
            "advice": list(self.advice),
            "hosts": [
                {
                    "rank": h.rank,
                    "address": h.address,
                    "ssh": h.ssh.describe(),
                    "nproc_per_node": (
                        str(h.nproc_per_node) if isinstance(h.nproc_per_node, Deferred) else h.nproc_per_node
                    ),
                    "container": h.container.name,
                    "gpu_mode": str(h.gpu_mode),
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
    many = not config.one_machine
    # a `local` host's own name says nothing: with SSH hosts beside it, its advertise_addr is required
    names = [] if target0.local and many else [target0.hostname, host0.address]
    candidates = [host0.advertise_addr, facts0.master_addr if facts0 else None, *names]
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


def resolve_gpu_mode(requested: str, gpu: GpuHost) -> tuple[str, str]:
    """`auto` -> what the host offers, best first: the toolkit's runtime, CDI specs, else device nodes."""
    if requested != "auto":
        return requested, "set in the config"
    if gpu.nvidia_runtime:
        return "gpus", "nvidia-container-toolkit runtime registered with dockerd"
    major = int(gpu.engine.split(".")[0]) if gpu.engine and gpu.engine.split(".")[0].isdigit() else 0
    if gpu.cdi_specs and major >= 25:
        return "cdi", f"CDI spec {gpu.cdi_specs[0]}, Docker {gpu.engine}"
    return "devices", "no toolkit runtime or CDI spec: device nodes and the driver's libraries"


@dataclass(frozen=True)
class GpuAccess:
    """What a container needs to reach its GPUs in one mode."""

    mode: str
    why: str
    gpus: str | None = None  # docker --gpus value
    devices: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def _numbered(node: str) -> int | None:
    tail = node.removeprefix("/dev/nvidia")
    return int(tail) if tail.isdigit() else None


def device_access(gpus, gpu: GpuHost, user_env: dict[str, str], where: str, why: str) -> GpuAccess:
    """No toolkit: the control nodes, every /dev/nvidiaN, CUDA_VISIBLE_DEVICES for the chosen ones, and the host's
    driver libraries read-only under /usr/local/nvidia (where CUDA images look), on the loader's path.

    Every GPU node, not only the chosen ones: NCCL between two containers of one machine (one GPU each, --ipc
    host) picks P2P/CUMEM and then fails with `Cuda failure 101 'invalid device ordinal'` when the peer's node is
    missing (seen on 2 x H200); with all nodes it runs at bare-metal speed."""
    numbered = sorted((n for n in gpu.device_nodes if _numbered(n) is not None), key=_numbered)
    if gpus == "all":
        chosen = numbered
    elif isinstance(gpus, int):
        chosen = numbered[:gpus]
    else:
        bad = [g for g in gpus if not g.isdigit()]
        if bad:
            raise ConfigError(f"{where}: gpus {bad[0]!r}: device-node access (no nvidia-container-toolkit here) "
                              "takes GPU indices; use indices or install the toolkit")
        chosen = [f"/dev/nvidia{g}" for g in gpus]
    missing = [n for n in chosen if n not in gpu.device_nodes]
    wanted = gpus if isinstance(gpus, int) else len(chosen)
    if missing or not chosen or len(chosen) < wanted:
        have = ", ".join(numbered) or "none"
        raise ConfigError(f"{where}: asks for GPUs {gpus} but the host has GPU device nodes: {have}; "
                          "set container.gpus (gpus: none for a CPU job)")
    if not gpu.libs:
        raise ConfigError(f"{where}: no NVIDIA driver libraries found with `ldconfig -p` (libcuda, libnvidia-ml); "
                          "is the driver installed?")
    devices = [n for n in GPU_CONTROL_NODES if n in gpu.device_nodes] + numbered
    mounts = [f"{path}:{NVIDIA_DIR}/lib64/{soname}:ro" for soname, path in gpu.libs]
    if gpu.nvidia_smi:
        mounts.append(f"{gpu.nvidia_smi}:{NVIDIA_DIR}/bin/nvidia-smi:ro")
    env: list[tuple[str, str]] = []
    if chosen != numbered and "CUDA_VISIBLE_DEVICES" not in user_env:
        env.append(("CUDA_VISIBLE_DEVICES", ",".join(str(_numbered(n)) for n in chosen)))
    if "LD_LIBRARY_PATH" not in user_env:
        image = dict(e.split("=", 1) for e in (gpu.image_env or ()) if "=" in e).get("LD_LIBRARY_PATH", "")
        if f"{NVIDIA_DIR}/lib64" not in image.split(":"):
            env.append(("LD_LIBRARY_PATH", ":".join(p for p in (f"{NVIDIA_DIR}/lib64", image) if p)))
    return GpuAccess("devices", why, devices=tuple(devices), mounts=tuple(mounts), env=tuple(env))


def gpu_access(gpus, requested: str, gpu: GpuHost | None, user_env: dict[str, str], where: str
               ) -> GpuAccess | Deferred | None:
    """The GPU flags for one host; Deferred when they depend on facts not gathered yet (a dry run)."""
    if gpus == "none":
        return None
    if requested in ("gpus", "cdi"):
        mode, why = requested, "set in the config"
    elif gpu is None:
        return Deferred("GPU access of the host: --gpus (toolkit), CDI, or /dev/nvidia* + driver libraries"
                        if requested == "auto" else "/dev/nvidia* device nodes and driver libraries of the host")
    else:
        mode, why = resolve_gpu_mode(requested, gpu)
    if mode == "devices":
        return device_access(gpus, gpu, user_env, where, why)
    if mode == "cdi" and isinstance(gpus, int):
        raise ConfigError(f"{where}: CDI (chosen for this host) takes gpus: all or a device list, not a count")
    value, cdi = _gpu_flags(gpus, mode)
    return GpuAccess(mode, why, gpus=value, devices=tuple(cdi))


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


TORCH_LABEL = "ai.dockerlaunch.pin.torch"  # set by `dockerlaunch build`
FR_NEW_NAMES_ONLY = (2, 11)  # torch 2.11 (seen) reads TORCH_FR_* and warns at every rank about the old names


def torch_version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2])) if m else None


def nccl_log_name(rank: int) -> str:
    """Per container: containers of one machine each have a PID namespace of their own, so the same pid in two of
    them would share (and truncate) one `nccl.%h.%p.log` -- seen with two `local` hosts on a GPU machine."""
    return f"nccl.{rank}.%h.%p.log"


def diagnostics_env(config: ClusterConfig, torch: str | None = None, rank: int = 0) -> dict[str, str]:
    """Flight recorder and NCCL logging into the job's diagnostics folder (the user's own values win).

    The flight recorder's variables were renamed (TORCH_NCCL_TRACE_BUFFER_SIZE -> TORCH_FR_BUFFER_SIZE, ...);
    both are set unless the image's labels say its torch reads the new names, where the old ones only warn."""
    d, where = config.diagnostics, diag_dir(config)
    env: dict[str, str] = {}
    if d.nccl_log:
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                   NCCL_DEBUG_FILE=f"{where}/nccl/{nccl_log_name(rank)}")
    if d.flight_recorder:
        version = torch_version(torch)
        if version is None or version < FR_NEW_NAMES_ONLY:
            env.update(TORCH_NCCL_TRACE_BUFFER_SIZE=FR_ENTRIES, TORCH_NCCL_DEBUG_INFO_TEMP_FILE=f"{where}/fr/rank_")
        # files are <stem><rank>; the pipe kept its name
        env.update(TORCH_FR_BUFFER_SIZE=FR_ENTRIES, TORCH_FR_DUMP_TEMP_FILE=f"{where}/fr/rank_",
                   TORCH_NCCL_DUMP_ON_TIMEOUT="1", TORCH_NCCL_DEBUG_INFO_PIPE_FILE=f"{where}/fr-pipe/rank_")
    return env


def offline_advice(command: list[str] | str | None) -> str | None:
    """ms-swift's trainers ask ModelScope whether a local model is the latest (its `check_model`, on by default):
    on an air-gapped host that is 25 s to 2 minutes of retries on every rank (benchmarks/RESULTS.md), and no
    environment variable turns it off."""
    if command is None:
        return None
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
    else:
        words = list(command)
    runs_trainer = any(w.rsplit("/", 1)[-1] in ("swift", "megatron") and nxt in SWIFT_TRAINERS
                       for w, nxt in zip(words, words[1:]))
    if not runs_trainer or any(w.startswith("--check_model") for w in words):
        return None
    return ("job.offline: ms-swift still asks ModelScope whether the model is the latest (25 s to 2 minutes of "
            "retries on every rank without a hub): add --check_model false to the swift/megatron command "
            "(megatron: ms-swift >= 3.12)")


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
    note = offline_advice(config.job.command) if config.job.offline else None
    if note:
        plan.advice.append(note)
    for rank, (host, target) in enumerate(zip(config.hosts, targets)):
        f = facts.get(rank)
        gpus = host.gpus if host.gpus is not None else c.gpus
        access = gpu_access(gpus, c.gpu_mode, f.gpu if f else None, c.env, f"hosts[{rank}] {host.address}")
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

        caps = list(c.cap_add)
        ulimits: dict[str, str] = {}
        deferred_flags: list[Deferred] = []
        devices: list[str] = []
        gpu_mounts: list[str] = []
        if isinstance(access, GpuAccess):
            devices += access.devices
            gpu_mounts += access.mounts
            env.update(dict(access.env))
        elif isinstance(access, Deferred):
            deferred_flags.append(access)
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
        env.update(diagnostics_env(config, f.torch if f else None, rank))
        if config.job.offline:
            env.update(OFFLINE_ENV)
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
            mounts=[m.render() for m in c.mounts] + gpu_mounts
            + ([f"{plan.diag_dir}:{plan.diag_dir}"] if plan.diag_dir else []),
            network="host",
            ipc=c.effective_ipc,
            shm_size=c.shm_size,
            gpus=access.gpus if isinstance(access, GpuAccess) else None,
            devices=devices,
            cap_add=caps,
            ulimits=ulimits,
            workdir=c.workdir,
            user=c.user,
            privileged=c.privileged,
            extra_args=list(c.extra_args),
            deferred_flags=deferred_flags,
        )
        plan.hosts.append(HostPlan(
            rank=rank, host=host, ssh=target, nproc_per_node=nproc, container=spec,
            gpu_mode=access.mode if isinstance(access, GpuAccess) else access if access is not None else "none",
            gpu_why=access.why if isinstance(access, GpuAccess) else "",
        ))
    return plan
