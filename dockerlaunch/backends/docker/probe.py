"""What a host must tell us before its container can be planned: NIC toward the master, IB ports, GPUs.

One probe script per host (one SSH round trip); parsing is pure and tested on fixture output. probe.sh answers in
the key=value contract (`dockerlaunch/keyvalue.py`); its keys are PROBE_SINGLE and PROBE_LISTS here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker import script
from dockerlaunch.errors import HostError
from dockerlaunch.gpu import smi
from dockerlaunch.gpu.access import HostGpuAccess
from dockerlaunch.gpu.host import GpuHost
from dockerlaunch.job.facts import EngineSecurity

if TYPE_CHECKING:  # probe() only calls what it is given: the parsers stay free of SSH
    from dockerlaunch.hosts.ssh import Remote

BAD_IFACE = re.compile(r"^(lo|docker\d*|virbr\d*|br-[0-9a-f]+|veth.*)$")


@dataclass(frozen=True)
class Route:
    interface: str | None
    source: str | None
    local: bool  # the address is this host's own


def parse_route_get(text: str) -> Route:
    """`ip -o route get ADDR` -> device, source, whether it is local."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    dev = re.search(r"\bdev (\S+)", line)
    src = re.search(r"\bsrc (\S+)", line)
    return Route(dev.group(1) if dev else None, src.group(1) if src else None, line.startswith("local "))


def parse_addr_owner(text: str) -> str | None:
    """`ip -o addr show to ADDR` -> the interface holding ADDR (e.g. `2: eth0    inet 10.0.0.5/24 ...`)."""
    for line in text.strip().splitlines():
        m = re.match(r"^\d+:\s+(\S+?)(@\S+)?\s+inet6?\s", line)
        if m:
            return m.group(1)
    return None


def nic_problem(interface: str | None, source: str | None) -> str | None:
    """Why this NIC cannot carry NCCL/Gloo traffic between hosts, or None."""
    if not interface:
        return "no route"
    if BAD_IFACE.match(interface):
        return f"route goes through {interface}, a loopback/bridge/virtual interface"
    if source and (source.startswith("127.") or source.startswith("172.17.")):
        return f"source address {source} is loopback or Docker's default bridge"
    return None


def parse_ib_ports(lines: list[str]) -> tuple[list[str], list[str]]:
    """Lines `PORT_DIR STATE LINK_LAYER` -> (active `hca:port` list, every `hca:port state` seen).

    STATE is /sys/class/infiniband/<hca>/ports/<n>/state, e.g. `4: ACTIVE`.
    """
    active, seen = [], []
    for line in lines:
        m = re.match(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)\s+(\d+):\s*(\S+)", line.strip())
        if not m:
            continue
        hca, port, _, state = m.groups()
        seen.append(f"{hca}:{port} {state}")
        if state == "ACTIVE":
            active.append(f"{hca}:{port}")
    return active, seen


@dataclass(frozen=True)
class Probe:
    interface: str | None
    source: str | None
    problem: str | None
    ib_device: bool
    ib_active: list[str]
    ib_seen: list[str]
    gpu_count: int | None  # None: no nvidia-smi on the host
    access: HostGpuAccess = field(default_factory=lambda: HostGpuAccess())
    image_labels: dict[str, str] | None = None  # the job image's labels there (None: not asked or no image)
    gpu_host: GpuHost | None = None  # the driver and each GPU (None: no nvidia-smi, or not asked)
    image_command: ImageCommand | None = None  # the job image's Entrypoint and Cmd there (None: not asked or no image)
    selinux: bool | None = None  # the engine labels containers (SELinux); None: not known (see parse_selinux)
    selinux_mode: str | None = None  # the kernel's: enforcing or permissive; None where it runs no SELinux


@dataclass(frozen=True)
class ImageCommand:
    """What an image runs when `docker run` gets no command: its ENTRYPOINT and CMD (empty: none)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @property
    def runs_something(self) -> bool:
        return bool(self.entrypoint or self.cmd)


def parse_image_command(text: str) -> ImageCommand | None:
    """probe.sh's `image_cmd=[ENTRYPOINT,CMD]` (each JSON: a list of strings or null) -> ImageCommand, or None
    where the image was not there to inspect or the answer is not that shape (then nothing is refused). (pure)"""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != 2:
        return None
    parts = []
    for v in value:
        if v is None:
            v = []
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            return None
        parts.append(tuple(v))
    return ImageCommand(parts[0], parts[1])


def parse_ldconfig(lines: list[str]) -> tuple[tuple[str, str], ...]:
    """`ldconfig -p` lines -> (soname, path) for 64-bit x86 entries, first path per soname."""
    out: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$", line)
        if m and "x86-64" in m[2] and m[1] not in out:
            out[m[1]] = m[3]
    return tuple(out.items())


def untrusted_files(paths: list[str], files: list[str]) -> tuple[str, ...]:
    """Of the driver files the job would get bind-mounted, those not root's own or writable by group or others,
    named with their owner and mode (from `file=UID MODE PATH` lines; a file the host could not stat is one too)."""
    seen: dict[str, tuple[str, str]] = {}
    for line in files:
        uid, _, rest = line.partition(" ")
        mode, _, path = rest.partition(" ")
        seen.setdefault(path, (uid, mode))
    out = []
    for path in dict.fromkeys(paths):
        uid, mode = seen.get(path, ("?", "?"))
        try:
            writable = int(mode, 8) & 0o022
        except ValueError:
            writable = True
        if uid != "0" or writable:
            out.append(f"{path} (owner uid {uid}, mode {mode})")
    return tuple(out)


def _gpu_access(kv: dict[str, list[str]], info: dict | None) -> HostGpuAccess:
    """How containers reach the GPUs there: the engine's facts from its one `docker info` (`info`: its version, the
    CDI spec dirs it reads, its runtimes), the rest from probe.sh's own lines."""
    one = lambda k: (kv.get(k) or [""])[0]  # noqa: E731
    engine = info or {}
    runtimes = engine.get("Runtimes") or {}
    dirs = engine.get("CDISpecDirs")  # a field Docker has from 25 on: () where it lists none (CDI off)
    try:
        env = json.loads(one("image_env")) if one("image_env") else None
    except ValueError:
        env = None
    libs = parse_ldconfig(kv.get("lib", []))
    smi = one("nvidia_smi") or None
    return HostGpuAccess(
        cdi_dirs=tuple(str(d) for d in dirs) if isinstance(dirs, list) else () if "CDISpecDirs" in engine else None,
        device_nodes=tuple(kv.get("gpu_dev", [])),
        nvidia_runtime=isinstance(runtimes, dict) and "nvidia" in runtimes,
        cdi_specs=tuple(kv.get("cdi", [])),
        engine=str(engine["ServerVersion"]) if engine.get("ServerVersion") else None,
        libs=libs,
        nvidia_smi=smi,
        image_env=tuple(env) if isinstance(env, list) else None,
        untrusted=untrusted_files([path for _, path in libs] + ([smi] if smi else []), kv.get("file", [])),
    )


def docker_info(text: str) -> dict | None:
    """`docker info --format '{{json .}}'` -> its fields, or None (no engine answered, or not asked)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


SELINUX_MODES = {"1": "enforcing", "0": "permissive"}


def parse_selinux(kv: dict[str, list[str]], info: dict | None) -> tuple[bool | None, str | None]:
    """(the engine labels containers, the kernel's mode) from probe.sh's selinuxfs=, selinux_enforce= and the
    engine's SecurityOptions (in its `docker info`, `info`, or security_options= from a host that gets no GPUs). The
    engine's word decides; without it, a kernel with no selinuxfs mounted is one whose engine cannot label (False),
    and one with it is not known (None): `up` refuses to guess under container.selinux auto. (pure)"""
    text = (kv.get("security_options") or [""])[0]
    security = None
    if info is not None and "SecurityOptions" in info:
        security = EngineSecurity.parse(info["SecurityOptions"])
    elif text:
        try:
            security = EngineSecurity.parse(json.loads(text))
        except ValueError:
            security = None
    mounted = (kv.get("selinuxfs") or [None])[0]
    mode = SELINUX_MODES.get((kv.get("selinux_enforce") or [""])[0].strip()) if mounted else None
    if security is not None:
        return security.selinux, mode
    return (False if mounted == "" else None), mode


# probe.sh's keys: said once, or a line each
PROBE_SINGLE = ("route", "owner", "ib_dev", "gpus", "nvidia_smi", "has_ip", "image_labels", "docker_info",
                "image_env", "xid_readable", "driver_loaded", "uptime", "nvswitches", "fabric_manager",
                "image_cmd", "selinuxfs", "selinux_enforce", "security_options")
PROBE_LISTS = ("ib_port", "smi_gpu", "smi_q", "smi_app", "smi_parent", "smi_error", "smi_unknown", "xid", "gpu_dev",
               "cdi", "lib", "file")


def parse_probe(text: str, host: str = "?") -> Probe:
    """probe.sh's answer -> Probe; a HostError naming `host` and the key when it breaks the key=value contract."""
    try:
        kv = keyvalue.parse(text, PROBE_SINGLE, PROBE_LISTS)
    except keyvalue.Malformed as e:
        raise keyvalue.host_error(host, PROBE_STEP, e) from None
    return read_probe(kv)


def read_probe(kv: dict[str, list[str]]) -> Probe:
    """probe.sh's answer once parsed (keyvalue.parse with PROBE_SINGLE and PROBE_LISTS among its keys: doctor parses
    observe.sh's and probe.sh's answer, one round trip, in one go) -> Probe. (pure)"""
    get = lambda k: (kv.get(k) or [""])[0]  # noqa: E731
    if get("has_ip") == "0":
        iface, src, problem = None, None, "the host has no `ip` command (install iproute2)"
    else:
        route = parse_route_get(get("route"))
        iface, src = route.interface, route.source
        if route.local:  # we are the master: use the NIC that owns the address, not lo
            iface = parse_addr_owner(get("owner")) or iface
            src = None
        problem = nic_problem(iface, src)
        if problem == "no route":
            problem = f"no route: {get('route')[:160]}"
    active, seen = parse_ib_ports(kv.get("ib_port", []))
    gpus = get("gpus")
    gpu_host = smi.parse(kv)
    info = docker_info(get("docker_info"))  # the engine's one answer: GPU access and SELinux both read it
    selinux, selinux_mode = parse_selinux(kv, info)
    return Probe(
        interface=iface,
        source=src,
        problem=problem,
        ib_device=get("ib_dev") == "1",
        ib_active=active,
        ib_seen=seen,
        gpu_count=int(gpus) if gpus.isdigit() else None,
        access=_gpu_access(kv, info),
        image_labels=_labels(get("image_labels")),
        gpu_host=gpu_host,
        image_command=parse_image_command(get("image_cmd")),
        selinux=selinux,
        selinux_mode=selinux_mode,
    )


def _labels(text: str) -> dict[str, str] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


PROBE_STEP = "probing the host"


def probe_argv(master_addr: str, image: str | None = None, gpu: bool = True) -> list[str]:
    """`gpu=False` (a host that gets no GPUs) leaves out the engine's GPU facts: `docker info` is the costliest
    question to an engine, and hosts may share one."""
    return ["sh", "-c", ("" if gpu else "DL_PROBE_GPU=0\n") + script("probe.sh"), "sh", master_addr,
            *([image] if image else [])]


def probe(remote: Remote, master_addr: str, image: str | None = None) -> Probe:
    return parse_probe(remote.check(probe_argv(master_addr, image), PROBE_STEP, timeout=60).stdout, remote.name)


GPU_ARCHS_STEP = "asking the host for its GPUs' compute capability"


def gpu_compute_caps(remote: Remote, host: str) -> list[str]:
    """Each GPU's compute capability on a cluster host (gpu.smi's one reading), or a one-line HostError."""
    r = remote.run(["sh", "-c", smi.CAPS_QUERY], timeout=60)
    try:
        return smi.parse_compute_caps(r.exit_status, r.stdout)
    except smi.CapsUnknown as e:
        raise HostError(host, f"{e.why}: leave it out of --hosts, or pass --cuda-archs", step=GPU_ARCHS_STEP) from None
