"""Observe (I/O): each host's raw facts in one round trip, then the steps that need a container or two hosts
(shm/memlock and GPUs with the job's flags, shared storage, reachability); and the pure parsers of what they print."""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field

from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.docker_cli import run_argv
from dockerlaunch.backends.docker.dockerhost import DockerHost
from dockerlaunch.errors import ConfigError, HostError
from dockerlaunch.hosts.fleet import Fleet, Host
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import NVIDIA_DIR, HostPlan, JobPlan, gpu_access, infiniband_needs
from dockerlaunch.job.spec import IB_CAP, BindMount, ContainerSpec, Deferred, GpuAccess


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
