"""The job for Kubernetes: an Indexed Job and a headless Service (`k8s`), or a JobSet (`jobset`).

Never a StatefulSet: its pods only allow restartPolicy Always, so a finished training job starts again
(mpi-operator#37). Here every pod has restartPolicy Never and the Job backoffLimit 0: a job that ends, ends. The
JobSet restarts every pod of a failed job up to job.max_restarts times (failurePolicy.maxRestarts; its attempt
number, the `jobset.sigs.k8s.io/restart-attempt` annotation, is DL_RESTART_COUNT), never a finished one.
Pod i is node rank i (the Job's completion index);
rank 0's pod has a stable DNS name through the headless Service, which is MASTER_ADDR.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import yaml

from dockerlaunch.backends import RenderedFile, Unsupported, caught, refuse_all
from dockerlaunch.backends.refusals import common_refusals, droppable, per_host_refusals, plain_labels
from dockerlaunch.container import IB_DEVICE, IB_MEMLOCK, NOFILE, Deferred, GpuAccess
from dockerlaunch.job.plan import RESTART_ENV, JobPlan

GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin / GPU operator
# Mellanox/NVIDIA k8s-rdma-shared-dev-plugin's example resource; sites name their own (render --rdma-resource)
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
RESTART_KEY = "jobset.sigs.k8s.io/restart-attempt"  # JobSet's RestartsKey: annotation and label of each pod
CONTAINER = "trainer"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "node"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


@dataclass(frozen=True)
class Options:
    target: str = "k8s"  # k8s (Indexed Job + Service) or jobset
    host_network: bool = False  # hostNetwork (+ dnsPolicy ClusterFirstWithHostNet): NCCL over the nodes' NICs
    rdma_resource: str = RDMA_RESOURCE
    namespace: str | None = None


def refusals(plan: JobPlan, target: str) -> Iterator[Unsupported]:
    """Everything this target cannot express, each once (the caller raises them together)."""
    yield from common_refusals(plan, target)
    if not DNS_LABEL.match(plan.job) or len(plan.job) > 40:
        yield Unsupported(target, f"job.name {plan.job!r}", "Kubernetes names pods <name>-<index> as DNS labels: use "
                          "lowercase letters, digits and '-', at most 40 characters (--name)")
    c = plan.config.container
    yield from per_host_refusals(plan, target, "an Indexed Job runs one pod template for every index")
    if c.gpu_mode in ("devices", "cdi"):
        yield Unsupported(target, f"container.gpu_mode {c.gpu_mode}", f"pods get GPUs from the device plugin as "
                          f"{GPU_RESOURCE}; use gpu_mode auto or gpus")
    if any(isinstance(hp.container.infiniband, Deferred) for hp in plan.hosts):
        yield Unsupported(target, "container.infiniband auto", "a pod template cannot look at the node it lands "
                          "on; set infiniband: on (asks for the RDMA resource) or off (--infiniband on|off)")
    for hp in plan.hosts:
        s = hp.container
        # dockerlaunch's own limits are left to the nodes: InfiniBand's memlock is covered by IPC_LOCK, and open
        # files are the node runtime's (the file's header says so)
        ours = {"nofile": NOFILE, **({"memlock": IB_MEMLOCK} if s.infiniband else {})}
        extra = {k: u for k, u in s.ulimits.items() if ours.get(k) != u}
        if c.ulimits or extra:
            yield droppable(target, "container.ulimits", "pods have no ulimits (the nodes' container runtime sets "
                            "them; InfiniBand's memlock is covered by IPC_LOCK): remove them from the config for "
                            "this target", "container.ulimits")
        if isinstance(s.gpu, GpuAccess) and s.gpu.mode != "gpus" and c.gpu_mode not in ("devices", "cdi"):
            yield Unsupported(target, f"gpu_mode {s.gpu.mode}", f"pods get GPUs from the device plugin as "
                              f"{GPU_RESOURCE}; use gpu_mode auto or gpus")
        if not s.host_network:
            yield Unsupported(target, "network", "a pod always has a network")
    if c.user and not all(p.isdigit() for p in c.user.split(":")):
        yield Unsupported(target, "container.user", f"{c.user!r}: a pod runs as numeric ids (runAsUser); "
                          "use uid[:gid]")
    yield from caught(lambda: _gpu_count(plan, target))
    other = [d for d in plan.hosts[0].container.devices if d != IB_DEVICE]
    if other:
        yield Unsupported(target, "devices", f"{other[0]}: a pod gets devices from device plugins, not paths")


def _gpu_count(plan: JobPlan, target: str) -> int | None:
    spec = plan.hosts[0].container
    if spec.gpus is None:
        return None
    if isinstance(spec.gpus, int):
        return spec.gpus
    if isinstance(spec.gpus, tuple):
        raise Unsupported(target, "container.gpus", "a device list cannot be asked of the device plugin; give a "
                          "count (gpus: N)")
    nproc = plan.hosts[0].nproc_per_node
    if isinstance(nproc, int):
        return nproc
    raise Unsupported(target, "container.gpus all", "a pod asks for a number of GPUs; pass --nproc-per-node N "
                      "(job.nproc_per_node) or set container.gpus: N")


def k8s_literal(value: str) -> str:
    """Kubernetes expands `$(VAR)` in env values, command and args and turns `$$` into `$`; every `$` doubled
    makes the pod see exactly the bytes `up` passes (`$(HOME)`, `$$`, a shell's `$NNODES` alike)."""
    return value.replace("$", "$$")


def pod_template(plan: JobPlan, target: str, master_addr: str, opts: Options) -> dict:
    spec = plan.hosts[0].container
    gpus = _gpu_count(plan, target)
    other = [d for d in spec.devices if d != IB_DEVICE]
    if other:
        raise Unsupported(target, "devices", f"{other[0]}: a pod gets devices from device plugins, not paths")
    env: list[dict] = []
    for k, v in spec.env.items():
        if k == "NODE_RANK":
            index = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}
            env.append({"name": k, "valueFrom": index})
        elif k in RESTART_ENV and target == "jobset":  # the JobSet controller counts its restarts
            env.append({"name": k, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{RESTART_KEY}']"}}})
        elif k == "MASTER_ADDR":
            env.append({"name": k, "value": master_addr})
        elif k == "NPROC_PER_NODE":
            env.append({"name": k, "value": str(gpus if isinstance(v, Deferred) else v)})
        elif isinstance(v, Deferred):
            continue  # NIC and HCAs: NCCL finds them in the pod (see the header)
        else:
            env.append({"name": k, "value": k8s_literal(v)})
    limits: dict[str, str | int] = {}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    if spec.infiniband is True:
        limits[opts.rdma_resource] = 1
    caps = [c for c in spec.cap_add]
    container: dict = {"name": CONTAINER, "image": spec.image}
    if spec.command:
        container["args"] = [k8s_literal(a) for a in spec.command]  # docker's CMD: the image's entrypoint stays
    container["env"] = env
    if spec.env_files:
        container["envFrom"] = [{"secretRef": {"name": f"{plan.job}-env"}}]
    container["ports"] = [{"name": "rendezvous", "containerPort": plan.master_port}]
    if limits:
        container["resources"] = {"limits": limits}
    security: dict = {}
    if caps:
        security["capabilities"] = {"add": caps}
    if spec.privileged:
        security["privileged"] = True
    if spec.label_disable is not False:  # docker's label=disable: the process runs as spc_t (container.selinux)
        security["seLinuxOptions"] = {"type": "spc_t"}
    if spec.user:
        uid, _, gid = spec.user.partition(":")
        security["runAsUser"] = int(uid)
        if gid:
            security["runAsGroup"] = int(gid)
    if security:
        container["securityContext"] = security
    if spec.workdir:
        container["workingDir"] = spec.workdir
    if spec.tty:
        container["tty"] = True  # whole lines from several ranks, as with docker (container.tty)
    mounts, volumes = [], []
    shm: dict = {"medium": "Memory"}
    if spec.shm_size:
        shm["sizeLimit"] = _quantity(spec.shm_size)
    volumes.append({"name": "dshm", "emptyDir": shm})  # 64 MB of /dev/shm breaks dataloaders and NCCL
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    for i, m in enumerate(spec.mounts):
        name = f"mount-{i}"
        kind = "DirectoryOrCreate" if m.source == plan.diag_dir else "Directory"  # the diagnostics folder is ours
        volumes.append({"name": name, "hostPath": {"path": m.source, "type": kind}})
        mounts.append({"name": name, "mountPath": m.target, **({"readOnly": True} if m.read_only else {})})
    container["volumeMounts"] = mounts
    pod: dict = {"restartPolicy": "Never"}
    if spec.ipc == "host":
        pod["hostIPC"] = True  # as docker's --ipc host: NCCL's shared memory between processes of the node
    if opts.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    pod["containers"] = [container]
    pod["volumes"] = volumes
    return {"metadata": {"labels": plain_labels(spec, template=True)}, "spec": pod}


def _quantity(size: str) -> str:
    """docker's 64g -> Kubernetes' 64Gi."""
    unit = size[-1].lower()
    return size[:-1] + {"k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti", "b": ""}[unit] if unit.isalpha() else size


def _job_spec(plan: JobPlan, template: dict) -> dict:
    return {"completionMode": "Indexed", "completions": plan.nnodes, "parallelism": plan.nnodes,
            "backoffLimit": 0, "template": template}


def _restarts(plan: JobPlan, target: str) -> str:
    n = plan.config.job.max_restarts
    if target == "jobset" and n:
        return (f"failurePolicy.maxRestarts {n}: a failed job starts again on every pod, up to {n} time(s); a "
                "finished one never.")
    return ("failurePolicy.maxRestarts 0" if target == "jobset" else "backoffLimit 0") + (
        ": a finished or failed job is never started again.")


def _header(plan: JobPlan, target: str, master_addr: str, opts: Options) -> list[str]:
    spec = plan.hosts[0].container
    lines = [
        f"# dockerlaunch job {plan.job!r} as {'a JobSet' if target == 'jobset' else 'an Indexed Job'}: "
        f"{plan.nnodes} pods, pod i is NODE_RANK i; MASTER_ADDR={master_addr}",
        "# restartPolicy Never, " + _restarts(plan, target),
        "# What the cluster must provide:",
    ]
    if target == "jobset":
        lines.append("#   - the JobSet controller (kubernetes-sigs/jobset, API jobset.x-k8s.io/v1alpha2)")
    if spec.gpus is not None:
        lines.append(f"#   - GPUs as {GPU_RESOURCE} (NVIDIA device plugin or GPU operator)")
    if spec.infiniband is True:
        lines.append(f"#   - RDMA devices as {opts.rdma_resource} (e.g. k8s-rdma-shared-dev-plugin; "
                     "--rdma-resource names yours); IPC_LOCK covers pinned memory")
    if spec.mounts:
        lines.append("#   - the hostPath folders on every node (shared storage for models and checkpoints)")
    if spec.env_files:
        lines.append(f"#   - the secret {plan.job}-env: kubectl create secret generic {plan.job}-env "
                     "--from-env-file=FILE")
    if not opts.host_network:
        lines.append("#   - a pod network NCCL can use between nodes (or render with --host-network)")
    if spec.ulimits.get("nofile") == NOFILE:
        lines.append(f"#   - open files: a pod has no ulimits and gets its node runtime's; where that is 1024 "
                     f"(containerd 2.x) raise containerd's LimitNOFILE (dockerlaunch asks Docker for {NOFILE.soft})")
    if spec.label_disable is not False:
        mode = "auto" if isinstance(spec.label_disable, Deferred) else "disable"
        lines.append(f"# seLinuxOptions type spc_t (container.selinux {mode}, docker's label=disable): hostPath "
                     "folders are not denied on SELinux nodes, where SELinux then does not confine the pod; nodes "
                     "without SELinux ignore it (Pod Security baseline refuses it, as it does hostPath and hostIPC)")
    lines.append("# NCCL_SOCKET_IFNAME / NCCL_IB_HCA are not set: NCCL picks them in the pod.")
    if spec.init:
        lines.append("# No init process (docker's --init): the command is PID 1; torchrun forwards signals itself, "
                     "for other commands use an image with tini.")
    return lines


def render(plan: JobPlan, opts: Options | None = None) -> list[RenderedFile]:
    opts = opts or Options()
    target = opts.target
    refuse_all(refusals(plan, target))
    name = plan.job
    meta = {"name": name, **({"namespace": opts.namespace} if opts.namespace else {})}
    if target == "jobset":
        # pod hostnames are <jobset>-<replicated job>-<job index>-<pod index>, under the subdomain <jobset>
        master = f"{name}-{REPLICATED_JOB}-0-0.{name}"
        template = pod_template(plan, target, master, opts)
        doc = {
            "apiVersion": JOBSET_API, "kind": "JobSet", "metadata": meta,
            "spec": {
                "network": {"enableDNSHostnames": True, "subdomain": name},
                "failurePolicy": {"maxRestarts": plan.config.job.max_restarts},
                "successPolicy": {"operator": "All"},
                "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                    "template": {"spec": _job_spec(plan, template)}}],
            },
        }
        docs = [doc]
    else:
        master = f"{name}-0.{name}"  # an Indexed Job's pod i is <job>-i; the Service is its subdomain
        template = pod_template(plan, target, master, opts)
        template["spec"] = {"subdomain": name, **template["spec"]}
        service = {
            "apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": "None", "selector": {"job-name": name}, "publishNotReadyAddresses": True,
                     "ports": [{"name": "rendezvous", "port": plan.master_port}]},
        }
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": _job_spec(plan, template)}
        docs = [service, job]
    body = yaml.safe_dump_all(docs, sort_keys=False, width=1000)
    return [RenderedFile(f"{name}.{target}.yaml", "\n".join(_header(plan, target, master, opts)) + "\n" + body)]
