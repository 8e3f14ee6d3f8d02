"""Plan: config -> one neutral container spec per node, made once; host facts then fill its placeholders.

Pure: no SSH, no Docker, no clock. `make_plan` is what `--dry-run` and `render` show, with host-dependent values
as `Deferred`; the docker backend gathers `HostFacts` at launch and `resolve` fills exactly those values, so the
plan `up` applies is the one the dry run printed. Every decision about what a job container needs is made here;
how it reaches the host's GPUs is decided by the GPU model's rules (gpu/access.py), which the plan writes into the spec.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dockerlaunch import __version__
from dockerlaunch.container import (
    IB_CAP,
    IB_DEVICE,
    IB_MEMLOCK,
    NOFILE,
    BindMount,
    ContainerSpec,
    Deferred,
    GpuAccess,
    GpuRequest,
    Supervisor,
    Ulimit,
)
from dockerlaunch.errors import ConfigError
from dockerlaunch.gpu.access import HostGpuAccess, choose_access, pending_access
from dockerlaunch.job.config import ClusterConfig, HostConfig, is_ip, is_loopback
from dockerlaunch.job.facts import HostFacts

RANK_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE")
# Which attempt of a gang restart this is (0: the first start). TORCHELASTIC_RESTART_COUNT too, for commands that
# read torch elastic's name without torchrun; under torchrun its agent sets that one to its own count in every
# worker (0 here: torchrun restarts nothing), so DL_RESTART_COUNT is the one to read.
RESTART_ENV = ("DL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
LABEL_JOB = "dockerlaunch.job"
LABEL_RANK = "dockerlaunch.rank"
LABEL_NNODES = "dockerlaunch.nnodes"
LABEL_VERSION = "dockerlaunch.version"
LABEL_RUN = "dockerlaunch.run"  # one launch of the job: what a host's watchdog removes
# the host (as the config names it) that started the container: hosts may share an engine (several `local`
# entries, the sim's light hosts), and each host lists, removes and watches only its own
LABEL_HOST = "dockerlaunch.host"
# Output as it happens. On a terminal (container.tty, the default) Python line-buffers by itself, and an empty
# PYTHONUNBUFFERED (over an image's 1) keeps each print one write: several ranks' pieces then never interleave
# ("stepstep  3838" with PYTHONUNBUFFERED=1, measured: 1788 of 24000 lines cut with 8 processes, 0 on a tty).
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}
TTY_ENV = {"PYTHONUNBUFFERED": ""}
FR_ENTRIES = "2000"  # flight-recorder ring size: collectives remembered per rank
# job.offline: the hubs' own offline switches (huggingface_hub, transformers, datasets). ModelScope has none
# (modelscope 1.40.2 / modelscope-hub 0.5.1, the cpu stack's): in an ms-swift job its one hub call with local paths
# is the trainer's `check_model`, an ms-swift argument (see offline_advice).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SWIFT_TRAINERS = {"sft", "pt", "rlhf"}  # `swift X` / `megatron X` that build a trainer, which asks ModelScope
# the per-job diagnostics folder (same path on the host and in the container); `up` empties them before a start
DIAG_SUBDIRS = ("nccl", "fr", "fr-pipe")
# The gang supervisor (gang.py), `up --detach`: its files in the job's folder (bin/, kept: dump's py-spy lives there
# too), mounted read-only at SUPERVISOR_DIR; each run's records under runs/<run id> (kept: never emptied by a start)
GANG_BIN, GANG_RUNS = "bin", "runs"
SUPERVISOR_DIR = "/.dockerlaunch"
GANG_ENTRY = f"{SUPERVISOR_DIR}/gang-entry.sh"
SUPERVISOR = Supervisor("/bin/sh", "/run/dockerlaunch:rw,nosuid,nodev,noexec,mode=1777,size=1m")
STOP_GRACE = 5.0  # gang.STOP_GRACE: SIGTERM to SIGKILL of an attempt's processes


@dataclass
class HostPlan:
    rank: int
    host: HostConfig
    nproc_per_node: int | Deferred
    container: ContainerSpec
    gpu_mode: str | Deferred = "none"  # gpus / cdi / devices, as resolved for this host
    gpu_why: str = ""

    @property
    def address(self) -> str:
        return self.host.address


@dataclass
class JobPlan:
    """The whole job, backend-neutral: what `--dry-run` and `render` show and what `up` applies once resolved."""

    config: ClusterConfig
    job: str
    image: str
    nnodes: int
    master_addr: str
    master_port: int
    hosts: list[HostPlan] = field(default_factory=list)
    diag_dir: str | None = None  # DIR/<job> on every host, when any diagnostics are on
    advice: list[str] = field(default_factory=list)  # what the user should change; printed by --dry-run and `up`
    master_hostname: str | None = None  # host 0's address as SSH resolves it (~/.ssh/config HostName)
    attempt: int = 0  # 0 for the first start, N for the Nth gang restart
    supervised: bool = False  # the gang supervisor runs in every container (`up --detach`)
    job_dir: str = ""  # DIR/<job> on every host: diagnostics, and the supervisor's files and records

    @property
    def known_image(self) -> str | None:
        """The image, or None where the plan holds its placeholder (commands that only find the job's containers)."""
        return None if isinstance(self.image, Deferred) else self.image

    def unresolved(self) -> list[str]:
        return [f"rank {h.rank} ({h.address}) {u}" for h in self.hosts for u in h.container.unresolved()]

    def restart_policy(self) -> dict:
        """What `up` does after a failure (job.max_restarts, restart_backoff, hang_timeout, progress_regex, spares)."""
        j = self.config.job
        return {"max_restarts": j.max_restarts, "restart_backoff": j.restart_backoff, "hang_timeout": j.hang_timeout,
                "progress_regex": j.progress_regex, "spares": [h.address for h in self.config.spares]}

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "image": self.image,
            "nnodes": self.nnodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "diag_dir": self.diag_dir,
            "command": shown_command(self.config),
            "advice": list(self.advice),
            "recovery": self.restart_policy(),  # the dry run's key (docs/CLI-JSON.md)
            "supervised": self.supervised,
            "hosts": [
                {
                    "rank": h.rank,
                    "address": h.address,
                    "nproc_per_node": (
                        str(h.nproc_per_node) if isinstance(h.nproc_per_node, Deferred) else h.nproc_per_node
                    ),
                    "container": h.container.name,
                    "gpu_mode": str(h.gpu_mode),
                    "env": dict(h.container.env),
                    "ulimits": {k: f"{u.soft}:{u.hard}" for k, u in h.container.ulimits.items()},
                    "unresolved": h.container.unresolved(),
                }
                for h in self.hosts
            ],
        }


def container_name(job: str, rank: int) -> str:
    return f"{job}-{rank}"


def _master_addr(config: ClusterConfig, hostname0: str | None, facts0: HostFacts | None) -> str:
    host0 = config.hosts[0]
    many = not config.one_machine
    hostname0 = "127.0.0.1" if host0.local else hostname0 or host0.address
    # a `local` host's own name says nothing: with SSH hosts beside it, its advertise_addr is required
    names = [] if host0.local and many else [hostname0, host0.address]
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
    if is_ip(hostname0) and not (host0.local and many):
        return hostname0
    return Deferred(f"address of {host0.address} that the other hosts reach", "master_addr")


def gpu_access(gpus, requested: str, gpu: HostGpuAccess | None, user_env: dict[str, str], where: str,
               driver: str | None = None) -> GpuAccess | Deferred | None:
    """How a Docker engine on one host reaches the job's GPUs (gpu/access.py's rules), as the spec holds it;
    Deferred when that depends on facts not gathered yet (a dry run). `driver`: the host's driver version
    (gpu.host.GpuHost's), which device mode needs."""
    if gpus == "none":
        return None
    chosen = choose_access(gpus, requested, gpu, user_env, where, driver)
    if chosen is None:
        return Deferred(pending_access(requested), "gpu_access")
    return GpuAccess(chosen.mode, chosen.why, gpu_request(gpus), devices=chosen.devices,
                     mounts=tuple(BindMount(source, target, read_only=True) for source, target in chosen.mounts),
                     env=chosen.env)


def gpu_request(gpus) -> GpuRequest | None:
    """The config's request (`all`, `none`, a count, a device list) as the spec holds it."""
    if gpus == "none":
        return None
    return tuple(gpus) if isinstance(gpus, list) else gpus


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
    return Deferred("GPU count of the host", "gpu_count")


DIAG_ROOT = "/var/tmp/dockerlaunch"  # diagnostics.dir's default for root (another login: DIAG_ROOT-<user>)
_LOGIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")


def diag_root(config: ClusterConfig, login: str | None = None) -> str:
    """diagnostics.dir, else DIAG_ROOT for root and DIAG_ROOT-<login> for another SSH login: diagdir.sh refuses a
    parent another non-root user owns (they could swap the job's folder in it), so two logins never share one."""
    if config.diagnostics.dir:
        return config.diagnostics.dir
    return f"{DIAG_ROOT}-{login}" if login and login != "root" and _LOGIN.fullmatch(login) else DIAG_ROOT


def with_login(config: ClusterConfig, login: str | None) -> ClusterConfig:
    """The config with diagnostics.dir settled for this SSH login (plan_job: the plan's config is read after it)."""
    if config.diagnostics.dir:
        return config
    return config.model_copy(update={"diagnostics": config.diagnostics.model_copy(
        update={"dir": diag_root(config, login)})})


def diag_dir(config: ClusterConfig) -> str:
    return f"{diag_root(config)}/{config.job.name}"


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


IMAGE_CMD = "<the image's CMD>"  # what the dry run shows where no command was given: the image's own runs
NO_COMMAND_FIX = "put the command after `--` or set `job.command`"


def shown_command(config: ClusterConfig) -> list[str] | str:
    """The job's command as the dry run shows it: the argv, or IMAGE_CMD where none was given. (pure)"""
    return _command(config) or IMAGE_CMD


def command_refusal(config: ClusterConfig, image: str, runs_something: bool | None) -> str | None:
    """Why the job cannot start, when no command was given (nothing after `--`, no job.command) and the image has
    neither CMD nor ENTRYPOINT (`runs_something` False; None: not known, nothing refused): Docker would say only
    `No command specified`, after the whole pre-flight. (pure)"""
    if _command(config) or runs_something is None or runs_something:
        return None
    return (f"no command to run: nothing after `--`, no job.command, and the image {image} has no CMD or "
            f"ENTRYPOINT; {NO_COMMAND_FIX}")


def _command(config: ClusterConfig) -> list[str]:
    cmd = config.job.command
    if cmd is None:
        return []
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    return list(cmd)


class Resolved(Protocol):
    hostname: str  # where SSH connects (hosts/targets.SSHTarget)
    user: str  # the SSH login


def plan_job(config: ClusterConfig, targets: Sequence[Resolved], require_image: bool = True,
             supervised: bool = False) -> JobPlan:
    """The job's one plan before any host was asked, with host 0's address as SSH resolves it (`targets`:
    hosts/targets.resolve_all) as a candidate for MASTER_ADDR. Commands that only find the job's containers (down,
    status, logs, exec, transport, dump) need no image: the plan then holds a placeholder no container starts with."""
    return make_plan(with_login(config, targets[0].user), master_hostname=targets[0].hostname,
                     require_image=require_image, supervised=supervised)


def make_plan(
    config: ClusterConfig,
    facts: dict[int, HostFacts] | None = None,
    *,
    master_hostname: str | None = None,
    run_id: str | None = None,
    require_image: bool = True,
    attempt: int = 0,
    supervised: bool = False,
) -> JobPlan:
    """The job's plan; `facts` (keyed by rank) fill host values, else they stay `Deferred` (dry run, render).

    `master_hostname`: host 0's address as SSH resolves it (an ~/.ssh/config alias's HostName), a candidate
    for MASTER_ADDR. `attempt`: which start of a restarted job (DL_RESTART_COUNT)."""
    facts = facts or {}
    if not config.image and require_image:
        raise ConfigError("no image: pass --image IMAGE or set image: in the config")
    reserved = sorted((set(RANK_ENV) | set(RESTART_ENV)) & set(config.container.env))
    if reserved:
        raise ConfigError(
            f"container.env.{reserved[0]} is set per rank by dockerlaunch; remove it "
            "(use --master-port, --nproc-per-node or the host list instead)"
        )
    master_addr = _master_addr(config, master_hostname, facts.get(0))
    plan = JobPlan(
        config=config, job=config.job.name, nnodes=len(config.hosts), master_addr=master_addr,
        image=config.image or Deferred("the job image: --image or image: (not needed to find a job's containers)",
                                       "image"),
        master_port=config.job.master_port, diag_dir=diag_dir(config) if config.diagnostics.enabled else None,
        master_hostname=master_hostname, attempt=attempt, supervised=supervised, job_dir=diag_dir(config),
    )
    note = offline_advice(config.job.command) if config.job.offline else None
    if note:
        plan.advice.append(note)
    plan.hosts = [_host_plan(plan, rank, host, facts.get(rank), run_id) for rank, host in enumerate(config.hosts)]
    return plan


def resolve(plan: JobPlan, facts: dict[int, HostFacts], run_id: str, attempt: int = 0) -> JobPlan:
    """The same plan with its placeholders filled from what the hosts said (the docker backend, at launch).

    The planning rules are the ones that made the dry plan, so what `up --dry-run` printed is what runs, with
    host facts where it showed `<resolved at launch: ...>` (tests/unit/job/test_plan.py keeps that true)."""
    return make_plan(plan.config, facts, master_hostname=plan.master_hostname, run_id=run_id, attempt=attempt,
                     supervised=plan.supervised)


def label_disable(mode: str, labels: bool | None) -> bool | Deferred:
    """container.selinux on one host: whether its containers get `--security-opt label=disable`. `labels`: the
    host's engine labels containers (HostFacts.selinux; None: not asked yet, a dry run or a render). auto turns the
    labels off exactly where the engine has them; never `:z`, which relabels the host's folder itself."""
    if mode == "disable":
        return True
    if mode == "keep":
        return False
    if labels is None:
        return Deferred("--security-opt label=disable where the engine of the host labels containers (SELinux)",
                        "selinux")
    return labels


def infiniband_needs(spec: ContainerSpec, user_ulimits: dict[str, Ulimit]) -> None:
    """What InfiniBand needs in a container, added to the spec: the device folder, IPC_LOCK, unlimited memlock
    (the user's own memlock wins)."""
    if IB_DEVICE not in spec.devices:
        spec.devices.append(IB_DEVICE)
    if IB_CAP not in spec.cap_add:
        spec.cap_add.append(IB_CAP)
    if "memlock" not in user_ulimits:
        spec.ulimits = {"memlock": IB_MEMLOCK, **spec.ulimits}
    spec.infiniband = True


# long on purpose: every decision about one host's container in the order they depend on each other (env,
# GPUs, IB, IPC, mounts, labels); each step is a call into a small rule above.
def _host_plan(plan: JobPlan, rank: int, host: HostConfig, f: HostFacts | None, run_id: str | None) -> HostPlan:
    config, c = plan.config, plan.config.container
    master_addr = plan.master_addr
    gpus = host.gpus if host.gpus is not None else c.gpus
    access = gpu_access(gpus, c.gpu_mode, f.access if f else None, c.env, f"hosts[{rank}] {host.address}",
                        f.gpu_host.driver if f and f.gpu_host else None)
    nproc = _nproc(config, host, gpus, f)

    env: dict[str, str] = {
        "NNODES": str(plan.nnodes),
        "NODE_RANK": str(rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(config.job.master_port),
        "NPROC_PER_NODE": nproc if isinstance(nproc, Deferred) else str(nproc),
        **dict.fromkeys(RESTART_ENV, str(plan.attempt)),
    }
    iface = f.interface if f and f.interface else Deferred(f"NIC of the route to {master_addr}", "nic")
    env["NCCL_SOCKET_IFNAME"] = iface
    env["GLOO_SOCKET_IFNAME"] = iface

    user_ulimits = {k: Ulimit.parse(v) for k, v in c.ulimits.items()}
    spec = ContainerSpec(
        name=container_name(config.job.name, rank),
        image=plan.image,
        command=_command(config),
        labels={
            LABEL_JOB: config.job.name,
            LABEL_RANK: str(rank),
            LABEL_HOST: config.hosts[rank].address,
            LABEL_NNODES: str(plan.nnodes),
            LABEL_VERSION: __version__,
            LABEL_RUN: run_id or Deferred("a random id of this launch", "run_id"),
        },
        mounts=[BindMount(m.source, m.target, m.read_only) for m in c.mounts],
        gpus=gpu_request(gpus),
        gpu=access,
        host_network=True,
        ipc=effective_ipc(c.ipc, c.shm_size),
        shm_size=c.shm_size,
        cap_add=list(c.cap_add),
        ulimits={"nofile": NOFILE},  # Docker 29 gives 1024 (spec.NOFILE); container.ulimits.nofile wins below
        workdir=c.workdir,
        user=c.user,
        privileged=c.privileged,
        label_disable=label_disable(c.selinux, f.selinux if f else None),
        docker_args=list(c.extra_args),
    )
    if isinstance(access, GpuAccess):
        spec.devices += access.devices
        spec.mounts += access.mounts
        env.update(dict(access.env))
    ib = c.infiniband
    if ib == "auto" and f is not None and f.infiniband is not None:
        ib = "on" if f.infiniband else "off"
    if ib == "on":
        infiniband_needs(spec, user_ulimits)
        if f is not None and f.ib_hca is not None:
            if f.ib_hca:
                env["NCCL_IB_HCA"] = f.ib_hca
        else:
            env["NCCL_IB_HCA"] = Deferred("ACTIVE InfiniBand ports of the host", "ib_hca")
    elif ib == "auto":
        spec.infiniband = Deferred("if the host has /dev/infiniband: its device folder, IPC_LOCK, memlock unlimited",
                                   "infiniband")
        env["NCCL_IB_HCA"] = Deferred("ACTIVE InfiniBand ports of the host, if any", "ib_hca")
    spec.ulimits.update(user_ulimits)  # the user's values win
    if config.diagnostics.ptrace and "SYS_PTRACE" not in spec.cap_add:
        spec.cap_add.append("SYS_PTRACE")  # py-spy; cannot be added once the container runs
    env.update(TTY_ENV if c.tty else DEFAULT_ENV)
    spec.tty = c.tty
    env.update(diagnostics_env(config, f.torch if f else None, rank))
    if config.job.offline:
        env.update(OFFLINE_ENV)
    env.update(c.env)  # the user's values win over the launcher's NCCL/GLOO guesses
    spec.env = env
    if c.env_files:
        if f is not None and f.env_files is not None:
            spec.env_files = list(f.env_files)
        else:
            spec.env_files = [Deferred(f"0600 copy of {p} on the host, removed after start", "env_file")
                              for p in c.env_files]
    if plan.diag_dir:
        spec.mounts.append(BindMount(plan.diag_dir, plan.diag_dir))
    if plan.supervised:
        supervise(spec, plan, rank, f, run_id)
    return HostPlan(
        rank=rank, host=host, nproc_per_node=nproc, container=spec,
        gpu_mode=access.mode if isinstance(access, GpuAccess) else access if access is not None else "none",
        gpu_why=access.why if isinstance(access, GpuAccess) else "",
    )


def gang_dir(plan: JobPlan, run_id: str) -> str:
    """One run's records on every host (gang.py's RUNDIR): the same path inside the containers."""
    return f"{plan.job_dir}/{GANG_RUNS}/{run_id}"


def supervise(spec: ContainerSpec, plan: JobPlan, rank: int, f: HostFacts | None, run_id: str | None) -> None:
    """The gang supervisor as the entrypoint: gang-entry.sh (image's python3 -> gang.py) runs the image's own
    ENTRYPOINT plus the command (or the image's CMD, as Docker would) as its child. What the supervisor needs is
    one JSON argument: no secret is in it (the secret comes on `docker exec`'s stdin at the start)."""
    config, job = plan.config, plan.config.job
    image_command = f.image_command if f is not None else None
    if image_command is None:
        child: list[str] = ([Deferred("the image's ENTRYPOINT, if any", "image_command"), *spec.command]
                            if spec.command else [Deferred("the image's ENTRYPOINT and CMD", "image_command")])
    else:
        entrypoint, cmd = image_command
        child = [*entrypoint, *(spec.command or cmd)]
    addr = plan.master_addr
    if run_id is None or isinstance(addr, Deferred):
        settings: str = Deferred("the gang's settings (JSON): run id, MASTER_ADDR, job.gang_port, restarts, "
                                 "timeouts", "gang")
    else:
        settings = json.dumps({
            "job": plan.job, "run": run_id, "rank": rank, "nnodes": plan.nnodes,
            "hosts": [h.address for h in config.hosts], "host": config.hosts[rank].address,
            "addr": addr, "port": job.gang_port, "dir": gang_dir(plan, run_id),
            "max_restarts": job.max_restarts, "backoff": job.restart_backoff, "hang_timeout": job.hang_timeout,
            "progress_regex": job.progress_regex, "host_timeout": job.host_timeout,
            "start_timeout": job.start_timeout, "stop_grace": STOP_GRACE, "tty": bool(spec.tty),
        }, sort_keys=True, separators=(",", ":"))
    spec.supervisor = SUPERVISOR
    spec.command = [GANG_ENTRY, "run", settings, "--", *child]
    spec.mounts.append(BindMount(f"{plan.job_dir}/{GANG_BIN}", SUPERVISOR_DIR, read_only=True))
    if not plan.diag_dir:  # else the whole job folder is mounted already
        spec.mounts.append(BindMount(f"{plan.job_dir}/{GANG_RUNS}", f"{plan.job_dir}/{GANG_RUNS}"))


def effective_ipc(ipc: str | None, shm_size: str | None) -> str:
    """Host IPC unless asked otherwise: 64 MB of /dev/shm breaks dataloaders, and NCCL between containers of one
    machine needs the shared namespace (77x slower over sockets without it, benchmarks/RESULTS.md)."""
    return ipc or ("private" if shm_size else "host")
