"""The neutral job spec: what one node's container needs, typed, in no backend's syntax.

Every decision about what a job container needs (host network, IPC and /dev/shm, GPUs, InfiniBand, capabilities,
ulimits, mounts, rank env) is made once, by `job/plan.py`, into these types. Each backend (`backends/<target>/`)
turns them into its own form -- `docker run` argv, a compose service, a pod, an sbatch script -- and refuses in one
line what it cannot express. Values only a host can supply are `Deferred` placeholders: the docker backend fills
them from host facts at launch, a renderer maps them to its target's own mechanism, and nothing can run one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


class Deferred(str):
    """A value resolved on the host at launch. Displays as `<resolved at launch: WHAT>`.

    `key` says which host fact fills it (`nic`, `gpu_count`, `ib_hca`, `master_addr`, `run_id`, `env_file`,
    `gpu_access`, `infiniband`, `selinux`), so a backend can map it to its own mechanism without parsing text."""

    what: str
    key: str

    def __new__(cls, what: str, key: str = "") -> Deferred:
        obj = super().__new__(cls, f"<resolved at launch: {what}>")
        obj.what = what
        obj.key = key
        return obj

    def __reduce__(self):  # keep the type through copy/pickle
        return (Deferred, (self.what, self.key))


class UnresolvedError(ValueError):
    pass


GpuRequest = Literal["all"] | int | tuple[str, ...]  # every GPU, a count, or device indices/UUIDs


@dataclass(frozen=True)
class BindMount:
    """A host path in the container (torchx's BindMount)."""

    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Ulimit:
    """soft and hard; -1 is unlimited."""

    soft: int
    hard: int

    @classmethod
    def parse(cls, text: str) -> Ulimit:
        soft, _, hard = str(text).partition(":")
        return cls(int(soft), int(hard or soft))

    @property
    def unlimited(self) -> bool:
        return self.soft == -1 and self.hard == -1


@dataclass(frozen=True)
class GpuAccess:
    """How a Docker engine on one host reaches the GPUs the job asked for.

    `gpus`: nvidia-container-toolkit's runtime; `cdi`: CDI device names (Docker >= 25); `devices`: the device
    nodes in `devices` plus the host's driver libraries in `mounts`, no toolkit (env: CUDA_VISIBLE_DEVICES for a
    subset, LD_LIBRARY_PATH for the libraries)."""

    mode: Literal["gpus", "cdi", "devices"]
    why: str
    request: GpuRequest
    devices: tuple[str, ...] = ()
    mounts: tuple[BindMount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


# What InfiniBand needs in a container (NCCL's verbs transport): the device folder, the right to pin memory, and
# no limit on pinned memory ("ibv_reg_mr ... Cannot allocate memory", nccl-tests#206). Decided here, once.
IB_DEVICE = "/dev/infiniband"
IB_CAP = "IPC_LOCK"
IB_MEMLOCK = Ulimit(-1, -1)

# Open files, for every job container. Each DataLoader worker's shared tensors and each NCCL/gloo socket is a file
# descriptor: at 1024 a rank with many workers fails with "Too many open files". Docker <= 28 containers got
# 1048576 from containerd's unit file (LimitNOFILE=infinity); Docker 29 with containerd 2.x gives them 1024
# (moby#51485), so a job that ran everywhere fails on Docker 29 hosts only. 1048576 (soft and hard) is what they
# had, and the kernel's default fs.nr_open: the most a root engine can set without a sysctl. An engine that cannot
# raise its own hard limit (rootless Docker, Docker inside a container such as the sim's nodes) refuses it at start
# ("error setting rlimit type 7"): container.ulimits.nofile sets a lower value, and the user's value always wins.
NOFILE = Ulimit(1048576, 1048576)


@dataclass(frozen=True)
class Supervisor:
    """The gang supervisor (dockerlaunch/gang.py) as the container's entrypoint: docker-init's direct child, running
    the image's ENTRYPOINT plus the command as its own child (the spec's command then starts with the wrapper). Set
    by `up` only (a detached job keeps its guarantees beside it); no render target has it."""

    entrypoint: str  # the shim that picks the image's python3 (gang-entry.sh, run by /bin/sh)
    tmpfs: str  # where the run's secret is handed over: never argv, env, labels or mounts


@dataclass
class ContainerSpec:
    """One node's container. Built by the planner (validated there); a plain dataclass so `Deferred` values
    survive as they are (pydantic would coerce them to `str`)."""

    name: str
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_files: list[str] = field(default_factory=list)  # secrets: files of KEY=VALUE lines where the engine runs
    labels: dict[str, str] = field(default_factory=dict)
    mounts: list[BindMount] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # device paths, the same inside
    gpus: GpuRequest | None = None  # what the job asks for on this node; None: no GPUs
    gpu: GpuAccess | Deferred | None = None  # how a Docker engine there reaches them (None with gpus None)
    infiniband: bool | Deferred = False  # True: IB_DEVICE/IB_CAP/IB_MEMLOCK are in devices/cap_add/ulimits
    host_network: bool = True  # False: no network at all (one-shot tools)
    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: str | None = None
    cap_add: list[str] = field(default_factory=list)
    ulimits: dict[str, Ulimit] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    privileged: bool = False
    # True: the engine's SELinux labels off for this container (`--security-opt label=disable`, container.selinux):
    # its bind mounts of host folders are not denied, and SELinux does not confine it
    label_disable: bool | Deferred = False
    init: bool = True  # an init reaps torchrun's children and forwards signals
    tty: bool = False  # a terminal for its output: each write whole, lines of several processes never mixed
    detach: bool = True  # runs in the background (a job); False: in the foreground (a probe)
    remove: bool = False  # removed when it exits: probes only, a job container's exit code is evidence
    docker_args: list[str] = field(default_factory=list)  # container.extra_args: literal docker flags
    supervisor: Supervisor | None = None  # `up`'s gang supervisor as the entrypoint (None: the image's own)

    def unresolved(self) -> list[str]:
        """What still needs the host, by name."""
        out = [f"image: {self.image.what}"] if isinstance(self.image, Deferred) else []
        out += [f"env {k}: {v.what}" for k, v in self.env.items() if isinstance(v, Deferred)]
        out += [f"env file: {f.what}" for f in self.env_files if isinstance(f, Deferred)]
        out += [f"label {k}: {v.what}" for k, v in self.labels.items() if isinstance(v, Deferred)]
        out += [f"gpus: {self.gpu.what}"] if isinstance(self.gpu, Deferred) else []
        out += [f"infiniband: {self.infiniband.what}"] if isinstance(self.infiniband, Deferred) else []
        out += [f"selinux: {self.label_disable.what}"] if isinstance(self.label_disable, Deferred) else []
        out += [f"command: {c.what}" for c in self.command if isinstance(c, Deferred)]
        return out
