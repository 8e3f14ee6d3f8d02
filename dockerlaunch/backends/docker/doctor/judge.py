"""Judge (pure): observations -> PASS/WARN/FAIL/SKIP rows; every verdict unit-tested on recorded facts."""

from __future__ import annotations

from dataclasses import replace

from dockerlaunch import hints
from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker.doctor.observations import (
    ContainerFacts,
    HostObservation,
    ImageBuild,
    Observations,
    image_lacks,
    refused_rlimit,
    uses_ib,
    wants_gpus,
)
from dockerlaunch.backends.docker.doctor.report import (
    CHECK_ORDER,
    ERROR,
    FAIL,
    PASS,
    SKIP,
    WARN,
    Report,
)
from dockerlaunch.container import Ulimit
from dockerlaunch.gpu import health
from dockerlaunch.gpu.host import GpuHost
from dockerlaunch.gpu.needs import ImageNeeds
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import HostPlan, JobPlan

SHM_DEFAULT_KB = 65536

SKEW_WARN_S, SKEW_FAIL_S = 1.0, 10.0


MIN_FREE_GB = 20


# where ms-swift / transformers / torch keep downloads: on a multi-host job each belongs on shared storage
CACHE_ENV = ("MODELSCOPE_CACHE", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE",
             "HF_DATASETS_CACHE", "TORCH_HOME")


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
    if o.probe_error:
        report.add(a, "probe", FAIL, o.probe_error)
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
    if p is not None:
        _judge_selinux(report, a, config, hp, p)
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
    if wants_gpus(hp) and p is not None and p.gpu_host is not None:
        needs = ImageNeeds.of_image(p.image_labels, p.access.image_env, o.image_needs)
        judge_gpu_facts(report, a, p.gpu_host, needs, config.diagnostics.xid_window,
                        o.gpus.gpu_mode if o.gpus is not None else None)


def _judge_selinux(report: Report, a: str, config: ClusterConfig, hp: HostPlan, p: probelib.Probe) -> None:
    """Where the engine labels containers (SELinux), a bind mount of a host folder is denied in a labelled container
    unless the folder is labelled for containers: say what the job's containers get here. No row where nothing
    labels containers."""
    mode = config.container.selinux
    kernel = f"SELinux {p.selinux_mode}" if p.selinux_mode else "SELinux"
    if p.selinux is None:
        if mode == "auto":  # `up` refuses to guess as well
            report.add(a, "selinux", ERROR, f"could not tell whether the engine labels containers: the kernel runs "
                       f"{kernel} and `docker info` gave no SecurityOptions; set container.selinux: disable "
                       "(--security-opt label=disable) or keep (the engine's labels)")
        return
    if not p.selinux:
        return
    folders = [m.source for m in hp.container.mounts]
    if mode != "keep":
        report.add(a, "selinux", PASS, f"the engine labels containers ({kernel}): the job's, doctor's and dump's "
                   f"containers get --security-opt label=disable (container.selinux {mode}), so their bind mounts "
                   "are not denied; SELinux does not confine them")
    elif hp.container.ipc == "host" or hp.container.privileged:
        report.add(a, "selinux", PASS, f"the engine labels containers ({kernel}), but Docker turns the labels off "
                   "itself for --ipc host and --privileged containers, as the job's is (container.selinux keep)")
    elif folders:
        shown = ", ".join(folders[:3]) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
        fate = ("denials are only logged while the kernel is permissive" if p.selinux_mode == "permissive"
                else "reading or writing them fails (Permission denied)")
        report.add(a, "selinux", WARN, f"the engine labels containers ({kernel}) and container.selinux keep leaves "
                   f"the job's labelled: its host folders ({shown}) are denied in it unless labelled for containers "
                   f"({fate}): chcon -R -t container_file_t DIR, or container.selinux auto")
    else:
        report.add(a, "selinux", PASS, f"the engine labels containers ({kernel}) and the job mounts no host folder "
                   "(container.selinux keep)")


def judge_gpu_facts(report: Report, a: str, host: GpuHost, needs: ImageNeeds,
                    xid_window_s: float | None = None, gpu_mode: str | None = None) -> None:
    """The image against this host's driver and GPUs (gpu.needs), and the GPUs' health (gpu.health)."""
    report.checks += [replace(f, host=a) for f in [*needs.runs_on(host, gpu_mode), health.judge(host, xid_window_s)]]


def _judge_gpu_models(report: Report, obs: list[HostObservation], plan: JobPlan) -> None:
    """Ranks wait for the slowest GPU at every collective: different models across hosts cost the difference."""
    models = {}
    for o, hp in zip(obs, plan.hosts):
        if wants_gpus(hp) and o.probe is not None and o.probe.gpu_host is not None and o.probe.gpu_host.gpus:
            models[o.address] = sorted({g.name for g in o.probe.gpu_host.gpus})
    kinds = {tuple(m) for m in models.values()}
    if len(kinds) > 1:
        said = "; ".join(f"{h}: {', '.join(m)}" for h, m in models.items())
        report.add(obs[0].address, "gpu models", WARN, f"the hosts have different GPUs ({said}): every rank runs at "
                   "the slowest one's pace")


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


def _judge_image(report: Report, config: ClusterConfig, plan: JobPlan, obs: list[HostObservation],
                 image_here: bool | None = None, local: ImageBuild | None = None) -> None:
    """Every host must hold the build this machine holds (the one the user just built: a forgotten push must not
    train yesterday's code), or, where this machine lacks the image, the same build as the others."""
    checked = [o for o in obs if o.usable and o.image_id is not None]
    builds = {o.rank: o.image_build or ImageBuild(o.image_id) for o in checked if o.image_id}
    reference = local or next(iter(builds.values()), None)
    push = config.invocation.fix("push", plan.image, name=False, hint="doctor.push")
    for o in checked:
        build = builds.get(o.rank)
        if build is None and image_here is False:
            report.add(o.address, "image", FAIL, f"{plan.image} is missing, and not on this machine either: build or "
                       f"pull it first (`{hints.command('docker', 'pull', plan.image, hint='doctor.pull')}`, or "
                       f"`{hints.dockerlaunch('build', '--stack', 'NAME', hint='doctor.build')}`), then "
                       f"{push}")
        elif build is None:
            report.add(o.address, "image", FAIL, f"{plan.image} is missing here; {push}")
        elif local is not None and not build.same_as(local):
            if local.older_than(build):  # a push of ours would overwrite a newer build (a teammate's, CI's)
                report.add(o.address, "image", FAIL, f"{plan.image} is {build.describe()} here, newer than this "
                           f"machine's {local.describe()}: no push over it. To run the hosts' build, remove the "
                           "older tag here (`"
                           + hints.command("docker", "image", "rm", plan.image, hint="doctor.remove-older")
                           + "`); to run yours, rebuild it")
            else:
                report.add(o.address, "image", FAIL, f"{plan.image} is {build.describe()} here but "
                           f"{local.describe()} on this machine (built, not pushed?); {push}")
        elif local is None and reference is not None and not build.same_as(reference):
            report.add(o.address, "image", FAIL, f"{plan.image} is {build.short} here but "
                       f"{reference.short} on another host; {push}")
        else:
            report.add(o.address, "image", PASS, build.short + (" (as on this machine)" if local else ""))


def _judge_cluster(report: Report, config: ClusterConfig, plan: JobPlan, ob: Observations) -> None:
    obs = ob.hosts
    h0 = obs[0]
    for o in obs:
        for source, got in o.shared.items():
            if got.same is None:
                report.add(o.address, "shared", ERROR, got.how)
            elif got.same:
                report.add(o.address, "shared", PASS, f"{source} is shared with host 0 ({got.how})")
            else:
                report.add(o.address, "shared", FAIL, f"{source} is not the same storage as on host 0 (marked "
                           f"shared: true; {got.how})")
    _judge_caches(report, config, h0.address)
    port_free = None
    if h0.usable and h0.listening is not None:
        port_free = plan.master_port not in h0.listening
        if port_free:
            report.add(h0.address, "master port", PASS, f"{plan.master_port} is free")
        else:
            report.add(h0.address, "master port", FAIL,
                       f"port {plan.master_port} is already in use on host 0: pick another with --master-port")
        if plan.supervised:  # `up --detach`: host 0's gang supervisor listens there
            gang_port = config.job.gang_port
            if gang_port in h0.listening:
                port_free = False
                report.add(h0.address, "gang port", FAIL, f"port {gang_port} is already in use on host 0: pick "
                           "another with job.gang_port")
            else:
                report.add(h0.address, "gang port", PASS, f"{gang_port} is free (the gang supervisor's)")
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
    _judge_image(report, config, plan, ob.hosts, ob.image_here, ob.local_build)
    _judge_cluster(report, config, plan, ob)
    _judge_gpu_models(report, ob.hosts, plan)
    rank_of = {label: i for i, label in enumerate(labels)}
    report.checks = sorted((replace(c, rank=rank_of[c.host]) for c in report.checks),
                           key=lambda c: (c.rank, CHECK_ORDER.index(c.check)))
    return report


def host_labels(plan: JobPlan, targets: list[SSHTarget]) -> list[str]:
    """How report rows name each host: its address, with the SSH port where two hosts share an address."""
    addresses = [hp.address for hp in plan.hosts]
    labels = [a if addresses.count(a) == 1 else f"{a}:{t.port}" for a, t in zip(addresses, targets)]
    return [lb if labels.count(lb) == 1 else f"{lb}#{i}" for i, lb in enumerate(labels)]
