"""The job as compose files, one per node: start node R with `docker compose -f node-R.yaml up` on that host.

Runs with compose v2 (`docker compose`) and Debian's `docker-compose` 1.29 alike (the Compose Specification,
no `version:` key). Host values the plan could not know are compose's own `${VAR:?why}` substitutions, set in the
environment of whoever runs `docker compose` there; `render --probe` asks the hosts instead, as `up` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from dockerlaunch.backends import RenderedFile, Unsupported, caught, refuse_all
from dockerlaunch.backends.refusals import common_refusals, env_file_paths, plain_labels
from dockerlaunch.container import Deferred, GpuAccess
from dockerlaunch.job.plan import HostPlan, JobPlan

TARGET = "compose"
SERVICE = "node"
# what compose substitutes from the environment when the plan left it to the host, and what to say if unset
SUBSTITUTED = {
    "master_addr": ("MASTER_ADDR", "set MASTER_ADDR to the IP of host 0 that the other hosts reach"),
    "gpu_count": ("NPROC_PER_NODE", "set NPROC_PER_NODE to the GPU count of this host"),
}
LEFT_TO_NCCL = {  # not set at all unless known: NCCL's own choice is better than a guess
    "nic": "NCCL/Gloo pick the NIC themselves (set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME on multi-NIC hosts, "
           "or render with --probe)",
    "ib_hca": "NCCL uses every InfiniBand port it finds (render with --probe for the ACTIVE ones)",
}


IB_AUTO = Unsupported(TARGET, "container.infiniband auto", "whether a host has InfiniBand is decided there at "
                      "launch, and a compose file cannot; pass --infiniband on|off (container.infiniband), or "
                      "--probe to ask the hosts")


def _gpus(plan: JobPlan, hp: HostPlan) -> tuple[dict, list[str], list[str], dict[str, str]]:
    """(deploy section, devices, volumes, env) for the node's GPUs."""
    c = hp.container
    if c.gpus is None:
        return {}, [], [], {}
    access = c.gpu
    if isinstance(access, Deferred):
        if plan.config.container.gpu_mode == "auto":  # compose's own way: the toolkit
            access = GpuAccess("gpus", "compose's own GPU request (nvidia-container-toolkit)", c.gpus)
        else:
            raise Unsupported(TARGET, f"hosts[{hp.rank}] gpu_mode devices", "device nodes and driver libraries "
                              "differ per host: render with --probe, or use gpu_mode gpus (the toolkit)")
    if access.mode == "cdi":
        raise Unsupported(TARGET, "container.gpu_mode cdi", "compose files ask for GPUs through the toolkit "
                          "(deploy.resources.reservations.devices); use gpu_mode gpus or auto")
    if access.mode == "devices":
        return {}, list(access.devices), [_volume(m) for m in access.mounts], dict(access.env)
    request = access.request
    device: dict = {"driver": "nvidia", "capabilities": ["gpu"]}
    if request == "all":
        device["count"] = "all"
    elif isinstance(request, int):
        device["count"] = request
    else:
        device["device_ids"] = list(request)
    return {"resources": {"reservations": {"devices": [device]}}}, [], [], {}


def _volume(m) -> str:
    return f"{m.source}:{m.target}" + (":ro" if m.read_only else "")


def service(plan: JobPlan, hp: HostPlan) -> tuple[dict, list[str]]:
    """The compose service of one node and the notes for its header."""
    c = hp.container
    notes: list[str] = []
    if isinstance(c.infiniband, Deferred):
        raise IB_AUTO
    deploy, gpu_devices, gpu_volumes, gpu_env = _gpus(plan, hp)
    env: dict[str, str] = {}
    substituted: set[str] = set()  # compose's own ${VAR:?why}: not escaped
    for k, v in c.env.items():
        if not isinstance(v, Deferred):
            env[k] = v
        elif v.key in SUBSTITUTED:
            var, why = SUBSTITUTED[v.key]
            env[k] = f"${{{var}:?{why}}}"
            substituted.add(k)
        elif v.key in LEFT_TO_NCCL:
            note = f"{k} is not set: {LEFT_TO_NCCL[v.key]}"
            if k != "GLOO_SOCKET_IFNAME":
                notes.append(note)
        else:
            raise Unsupported(TARGET, f"env {k}", f"{v.what}: no compose form")
    env.update(gpu_env)
    svc: dict = {
        "image": c.image,
        "container_name": c.name,
        "network_mode": "host" if c.host_network else "none",
        "ipc": c.ipc,
        "init": c.init,
        **({"tty": True} if c.tty else {}),
        "restart": "no",
        "labels": plain_labels(c),
    }
    if c.shm_size:
        svc["shm_size"] = c.shm_size
    if c.command:
        svc["command"] = list(c.command)
    if c.privileged:
        svc["privileged"] = True
    if c.label_disable is not False:
        # container.selinux auto: a compose file cannot ask the engine, and label=disable changes nothing where
        # Docker does not label containers (render --probe asks each host instead, as `up` does)
        svc["security_opt"] = ["label=disable"]
        if isinstance(c.label_disable, Deferred):
            notes.append("security_opt label=disable (container.selinux auto): where Docker labels containers "
                         "(SELinux) the bind mounts are then not denied and SELinux does not confine the container; "
                         "elsewhere it changes nothing")
    devices = list(gpu_devices) + [d for d in c.devices if d not in gpu_devices]
    if devices:
        svc["devices"] = devices
    if c.cap_add:
        svc["cap_add"] = list(c.cap_add)
    if c.ulimits:
        svc["ulimits"] = {k: {"soft": u.soft, "hard": u.hard} for k, u in c.ulimits.items()}
    volumes = [_volume(m) for m in c.mounts if _volume(m) not in gpu_volumes] + gpu_volumes
    if volumes:
        svc["volumes"] = volumes
    if c.env_files:
        # compose reads these on the host that runs `docker compose`: the same paths must exist there
        svc["env_file"] = env_file_paths(c, plan)
        notes.append("env_file: the secret files must exist at these paths on this host")
    if c.workdir:
        svc["working_dir"] = c.workdir
    if c.user:
        svc["user"] = c.user
    if deploy:
        svc["deploy"] = deploy
    svc = _escape(svc)
    svc["environment"] = {k: v if k in substituted else _escape(v) for k, v in env.items()}
    return svc, notes


def _escape(value):
    """Literal `$` as compose's `$$`: compose substitutes variables in every value of the file, and the job's own
    `$NODE_RANK` (a shell command's) must reach the container as written."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, list):
        return [_escape(v) for v in value]
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    return value


# `env_file:` is read by compose's own dotenv rules (compose 2's, and python-dotenv's in 1.29), not Docker's
# --env-file ones (`up`'s, and the pyxis script's): where they differ, the container would get another value, so the
# render refuses the line. Measured against a real `docker run --env-file` by
# tests/integration/test_render_run.py::test_compose_env_file_gives_the_container_what_docker_run_env_file_does.
ENV_FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_FILE_MISREADS = (  # (what in a value, why compose reads it otherwise than docker, which takes it literally)
    (re.compile(r"\A['\"]"), "it starts with a quote, which compose takes away with what follows the closing one"),
    (re.compile(r"\A\s|\s\Z"), "it starts or ends with white space, which compose trims"),
    (re.compile(r"\s#"), "it has `#` after white space, where compose starts a comment"),
    (re.compile(r"\$[$\{A-Za-z_]"), "it has `$` before a name, `{` or `$`, which compose substitutes"),
    (re.compile(r"\r(?!\Z)"), "it holds a carriage return, where docker-compose 1.29 ends the line"),
)


def env_file_misreads(data: bytes) -> Iterator[tuple[int, str]]:
    """(line number, why) for each line of a secret env file that compose would give the container otherwise than
    `docker run --env-file` does: Docker takes NAME=VALUE with the value literally (lines end at `\n`, one `\r`
    before it dropped, blank and `#` lines skipped), NAME alone from its caller's environment. The reasons name the
    variable at most, never a value. A value cannot hold a line feed: the line after it is a line of its own."""
    if data.startswith(b"\xef\xbb\xbf"):  # a byte-order mark: Docker and both composes skip it
        data = data[3:]
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.removesuffix(b"\r").decode()
        except UnicodeDecodeError:
            yield n, "not UTF-8, which docker refuses and compose would read as other characters"
            continue
        text = line.lstrip(" \t")
        if not text or text.startswith("#"):
            continue
        name, eq, value = text.partition("=")
        if not ENV_FILE_NAME.match(name):
            yield n, ("not NAME=VALUE with a variable name ([A-Za-z_][A-Za-z0-9_]*), which docker refuses or compose "
                      "reads otherwise")
        elif not eq:  # NAME alone: from the caller's environment, in docker and compose alike, but for this
            if n == len(lines) and not data.endswith(b"\n"):
                yield n, f"{name} alone on a last line with no line feed after it, which compose 2 fails on"
        else:
            yield from ((n, f"{name}'s value: {why}") for pattern, why in ENV_FILE_MISREADS if pattern.search(value))


def env_file_refusals(plan: JobPlan) -> Iterator[Unsupported]:
    """The secret files' lines compose would misread (env_file_misreads), read where the render runs (the paths
    compose reads on the node; `render` has read them already): checked, never written out. A file not here to
    read is the CLI's refusal, not this one's."""
    for path in plan.config.container.env_files:
        try:
            data = Path(path).expanduser().read_bytes()
        except OSError:
            continue
        for n, why in env_file_misreads(data):
            yield Unsupported(TARGET, "container.env_files", f"{path} line {n}: {why}: compose would not give the "
                              "container what `up` (docker run --env-file) does; change that line")


def refusals(plan: JobPlan) -> Iterator[Unsupported]:
    """Everything a compose file cannot express, each once (the caller raises them together)."""
    yield from common_refusals(plan, TARGET)
    yield from env_file_refusals(plan)
    for hp in plan.hosts:
        if isinstance(hp.container.infiniband, Deferred):
            yield IB_AUTO
        yield from caught(lambda hp=hp: _gpus(plan, hp))
        for k, v in hp.container.env.items():
            if isinstance(v, Deferred) and v.key not in SUBSTITUTED and v.key not in LEFT_TO_NCCL:
                yield Unsupported(TARGET, f"env {k}", f"{v.what}: no compose form")


def render(plan: JobPlan) -> list[RenderedFile]:
    refuse_all(refusals(plan))
    files = []
    for hp in plan.hosts:
        svc, notes = service(plan, hp)
        header = [
            f"# dockerlaunch job {plan.job!r}, node {hp.rank} of {plan.nnodes}: run on {hp.address} with",
            f"#   docker compose -f node-{hp.rank}.yaml up --abort-on-container-exit --exit-code-from {SERVICE}",
            "# (or docker-compose 1.29); `down` removes the container. Every node's file must be started.",
            *[f"# note: {n}" for n in notes],
        ]
        body = yaml.safe_dump({"services": {SERVICE: svc}}, sort_keys=False, width=1000)
        files.append(RenderedFile(f"node-{hp.rank}.yaml", "\n".join(header) + "\n" + body))
    return files
