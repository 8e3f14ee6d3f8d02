"""Judge (pure): observations -> PASS/WARN/FAIL/SKIP rows; every verdict unit-tested on recorded facts."""

from __future__ import annotations

import re
from dataclasses import replace

from dockerlaunch import cuda
from dockerlaunch.backends.docker import nvsmi
from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker.doctor.observations import (
    ContainerFacts,
    HostObservation,
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
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import HostPlan, JobPlan
from dockerlaunch.job.spec import Ulimit

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
    if wants_gpus(hp) and p is not None and p.smi is not None:
        judge_gpu_facts(report, a, p.smi, p.image_labels or {}, o.image_scan, p.gpu.image_env)


LABEL = "ai.dockerlaunch."
FOREIGN_MIB = 1024  # GPU memory a process that is not the job's may hold before the GPU counts as taken
MPS = "nvidia-cuda-mps-server"
# what each compiled package is called in an image's pins, for images built before the `compiled` label
COMPILED_PINS = (("transformer_engine", "transformer-engine-torch"), ("apex", "apex"), ("flash_attn", "flash-attn"))


def _gpus(gpus: list[nvsmi.Gpu]) -> str:
    idx = ",".join(str(g.index) for g in gpus)
    return f"GPU {idx}" if len(gpus) == 1 else f"GPUs {idx}"


def judge_gpu_facts(report: Report, a: str, smi: nvsmi.SmiFacts, labels: dict[str, str], scan: dict | None = None,
                    env: tuple[str, ...] | None = None) -> None:
    """The image against this host's driver and GPUs, and the GPUs' health. What the image needs comes from
    dockerlaunch's labels, else from its environment (CUDA_VERSION of nvidia/cuda bases) and what `dockerlaunch
    verify` recorded of its Image ID here (`scan`: each library's cubins and PTX, its runtime's CUDA)."""
    _judge_driver(report, a, smi, labels, _needs_cuda(labels, scan, env))
    if labels.get(f"{LABEL}cuda-archs") or not scan:
        _judge_archs(report, a, smi, labels)
    else:
        _judge_scanned_archs(report, a, smi, scan)
    _judge_health(report, a, smi)


def _needs_cuda(labels: dict[str, str], scan: dict | None, env: tuple[str, ...] | None) -> tuple[str, str] | None:
    """(CUDA major.minor the image needs, where that was read)."""
    if labels.get(f"{LABEL}pin.cuda"):
        return labels[f"{LABEL}pin.cuda"], f"{LABEL}pin.cuda"
    for e in env or ():
        m = re.match(r"^CUDA_VERSION=(\d+)\.(\d+)", e)
        if m:
            return f"{m.group(1)}.{m.group(2)}", "the image's CUDA_VERSION"
    if scan and scan.get("cuda"):
        return str(scan["cuda"]), "its CUDA runtime wheel (dockerlaunch verify)"
    return None


def _judge_scanned_archs(report: Report, a: str, smi: nvsmi.SmiFacts, scan: dict) -> None:
    """The same rule per library, from verify's record: a library of the image's own (not an nvidia-* wheel, which
    NVIDIA ships for a range of GPUs) with neither a cubin nor PTX for a host GPU fails."""
    caps = {g.compute_cap for g in smi.gpus if g.compute_cap}
    own = {lib: c for lib, c in (scan.get("cubins") or {}).items()
           if not str(c.get("dist") or "").startswith("nvidia-")}
    lacking: dict[str, list[str]] = {}
    for cap in sorted(caps, key=cuda.version_tuple):
        for lib, c in sorted(own.items()):
            if not cuda.cubin_covers(c.get("elf", []), cap) and not cuda.ptx_covers(c.get("ptx", []), cap):
                lacking.setdefault(cap, []).append(f"{lib} ({c.get('dist') or '?'}: {', '.join(c.get('elf', []))})")
    if lacking:
        report.add(a, "archs", FAIL, "; ".join(f"GPUs of compute capability {cap}: no cubin or PTX in "
                                               f"{', '.join(libs[:3])}" + (f" (+{len(libs) - 3} more)" if len(libs) > 3
                                                                            else "") for cap, libs in lacking.items())
                   + f" (from `dockerlaunch verify` of {scan.get('image', 'the image')}): rebuild them for "
                     f"{';'.join(sorted(caps, key=cuda.version_tuple))}")
    else:
        report.add(a, "archs", PASS, f"{len(own)} libraries with device code run on this host's GPUs "
                   f"({', '.join(sorted(caps))}; from `dockerlaunch verify` of {scan.get('image', 'the image')})")


def _judge_driver(report: Report, a: str, smi: nvsmi.SmiFacts, labels: dict[str, str],
                  needs: tuple[str, str] | None) -> None:
    if smi.driver is None:
        said = [e for e in smi.errors if "--query-gpu" in e] or list(smi.errors)
        report.add(a, "driver", ERROR, "nvidia-smi did not tell the driver version: "
                   + ("; ".join(said) if said else "no answer") + " (is the driver loaded?)")
        return
    runs = f" (CUDA {smi.cuda})" if smi.cuda else ""
    if needs is None:
        report.add(a, "driver", SKIP, f"driver {smi.driver}{runs}; the image does not say which CUDA it needs (no "
                   f"{LABEL}pin.cuda label or CUDA_VERSION; `dockerlaunch verify IMAGE` here records it)")
        return
    need = needs[0]
    problem = cuda.driver_problem(smi.driver, need)
    if problem is None:
        report.add(a, "driver", PASS, f"driver {smi.driver}{runs} runs the image's CUDA {need}")
        return
    verdict, why = problem
    if verdict == "FAIL":
        stack = labels.get(f"{LABEL}stack", "")
        runs_at_most = why.split(";")[0].removeprefix("runs CUDA <= ")
        report.add(a, "driver", FAIL, f"driver {smi.driver} {why}: upgrade the driver, or build a stack of CUDA <= "
                   f"{runs_at_most} (dockerlaunch stacks list" + (f"; this image is {stack}" if stack else "") + ")")
    else:
        report.add(a, "driver", WARN, f"driver {smi.driver}{runs} {why}")


def _compiled(labels: dict[str, str]) -> list[str]:
    if f"{LABEL}compiled" in labels:
        return [n for n in labels[f"{LABEL}compiled"].split(",") if n]
    return [name for pin, name in COMPILED_PINS if labels.get(f"{LABEL}pin.{pin}")]


def _judge_archs(report: Report, a: str, smi: nvsmi.SmiFacts, labels: dict[str, str]) -> None:
    """One rule with verify (dockerlaunch.cuda): a cubin runs on its major at an equal or higher minor; PTX on newer
    architectures. The image's compiled packages hold code for exactly its cuda-archs label."""
    if not smi.gpus:
        return
    label = labels.get(f"{LABEL}cuda-archs")
    if not label:
        report.add(a, "archs", SKIP, f"the image has no {LABEL}cuda-archs label (not built by dockerlaunch): run "
                   "`dockerlaunch verify IMAGE --cuda-archs X.Y` with this host's compute capability")
        return
    cubins, ptx = cuda.archs_as_cubins(label.split(";"))
    unknown = [g for g in smi.gpus if g.compute_cap is None]
    if unknown:
        report.add(a, "archs", ERROR, f"{_gpus(unknown)}: nvidia-smi did not tell the compute capability (the "
                   "driver is older than R510?)")
        return
    by_cap: dict[str, list[nvsmi.Gpu]] = {}
    for g in smi.gpus:
        by_cap.setdefault(g.compute_cap or "", []).append(g)
    lacking = {cap: gs for cap, gs in by_cap.items()
               if not cuda.cubin_covers(cubins, cap) and not cuda.ptx_covers(ptx, cap)}
    if lacking:
        pkgs = ", ".join(_compiled(labels)) or "its compiled packages"
        stack = labels.get(f"{LABEL}stack")
        want = ";".join(sorted({*label.split(";"), *lacking}, key=cuda.version_tuple))
        fix = f"dockerlaunch build --stack {stack} --cuda-archs '{want}'" if stack else \
            f"rebuild it with --cuda-archs '{want}'"
        gpus = "; ".join(f"{_gpus(gs)} {gs[0].name} ({cap}, sm_{cap.replace('.', '')})" for cap, gs in lacking.items())
        report.add(a, "archs", FAIL, f"{gpus}: the image's {pkgs} hold code only for {label} ({LABEL}cuda-archs): "
                   f"no kernel would run there; {fix}")
        return
    caps = ", ".join(f"{cap} x{len(gs)}" for cap, gs in sorted(by_cap.items()))
    report.add(a, "archs", PASS, f"the image's code ({label}) runs on this host's GPUs ({caps})")


def _judge_health(report: Report, a: str, smi: nvsmi.SmiFacts) -> None:
    fails, warns = [], []
    for app in smi.apps:
        if (app.used_mib or 0) > FOREIGN_MIB and not app.name.rsplit("/", 1)[-1].startswith(MPS):
            g = smi.gpu(app.bus_id)
            where = f"GPU {g.index}" if g else f"the GPU at {app.bus_id}"
            owner = f", user {app.owner}" if app.owner else ""
            fails.append(f"{where} holds {app.used_mib} MiB of pid {app.pid} ({app.name}{owner}), not this job's: a "
                         f"leftover of another job? stop it (kill {app.pid}) or give the job other GPUs")
    for g in smi.gpus:
        if g.ecc_volatile:
            fails.append(f"GPU {g.index}: {g.ecc_volatile} uncorrectable ECC errors since the driver loaded: drain "
                         f"the host and reset the GPU (nvidia-smi -r -i {g.index})")
        if g.remap_pending:
            fails.append(f"GPU {g.index}: a row remap is pending: reset the GPU (nvidia-smi -r -i {g.index}) or "
                         "reboot before use")
        if g.fabric_state is not None and (g.fabric_state != "Completed" or
                                           (g.fabric_status is not None and g.fabric_status != "Success")):
            fails.append(f"GPU {g.index}: NVSwitch fabric {g.fabric_state}/{g.fabric_status or '?'} (CUDA says "
                         "\"system not yet initialized\"): start the fabric manager (systemctl start "
                         "nvidia-fabricmanager) and wait for Completed/Success")
        if g.ecc_aggregate:
            warns.append(f"GPU {g.index}: {g.ecc_aggregate} uncorrectable ECC errors over its life")
    off = [g for g in smi.gpus if g.persistence == "Disabled"]
    if off:
        warns.append(f"persistence mode off on {_gpus(off)} (every start pays the driver's initialisation: "
                     "nvidia-smi -pm 1)")
    mig = [g for g in smi.gpus if g.mig == "Enabled"]
    if mig:
        warns.append(f"MIG is on for {_gpus(mig)}: the job sees MIG instances, not whole GPUs")
    if smi.xids:
        warns.append("XID errors since boot (dmesg): " + ", ".join(f"{code} x{n}" for code, n in smi.xids))
    if fails:
        report.add(a, "gpu health", FAIL, "; ".join(fails + warns + list(smi.errors)))
    elif smi.errors:
        report.add(a, "gpu health", ERROR, "could not check: " + "; ".join(smi.errors))
    elif warns:
        report.add(a, "gpu health", WARN, "; ".join(warns))
    else:
        used = sum(1 for app in smi.apps)
        report.add(a, "gpu health", PASS, f"{len(smi.gpus)} GPU(s): no memory held by other processes"
                   + (f" ({used} small or MPS)" if used else "") + ", no uncorrectable ECC errors or pending "
                   "remaps" + (", fabric Completed" if any(g.fabric_state for g in smi.gpus) else "")
                   + ("" if smi.xids is None else ", no XID errors since boot"))


def _judge_gpu_models(report: Report, obs: list[HostObservation], plan: JobPlan) -> None:
    """Ranks wait for the slowest GPU at every collective: different models across hosts cost the difference."""
    models = {}
    for o, hp in zip(obs, plan.hosts):
        if wants_gpus(hp) and o.probe is not None and o.probe.smi is not None and o.probe.smi.gpus:
            models[o.address] = sorted({g.name for g in o.probe.smi.gpus})
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
    _judge_gpu_models(report, ob.hosts, plan)
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
