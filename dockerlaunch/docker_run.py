"""The one writer of `docker run` argv: every container dockerlaunch starts is written here.

Job containers (the neutral spec, container.py), doctor's probes, dump's py-spy sidecar and sandbox, and the
one-tool containers of the image side (verify's scan, base tables, a builder's facts, a wheel compile, here or on a
host) all come through this module, so a docker flag has one home. It sits below images/ and backends/ so both may
use it. `run_argv` refuses placeholders, so a half-resolved plan can never start a container; `argv` shows them
(the dry run).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from dockerlaunch.container import (
    IB_CAP,
    IB_DEVICE,
    IB_MEMLOCK,
    BindMount,
    ContainerSpec,
    Deferred,
    GpuAccess,
    UnresolvedError,
)

# The engine's SELinux labels off for one container (container.selinux). Docker itself turns them off for --ipc host,
# --pid host and --privileged containers (moby daemon/create.go, generateSecurityOpt); every other container of an
# engine that labels gets a label of its own, and a bind mount of an unlabelled host folder is denied in it.
LABEL_DISABLE = ("--security-opt", "label=disable")


def label_disabled(security_opt: object) -> bool:
    """Whether a container's HostConfig.SecurityOpt (`docker inspect`) has its labels off: `label=disable`, or
    `label:disable` as Docker before 1.11 wrote it (an engine that disabled them itself writes it too)."""
    return isinstance(security_opt, list) and any(o in ("label=disable", "label:disable") for o in security_opt)


def ulimit_value(u) -> str:
    return f"{u.soft}:{u.hard}"


def gpu_flags(access: GpuAccess) -> list[str]:
    """`--gpus` (toolkit; docker parses its value as CSV, so a device list is quoted inside it) or CDI devices."""
    request = access.request
    if access.mode == "cdi":
        names = ["all"] if request == "all" else list(request)  # type: ignore[arg-type]
        return [x for n in names for x in ("--device", f"nvidia.com/gpu={n}")]
    if access.mode == "gpus":
        if request == "all":
            return ["--gpus", "all"]
        if isinstance(request, int):
            return ["--gpus", str(request)]
        return ["--gpus", '"device=' + ",".join(request) + '"']
    return []  # devices: the nodes are in spec.devices already


def ib_flags() -> list[str]:
    return ["--device", IB_DEVICE, "--cap-add", IB_CAP, "--ulimit", f"memlock={ulimit_value(IB_MEMLOCK)}"]


def argv(spec: ContainerSpec, inherit: tuple[str, ...] = ()) -> list[str]:
    """The full `docker run` argv; may contain Deferred placeholders (for display). `inherit`: variables passed as
    `--env NAME`, their values taken from the environment of whoever runs docker (a Slurm task's script)."""
    a = ["docker", "run"]
    if spec.detach:
        a.append("--detach")
    if spec.remove:
        a.append("--rm")
    a += ["--name", spec.name]
    for k, v in spec.labels.items():
        a += ["--label", f"{k}={v}"]
    a += ["--network", "host" if spec.host_network else "none", "--ipc", spec.ipc]
    if spec.shm_size:
        a += ["--shm-size", spec.shm_size]
    a += ["--restart", "no"]  # never a restart policy: it re-runs finished jobs
    if spec.init:
        a.append("--init")
    if spec.tty:
        a.append("--tty")
    if spec.privileged:
        a.append("--privileged")
    if spec.label_disable is True:
        a += LABEL_DISABLE
    if isinstance(spec.gpu, GpuAccess):
        a += gpu_flags(spec.gpu)
    for d in spec.devices:
        a += ["--device", d]
    for c in spec.cap_add:
        a += ["--cap-add", c]
    for k, u in spec.ulimits.items():
        a += ["--ulimit", f"{k}={ulimit_value(u)}"]
    if isinstance(spec.gpu, Deferred):
        a.append(spec.gpu)
    if isinstance(spec.infiniband, Deferred):
        a.append(Deferred("if the host has /dev/infiniband: " + " ".join(ib_flags()), "infiniband"))
    if isinstance(spec.label_disable, Deferred):
        a.append(spec.label_disable)
    for m in spec.mounts:
        a += ["--volume", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    for k, v in spec.env.items():
        a += ["--env", k if k in inherit else f"{k}={v}"]
    for f in spec.env_files:
        a += ["--env-file", f]
    if spec.workdir:
        a += ["--workdir", spec.workdir]
    if spec.user:
        a += ["--user", spec.user]
    if spec.supervisor is not None:
        a += ["--entrypoint", spec.supervisor.entrypoint, "--tmpfs", spec.supervisor.tmpfs]
    a += list(spec.docker_args)
    a.append(spec.image)
    a += list(spec.command)
    return a


def run_argv(spec: ContainerSpec) -> list[str]:
    """argv for execution: refuses placeholders, so a half-resolved plan can never start a container."""
    missing = spec.unresolved()
    out = argv(spec)
    # belt and braces: a placeholder that lost its type on the way (formatted into a string) still shows
    missing += [f"argv {a!r}" for a in out if "<resolved at launch:" in a and not missing]
    if missing:
        raise UnresolvedError(f"container {spec.name}: unresolved values: {'; '.join(missing)}")
    return out


def shell_command(spec: ContainerSpec) -> str:
    """The argv as one POSIX shell line, every value quoted (what reaches a remote shell)."""
    return shlex.join(run_argv(spec))


def sandbox_argv(name: str, image: str, command: list[str], *, ro_volumes: list[str], labels: dict[str, str],
                 memory: str = "8g", pids: int = 256, label_disable: bool = False) -> list[str]:
    """A throwaway container for reading untrusted files (dump's flight-recorder analysis, which unpickles them):
    no network, no capabilities, no new privileges, a read-only root with a small /tmp, memory and pid limits, an
    unprivileged user, only the given folders mounted read-only; none of the job's env, mounts or GPUs.
    `label_disable`: SELinux labels off, as the job's container has them (else the engine's label would deny the
    host folder it reads)."""
    a = ["docker", "run", "--rm", "--name", name, "--network", "none", "--cap-drop", "ALL",
         "--security-opt", "no-new-privileges", *(LABEL_DISABLE if label_disable else ()), "--read-only",
         "--tmpfs", "/tmp:rw,size=64m", "--memory", memory, "--pids-limit", str(pids), "--user", "65534:65534",
         "--entrypoint", "sh"]
    for k, v in labels.items():
        a += ["--label", f"{k}={v}"]
    for v in ro_volumes:
        a += ["--volume", f"{v}:ro"]
    return a + [image, *command]


def sidecar_argv(target: str, image: str, command: list[str], *, caps: list[str], volumes: list[str],
                 env: dict[str, str], labels: dict[str, str], entrypoint: str | None = None,
                 label_disable: bool = False) -> list[str]:
    """A throwaway container in `target`'s PID namespace with its mounts (dump's py-spy beside a rank).
    `label_disable`: where `target`'s SELinux labels are off. Docker gives a `--pid container:` container the
    target's label, but a fresh one where the target has none: its py-spy could then neither read the mounted
    binary nor trace the rank."""
    a = ["docker", "run", "--rm", "--pid", f"container:{target}", "--volumes-from", target, "--network", "none"]
    if label_disable:
        a += LABEL_DISABLE
    for c in caps:
        a += ["--cap-add", c]
    for k, v in labels.items():
        a += ["--label", f"{k}={v}"]
    for v in volumes:
        a += ["--volume", v]
    for k, v in env.items():
        a += ["--env", f"{k}={v}"]
    if entrypoint:
        a += ["--entrypoint", entrypoint]
    return a + [image, *command]


def tool_argv(image: str, command: Sequence[str], *, entrypoint: str | None = None, name: str | None = None,
              labels: Mapping[str, str] | None = None, env: Mapping[str, str | None] | None = None,
              mounts: Sequence[BindMount] = (), gpus: bool = False, detach: bool = False, stdin: bool = False,
              docker: str = "docker") -> list[str]:
    """A container that runs one tool over an image (verify's scan, a base's tables, a builder's facts, a wheel
    compile): no network, only the given mounts, removed when it ends unless detached (a compile outlives its
    launcher and is found again by name and label). An env value None passes the variable from the caller's
    environment (`-e NAME`), so a value that may be long or private never sits in the argv."""
    a = [docker, "run", "--detach" if detach else "--rm"]
    if stdin:
        a.append("-i")
    if name:
        a += ["--name", name]
    for k, v in (labels or {}).items():
        a += ["--label", f"{k}={v}"]
    a += ["--network", "none"]
    for k, v in (env or {}).items():
        a += ["-e", k if v is None else f"{k}={v}"]
    for m in mounts:
        a += ["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    if gpus:
        a += ["--gpus", "all"]
    if entrypoint:
        a += ["--entrypoint", entrypoint]
    return a + [image, *command]
