"""Observe (I/O): each host's raw facts in one round trip, then the steps that need a container or two hosts
(shm/memlock and GPUs with the job's flags, shared storage, reachability). The facts and their pure parsers are in
observations.py."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.dockerhost import DockerHost
from dockerlaunch.backends.docker.doctor.observations import (
    ContainerFacts,
    HostObservation,
    ImageBuild,
    MountIdentity,
    Observations,
    Shared,
    can_connect,
    can_listen,
    host_gpu_access,
    host_label_disable,
    image_lacks,
    listening_ports,
    missing_executable,
    parse_container_facts,
    parse_df_kb,
    parse_mounts,
    parse_observation,
    parse_reach,
    refused_rlimit,
    uses_ib,
    wants_gpus,
)
from dockerlaunch.cache import load_image_needs
from dockerlaunch.container import IB_CAP, BindMount, ContainerSpec, Deferred, GpuAccess
from dockerlaunch.docker_run import run_argv
from dockerlaunch.errors import ConfigError, HostError
from dockerlaunch.gpu.access import NVIDIA_DIR
from dockerlaunch.gpu.smi import count_gpus
from dockerlaunch.hosts.fleet import Fleet, Host, each
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import HostPlan, JobPlan, infiniband_needs

# doctor's check containers keep the label and name prefix users see (`dockerlaunch.probe`, `dlprobe-`)
CHECK_LABELS = {"dockerlaunch.probe": "1"}
CHECK_RUN = "dockerlaunch.probe.run"  # one doctor run's check containers, removed together when it is interrupted
REMOVE_SETTLE_S = 3.0  # after an interrupt: how long the checks' `docker run`s under way are waited for


class CheckContainers:
    """The check containers of one doctor run: each labelled with the run's token and started through `run`, so
    that an interrupt (Ctrl-C, SIGTERM during `up`'s pre-flight) removes every one of them from the hosts before
    the command exits (a `dlprobe-reach-*` container was left on the nodes), and none starts after it."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(6)
        self.stopped = threading.Event()
        self._lock = threading.Condition()
        self._flying = 0

    @property
    def labels(self) -> dict[str, str]:
        return {**CHECK_LABELS, CHECK_RUN: self.token}

    def run(self, h: Host, spec: ContainerSpec, timeout: float):
        """`docker run` of a check container on `h` (its Result); refused once the run is stopped."""
        with self._lock:
            if self.stopped.is_set():
                raise HostError(h.name, "the pre-flight was interrupted", step="starting a probe container")
            self._flying += 1
        try:
            return h.remote.run(run_argv(spec), timeout=timeout)
        finally:
            with self._lock:
                self._flying -= 1
                self._lock.notify_all()

    def remove(self, fleet: Fleet) -> None:
        """Stop starting checks and remove every container of this run on every connected host. A `docker run`
        already under way may create its container after a sweep: swept again until every run has returned (a
        removed check container ends its run at once), for at most REMOVE_SETTLE_S."""
        self.stopped.set()
        deadline = time.monotonic() + REMOVE_SETTLE_S
        while True:
            self._sweep(fleet)
            with self._lock:
                done = self._lock.wait_for(lambda: self._flying == 0, 0.5)
            if done or time.monotonic() > deadline:
                if not done:
                    self._sweep(fleet)
                return

    def _sweep(self, fleet: Fleet) -> None:
        def sweep(h: Host) -> None:
            r = h.remote.run(["docker", "ps", "-aq", "--filter", f"label={CHECK_RUN}={self.token}"], timeout=30)
            ids = r.stdout.split() if r.ok else []
            if ids:
                h.remote.run(["docker", "rm", "-f", *ids], timeout=60)

        fleet.each(sweep)


def _check_spec(hp: HostPlan, image: str, command: list[str], name: str, *, gpu: GpuAccess | None = None,
                ib: bool = False, mounts: list[BindMount] | None = None, env: dict[str, str] | None = None,
                label_disable: bool = False, labels: dict[str, str] | None = None) -> ContainerSpec:
    """A short-lived container with the job's runtime flags that matter for the check, and the job's own mounts
    (an image may take its tools from them); its SELinux labels off where the job's are (`label_disable`)."""
    c = hp.container
    spec = ContainerSpec(
        name=name, image=image, command=command, ipc=c.ipc, shm_size=c.shm_size, label_disable=label_disable,
        gpus=gpu.request if gpu else None, gpu=gpu, devices=list(gpu.devices if gpu else ()),
        ulimits=dict(c.ulimits) if ib else {k: v for k, v in c.ulimits.items() if k != "memlock"},
        cap_add=list(c.cap_add) if ib else [x for x in c.cap_add if x != IB_CAP],
        mounts=list(mounts or []) + (list(gpu.mounts) if gpu else []),
        env={**(env or {}), **(dict(gpu.env) if gpu else {})},
        detach=False, remove=True, init=False, labels=dict(labels or CHECK_LABELS),
    )
    if ib:  # what the job gets where IB is used, even when the dry plan left it to the host (infiniband: auto)
        infiniband_needs(spec, spec.ulimits)  # a memlock the job has (the user's own) wins, as in the plan
    return spec


def observe_argv(master: str, image: str, config: ClusterConfig) -> list[str]:
    """observe.sh then probe.sh, one round trip: what a host can say of itself (parse_observation reads it)."""
    return ["sh", "-c", script("observe.sh") + script("probe.sh"), "sh", master, image,
            *[m.source for m in config.container.mounts]]


def _observe_host(h: Host, image: str, config: ClusterConfig, master: str) -> HostObservation:
    obs = HostObservation(h.rank, h.address, ssh=h.target.describe())
    first: list[float] = []
    out = bytearray()

    def on_out(data: bytes) -> None:
        if not first:
            first.append(time.time())
        out.extend(data)

    t0 = time.time()
    argv = observe_argv(master, image, config)
    err = bytearray()
    status = h.remote.stream(argv, on_out, err.extend, timeout=120)
    text = out.decode(errors="replace")
    if status != 0 and "clock=" not in text:
        obs.error = (err.decode(errors="replace").strip().splitlines() or [f"exit status {status}"])[-1][:300]
        return obs
    parse_observation(obs, text)
    if obs.probe_error:
        return obs
    obs.image_needs = load_image_needs(obs.image_id)
    try:
        obs.clock_offset = float(obs.clock or "") - (t0 + (first[0] if first else time.time())) / 2
    except ValueError:
        obs.clock_offset = None
    return obs


def _in_container(h: Host, spec: ContainerSpec, checks: CheckContainers) -> ContainerFacts | str:
    """The check container's output, or what stopped it: the image lacks its command (`missing`) or the start failed."""
    r = checks.run(h, spec, timeout=120)
    if r.ok:
        return r.stdout
    text = r.stderr + r.stdout
    missing = missing_executable(r.exit_status, text)
    if missing:
        return ContainerFacts(missing=missing)
    # the engine's reason can be long or followed by other lines: the refused limit is named from all of it
    refused = next((line.strip()[-300:] for line in text.splitlines() if refused_rlimit(line)), None)
    return ContainerFacts(error=refused or r.last_line())


def _observe_containers(h: Host, hp: HostPlan, obs: HostObservation, config: ClusterConfig, image: str,
                        checks: CheckContainers) -> None:
    ib = uses_ib(config.container.infiniband, obs.probe)
    mounts = [BindMount(m.source, m.target, m.read_only) for m in config.container.mounts]
    hubs = not config.job.offline
    off = host_label_disable(config, obs.probe)
    spec = _check_spec(hp, image, container_probe(hubs, ib),
                       f"dlprobe-shm-{secrets.token_hex(3)}", ib=ib, mounts=mounts, label_disable=off,
                       env={k: v for k, v in config.container.env.items() if k.upper() in HUB_ENV} if hubs else None,
                       labels=checks.labels)
    out = _in_container(h, spec, checks)
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
        spec = _check_spec(hp, image, [smi, "-L"], f"dlprobe-gpu-{secrets.token_hex(3)}", gpu=access, mounts=mounts,
                           label_disable=off, labels=checks.labels)
        out = _in_container(h, spec, checks)
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
    """The check container's command (container_probe.sh): shm, nofile and memlock, the image's tools for reach.sh,
    and the hubs and InfiniBand where asked."""
    return ["sh", "-c", CONTAINER_PROBE, "sh", "1" if hubs else "0", "1" if ib else "0", HUB_CHECK if hubs else "",
            str(HUB_WAIT_S)]


MARKER = ".dockerlaunch-shared-"  # + a random token: the file doctor writes on host 0 and reads on the others
IN_CONTAINER = "/dl-shared"  # where a marker container sees the mount


def _observe_shared(fleet: Fleet, plan: JobPlan, obs: list[HostObservation], checks: CheckContainers) -> None:
    """Is each `shared: true` mount the same storage on every host as on host 0? The mount's identity decides where
    it proves sameness (the same network filesystem at the same place, from each host's mount table); else a file
    written on host 0 and read on the others, written by the SSH user or, where that login may not write (no root
    on the hosts), from a container as the job's user. A mount nothing may write (read-only: models) is compared by
    the names at its top level."""
    mounts = [m for m in plan.config.container.mounts if m.shared]
    if not mounts or not fleet.hosts[0].connected:
        return
    sources = [m.source for m in mounts]
    argv = ["sh", "-c", script("mounts.sh"), "sh", *sources]
    ids: dict[int, dict[str, MountIdentity | None]] = {}
    for o in fleet.each(lambda h: h.remote.run(argv, timeout=30), fleet.live):
        if o.ok and o.value.ok:
            try:
                ids[o.item.rank] = parse_mounts(o.value.stdout, sources)
            except keyvalue.Malformed:
                pass  # no identity from this host: the marker decides
    for m in mounts:
        id0 = ids.get(0, {}).get(m.source)
        pending = []
        for h in (h for h in fleet.live if h.rank != 0):
            if id0 is not None and id0.networked and ids.get(h.rank, {}).get(m.source) == id0:
                obs[h.rank].shared[m.source] = Shared(True, f"{id0.fstype} {id0.source} on both (mount table)")
            else:
                pending.append(h)
        if pending:
            _shared_by_marker(fleet.hosts[0], pending, plan, m, obs, checks, id0)


def _in_job_container(h: Host, plan: JobPlan, ob: HostObservation, source: str, command: list[str],
                      checks: CheckContainers):
    """`command` in a container of the job's image as the job's user (its SELinux labels as the job's), the mount at
    IN_CONTAINER."""
    spec = _check_spec(plan.hosts[h.rank], plan.image, command, f"dlprobe-shared-{secrets.token_hex(3)}",
                       mounts=[BindMount(source, IN_CONTAINER)],
                       label_disable=host_label_disable(plan.config, ob.probe), labels=checks.labels)
    spec.user = plan.hosts[h.rank].container.user
    return checks.run(h, spec, timeout=60)


ABSENT = 3  # READ's exit status when the file is not there (an exit status, not an error text in the host's locale)
READ = 'if [ -e "$1" ]; then exec cat -- "$1"; fi; exit 3'


def _shared_by_marker(h0: Host, readers: list[Host], plan: JobPlan, m, obs: list[HostObservation],
                      checks: CheckContainers, id0: MountIdentity | None) -> None:
    login = h0.target.user
    if m.read_only or (id0 is not None and id0.read_only):  # the job only reads it (models): doctor writes nothing
        _shared_by_listing(h0, readers, m, obs, "mounted read-only")
        return
    token = secrets.token_hex(8)
    name = MARKER + token
    path = f"{m.source.rstrip('/')}/{name}"
    w = h0.remote.run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", token, path], timeout=30)
    as_job = None
    if not w.ok and obs[0].image_id:  # a login without root may not write where the job's containers do
        as_job = _in_job_container(h0, plan, obs[0], m.source,
                                   ["sh", "-c", 'printf %s "$1" > "$2/$3"', "sh", token, IN_CONTAINER, name], checks)
    if not w.ok and not (as_job and as_job.ok):
        why = f"{login} cannot write to {m.source} ({w.last_line()})" + (
            f", nor the job's user in a container ({as_job.last_line()})" if as_job else
            ", and the image is missing on host 0 to try as the job's user")
        obs[0].shared[m.source] = Shared(None, f"could not check: {why}")
        return
    how = f"reads the file {login} wrote there" if w.ok else "reads the file the job's user wrote there, in a container"
    try:
        for o in each(lambda h: h.remote.run(["sh", "-c", READ, "sh", path], timeout=30), readers):
            r = o.value if o.ok else None
            if r is not None and r.ok:
                obs[o.item.rank].shared[m.source] = Shared(r.stdout == token, how)
            elif r is not None and r.exit_status == ABSENT:
                obs[o.item.rank].shared[m.source] = Shared(False, "the file written there on host 0 is not here")
            else:
                obs[o.item.rank].shared[m.source] = Shared(None, "could not check: " + (
                    r.last_line() if r is not None else str(o.error)))
    finally:
        if w.ok:
            h0.remote.run(["rm", "-f", path], timeout=30)
        else:
            _in_job_container(h0, plan, obs[0], m.source, ["rm", "-f", f"{IN_CONTAINER}/{name}"], checks)


def _shared_by_listing(h0: Host, readers: list[Host], m, obs: list[HostObservation], why: str) -> None:
    """A read-only mount: the same names at its top level as on host 0 (a replica of the same files serves the job
    as well as one store); nothing more can be proven without writing."""
    def names(h: Host) -> list[str] | None:
        r = h.remote.run(["ls", "-A", "--", m.source], timeout=30)
        return sorted(r.stdout.split("\n")) if r.ok else None

    want = names(h0)
    for o in each(names, readers):
        got = o.value if o.ok else None
        if want is None or got is None:
            obs[o.item.rank].shared[m.source] = Shared(None, f"could not check: {why}; nor list it")
        else:
            obs[o.item.rank].shared[m.source] = Shared(
                got == want, f"{why}: the names at its top level compared, {len(want)} on host 0"
                + ("" if got == want else f", {len(got)} here"))


REACH = script("reach.sh")


LISTEN_TTL_S = 300  # listeners end by themselves after this, should doctor be killed before it removes them
_PID = re.compile(r"[1-9][0-9]{0,9}")


BIND_WAIT_S = 15


ADD_NC = "add netcat-openbsd to the image (apt-get install netcat-openbsd) or install it on the host"


def _image_why(facts: ContainerFacts | None, need: str) -> str:
    """Why reach.sh does not run in a job container here (the start of the row's `checked from the host:` note)."""
    if facts is None or facts.error is not None:
        return "no container of the image ran here (see shm)"
    if facts.missing:
        return image_lacks(facts.missing)
    return f"the image has no {need}"


def _connect(h: Host, image: str, facts: ContainerFacts | None, master: str, ports: tuple[int, int],
             checks: CheckContainers, label_disable: bool = False) -> tuple[dict[str, tuple[str, str, str]] | str, str]:
    """reach.sh connect in a container of the job's image when it has a tool, else on the host (the same network:
    job containers use --network host). -> (per port results, or why nothing was checked; the note)."""
    args = ["sh", "-c", REACH, "sh", "connect", master, *map(str, ports)]
    if can_connect(facts.tools if facts else None):
        spec = ContainerSpec(name=f"dlprobe-reach-{secrets.token_hex(4)}", image=image, command=args, detach=False,
                             remove=True, init=False, labels=checks.labels, label_disable=label_disable)
        r = checks.run(h, spec, timeout=60)
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


def _listen(h0: Host, image: str, facts: ContainerFacts | None, ports: tuple[int, int], checks: CheckContainers,
            label_disable: bool = False
            ) -> tuple[str, str, str | None]:
    """Listeners on host 0: in a --network host container of the job's image when it has a tool, else on the
    host. -> (how, a container name or a host PID to end them with, why there are none)."""
    if can_listen(facts.tools if facts else None):
        name = f"dlprobe-listen-{secrets.token_hex(4)}"
        spec = ContainerSpec(name=name, image=image, command=["sh", "-c", REACH, "sh", "serve", str(LISTEN_TTL_S),
                                                              *map(str, ports)],
                             init=True, remove=True, labels=checks.labels, label_disable=label_disable)
        try:
            started = checks.run(h0, spec, timeout=60)
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
    try:
        line = keyvalue.parse(r.stdout, ("listen",)).get("listen", [""])[0].split() or None
    except keyvalue.Malformed as e:
        return "", "", f"no listener on host 0: its answer broke the key=value contract ({e})"
    if not line or line[0] == "none" or len(line) < 2:
        what = (f"{why} and the host has no python3 or nc to listen with: {ADD_NC}" if line
                else f"{why}, and the host's listener did not start: {r.last_line()}")
        return "", "", f"no listener on host 0: {what}"
    return f"{line[0]} on host 0's host ({why})", line[1], None


def _observe_reach(fleet: Fleet, plan: JobPlan, observations: Observations, checks: CheckContainers,
                   each: Callable[..., Any]) -> None:
    """Listeners on host 0 (master port + a random high port), then a connection to each from every other host.

    Both ends run reach.sh in a container of the job's image where it has nc or python3, else on the host itself:
    job containers use --network host, so it is the same network either way; the row says where it ran."""
    obs = observations.hosts
    others = [h for h in fleet.live if h.rank != 0 and obs[h.rank].usable]
    if not others or not obs[0].usable or not obs[0].image_id:
        return
    # a supervised job (`up --detach`) needs the gang's port too: it is the second port tried, else a random one
    second = plan.config.job.gang_port if plan.supervised else 40000 + secrets.randbelow(20000)
    if obs[0].listening is not None and {plan.master_port, second} & set(obs[0].listening):
        return  # the master (or gang) port check fails; a listener there would not start
    ports = (plan.master_port, second)
    observations.reach_ports = ports
    h0, how, handle = fleet.hosts[0], "", ""
    try:  # from before the start: an interrupt between start and cleanup must not leave the listener
        how, handle, missing = _listen(h0, plan.image, obs[0].shm, ports, checks,
                                       host_label_disable(plan.config, obs[0].probe))
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

        def reach(h: Host) -> tuple[list[str] | str, str]:
            if not obs[h.rank].image_id:
                return "image missing here", ""
            off = host_label_disable(plan.config, obs[h.rank].probe)
            got, note = _connect(h, plan.image, obs[h.rank].shm, master, ports, checks, off)
            if isinstance(got, dict) and any(v[0] == "fail" for v in got.values()):
                time.sleep(0.5)  # once more, for a connection lost on the way
                got, note = _connect(h, plan.image, obs[h.rank].shm, master, ports, checks, off)
            return got, note  # type: ignore[return-value]

        for o in each("reach", reach, others):
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
        elif _PID.fullmatch(handle):
            # the host's word for its listener reaches `kill` only as a pid: never an option, `0` (the group), a
            # negative number (a group, or every process the login may signal); else it ends after LISTEN_TTL_S
            h0.remote.run(["kill", handle], timeout=30)


def image_here(image: str) -> tuple[bool | None, ImageBuild | None]:
    """Whether this machine's engine has the image, and which build (the one the user just built is the one that
    must run); (None, None): no engine here."""
    import docker

    from dockerlaunch.engine import engine
    from dockerlaunch.errors import EngineError

    try:
        attrs = engine().images.get(image).attrs
    except docker.errors.ImageNotFound:
        return False, None
    except (EngineError, docker.errors.DockerException, OSError):
        return None, None
    return True, ImageBuild.of(str(attrs.get("Id") or ""), str(attrs.get("Created") or ""),
                               (attrs.get("RootFS") or {}).get("Layers"))


Progress = Callable[[str, int, int], None]  # (what is asked, hosts that answered, hosts asked)


def observe(fleet: Fleet, plan: JobPlan, progress: Progress | None = None) -> Observations:
    """Every host's facts for the judge. `progress`: told, as each host answers a step, how many of the hosts asked
    have answered (`up` shows it on a terminal). An interrupt removes the check containers this run started, on
    every host, before it goes on (CheckContainers)."""
    checks = CheckContainers()
    try:
        return _observe(fleet, plan, checks, progress or (lambda what, done, asked: None))
    except BaseException:
        checks.remove(fleet)
        raise


def _observe(fleet: Fleet, plan: JobPlan, checks: CheckContainers, progress: Progress) -> Observations:
    def each(what: str, fn: Callable[[Host], Any], hosts: Sequence[Host] | None = None):
        hosts = list(fleet.live if hosts is None else hosts)
        done = [0]
        lock = threading.Lock()
        progress(what, 0, len(hosts))

        def step(h: Host) -> Any:
            try:
                return fn(h)
            finally:
                with lock:
                    done[0] += 1
                    progress(what, done[0], len(hosts))

        return fleet.each(step, hosts)

    config = plan.config  # after planning only the plan is read (its config is the one it was made from)
    master = plan.master_addr
    if isinstance(master, Deferred):
        master = fleet.peer_ip(0) or master
    obs = [HostObservation(h.rank, h.address, ssh=h.target.describe(),
                           ssh_error=h.error.reason if h.error else None) for h in fleet.hosts]
    for o in each("host facts", lambda h: _observe_host(h, plan.known_image or "", config, master)):
        if o.ok:
            obs[o.item.rank] = o.value
        else:
            obs[o.item.rank].error = o.error.reason if isinstance(o.error, HostError) else str(o.error)

    def containers(h: Host) -> None:
        ob = obs[h.rank]
        if ob.usable and ob.image_id:
            _observe_containers(h, plan.hosts[h.rank], ob, config, plan.image, checks)

    for o in each("probe containers", containers):
        if not o.ok:
            ob = obs[o.item.rank]
            why = o.error.reason if isinstance(o.error, HostError) else str(o.error)
            ob.shm = ob.shm or ContainerFacts(error=why)
            if wants_gpus(plan.hosts[o.item.rank]):
                ob.gpus = ob.gpus or ContainerFacts(error=why)
    observations = Observations(str(master), obs)
    if plan.known_image:
        observations.image_here, observations.local_build = image_here(plan.image)
    try:
        _observe_shared(fleet, plan, obs, checks)
    except HostError as e:
        obs[0].shared = {m.source: Shared(None, f"could not check: {e.reason}") for m in config.container.mounts
                         if m.shared}
    try:
        _observe_reach(fleet, plan, observations, checks, each)
    except HostError as e:
        observations.reach_error = e.reason
    return observations
