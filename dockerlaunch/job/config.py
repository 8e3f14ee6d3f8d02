"""The cluster config's schema: the pydantic models a `dockerlaunch.yaml` is validated into, their validators and
the value grammars those validators read (host strings, mounts, durations, image references).

One validated `ClusterConfig` is the only input of the planning layer, so every check on one value of user input
lives here and fails naming the field. Where a config comes from and how it is read is job/load.py; the flags merged
into it, job/flags.py; what a wrong one is said as (did you mean, the flag to blame), job/messages.py.

Why one file of ~650 lines: it is one schema (`dockerlaunch schema` prints it whole) whose models' validators refer
to each other and to the grammars below them; split, the schema would be assembled from pieces that cannot be read
alone.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from dockerlaunch.job.invocation import Invocation

LOCAL = "local"  # a host address: this machine, through its own Docker engine, without SSH

# an env name that looks like a secret: warned of in container.env, never repeated in a printed command
SECRET_NAME = re.compile(r"(TOKEN|_KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
# the validators end at \Z: `$` also matches before a trailing line feed (`--name 'train\n'` passed)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")
_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?\Z")
_ULIMIT_VALUE = re.compile(r"^-?[0-9]+(:-?[0-9]+)?\Z")
_CAP = re.compile(r"^[A-Z_]+\Z")
_GPU_DEVICE = re.compile(r"^([0-9]+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)\Z")
# what reaches ssh, known_hosts and remote shells: host names, IPv4/IPv6 literals, login names
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})\Z")
_LOGIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_CONTAINER_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?\Z")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_loopback(value: str) -> bool:
    if value.lower() in {"localhost", "localhost.localdomain", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


class SSHSettings(_Model):
    """Defaults for every host; a host entry or ~/.ssh/config fills what is left unset."""

    user: str | None = Field(None, description="Login user; default: ~/.ssh/config's User, else the local user.")
    port: int | None = Field(None, ge=1, le=65535, description="Default: ~/.ssh/config's Port, else 22.")
    identity_file: str | None = Field(None, description="Private key file; default: ~/.ssh/config, agent, ~/.ssh/id_*.")
    known_hosts: str | None = Field(None, description="known_hosts file; default ~/.ssh/known_hosts.")
    host_key_policy: Literal["strict", "accept-new"] = Field(
        "strict",
        description="strict: unknown or changed host keys are refused. accept-new: unknown keys are recorded, "
        "changed keys are still refused.",
    )
    connect_timeout: float = Field(10.0, gt=0, le=600, description="Seconds to wait for a TCP connect + handshake.")
    config_file: str | None = Field("~/.ssh/config", description="OpenSSH client config to honour; null to ignore.")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return check_login(v)


class HostConfig(_Model):
    address: str = Field(..., min_length=1, description="Host name, ~/.ssh/config alias or IP address.")
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    advertise_addr: str | None = Field(
        None, description="The IP the other hosts use to reach this one (MASTER_ADDR when this is host 0)."
    )
    gpus: GpuRequest | None = Field(None, description="Override container.gpus on this host.")
    nproc_per_node: int | None = Field(None, ge=1, le=1024, description="Override job.nproc_per_node on this host.")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        v = v.strip()
        if not (is_ip(v) or _HOSTNAME.match(v)):
            raise ValueError(f"{v!r} is not a host name or IP address (letters, digits, '.', '-', '_')")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return check_login(v)

    _gpus = field_validator("gpus", mode="before")(lambda cls, v: normalize_gpus(v))

    @property
    def local(self) -> bool:
        return self.address == LOCAL

    @model_validator(mode="after")
    def _local_has_no_ssh(self) -> HostConfig:
        if self.local and (self.user or self.port or self.identity_file):
            raise ValueError("local runs on this machine without SSH: drop user, port and identity_file")
        return self

    @field_validator("advertise_addr")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is not None and not is_ip(v):
            raise ValueError(f"{v!r} is not an IP address (advertise_addr must be the IP other hosts reach)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return parse_host_string(data)
        if isinstance(data, dict) and isinstance(data.get("address"), str):
            parsed = parse_host_string(data["address"])
            for key, value in parsed.items():
                if key != "address" and data.get(key) not in (None, value):
                    raise ValueError(f"address {data['address']!r} says {key} {value}, but {key}: {data[key]}")
            return {**data, **parsed}
        return data


# `all` | `none` | a count | a list of device indexes or UUIDs
GpuRequest = Literal["all", "none"] | Annotated[int, Field(ge=1, le=1024)] | list[str]
HostConfig.model_rebuild()


def normalize_gpus(v: Any) -> Any:
    """Accept YAML's natural spellings: `[0, 1]`, `"0,1"`, `"2"`, `0` (= none)."""
    if v is None:
        return None  # unset (a host without an override)
    if isinstance(v, bool):
        raise ValueError("use all, none, a count or a device list")
    if v == 0:
        return "none"
    if isinstance(v, str) and v not in ("all", "none"):
        if v.isdigit():
            return int(v)
        v = [p.strip() for p in v.split(",") if p.strip()]
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("an empty device list; use none for no GPUs")
        devices = [str(x) for x in v]
        for d in devices:
            if not _GPU_DEVICE.match(d):
                raise ValueError(f"{d!r} is not a GPU index or UUID (use all, none, a count, or e.g. [0, 1])")
        repeated = sorted({d for d in devices if devices.count(d) > 1})
        if repeated:
            raise ValueError(f"GPU {repeated[0]} is listed twice; list each device once")
        return devices
    return v


class Mount(_Model):
    source: str = Field(..., description="Absolute path on the host.")
    target: str = Field(..., description="Absolute path in the container.")
    read_only: bool = False
    shared: bool = Field(False, description="The same storage on every host (NFS, Lustre...); doctor checks it.")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return parse_mount_string(data)
        return data

    @field_validator("source", "target")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"{v!r} is not an absolute path")
        if "," in v or ":" in v:
            raise ValueError(f"{v!r}: ',' and ':' are not allowed in mount paths")
        return v


class ContainerSettings(_Model):
    mounts: list[Mount] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Plain variables. Put secrets in env_files.")
    env_files: list[str] = Field(
        default_factory=list,
        description="Local files of KEY=VALUE lines (secrets): never shown or put on a command line.",
    )
    ipc: Literal["host", "private", "shareable"] | None = Field(
        None, description="Default host; private when shm_size is set."
    )
    shm_size: str | None = Field(None, description="e.g. 64g; needs ipc other than host.")
    tty: bool = Field(
        True, description="A terminal for the job's output (docker run --tty): every process's line is written "
        "whole, so 8 ranks on one host never cut into each other's lines (stdout and stderr become one stream; "
        "Python line-buffers it, so PYTHONUNBUFFERED is left empty). false: separate pipes, PYTHONUNBUFFERED=1.",
    )
    gpus: GpuRequest = "all"
    gpu_mode: Literal["auto", "gpus", "cdi", "devices"] = Field(
        "auto", description="gpus: docker --gpus (nvidia-container-toolkit); cdi: --device nvidia.com/gpu=... "
        "(Docker >= 25 with CDI specs); devices: /dev/nvidia* + the host's driver libraries, no toolkit; "
        "auto: per host, in that order of preference, from what the host has.",
    )
    infiniband: Literal["auto", "on", "off"] = Field(
        "auto", description="on: /dev/infiniband, IPC_LOCK, memlock unlimited; auto: the same where the host has IB."
    )
    ulimits: dict[str, str] = Field(
        default_factory=dict, description="name -> soft[:hard], e.g. memlock: '-1'. Yours win over dockerlaunch's: "
        "nofile 1048576 on every job (Docker 29 gives 1024), memlock -1 where InfiniBand is used; an engine that "
        "cannot raise its own limits (rootless Docker, Docker in a container) needs lower ones, e.g. nofile: '65536'.",
    )
    cap_add: list[str] = Field(default_factory=list)
    workdir: str | None = None
    user: str | None = None
    privileged: bool = Field(False, description="Only when you really need it.")
    selinux: Literal["auto", "disable", "keep"] = Field(
        "auto", description="Where an engine labels containers (SELinux: its `docker info` lists selinux), a bind "
        "mount of a host folder is denied in a labelled container unless the folder is labelled for containers. "
        "auto: asked per host at launch; on such an engine the job's, doctor's and dump's containers get "
        "--security-opt label=disable (SELinux then does not confine them), elsewhere nothing. disable: always. "
        "keep: never (label the folders: chcon -R -t container_file_t DIR). Never :z, which would relabel the "
        "folder itself (a shared home's files).",
    )
    extra_args: list[str] = Field(default_factory=list, description="Appended to docker run before the image.")

    _gpus = field_validator("gpus", mode="before")(lambda cls, v: normalize_gpus(v))

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            check_env_key(key)
        return {k: str(val) for k, val in v.items()}

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): scalar(val, f"{k}") for k, val in v.items()}
        return v

    @field_validator("infiniband", mode="before")
    @classmethod
    def _ib_bool(cls, v: Any) -> Any:
        # YAML 1.1 reads `on`/`off`/`yes`/`no` as booleans; users write exactly that
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("user")
    @classmethod
    def _container_user(cls, v: str | None) -> str | None:
        if v is not None and not _CONTAINER_USER.match(str(v)):
            raise ValueError(f"{v!r} is not a user[:group] name or uid[:gid]")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r} is not an absolute path")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str | None) -> str | None:
        if v is not None and not _SIZE.match(str(v)):
            raise ValueError(f"{v!r} is not a size like 64g or 16384m")
        return v

    @field_validator("ulimits", mode="before")
    @classmethod
    def _ulimits_str(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): scalar(val, str(k)) for k, val in v.items()}
        return v

    @field_validator("ulimits")
    @classmethod
    def _ulimits(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not re.fullmatch(r"[a-z]+", name):
                raise ValueError(f"{name!r} is not a ulimit name (memlock, nofile, stack, ...)")
            if not _ULIMIT_VALUE.match(value):
                raise ValueError(f"ulimit {name}={value!r} is not soft[:hard] integers (-1 = unlimited)")
            if name == "nofile":  # what runc would refuse only once the container starts
                soft, _, hard = value.partition(":")
                if "-" in value:
                    raise ValueError(f"ulimit nofile={value!r}: open files cannot be unlimited (the kernel caps them "
                                     "at fs.nr_open, 1048576 by default); give a number such as 1048576")
                if hard and int(soft) > int(hard):
                    raise ValueError(f"ulimit nofile={value!r}: the soft limit is above the hard one")
        return v

    @field_validator("cap_add")
    @classmethod
    def _caps(cls, v: list[str]) -> list[str]:
        out = []
        for cap in v:
            cap = cap.upper().removeprefix("CAP_")
            if not _CAP.match(cap):
                raise ValueError(f"{cap!r} is not a capability name like SYS_PTRACE")
            out.append(cap)
        return out

    @model_validator(mode="after")
    def _ipc_shm(self) -> ContainerSettings:
        if self.shm_size and self.ipc == "host":
            raise ValueError("shm_size has no effect with ipc: host; drop one of them")
        if self.gpu_mode == "cdi" and isinstance(self.gpus, int):
            raise ValueError("gpu_mode cdi takes gpus: all, none or a device list, not a count")
        if self.gpu_mode == "devices" and isinstance(self.gpus, list) and not all(g.isdigit() for g in self.gpus):
            raise ValueError("gpu_mode devices takes GPU indices (e.g. [0, 1]), not UUIDs: it passes /dev/nvidiaN")
        return self


# Docker's reference grammar (distribution/reference's regexp.go): NAME[:TAG][@DIGEST], NAME = [DOMAIN[:PORT]/]PATH;
# or an image ID. Anything else (`x;curl${IFS}e|sh`) is refused before it reaches a command line or a printed fix.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_IMAGE_REF = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"  # name
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",  # digest
    re.ASCII)
_IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}", re.ASCII)


# enroot's forms, for `render --to slurm` with pyxis: REGISTRY#IMAGE, dockerd://REF, a squashfs file
_ENROOT_FILE = re.compile(r"/[A-Za-z0-9._+/-]+\.(?:sqsh|squashfs)", re.ASCII)


def is_image_ref(text: str) -> bool:
    """A reference Docker accepts (its grammar, names at most 255 characters), an image ID, or one of enroot's
    forms of them (pyxis)."""
    if _IMAGE_ID.fullmatch(text) or _ENROOT_FILE.fullmatch(text):
        return True
    if text.startswith("dockerd://"):
        return is_image_ref(text[len("dockerd://"):]) and "#" not in text
    if "#" in text:
        registry, _, rest = text.partition("#")
        return bool(re.fullmatch(_DOMAIN, registry, re.ASCII)) and "#" not in rest and is_image_ref(
            f"{registry}/{rest}")
    if _IMAGE_REF.fullmatch(text) is None:
        return False
    name = text.split("@")[0]
    name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    first = name.split("/")[0]
    # a first part without '.' or ':' (not localhost) is a path, not a registry, as Docker splits it: lowercase
    if "/" in name and not ("." in first or ":" in first or first == "localhost" or first.startswith("[")) \
            and not re.fullmatch(_PATH_COMPONENT, first):
        return False
    return len(name) <= 255


class JobSettings(_Model):
    name: str = Field("dockerlaunch", description="Container names are <name>-<rank>.")
    nproc_per_node: int | None = Field(
        None, ge=1, le=1024, description="Default: the GPU count (resolved at launch for gpus: all), 1 for gpus: none."
    )
    master_port: int = Field(29500, ge=1, le=65535)
    command: list[str] | str | None = Field(
        None, description="A list runs as is; a string runs under /bin/sh -c (so $NODE_RANK expands in the container)."
    )
    host_timeout: float = Field(
        30.0, ge=5, le=3600,
        description="Seconds without a heartbeat answer before `up` declares a host lost and tears the job down.",
    )
    gang_port: int = Field(
        29499, ge=1, le=65535,
        description="`up --detach`: the port host 0's gang supervisor listens on (MASTER_ADDR) for the other ranks' "
        "supervisors (fail-fast, restarts, hangs, lost hosts without the launcher); open it as MASTER_PORT is.",
    )
    start_timeout: float = Field(
        300.0, ge=10, le=86400,
        description="`up --detach`: seconds for every rank's supervisor to join the gang; a rank whose gang has not "
        "formed by then stops (a launcher killed mid-start leaves nothing running past it).",
    )
    orphan_grace: float = Field(
        60.0, ge=1, le=86400,
        description="When the launcher's session to a host drops (launcher killed, its machine gone, network cut), "
        "the host removes the job's containers after this many seconds (not for --detach).",
    )
    offline: bool = Field(
        False,
        description="The hosts have no model hub (air-gapped): set the hubs' offline switches (HF_HUB_OFFLINE, "
        "TRANSFORMERS_OFFLINE, HF_DATASETS_OFFLINE) so each rank fails at once instead of retrying; models and "
        "datasets come from local paths.",
    )
    push: bool = Field(
        False,
        description="`up` first pushes this machine's build of the image (as `dockerlaunch push`, thin) to every host "
        "that lacks it or holds another build, so an edit-build-up loop never trains yesterday's build. Refused when "
        "this machine lacks the image.",
    )
    max_restarts: int = Field(
        0, ge=0, le=1000,
        description="Gang restarts: when a rank exits non-zero, a host is lost or the job hangs, `up` removes every "
        "container and starts every host again, up to this many times (DL_RESTART_COUNT says which attempt). A job "
        "whose ranks all exit 0 is never restarted; Ctrl-C / SIGTERM never starts a new attempt.",
    )
    restart_backoff: float = Field(
        10.0, ge=0, le=3600, description="Seconds between one attempt's teardown and the next attempt's start."
    )
    hang_timeout: float | None = Field(
        None, ge=10, le=7 * 86400,
        description="Off unless set (seconds, or 90s / 30m / 2h): when no rank has printed a line (or matched "
        "job.progress_regex) for this long, `up` dumps every rank into the attempt's log folder, then treats the "
        "attempt as failed.",
    )
    progress_regex: str | None = Field(
        None, description="With hang_timeout: only lines matching this (Python) regular expression count as "
        "progress, e.g. 'iteration +[0-9]+'.",
    )

    @field_validator("hang_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return parse_duration(v) if isinstance(v, str) else v

    @field_validator("progress_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"{v!r} is not a regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _progress_needs_hang(self) -> JobSettings:
        if self.progress_regex is not None and self.hang_timeout is None:
            raise ValueError("progress_regex is only read with hang_timeout: set job.hang_timeout (e.g. 30m)")
        if self.gang_port == self.master_port:
            raise ValueError(f"gang_port {self.gang_port} is the master_port too: pick another for one of them")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _JOB_NAME.match(v):
            raise ValueError(f"{v!r}: use letters, digits, '_', '.', '-' (start with a letter or digit, at most 63)")
        return v


class DiagnosticsSettings(_Model):
    """What must be in place before a job hangs for `dump` and `transport` to see inside it afterwards."""

    ptrace: bool = Field(True, description="cap SYS_PTRACE on job containers: py-spy in the image can dump stacks.")
    flight_recorder: bool = Field(
        True, description="PyTorch's NCCL flight recorder: dumped on a collective timeout and by `dockerlaunch dump`."
    )
    nccl_log: bool = Field(
        True, description="NCCL_DEBUG=INFO (INIT,NET) to files, not the console: `transport` reads NCCL's choices."
    )
    dir: str | None = Field(
        None,
        description="On each host, DIR/<job>/ holds the NCCL logs and flight-recorder files; mounted at the same path. "
        "Default: /var/tmp/dockerlaunch for root, /var/tmp/dockerlaunch-USER for another SSH user (host 0's): a "
        "folder one login made is not safe for another's jobs, so logins never share one.",
    )
    xid_window: float | None = Field(
        None, ge=60, le=365 * 86400,
        description="Pre-flight: a fatal GPU XID in the kernel log fails a host only when it is newer than the "
        "driver's "
        "load; set this (seconds, or 30m / 24h) to fail on one inside this window instead (a GPU reset does not "
        "reload the driver).",
    )

    @field_validator("xid_window", mode="before")
    @classmethod
    def _window(cls, v: Any) -> Any:
        return parse_duration(v) if isinstance(v, str) else v

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/") or v.rstrip("/") == "" or "," in v or ":" in v or any(c.isspace() for c in v):
            raise ValueError(f"{v!r} is not an absolute folder path (no ',', ':' or spaces), "
                             "e.g. /var/tmp/dockerlaunch")
        return v.rstrip("/")

    @property
    def enabled(self) -> bool:
        return self.ptrace or self.flight_recorder or self.nccl_log


class ClusterConfig(_Model):
    # how the user named this config and its overrides (load_config): every printed fix is built from it
    _invocation: Invocation = PrivateAttr(default_factory=Invocation)
    hosts: list[HostConfig] = Field(..., min_length=1, description="Rank 0 is the first host.")
    spares: list[HostConfig] = Field(
        default_factory=list,
        description="Hosts that stand by: before a restart, a lost host (or one that fails the doctor checks) is "
        "replaced by the first healthy spare, which takes its rank.",
    )
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    image: str | None = Field(None, description="The job image, e.g. registry/name:tag or an image ID.")
    container: ContainerSettings = Field(default_factory=ContainerSettings)
    job: JobSettings = Field(default_factory=JobSettings)
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not is_image_ref(v):
            raise ValueError(f"{v!r} is not an image reference (NAME[:TAG][@DIGEST] as Docker reads it, e.g. "
                             "registry:5000/team/train:v1, or an image ID)")
        return v

    @property
    def invocation(self) -> Invocation:
        """The user's own --config, --hosts and --name: what every printed fix repeats (job/invocation.py)."""
        return self._invocation

    @property
    def one_machine(self) -> bool:
        """Every rank on this one machine (one host, or only `local` entries): loopback is a fine MASTER_ADDR."""
        return len(self.hosts) == 1 or all(h.local for h in self.hosts)

    @model_validator(mode="after")
    def _unique_hosts(self) -> ClusterConfig:
        seen: dict[tuple[str, int | None], int] = {}
        for i, h in enumerate(self.hosts):
            if h.local and not self.one_machine and not h.advertise_addr:
                raise ValueError(f"hosts[{i}] local: in a job with SSH hosts, give its advertise_addr (the IP of "
                                 "this machine that the other hosts reach)")
            if h.local:
                continue  # several `local` "hosts" (e.g. one GPU each) share this machine
            key = (h.address, h.port)
            if key in seen:
                raise ValueError(f"host {h.address!r} is listed twice (hosts[{seen[key]}] and hosts[{i}])")
            seen[key] = i
        named = {key: f"hosts[{i}]" for key, i in seen.items()}
        for i, h in enumerate(self.spares):
            if h.local:
                raise ValueError(f"spares[{i}] local: a spare is another machine; list it by its SSH address")
            key = (h.address, h.port)
            if key in named:
                raise ValueError(f"spare {h.address!r} is listed twice ({named[key]} and spares[{i}])")
            named[key] = f"spares[{i}]"
        return self


# ---------------------------------------------------------------- parsing helpers (pure)


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d)?\s*\Z")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90', '90s', '30m', '2h', '1d' -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration: give seconds, or a number with s, m, h or d (e.g. 30m)")
    return float(m[1]) * _UNIT_S[m[2] or "s"]


def scalar(value: Any, name: str) -> str:
    """A YAML scalar as the string a container sees; lists and maps are refused (never a Python repr)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float, str)):
        return str(value)
    kind = "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else type(value).__name__
    raise ValueError(f"{name} is {kind}, not a single value; quote it as one string")


def check_login(v: str | None) -> str | None:
    if v is not None and not _LOGIN.match(v):
        raise ValueError(f"{v!r} is not a login name (letters, digits, '.', '-', '_')")
    return v


def check_env_key(key: str) -> str:
    if not _ENV_KEY.match(key):
        raise ValueError(f"{key!r} is not a valid environment variable name")
    return key


def parse_host_string(text: str) -> dict[str, Any]:
    """`[user@]host[:port]`, with `[v6addr]:port` for IPv6; a bare IPv6 address has no port."""
    text = text.strip()
    out: dict[str, Any] = {}
    if "@" in text:
        user, text = text.rsplit("@", 1)
        if not user:
            raise ValueError("empty user before '@'")
        out["user"] = user
    port: str | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: missing ']' after an IPv6 address")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{text!r}: expected :PORT after ']'")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host = text
    if port is not None:
        if not port.isdigit():
            raise ValueError(f"{port!r} is not a port number")
        out["port"] = int(port)
    out["address"] = host
    return out


def parse_mount_string(text: str) -> dict[str, Any]:
    """`host:container[:ro|rw]`, docker's -v syntax."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"{text!r} is not host_path:container_path[:ro]")
    out: dict[str, Any] = {"source": parts[0], "target": parts[1]}
    if len(parts) == 3:
        if parts[2] not in ("ro", "rw"):
            raise ValueError(f"{text!r}: mode must be ro or rw, not {parts[2]!r}")
        out["read_only"] = parts[2] == "ro"
    return out


def config_schema() -> dict[str, Any]:
    return ClusterConfig.model_json_schema()


def secret_looking_env(config: ClusterConfig) -> list[str]:
    """Names in container.env that look like secrets (HF_TOKEN, WANDB_API_KEY, ..._SECRET, ...PASSWORD...): a
    plain value shows in `docker run`'s argv on every host, in --dry-run, renders and attempts.jsonl."""
    return [k for k in config.container.env if SECRET_NAME.search(k)]
