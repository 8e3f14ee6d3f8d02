"""What doctor observed, as typed facts, and the pure parsers that make them from what hosts and probe
containers print: everything `judge` reads, unit-tested on recorded output, with no I/O."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.container import GpuAccess
from dockerlaunch.errors import ConfigError, HostError
from dockerlaunch.gpu.needs import ImageNeeds
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import HostPlan, gpu_access, label_disable


def local_ports(proc_net_tcp: str, state: str) -> set[int]:
    """Local ports of the sockets in `state` (0A listen, 01 established) from /proc/net/tcp and tcp6 text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3] == state and ":" in parts[1]:
            try:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
            except ValueError:
                continue
    return ports


def listening_ports(proc_net_tcp: str) -> set[int]:
    return local_ports(proc_net_tcp, "0A")


def parse_df_kb(text: str) -> tuple[int, int] | None:
    """`df -Pk PATH` -> (size KiB, available KiB)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    parts = lines[-1].split()
    try:
        return int(parts[1]), int(parts[3])
    except (IndexError, ValueError):
        return None


# How engines say that a container's command is not in the image: runc (Docker 20.10 to 28) and crun. Docker's own
# exit status for it is 127; a shell inside the container that cannot find a command also exits 127, but says so in
# its own words, so both are required.
_NOT_FOUND = (re.compile(r'exec: "([^"]+)": (?:executable file not found|stat [^:]*: no such file or directory)'),
              re.compile(r"executable file `([^`]+)` not found"))


# runc: "error setting rlimit type 7: operation not permitted" (the numbers of <sys/resource.h> on Linux)
_RLIMIT = re.compile(r"error setting rlimit type (\d+)")


RLIMIT_NAMES = {"3": "stack", "4": "core", "6": "nproc", "7": "nofile", "8": "memlock"}


def missing_executable(exit_status: int | None, text: str) -> str | None:
    """The executable a `docker run` could not start because the image lacks it, else None (a real failure)."""
    if exit_status != 127:
        return None
    for pattern in _NOT_FOUND:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def refused_rlimit(text: str) -> str | None:
    """The ulimit (nofile, memlock, ...) an engine could not give a container, from its start error."""
    m = _RLIMIT.search(text)
    return RLIMIT_NAMES.get(m.group(1), f"rlimit type {m.group(1)}") if m else None


def image_lacks(executable: str) -> str:
    return "the image has no /bin/sh" if executable in ("sh", "/bin/sh") else f"the image has no {executable}"


# reach.sh's tools, as the probe container lists them (tools=)
def can_connect(tools: list[str] | None) -> bool:
    return tools is not None and ("nc" in tools or "python3" in tools or {"bash", "timeout"} <= set(tools))


def can_listen(tools: list[str] | None) -> bool:
    return tools is not None and ("nc" in tools or "python3" in tools)


def parse_reach(text: str) -> dict[str, tuple[str, str, str]] | None:
    """reach.sh connect -> {port: (ok|fail|error, tool, why)}; {} for `reach=none` (no tool); None: no answer."""
    out: dict[str, tuple[str, str, str]] = {}
    try:
        lines = keyvalue.parse(text, (), ("reach",)).get("reach")
    except keyvalue.Malformed:
        return None  # not an answer of reach.sh's: "could not check", never a guess
    for line in lines or []:
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[1] in ("ok", "fail", "error"):
            out[parts[0]] = (parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out if lines is not None else None


RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
LAYER_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def parse_created(text: str) -> int | None:
    """An engine's `Created` (RFC 3339 with up to nanoseconds, as `docker image inspect` gives it) -> nanoseconds
    since the epoch; None for anything else (an image may carry no creation time)."""
    m = RFC3339.fullmatch(text.strip())
    if not m:
        return None
    y, mo, d, h, mi, s, frac, zone = m.groups()
    try:
        offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
        whole = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=timezone.utc)
    except ValueError:
        return None
    return (int(whole.timestamp()) - offset) * 10**9 + int((frac or "").ljust(9, "0"))


@dataclass(frozen=True)
class ImageBuild:
    """One build of the job's image as an engine holds it. Its ID differs between image stores (the classic store's
    config digest, containerd's manifest digest); its creation time and layers do not. So two engines hold the same
    build when the IDs match or, across stores, the creation time and layers do; and which of two builds is newer
    is known only from creation times both engines gave."""

    id: str
    created_ns: int | None = None  # since the epoch; None: not given, or not RFC 3339
    layers: tuple[str, ...] | None = None  # RootFS diff IDs; None: not given, or not digests

    @classmethod
    def of(cls, image_id: str, created: str, layers: object) -> ImageBuild:
        ok = isinstance(layers, list) and bool(layers) and all(
            isinstance(x, str) and LAYER_DIGEST.fullmatch(x) for x in layers)
        return cls(image_id, parse_created(created), tuple(layers) if ok else None)  # type: ignore[arg-type]

    @classmethod
    def from_content(cls, image_id: str, content: str) -> ImageBuild:
        """From observe.sh's `image_content`: `{{.Created}} {{json .RootFS.Layers}}`."""
        created, _, layers = content.partition(" ")
        try:
            parsed = json.loads(layers) if layers else None
        except ValueError:
            parsed = None
        return cls.of(image_id, created, parsed)

    def same_as(self, other: ImageBuild) -> bool:
        if self.id == other.id:
            return True
        return (self.created_ns is not None and self.layers is not None
                and (self.created_ns, self.layers) == (other.created_ns, other.layers))

    def older_than(self, other: ImageBuild) -> bool:
        return self.created_ns is not None and other.created_ns is not None and self.created_ns < other.created_ns

    @property
    def short(self) -> str:
        return self.id[7:19] if self.id.startswith("sha256:") else self.id[:12]

    @property
    def built(self) -> str:
        if self.created_ns is None:
            return "build time unknown"
        when = datetime.fromtimestamp(self.created_ns // 10**9, timezone.utc)
        return f"built {when:%Y-%m-%d %H:%M:%S} UTC"

    def describe(self) -> str:
        return f"{self.short} ({self.built})"


# Filesystems whose mounts are served from elsewhere (the kernel's type names, as mountinfo's field after " - "):
# NFS, Lustre, IBM Storage Scale (gpfs), CephFS (kernel and FUSE), BeeGFS, WEKA, GlusterFS, SMB, OrangeFS, JuiceFS.
NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "ceph", "fuse.ceph-fuse", "beegfs", "wekafs", "glusterfs",
                        "fuse.glusterfs", "cifs", "smb3", "orangefs", "pvfs2", "fuse.juicefs"})
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountIdentity:
    """Which filesystem holds a path, and where in it: the same network filesystem at the same place on two hosts
    is the same storage; on a local filesystem the same device name on two hosts proves nothing."""

    fstype: str
    source: str  # the mount source: server:/export, an MGS list, a device
    path: str  # the path inside that filesystem (the mount's root joined with the rest of the path)
    read_only: bool = field(default=False, compare=False)  # mounted `ro` here (the same storage either way)

    @property
    def networked(self) -> bool:
        return self.fstype in NETWORK_FS

    def __str__(self) -> str:
        return f"{self.fstype} {self.source} {self.path}"


def mount_identity(mountinfo: str, real: str) -> MountIdentity | None:
    """The mount that holds `real` (a resolved path) in /proc/self/mountinfo's text: the longest mount point above
    it, the later of two at one point (it is mounted on top). proc(5): `ID PARENT MAJ:MIN ROOT POINT OPTIONS
    [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS`, with space, tab, newline and backslash in paths as octal escapes."""
    if not real.startswith("/"):
        return None
    best: tuple[str, str, str, str, bool] | None = None
    for line in mountinfo.split("\n"):
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        root, point = (_OCTAL.sub(lambda m: chr(int(m[1], 8)), f) for f in fields[3:5])
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                best = (point, tail[0], _OCTAL.sub(lambda m: chr(int(m[1], 8)), tail[1]), root,
                        "ro" in fields[5].split(","))
    if best is None:
        return None
    point, fstype, source, root, ro = best
    rest = real[len(point):].strip("/")
    return MountIdentity(fstype, source, posixpath.join(root, rest) if rest else root, ro)


def parse_mounts(text: str, sources: list[str]) -> dict[str, MountIdentity | None]:
    """mounts.sh's answer -> each source's identity (None where it does not resolve or no mount holds it)."""
    kv = keyvalue.parse(text, (), ("real", "mountinfo"))
    reals = kv.get("real", [])
    if len(reals) != len(sources):
        raise keyvalue.Malformed(f"it said real= {len(reals)} times for {len(sources)} source(s)")
    table = "\n".join(kv.get("mountinfo", []))
    return {s: mount_identity(table, r) for s, r in zip(sources, reals)}


@dataclass(frozen=True)
class Shared:
    """One `shared: true` mount on one host against host 0: the same storage (True), not (False), or not known
    (None, `how` says why); `how` says how it was decided."""

    same: bool | None
    how: str = ""


@dataclass
class ContainerFacts:
    """What a short-lived container with the job's flags saw (or why it did not run)."""

    error: str | None = None
    shm_kb: int | None = None  # /dev/shm size; None: unreadable
    memlock: str | None = None  # `ulimit -l`
    nofile: str | None = None  # `ulimit -n`
    tools: list[str] | None = None  # which of nc, python3, bash, timeout the image has (reach.sh can use them)
    missing: str | None = None  # the probe's command is not in the image ("sh"): nothing ran inside it
    host_shm_kb: int | None = None  # with `missing` and ipc host: the host's /dev/shm, which the container shares
    gpus: int | None = None  # GPUs nvidia-smi -L listed in it (gpu.smi.count_gpus)
    ib_devices: list[str] | None = None  # /dev/infiniband in the container (probed where IB is used)
    ibverbs: bool | None = None  # the image has libibverbs
    ib_provider: bool | None = None  # ... and a verbs provider (libmlx5 & co.)
    gpu_mode: str | None = None  # how the GPU probe reached the GPUs (gpus / cdi / devices), and why
    gpu_why: str | None = None
    hubs: dict[str, str] | None = None  # hub -> "ok" or why the job's container could not reach it; {} no python3


@dataclass
class HostObservation:
    """Raw facts about one host. `None` means not observed (a step before it failed or did not apply);
    `*_error` fields say why a step failed."""

    rank: int
    address: str
    ssh: str = ""  # user@host:port, when connected
    ssh_error: str | None = None
    error: str | None = None  # the observation round trip itself failed
    probe_error: str | None = None  # its answer broke the key=value contract (keyvalue.py): none of it was used
    clock: str | None = None  # the host's `date +%s.%N` at the start of its answer (observe.sh's first line)
    docker: str | None = None  # engine version
    docker_error: str | None = None
    image_id: str | None = None  # "" when the image is missing
    image_build: ImageBuild | None = None  # its ID, creation time and layers (None when missing)
    image_needs: ImageNeeds | None = None  # what `dockerlaunch verify` recorded of this Image ID here
    probe: probelib.Probe | None = None
    disk: tuple[int, int] | None = None  # (size, available) KiB under the docker root
    mounts_missing: list[str] | None = None
    listening: set[int] | None = None
    clock_offset: float | None = None  # host clock minus ours, seconds
    shm: ContainerFacts | None = None
    gpus: ContainerFacts | None = None
    shared: dict[str, Shared] = field(default_factory=dict)  # mount source -> the same storage as on host 0?
    reach: list[str] | str | None = None  # unreachable listeners on host 0, or why it was not tried
    reach_note: str = ""  # where the check ran when not in a job container ("checked from the host: ...")
    reach_missing: str | None = None  # not checked: the tool that is missing here, and how to add it

    @property
    def usable(self) -> bool:
        """Connected, observed, and docker works: the checks that need docker can run."""
        return not self.ssh_error and not self.error and not self.probe_error and self.docker is not None


@dataclass
class Observations:
    master: str
    hosts: list[HostObservation]
    reach_ports: tuple[int, int] | None = None  # (master port, a random high port) when tried
    reach_error: str | None = None  # the listener on host 0 did not start
    reach_missing: str | None = None  # no listener on host 0: the tool that is missing there, and how to add it
    image_here: bool | None = None  # this machine has the job image (None: unknown, no engine here)
    local_build: ImageBuild | None = None  # ... and which build it is: what the user built is what must run

    def probes(self) -> list[probelib.Probe | Exception]:
        """Each host's probe.sh answer, read in the round trip of its facts, or why it has none: `up` plans from
        these instead of asking each host again."""
        return [o.probe if o.probe is not None else HostError(
            o.address, o.probe_error or o.error or o.ssh_error or "not observed", step=probelib.PROBE_STEP)
            for o in self.hosts]


OBSERVE_SINGLE = ("clock", "docker", "docker_error", "image", "image_content")
OBSERVE_LISTS = ("disk", "mount_ok", "mount_missing", "tcp")


def parse_observation(obs: HostObservation, text: str) -> HostObservation:
    """observe.sh + probe.sh output (one answer: parsed once, with both scripts' keys) -> the fields of `obs` (pure;
    tested on recorded output). An answer that breaks the key=value contract (keyvalue.py) sets only `probe_error`:
    nothing of it is used."""
    try:
        kv = keyvalue.parse(text, OBSERVE_SINGLE + probelib.PROBE_SINGLE, OBSERVE_LISTS + probelib.PROBE_LISTS)
    except keyvalue.Malformed as e:
        obs.probe_error = keyvalue.host_error(obs.address, probelib.PROBE_STEP, e).reason
        return obs
    probe = probelib.read_probe(kv)
    one = lambda k: (kv.get(k) or [None])[0]  # noqa: E731
    obs.clock = one("clock")
    obs.docker, obs.docker_error = one("docker"), one("docker_error")
    if obs.docker is not None:
        obs.image_id = one("image") or ""
        if obs.image_id:
            obs.image_build = ImageBuild.from_content(obs.image_id, one("image_content") or "")
        obs.disk = parse_df_kb("\n".join(kv.get("disk", [])))
    obs.mounts_missing = kv.get("mount_missing", [])
    obs.listening = listening_ports("\n".join(kv.get("tcp", [])))
    obs.probe = probe
    return obs


def wants_gpus(hp: HostPlan) -> bool:
    return hp.gpu_mode != "none"


def host_gpu_access(config: ClusterConfig, hp: HostPlan, probe: probelib.Probe | None) -> GpuAccess:
    """The job's GPU flags on this host, from what doctor observed there (raises ConfigError when impossible)."""
    gpus = hp.host.gpus if hp.host.gpus is not None else config.container.gpus
    access = gpu_access(gpus, config.container.gpu_mode, probe.access if probe else None, config.container.env,
                        hp.address, probe.gpu_host.driver if probe and probe.gpu_host else None)
    if not isinstance(access, GpuAccess):
        raise ConfigError("could not check: the host's GPU facts were not gathered")
    return access


def host_label_disable(config: ClusterConfig, probe: probelib.Probe | None) -> bool:
    """Whether doctor's containers on this host get `--security-opt label=disable`, as the job's would
    (container.selinux, from what the host's engine said); not known: none (the selinux row says why)."""
    return label_disable(config.container.selinux, probe.selinux if probe else None) is True


def uses_ib(mode: str, probe: probelib.Probe | None) -> bool:
    return mode == "on" or (mode == "auto" and probe is not None and probe.ib_device)


CONTAINER_SINGLE = ("ibdev", "ibverbs", "ibprovider", "tools", "nofile", "memlock", "hub")
CONTAINER_HUBS = ("huggingface.co", "modelscope.cn")  # hubs.py's hubs, each a `hub.NAME=` line


def parse_container_facts(out: str) -> ContainerFacts:
    """The probe container's output (container_probe.sh; hubs.py's lines where asked). An answer that breaks the
    key=value contract (keyvalue.py) is the container's error: nothing of it is used."""
    try:
        kv = keyvalue.parse(out, CONTAINER_SINGLE + tuple(f"hub.{h}" for h in CONTAINER_HUBS), ("shm",))
    except keyvalue.Malformed as e:
        return ContainerFacts(error=f"the probe container answered in a form the launcher does not write ({e})")
    one = {k: v[0] for k, v in kv.items()}
    df = parse_df_kb("\n".join(kv.get("shm", [])))
    facts = ContainerFacts(shm_kb=df[0] if df else None, memlock=one.get("memlock", "").strip() or None,
                           nofile=one["nofile"].strip() or None if "nofile" in one else None,
                           tools=one["tools"].split() if "tools" in one else None)
    if "ibdev" in one:
        facts.ib_devices = one["ibdev"].split()
        facts.ibverbs = one.get("ibverbs", "0").strip() not in ("", "0")
        facts.ib_provider = one.get("ibprovider", "0").strip() not in ("", "0")
    hubs = {k[4:]: v.strip() for k, v in one.items() if k.startswith("hub.")}
    if hubs or "hub" in one:
        facts.hubs = hubs
    return facts
