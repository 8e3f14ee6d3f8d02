"""Pre-flight checks: every failure users lose days to, caught before a container starts.

Observe, then judge. `observe` gathers each host's raw facts (one round trip per host for what the
host itself can say, then the few steps that need a container or two hosts: shm/memlock and GPUs in
a container with the job's flags, shared storage, reachability); `judge` is pure and turns those facts
into PASS/WARN/FAIL/SKIP rows, so every verdict is unit-tested on recorded facts. A step that raises
or times out is recorded as such, and judged FAIL: doctor never passes what it could not check.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field, replace

from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.docker_cli import run_argv
from dockerlaunch.backends.docker.dockerhost import DockerHost
from dockerlaunch.enums import StrEnum
from dockerlaunch.errors import ConfigError, HostError
from dockerlaunch.hosts.fleet import Fleet, Host
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import NVIDIA_DIR, HostPlan, JobPlan, gpu_access, infiniband_needs
from dockerlaunch.job.spec import IB_CAP, BindMount, ContainerSpec, Deferred, GpuAccess, Ulimit


class Verdict(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP
SHM_DEFAULT_KB = 65536
MIN_FREE_GB = 20
SKEW_WARN_S, SKEW_FAIL_S = 1.0, 10.0
CHECK_ORDER = ["ssh", "docker", "image", "route", "master port", "reachability", "shm", "memlock", "nofile", "gpus",
               "infiniband", "ib in container", "image ibverbs", "mounts", "shared", "model cache", "hubs", "disk",
               "clock"]
# where ms-swift / transformers / torch keep downloads: on a multi-host job each belongs on shared storage
CACHE_ENV = ("MODELSCOPE_CACHE", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE",
             "HF_DATASETS_CACHE", "TORCH_HOME")


@dataclass
class Check:
    host: str
    name: str
    status: Verdict
    reason: str
    rank: int = -1  # which host (two hosts may share an address behind one gateway, by port)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def add(self, host: str, name: str, status: Verdict, reason: str, rank: int = -1) -> None:
        self.checks.append(Check(host, name, status, reason, rank))

    def get(self, host: str, name: str) -> Check | None:
        return next((c for c in self.checks if c.host == host and c.name == name), None)

    def counts(self) -> dict[Verdict, int]:
        return {v: sum(1 for c in self.checks if c.status == v) for v in Verdict}

    def summary(self) -> str:
        n = self.counts()
        return f"doctor: {n[PASS]} PASS, {n[FAIL]} FAIL, {n[WARN]} WARN, {n[SKIP]} SKIP"

    def to_dict(self) -> dict:
        return {"ok": not self.failed, "counts": {str(k): v for k, v in self.counts().items()},
                "checks": [{"host": c.host, "check": c.name, "verdict": str(c.status), "reason": c.reason}
                           for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---------------------------------------------------------------- pure parsing


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


def count_gpus(nvidia_smi_l: str) -> int:
    return sum(1 for line in nvidia_smi_l.splitlines() if line.startswith("GPU "))


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
    seen = False
    for line in text.splitlines():
        if not line.startswith("reach="):
            continue
        seen = True
        parts = line[6:].split(" ", 3)
        if len(parts) >= 3 and parts[1] in ("ok", "fail", "error"):
            out[parts[0]] = (parts[1], parts[2], parts[3] if len(parts) > 3 else "")
    return out if seen else None


# ---------------------------------------------------------------- facts


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
    gpus: int | None = None  # GPUs nvidia-smi -L listed
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
    docker: str | None = None  # engine version
    docker_error: str | None = None
    image_id: str | None = None  # "" when the image is missing
    image_content: str = ""  # its creation time and layer digests: the same image in either image store
    probe: probelib.Probe | None = None
    disk: tuple[int, int] | None = None  # (size, available) KiB under the docker root
    mounts_missing: list[str] | None = None
    listening: set[int] | None = None
    clock_offset: float | None = None  # host clock minus ours, seconds
    shm: ContainerFacts | None = None
    gpus: ContainerFacts | None = None
    shared: dict[str, bool | str] = field(default_factory=dict)  # mount source -> same storage as host 0 / error
    reach: list[str] | str | None = None  # unreachable listeners on host 0, or why it was not tried
    reach_note: str = ""  # where the check ran when not in a job container ("checked from the host: ...")
    reach_missing: str | None = None  # not checked: the tool that is missing here, and how to add it

    @property
    def usable(self) -> bool:
        """Connected, observed, and docker works: the checks that need docker can run."""
        return not self.ssh_error and not self.error and self.docker is not None


@dataclass
class Observations:
    master: str
    hosts: list[HostObservation]
    reach_ports: tuple[int, int] | None = None  # (master port, a random high port) when tried
    reach_error: str | None = None  # the listener on host 0 did not start
    reach_missing: str | None = None  # no listener on host 0: the tool that is missing there, and how to add it


def parse_observation(obs: HostObservation, text: str) -> HostObservation:
    """observe.sh + probe.sh output -> the fields of `obs` (pure; tested on recorded output)."""
    kv: dict[str, list[str]] = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            kv.setdefault(k, []).append(v)
    one = lambda k: (kv.get(k) or [None])[0]  # noqa: E731
    obs.docker, obs.docker_error = one("docker"), one("docker_error")
    if obs.docker is not None:
        obs.image_id = one("image") or ""
        obs.image_content = one("image_content") or ""
        obs.disk = parse_df_kb("\n".join(kv.get("disk", [])))
    obs.mounts_missing = kv.get("mount_missing", [])
    obs.listening = listening_ports("\n".join(kv.get("tcp", [])))
    obs.probe = probelib.parse_probe(text)
    return obs


# ---------------------------------------------------------------- observe (I/O)


def _probe_spec(hp: HostPlan, image: str, command: list[str], name: str, *, gpu: GpuAccess | None = None,
                ib: bool = False, mounts: list[BindMount] | None = None, env: dict[str, str] | None = None
                ) -> ContainerSpec:
    """A short-lived container with the job's runtime flags that matter for the check, and the job's own mounts
    (an image may take its tools from them)."""
    c = hp.container
    spec = ContainerSpec(
        name=name, image=image, command=command, ipc=c.ipc, shm_size=c.shm_size,
        gpus=gpu.request if gpu else None, gpu=gpu, devices=list(gpu.devices if gpu else ()),
        ulimits=dict(c.ulimits) if ib else {k: v for k, v in c.ulimits.items() if k != "memlock"},
        cap_add=list(c.cap_add) if ib else [x for x in c.cap_add if x != IB_CAP],
        mounts=list(mounts or []) + (list(gpu.mounts) if gpu else []),
        env={**(env or {}), **(dict(gpu.env) if gpu else {})},
        detach=False, remove=True, init=False, labels={"dockerlaunch.probe": "1"},
    )
    if ib:  # what the job gets where IB is used, even when the dry plan left it to the host (infiniband: auto)
        infiniband_needs(spec, spec.ulimits)  # a memlock the job has (the user's own) wins, as in the plan
    return spec


def wants_gpus(hp: HostPlan) -> bool:
    return hp.gpu_mode != "none"


def host_gpu_access(config: ClusterConfig, hp: HostPlan, probe: probelib.Probe | None) -> GpuAccess:
    """The job's GPU flags on this host, from what doctor observed there (raises ConfigError when impossible)."""
    gpus = hp.host.gpus if hp.host.gpus is not None else config.container.gpus
    access = gpu_access(gpus, config.container.gpu_mode, probe.gpu if probe else None, config.container.env,
                        hp.address)
    if not isinstance(access, GpuAccess):
        raise ConfigError("could not check: the host's GPU facts were not gathered")
    return access


def uses_ib(mode: str, probe: probelib.Probe | None) -> bool:
    return mode == "on" or (mode == "auto" and probe is not None and probe.ib_device)


def _observe_host(h: Host, hp: HostPlan, config: ClusterConfig, master: str) -> HostObservation:
    obs = HostObservation(h.rank, h.address, ssh=h.target.describe())
    first: list[float] = []
    out = bytearray()

    def on_out(data: bytes) -> None:
        if not first:
            first.append(time.time())
        out.extend(data)

    t0 = time.time()
    argv = ["sh", "-c", script("observe.sh") + script("probe.sh"), "sh", master, config.image or "",
            *[m.source for m in config.container.mounts]]
    err = bytearray()
    status = h.remote.stream(argv, on_out, err.extend, timeout=120)
    text = out.decode(errors="replace")
    if status != 0 and "clock=" not in text:
        obs.error = (err.decode(errors="replace").strip().splitlines() or [f"exit status {status}"])[-1][:300]
        return obs
    parse_observation(obs, text)
    clock = next((line[6:] for line in text.splitlines() if line.startswith("clock=")), "")
    try:
        obs.clock_offset = float(clock) - (t0 + (first[0] if first else time.time())) / 2
    except ValueError:
        obs.clock_offset = None
    return obs


def _in_container(h: Host, spec: ContainerSpec) -> ContainerFacts | str:
    """The probe's output, or what stopped it: the image lacks its command (`missing`) or the start failed."""
    r = h.remote.run(run_argv(spec), timeout=120)
    if r.ok:
        return r.stdout
    text = r.stderr + r.stdout
    missing = missing_executable(r.exit_status, text)
    if missing:
        return ContainerFacts(missing=missing)
    # the engine's reason can be long or followed by other lines: the refused limit is named from all of it
    refused = next((line.strip()[-300:] for line in text.splitlines() if refused_rlimit(line)), None)
    return ContainerFacts(error=refused or r.last_line())


def _observe_containers(h: Host, hp: HostPlan, obs: HostObservation, config: ClusterConfig, image: str) -> None:
    ib = uses_ib(config.container.infiniband, obs.probe)
    mounts = [BindMount(m.source, m.target, m.read_only) for m in config.container.mounts]
    hubs = not config.job.offline
    spec = _probe_spec(hp, image, container_probe(hubs, ib),
                       f"dlprobe-shm-{secrets.token_hex(3)}", ib=ib, mounts=mounts,
                       env={k: v for k, v in config.container.env.items() if k.upper() in HUB_ENV} if hubs else None)
    out = _in_container(h, spec)
    obs.shm = parse_container_facts(out) if isinstance(out, str) else out
    if obs.shm.missing and spec.ipc == "host":  # no shell to ask inside: the container's /dev/shm is the host's
        df = parse_df_kb(h.remote.run(["df", "-Pk", "/dev/shm"], timeout=30).stdout)
        obs.shm.host_shm_kb = df[0] if df else None
    if wants_gpus(hp):
        try:
            access = host_gpu_access(config, hp, obs.probe)
        except ConfigError as e:
            obs.gpus = ContainerFacts(error=str(e))
            return
        # no shell: the toolkit and CDI put nvidia-smi on PATH; device mode mounts the host's under NVIDIA_DIR
        smi = f"{NVIDIA_DIR}/bin/nvidia-smi"
        smi = smi if any(m.target == smi for m in access.mounts) else "nvidia-smi"
        spec = _probe_spec(hp, image, [smi, "-L"], f"dlprobe-gpu-{secrets.token_hex(3)}", gpu=access, mounts=mounts)
        out = _in_container(h, spec)
        if isinstance(out, str):
            facts = ContainerFacts(gpus=count_gpus(out))
        else:
            facts = ContainerFacts(error=out.error or f"{out.missing} is neither in the image nor put there by the "
                                   "GPU runtime")
        facts.gpu_mode, facts.gpu_why = access.mode, access.why
        obs.gpus = facts


# Can the job's container reach the model hubs? Asked as the libraries ask (requests, its CA bundle, the proxy and
# endpoint variables of container.env); any HTTP answer counts. DNS is outside requests' timeout: threads, joined.
HUB_ENV = {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "HF_ENDPOINT", "MODELSCOPE_ENDPOINT",
           "MODELSCOPE_DOMAIN", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"}
HUB_WAIT_S = 8
HUB_CHECK = script("hubs.py")  # run by the image's own python3, with HUB_WAIT_S as its argument
CONTAINER_PROBE = script("container_probe.sh")


def container_probe(hubs: bool, ib: bool) -> list[str]:
    """The probe container's command: shm, nofile and memlock, the image's tools for reach.sh, and the hubs and
    InfiniBand where asked."""
    return ["sh", "-c", CONTAINER_PROBE, "sh", "1" if hubs else "0", "1" if ib else "0", HUB_CHECK if hubs else "",
            str(HUB_WAIT_S)]


def parse_container_facts(out: str) -> ContainerFacts:
    """The probe container's output (SHM_AND_MEMLOCK, after IN_CONTAINER_IB where IB is used)."""
    head, _, memlock = out.rpartition("memlock=")
    kv = dict(line.split("=", 1) for line in head.splitlines() if "=" in line and not line.startswith("/"))
    df = parse_df_kb("\n".join(line for line in head.splitlines() if "=" not in line))
    facts = ContainerFacts(shm_kb=df[0] if df else None, memlock=memlock.strip() or None,
                           nofile=kv["nofile"].strip() or None if "nofile" in kv else None,
                           tools=kv["tools"].split() if "tools" in kv else None)
    if "ibdev" in kv:
        facts.ib_devices = kv["ibdev"].split()
        facts.ibverbs = kv.get("ibverbs", "0").strip() not in ("", "0")
        facts.ib_provider = kv.get("ibprovider", "0").strip() not in ("", "0")
    hubs = {k[4:]: v.strip() for k, v in kv.items() if k.startswith("hub.")}
    if hubs or "hub" in kv:
        facts.hubs = hubs
    return facts


def _observe_shared(cluster: Fleet, config: ClusterConfig, obs: list[HostObservation]) -> None:
    """A token written under each `shared: true` mount on host 0 must be readable on every other host."""
    h0 = cluster.hosts[0]
    if not h0.connected:
        return
    readers = [h for h in cluster.live if h.rank != 0]
    for m in (m for m in config.container.mounts if m.shared):
        token = secrets.token_hex(8)
        path = f"{m.source.rstrip('/')}/.dockerlaunch-shared-{token}"
        w = h0.remote.run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", token, path], timeout=30)
        if not w.ok:
            obs[0].shared[m.source] = f"cannot write to {m.source}: {w.last_line()}"
            continue
        try:
            for o in cluster.each(lambda h, path=path: h.remote.run(["cat", path], timeout=30), readers):
                obs[o.item.rank].shared[m.source] = (o.ok and o.value.ok and o.value.stdout == token) if o.ok \
                    else str(o.error)
        finally:
            h0.remote.run(["rm", "-f", path], timeout=30)


REACH = script("reach.sh")
LISTEN_TTL_S = 300  # listeners end by themselves after this, should doctor be killed before it removes them
BIND_WAIT_S = 15
PROBE_LABELS = {"dockerlaunch.probe": "1"}
ADD_NC = "add netcat-openbsd to the image (apt-get install netcat-openbsd) or install it on the host"


def _image_why(facts: ContainerFacts | None, need: str) -> str:
    """Why reach.sh does not run in a job container here (the start of the row's `checked from the host:` note)."""
    if facts is None or facts.error is not None:
        return "no container of the image ran here (see shm)"
    if facts.missing:
        return image_lacks(facts.missing)
    return f"the image has no {need}"


def _connect(h: Host, image: str, facts: ContainerFacts | None, master: str, ports: tuple[int, int]
             ) -> tuple[dict[str, tuple[str, str, str]] | str, str]:
    """reach.sh connect in a container of the job's image when it has a tool, else on the host (the same network:
    job containers use --network host). -> (per port results, or why nothing was checked; the note)."""
    args = ["sh", "-c", REACH, "sh", "connect", master, *map(str, ports)]
    if can_connect(facts.tools if facts else None):
        spec = ContainerSpec(name=f"dlprobe-reach-{secrets.token_hex(4)}", image=image, command=args, detach=False,
                             remove=True, init=False, labels=PROBE_LABELS)
        r = h.remote.run(run_argv(spec), timeout=60)
        got = parse_reach(r.stdout)
        if got:
            return got, ""
        why = (f"a container of the image did not run reach.sh ({r.last_line()})" if got is None
               else "the image's tools could not connect")
    else:
        why = _image_why(facts, "nc or python3")
    r = h.remote.run(args, timeout=60)
    got = parse_reach(r.stdout)
    if got is None:
        return f"could not check from the host either ({why}): {r.last_line()}", ""
    if not got:
        return (f"not checked: {why} and the host has no nc, python3 or bash with timeout either: {ADD_NC}",
                "")
    return got, f"checked from the host: {why}"


def _listen(h0: Host, image: str, facts: ContainerFacts | None, ports: tuple[int, int]
            ) -> tuple[str, str, str | None]:
    """Listeners on host 0: in a --network host container of the job's image when it has a tool, else on the
    host. -> (how, a container name or a host PID to end them with, why there are none)."""
    if can_listen(facts.tools if facts else None):
        name = f"dlprobe-listen-{secrets.token_hex(4)}"
        spec = ContainerSpec(name=name, image=image, command=["sh", "-c", REACH, "sh", "serve", str(LISTEN_TTL_S),
                                                              *map(str, ports)],
                             init=True, remove=True, labels=PROBE_LABELS)
        try:
            started = h0.remote.run(run_argv(spec), timeout=60)
        except BaseException:
            DockerHost(h0.remote).remove([name], grace=0)
            raise
        if started.ok:
            return "in a job container", name, None
        DockerHost(h0.remote).remove([name], grace=0)
        why = f"a container of the image did not start ({started.last_line()})"
    else:
        why = _image_why(facts, "nc or python3")
    r = h0.remote.run(["sh", "-c", REACH, "sh", "listen", str(LISTEN_TTL_S), *map(str, ports)], timeout=60)
    line = next((x[7:].split() for x in r.stdout.splitlines() if x.startswith("listen=")), None)
    if not line or line[0] == "none" or len(line) < 2:
        what = (f"{why} and the host has no python3 or nc to listen with: {ADD_NC}" if line
                else f"{why}, and the host's listener did not start: {r.last_line()}")
        return "", "", f"no listener on host 0: {what}"
    return f"{line[0]} on host 0's host ({why})", line[1], None


def _observe_reach(cluster: Fleet, plan: JobPlan, observations: Observations) -> None:
    """Listeners on host 0 (master port + a random high port), then a connection to each from every other host.

    Both ends run reach.sh in a container of the job's image where it has nc or python3, else on the host itself:
    job containers use --network host, so it is the same network either way; the row says where it ran."""
    obs = observations.hosts
    others = [h for h in cluster.live if h.rank != 0 and obs[h.rank].usable]
    if not others or not obs[0].usable or not obs[0].image_id:
        return
    if obs[0].listening is not None and plan.master_port in obs[0].listening:
        return  # the master port check fails; a listener there would not start
    ports = (plan.master_port, 40000 + secrets.randbelow(20000))
    observations.reach_ports = ports
    h0, how, handle = cluster.hosts[0], "", ""
    try:  # from before the start: an interrupt between start and cleanup must not leave the listener
        how, handle, missing = _listen(h0, plan.image, obs[0].shm, ports)
        if missing:
            observations.reach_missing = missing
            return
        deadline = time.monotonic() + BIND_WAIT_S  # until both listeners are bound, instead of guessing a sleep
        # asked in the listener's own network namespace (the host's, with --network host; the sim's light hosts
        # share an engine's): sh's read, as the image may have no cat
        sockets = ["sh", "-c", "for f in /proc/net/tcp /proc/net/tcp6; do [ -r $f ] && "
                   "while IFS= read -r l; do echo \"$l\"; done < $f; done; true"]
        where = ["docker", "exec", handle] if how.startswith("in a job container") else []
        while True:
            tcp = h0.remote.run([*where, *sockets], timeout=30).stdout
            if set(ports) <= listening_ports(tcp):
                break
            if time.monotonic() > deadline:  # a listener that never bound says nothing about the network
                observations.reach_missing = (f"not checked: the listener ({how}) did not bind ports "
                                              f"{ports[0]} and {ports[1]} within {BIND_WAIT_S} s")
                return
            time.sleep(0.1)
        master = observations.master

        def probe(h: Host) -> tuple[list[str] | str, str]:
            if not obs[h.rank].image_id:
                return "image missing here", ""
            got, note = _connect(h, plan.image, obs[h.rank].shm, master, ports)
            if isinstance(got, dict) and any(v[0] == "fail" for v in got.values()):
                time.sleep(0.5)  # once more, for a connection lost on the way
                got, note = _connect(h, plan.image, obs[h.rank].shm, master, ports)
            return got, note  # type: ignore[return-value]

        for o in cluster.each(probe, others):
            ob = obs[o.item.rank]
            if not o.ok:
                ob.reach = f"could not check: {o.error}"
                continue
            got, ob.reach_note = o.value
            if isinstance(got, str):
                if got.startswith("not checked:"):
                    ob.reach_missing = got
                else:
                    ob.reach = got
                continue
            broken = [(p, v) for p, v in got.items() if v[0] == "error"]
            if broken:
                p, (_, tool, why) = broken[0]
                ob.reach_missing = f"not checked: {tool} failed ({why[:200]})"
                continue
            ob.reach = [f"{master}:{p} ({tool}: {why[:200]})" for p, (state, tool, why) in got.items()
                        if state != "ok"]
            ob.reach += [f"{master}:{p} (no answer)" for p in map(str, ports) if p not in got]
    finally:
        if how.startswith("in a job container"):
            DockerHost(h0.remote).remove([handle], grace=0)
        elif handle:
            h0.remote.run(["kill", handle], timeout=30)


def observe(cluster: Fleet, plan: JobPlan) -> Observations:
    config = cluster.config
    master = plan.master_addr
    if isinstance(master, Deferred):
        master = cluster.peer_ip(0) or master
    obs = [HostObservation(h.rank, h.address, ssh=h.target.describe(),
                           ssh_error=h.error.reason if h.error else None) for h in cluster.hosts]
    for o in cluster.each(lambda h: _observe_host(h, plan.hosts[h.rank], config, master)):
        if o.ok:
            obs[o.item.rank] = o.value
        else:
            obs[o.item.rank].error = o.error.reason if isinstance(o.error, HostError) else str(o.error)

    def containers(h: Host) -> None:
        ob = obs[h.rank]
        if ob.usable and ob.image_id:
            _observe_containers(h, plan.hosts[h.rank], ob, config, plan.image)

    for o in cluster.each(containers, [h for h in cluster.live]):
        if not o.ok:
            ob = obs[o.item.rank]
            why = o.error.reason if isinstance(o.error, HostError) else str(o.error)
            ob.shm = ob.shm or ContainerFacts(error=why)
            if wants_gpus(plan.hosts[o.item.rank]):
                ob.gpus = ob.gpus or ContainerFacts(error=why)
    observations = Observations(str(master), obs)
    try:
        _observe_shared(cluster, config, obs)
    except HostError as e:
        obs[0].shared = {m.source: f"could not check: {e.reason}" for m in config.container.mounts if m.shared}
    try:
        _observe_reach(cluster, plan, observations)
    except HostError as e:
        observations.reach_error = e.reason
    return observations


# ---------------------------------------------------------------- judge (pure)


def _judge_host(report: Report, config: ClusterConfig, hp: HostPlan, target: SSHTarget, o: HostObservation,
                master: str) -> None:
    a = o.address
    if o.ssh_error:
        report.add(a, "ssh", FAIL, o.ssh_error)
        return
    report.add(a, "ssh", PASS, o.ssh)
    if o.error:
        report.add(a, "docker", FAIL, f"could not check the host: {o.error}")
        return
    if o.docker is None:
        why = o.docker_error or "no answer"
        hint = " (add the user to the docker group)" if "permission denied" in why.lower() else ""
        report.add(a, "docker", FAIL, f"docker not usable by {target.user}: {why}{hint}")
    else:
        report.add(a, "docker", PASS, f"engine {o.docker}")
    p = o.probe
    if p is not None:
        if p.problem and config.one_machine:
            report.add(a, "route", PASS, f"{master} via {p.interface or 'lo'}: every rank is on this machine")
        elif p.problem:
            if "NCCL_SOCKET_IFNAME" in config.container.env:
                report.add(a, "route", WARN, f"toward {master}: {p.problem}; using your NCCL_SOCKET_IFNAME")
            else:
                report.add(a, "route", FAIL, f"toward {master}: {p.problem}")
        else:
            report.add(a, "route", PASS, f"{master} via {p.interface} (NCCL/GLOO_SOCKET_IFNAME)")
        _judge_ib(report, a, p, config.container.infiniband)
    if o.docker is None:
        return
    if o.disk is None:
        report.add(a, "disk", WARN, "could not read free space under the docker root")
    else:
        free_gb = o.disk[1] / 1024 / 1024
        report.add(a, "disk", PASS if free_gb >= MIN_FREE_GB else WARN, f"{free_gb:.0f} GB free under the docker root")
    if config.container.mounts and o.mounts_missing is not None:
        if o.mounts_missing:
            report.add(a, "mounts", FAIL, f"missing on the host: {', '.join(o.mounts_missing)}")
        else:
            report.add(a, "mounts", PASS, f"{len(config.container.mounts)} host path(s) exist")
    if not o.image_id:
        return
    _judge_shm(report, a, o.shm, uses_ib(config.container.infiniband, p), hp.container.ulimits.get("nofile"))
    _judge_hubs(report, config, a, o.shm)
    if not wants_gpus(hp):
        report.add(a, "gpus", SKIP, "the job asks for no GPUs")
    elif o.gpus is not None:
        g = o.gpus
        mode = f"mode {g.gpu_mode}: {g.gpu_why}" if g.gpu_mode else ""
        if g.error is not None:
            hint = {"gpus": "nvidia-container-toolkit", "cdi": "the CDI spec (nvidia-ctk cdi generate)",
                    "devices": "device nodes and driver libraries"}.get(g.gpu_mode or "", "")
            report.add(a, "gpus", FAIL, f"GPU container failed: {g.error}" + (f" ({mode}; check {hint})" if mode
                                                                                  else ""))
        elif isinstance(hp.nproc_per_node, int) and (g.gpus or 0) < hp.nproc_per_node:
            report.add(a, "gpus", FAIL, f"{g.gpus} GPU(s) visible in the container, "
                       f"nproc_per_node is {hp.nproc_per_node}" + (f" ({mode})" if mode else ""))
        else:
            report.add(a, "gpus", PASS, f"{g.gpus} GPU(s) visible in the container" + (f" ({mode})" if mode else ""))


def _judge_ib(report: Report, a: str, p: probelib.Probe, mode: str) -> None:
    if not p.ib_device:
        if mode == "on":
            report.add(a, "infiniband", FAIL, "infiniband: on but the host has no /dev/infiniband")
        else:
            report.add(a, "infiniband", SKIP, "no /dev/infiniband on the host")
    elif mode == "off":
        report.add(a, "infiniband", WARN, "the host has InfiniBand but infiniband: off: NCCL will use TCP")
    elif not p.ib_active:
        report.add(a, "infiniband", FAIL, f"no ACTIVE IB port ({', '.join(p.ib_seen) or 'none listed'})")
    else:
        report.add(a, "infiniband", PASS, f"NCCL_IB_HCA={','.join(p.ib_active)}")


def _size(kb: int) -> str:
    mb = kb // 1024
    return f"{mb // 1024} GB" if mb >= 1024 else f"{mb} MB"


def _judge_shm(report: Report, a: str, shm: ContainerFacts | None, ib: bool, nofile: Ulimit | None = None) -> None:
    if shm is None:
        report.add(a, "shm", FAIL, "could not check: no container was run")
        return
    if shm.missing:
        _judge_no_shell(report, a, shm, ib)
        return
    if shm.error is not None:
        report.add(a, "shm", FAIL, f"a container with the job's flags did not start: {shm.error}")
        _judge_refused_rlimit(report, a, shm.error, ib, nofile)
        return
    if shm.shm_kb is None:
        report.add(a, "shm", WARN, "could not read /dev/shm size")
    elif shm.shm_kb <= SHM_DEFAULT_KB:
        report.add(a, "shm", FAIL, f"/dev/shm is {shm.shm_kb // 1024} MB in the container: use ipc: host or shm_size")
    else:
        report.add(a, "shm", PASS, f"/dev/shm {_size(shm.shm_kb)}")
    if ib:
        if shm.memlock == "unlimited":
            report.add(a, "memlock", PASS, "ulimit -l in the container: unlimited")
        else:  # RDMA pins its buffers: NCCL's IB transport fails to register memory under a low limit
            report.add(a, "memlock", FAIL, f"ulimit -l in the container: {shm.memlock} (KB): InfiniBand needs "
                       "unlimited; drop container.ulimits.memlock (docker counts it in bytes) or use '-1'")
    if nofile is not None:
        _judge_nofile(report, a, shm.nofile, nofile)
    if ib:
        _judge_ib_container(report, a, shm)


def _judge_nofile(report: Report, a: str, seen: str | None, want: Ulimit) -> None:
    """Every DataLoader worker's shared tensors and every NCCL socket is an open file: at Docker 29's default of
    1024 a job fails with 'Too many open files' (moby#51485), so the plan asks for more (container.ulimits.nofile)."""
    if seen is None or not (seen.isdigit() or seen == "unlimited"):
        report.add(a, "nofile", WARN, f"could not read ulimit -n in the container ({seen or 'no answer'})")
    elif seen == "unlimited" or (want.soft != -1 and int(seen) >= want.soft):
        report.add(a, "nofile", PASS, f"ulimit -n in the container: {seen}")
    else:
        report.add(a, "nofile", FAIL, f"ulimit -n in the container: {seen}, below the {want.soft} the job asks for "
                   f"(--ulimit nofile={want.soft}:{want.hard}): something in the image (its entrypoint?) lowers it; "
                   "ranks with many DataLoader workers and NCCL sockets fail with 'Too many open files'")


def _judge_refused_rlimit(report: Report, a: str, error: str, ib: bool, nofile: Ulimit | None) -> None:
    """The engine could not give the container a ulimit the job asks for: name the limit and the fix."""
    name = refused_rlimit(error)
    why = ("the engine cannot raise its own hard limit (rootless Docker, Docker inside a container: no "
           "CAP_SYS_RESOURCE)")
    if name == "nofile" and nofile is not None:
        report.add(a, "nofile", FAIL, f"the engine refused --ulimit nofile={nofile.soft}:{nofile.hard}: {why}; set "
                   "container.ulimits.nofile to at most the engine's hard limit (`ulimit -Hn` where dockerd runs), "
                   "or raise dockerd's LimitNOFILE")
    elif name == "memlock" and ib:
        report.add(a, "memlock", FAIL, f"the engine refused the memlock ulimit InfiniBand needs: {why}; run the "
                   "engine with LimitMEMLOCK=infinity, or set container.ulimits.memlock (in bytes) to what it allows")


def _judge_no_shell(report: Report, a: str, shm: ContainerFacts, ib: bool) -> None:
    """The probe's shell is not in the image (one static binary, a distroless image): nothing ran inside it. What
    can be told from outside is said; the rest is a WARN naming the fix, never a FAIL for the image's choice."""
    lacks = image_lacks(shm.missing or "sh")
    # runc sets a container's ulimits before it looks for the command: a container that got as far as "not found"
    # has the job's flags (a refused ulimit is a start error instead)
    outside = "a container with the job's flags starts (docker applied its ulimits, then found no command)"
    if shm.host_shm_kb is not None:
        if shm.host_shm_kb <= SHM_DEFAULT_KB:
            report.add(a, "shm", FAIL, f"/dev/shm is {shm.host_shm_kb // 1024} MB on the host, which the container "
                       "shares (ipc: host): make the host's /dev/shm larger, or use ipc: private with shm_size")
            return
        outside += f"; its /dev/shm is the host's (ipc: host): {_size(shm.host_shm_kb)}"
    report.add(a, "shm", WARN, f"{lacks}: shm/memlock/nofile not checked inside it; {outside}; to check inside, add "
               "a shell to the image (e.g. COPY a static busybox as /bin/sh)")
    if ib:
        report.add(a, "ib in container", WARN, f"{lacks}: /dev/infiniband and libibverbs not checked inside it")


def _judge_hubs(report: Report, config: ClusterConfig, a: str, c: ContainerFacts | None) -> None:
    """Without a hub, every rank of an online job waits on the hubs' retries (ms-swift's ModelScope check: 25 s
    to 2 minutes per rank, benchmarks/RESULTS.md) before failing or going on from local files."""
    if config.job.offline:
        report.add(a, "hubs", PASS, "job.offline: the job does not ask the hubs (HF_HUB_OFFLINE=1 ...)")
        return
    if c is not None and c.missing:
        report.add(a, "hubs", SKIP, f"{image_lacks(c.missing)}: the hubs were not asked from a job container")
        return
    if c is None or c.error is not None or c.hubs is None:
        return  # the shm row says why no container ran
    if not c.hubs:
        report.add(a, "hubs", SKIP, "the image has no python3: the hubs were not asked from a job container "
                   "(the hubs' clients are Python; install python3 in the image to check)")
        return
    down = {name: why for name, why in c.hubs.items() if why != "ok"}
    if not down:
        report.add(a, "hubs", PASS, f"{' and '.join(c.hubs)} answer from a job container")
        return
    first = next(iter(down.values()))
    report.add(a, "hubs", WARN, f"{', '.join(down)} unreachable from a job container ({first[:120]}): every rank "
               "would wait on hub retries; if the hosts are air-gapped, set job.offline: true (up --offline) and "
               "give local model and dataset paths")


def _judge_ib_container(report: Report, a: str, c: ContainerFacts) -> None:
    """Without both, NCCL says `NET/IB : No device found.` and quietly runs over TCP sockets."""
    if c.ib_devices is None:
        return
    if c.ib_devices:
        report.add(a, "ib in container", PASS, "/dev/infiniband: " + " ".join(c.ib_devices))
    else:
        report.add(a, "ib in container", FAIL, "the job's container sees no /dev/infiniband devices: NCCL would "
                   "fall back to TCP sockets; check container.infiniband and the host's /dev/infiniband")
    if not c.ibverbs:
        report.add(a, "image ibverbs", FAIL, "the image has no libibverbs: NCCL would fall back to TCP sockets "
                   "(10-100x slower); install rdma-core (libibverbs1, ibverbs-providers) in the image")
    elif not c.ib_provider:
        report.add(a, "image ibverbs", WARN, "libibverbs but no verbs provider (libmlx5...) in the image: "
                   "install ibverbs-providers")
    else:
        report.add(a, "image ibverbs", PASS, "libibverbs and a verbs provider")


def _judge_image(report: Report, plan: JobPlan, obs: list[HostObservation]) -> None:
    checked = [o for o in obs if o.usable and o.image_id is not None]
    # one image has two IDs (config digest in the classic store, manifest digest in containerd's): hosts
    # compare what it holds, its layers and creation time, where they report it
    reference = next((o for o in checked if o.image_id), None)
    all_hosts = ",".join(h.address for h in plan.hosts)
    for o in checked:
        same = reference is not None and (o.image_id == reference.image_id or (
            bool(o.image_content) and o.image_content == reference.image_content))
        if not o.image_id:
            report.add(o.address, "image", FAIL,
                       f"{plan.image} is missing; copy it: dockerlaunch push {plan.image} --hosts {all_hosts}")
        elif not same:
            report.add(o.address, "image", FAIL, f"{plan.image} is {o.image_id[7:19]} here but "
                       f"{reference.image_id[7:19]} on another host; "
                       f"dockerlaunch push {plan.image} --hosts {all_hosts}")
        else:
            report.add(o.address, "image", PASS, o.image_id[7:19])


def _judge_cluster(report: Report, config: ClusterConfig, plan: JobPlan, ob: Observations) -> None:
    obs = ob.hosts
    h0 = obs[0]
    for o in obs:
        for source, same in o.shared.items():
            if isinstance(same, str):
                report.add(o.address, "shared", FAIL, same)
            else:
                report.add(o.address, "shared", PASS if same else FAIL, f"{source} is shared with host 0" if same
                           else f"{source} is not the same storage as on host 0 (marked shared: true)")
    _judge_caches(report, config, h0.address)
    port_free = None
    if h0.usable and h0.listening is not None:
        port_free = plan.master_port not in h0.listening
        if port_free:
            report.add(h0.address, "master port", PASS, f"{plan.master_port} is free")
        else:
            report.add(h0.address, "master port", FAIL,
                       f"port {plan.master_port} is already in use on host 0: pick another with --master-port")
    others = [o for o in obs[1:] if o.usable]
    if port_free:
        for o in others:
            if not h0.image_id:
                report.add(o.address, "reachability", SKIP, "the image is missing on host 0")
            elif ob.reach_error is not None:
                report.add(o.address, "reachability", FAIL, f"cannot start a listener on host 0: {ob.reach_error}")
            elif ob.reach_missing is not None:  # a missing tool is not a network fault: said, never a FAIL
                report.add(o.address, "reachability", WARN, ob.reach_missing)
            elif o.reach == "image missing here" or not o.image_id:
                report.add(o.address, "reachability", SKIP, "image missing here")
            elif o.reach_missing is not None:
                report.add(o.address, "reachability", WARN, o.reach_missing)
            elif isinstance(o.reach, str):
                report.add(o.address, "reachability", FAIL, o.reach)
            elif o.reach is None:
                report.add(o.address, "reachability", FAIL, "could not check: no probe ran")
            elif o.reach:  # a tool ran and the connection failed, to a listener that was bound
                report.add(o.address, "reachability", FAIL, "cannot reach " + "; ".join(o.reach) + " (firewall?)"
                           + (f" ({o.reach_note})" if o.reach_note else ""))
            else:
                p0, p1 = ob.reach_ports or (plan.master_port, 0)
                report.add(o.address, "reachability", PASS, f"reaches {ob.master}:{p0} and :{p1}"
                           + (f" ({o.reach_note})" if o.reach_note else ""))
    elif not h0.usable:
        for o in others:
            report.add(o.address, "reachability", SKIP, "host 0 is not usable")
    timed = [o for o in obs if o.clock_offset is not None]
    if len(timed) >= 2:
        ref = next((o for o in timed if o.rank == 0), timed[0])  # host 0, unless it could not be timed
        name = "host 0" if ref.rank == 0 else ref.address
        for o in timed:
            skew = abs(o.clock_offset - ref.clock_offset)
            report.add(o.address, "clock", PASS if skew < SKEW_WARN_S else WARN if skew < SKEW_FAIL_S else FAIL,
                       f"{skew:.2f}s from {name}")


def _judge_caches(report: Report, config: ClusterConfig, where: str) -> None:
    """On a multi-host job a download cache off shared storage means each host downloads its own copy (and one
    inside the container is lost with it): the ms-swift docs' advice for multi-node training."""
    if len(config.hosts) < 2:
        return
    for key in CACHE_ENV:
        path = config.container.env.get(key)
        if not path:
            continue
        mount = max((m for m in config.container.mounts
                     if path == m.target or path.startswith(m.target.rstrip("/") + "/")),
                    key=lambda m: len(m.target), default=None)
        if mount is None:
            report.add(where, "model cache", WARN, f"{key}={path} is inside the container: every host downloads its "
                       "own copy, lost with the container; put it on a mount marked shared: true")
        elif not mount.shared:
            report.add(where, "model cache", WARN, f"{key}={path} is on {mount.source}, not marked shared: true: "
                       "every host downloads its own copy unless that is shared storage (then mark it shared)")
        else:
            report.add(where, "model cache", PASS, f"{key}={path} is on shared storage ({mount.source})")


def judge(config: ClusterConfig, plan: JobPlan, targets: list[SSHTarget], ob: Observations) -> Report:
    """Facts -> verdicts (pure), sorted by host rank and CHECK_ORDER."""
    labels = host_labels(plan, targets)
    ob = replace(ob, hosts=[replace(o, address=labels[o.rank]) for o in ob.hosts])
    report = Report()
    for hp, target, o in zip(plan.hosts, targets, ob.hosts):
        _judge_host(report, config, hp, target, o, ob.master)
    _judge_image(report, plan, ob.hosts)
    _judge_cluster(report, config, plan, ob)
    rank_of = {label: i for i, label in enumerate(labels)}
    for c in report.checks:
        c.rank = rank_of[c.host]
    report.checks.sort(key=lambda c: (c.rank, CHECK_ORDER.index(c.name)))
    return report


def host_labels(plan: JobPlan, targets: list[SSHTarget]) -> list[str]:
    """How report rows name each host: its address, with the SSH port where two hosts share an address."""
    addresses = [hp.address for hp in plan.hosts]
    labels = [a if addresses.count(a) == 1 else f"{a}:{t.port}" for a, t in zip(addresses, targets)]
    return [lb if labels.count(lb) == 1 else f"{lb}#{i}" for i, lb in enumerate(labels)]


# ---------------------------------------------------------------- entry points


def check(cluster: Fleet, plan: JobPlan) -> Report:
    """Observe and judge a connected (maybe partly connected) cluster, for the job's one plan."""
    return judge(cluster.config, plan, cluster.targets, observe(cluster, plan))


def doctor(config: ClusterConfig, plan: JobPlan) -> Report:
    with Fleet.connect(config, require_all=False) as cluster:
        return check(cluster, plan)

