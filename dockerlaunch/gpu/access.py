"""How a container on one host reaches the GPUs its job asked for: what the host offers (`HostGpuAccess`, from its
probe), and the rules that choose, per host, among nvidia-container-toolkit's runtime (`--gpus`), CDI device names
(`--device nvidia.com/gpu=...`) and bare device nodes with the driver's own libraries (CUDA_VISIBLE_DEVICES for a
subset, LD_LIBRARY_PATH with forward compatibility's cuda-compat first where the image needs it), and say why.

Types and rules only, like the rest of gpu/. The rules answer in plain values (`Access`): job/plan.py writes them into
the container spec (container.GpuAccess), which gpu/ does not import, and holds a dry run's placeholder where the
host has not answered yet (`pending_access` says what it stands for).
"""

from __future__ import annotations

from dataclasses import dataclass

from dockerlaunch.errors import ConfigError
from dockerlaunch.gpu.needs import compat_to_load

NVIDIA_DIR = "/usr/local/nvidia"  # where nvidia/cuda images look for the driver (their PATH and LD_LIBRARY_PATH)
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class HostGpuAccess:
    """How containers on a host can reach its GPUs (probe.sh; the toolkit and libraries only where
    /dev/nvidiactl exists, the engine and CDI everywhere)."""

    device_nodes: tuple[str, ...] = ()  # /dev/nvidia*
    nvidia_runtime: bool = False  # nvidia-container-toolkit registered with dockerd (--gpus works)
    cdi_specs: tuple[str, ...] = ()  # CDI spec files naming nvidia.com/gpu (in /etc/cdi, /var/run/cdi)
    engine: str | None = None  # dockerd version (CDI needs >= 25)
    cdi_dirs: tuple[str, ...] | None = None  # the CDI spec dirs dockerd reads: () CDI off, None not reported
    libs: tuple[tuple[str, str], ...] = ()  # (soname, host path) of the driver's libraries, x86-64
    nvidia_smi: str | None = None
    image_env: tuple[str, ...] | None = None  # the job image's Config.Env, when asked
    # driver files (libs, nvidia_smi) not root's own or writable by others, "PATH (owner uid U, mode M)": never
    # bind-mounted into a job (another login could put its code there)
    untrusted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """How one host's engine reaches the job's GPUs, as the rules chose it: `mode` gpus, cdi or devices, and `why`;
    for devices, the device nodes, the driver's files to bind-mount read-only (host path, container path) and env."""

    mode: str
    why: str
    devices: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def resolve_gpu_mode(requested: str, gpu: HostGpuAccess) -> tuple[str, str]:
    """`auto` -> what the host offers, best first: the toolkit's runtime, CDI specs, else device nodes."""
    if requested != "auto":
        return requested, "set in the config"
    if gpu.nvidia_runtime:
        return "gpus", "nvidia-container-toolkit runtime registered with dockerd"
    usable, why = cdi_state(gpu)
    if usable:
        return "cdi", why
    return "devices", f"no toolkit runtime, and {why}: device nodes and the driver's libraries"


def cdi_state(gpu: HostGpuAccess) -> tuple[bool, str]:
    """Can `--device nvidia.com/gpu=...` work on this engine, and why (not)? Docker reads CDI specs from 25 on,
    only with the `cdi` feature on (measured: off in 26.1, on by default in 28.5); its `docker info` lists the
    spec dirs it reads then."""
    engine = gpu.engine or "?"
    major = int(engine.split(".")[0]) if engine.split(".")[0].isdigit() else 0
    if major and major < 25:
        return False, f"Docker {engine} has no CDI (it needs 25 or later)"
    if not gpu.cdi_dirs:
        return False, (f"CDI is off in Docker {engine} (its `docker info` lists no CDI spec dirs): add "
                       '"features": {"cdi": true} to /etc/docker/daemon.json and restart dockerd')
    specs = [s for s in gpu.cdi_specs if any(s.startswith(d.rstrip("/") + "/") for d in gpu.cdi_dirs)]
    if not specs:
        return False, (f"no CDI spec names nvidia.com/gpu in {', '.join(gpu.cdi_dirs)} "
                       "(nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)")
    return True, f"CDI spec {specs[0]}, Docker {engine}"


def _numbered(node: str) -> int | None:
    tail = node.removeprefix("/dev/nvidia")
    return int(tail) if tail.isdigit() else None


# what a dry run can say of device mode before any host answered (device_access decides it per host)
COMPAT_LATER = (" (device nodes: the image's cuda-compat folder first on LD_LIBRARY_PATH where the host's driver is "
                "older than the image's CUDA needs)")


def device_access(gpus, gpu: HostGpuAccess, user_env: dict[str, str], where: str, why: str,
                  driver: str | None = None) -> Access:
    """No toolkit: the control nodes, every /dev/nvidiaN, CUDA_VISIBLE_DEVICES for the chosen ones, and the host's
    driver libraries read-only under /usr/local/nvidia (where CUDA images look), on the loader's path: first, except
    where forward compatibility is what runs the image (gpu.needs.compat_to_load: the host's driver older than the
    image's CUDA needs, its cuda-compat of a newer branch), whose compat folder then goes before them (the host's
    libcuda would hide it) and `why` says so.

    Every GPU node, not only the chosen ones: NCCL between two containers of one machine (one GPU each, --ipc
    host) picks P2P/CUMEM and then fails with `Cuda failure 101 'invalid device ordinal'` when the peer's node is
    missing (seen on 2 x H200); with all nodes it runs at bare-metal speed."""
    numbered = sorted((n for n in gpu.device_nodes if _numbered(n) is not None), key=_numbered)
    if gpus == "all":
        chosen = numbered
    elif isinstance(gpus, int):
        chosen = numbered[:gpus]
    else:
        bad = [g for g in gpus if not g.isdigit()]
        if bad:
            raise ConfigError(f"{where}: gpus {bad[0]!r}: device-node access (no nvidia-container-toolkit here) "
                              "takes GPU indices; use indices or install the toolkit")
        chosen = [f"/dev/nvidia{g}" for g in gpus]
    missing = [n for n in chosen if n not in gpu.device_nodes]
    wanted = gpus if isinstance(gpus, int) else len(chosen)
    if missing or not chosen or len(chosen) < wanted:
        have = ", ".join(numbered) or "none"
        raise ConfigError(f"{where}: asks for GPUs {gpus} but the host has GPU device nodes: {have}; "
                          "set container.gpus (gpus: none for a CPU job)")
    if not gpu.libs:
        raise ConfigError(f"{where}: no NVIDIA driver libraries found with `ldconfig -p` (libcuda, libnvidia-ml); "
                          "is the driver installed?")
    if gpu.untrusted:
        raise ConfigError(f"{where}: the driver file {gpu.untrusted[0]} is not root's own or is writable by others, "
                          "and device-node access would bind-mount it into the job: have root own it "
                          "(chown root:root, chmod go-w) or fix the ldconfig path that names it")
    devices = [n for n in GPU_CONTROL_NODES if n in gpu.device_nodes] + numbered
    mounts = [(path, f"{NVIDIA_DIR}/lib64/{soname}") for soname, path in gpu.libs]
    if gpu.nvidia_smi:
        mounts.append((gpu.nvidia_smi, f"{NVIDIA_DIR}/bin/nvidia-smi"))
    env: list[tuple[str, str]] = []
    if chosen != numbered and "CUDA_VISIBLE_DEVICES" not in user_env:
        env.append(("CUDA_VISIBLE_DEVICES", ",".join(str(_numbered(n)) for n in chosen)))
    if "LD_LIBRARY_PATH" not in user_env:
        image = dict(e.split("=", 1) for e in (gpu.image_env or ()) if "=" in e).get("LD_LIBRARY_PATH", "")
        forward = compat_to_load(gpu.image_env, driver)
        if forward is not None:
            # the host's libcuda would hide the image's compat one: forward compatibility is what runs this image
            compat, cuda_v = forward
            rest = [p for p in image.split(":") if p and p.rstrip("/") != compat.path]
            lib64 = [] if f"{NVIDIA_DIR}/lib64" in rest else [f"{NVIDIA_DIR}/lib64"]
            env.append(("LD_LIBRARY_PATH", ":".join([compat.path, *lib64, *rest])))
            why += (f"; forward compatibility: driver {driver} is older than the image's CUDA {cuda_v} needs, so "
                    f"the image's cuda-compat ({compat.path}) goes first on LD_LIBRARY_PATH, before the host's "
                    f"libraries in {NVIDIA_DIR}/lib64")
        elif f"{NVIDIA_DIR}/lib64" not in image.split(":"):
            env.append(("LD_LIBRARY_PATH", ":".join(p for p in (f"{NVIDIA_DIR}/lib64", image) if p)))
    return Access("devices", why, devices=tuple(devices), mounts=tuple(mounts), env=tuple(env))


def pending_access(requested: str) -> str:
    """What a dry run says of a host's GPU access before the host answered (`choose_access` returned None)."""
    if requested == "auto":
        return "GPU access of the host: --gpus (toolkit), CDI, or /dev/nvidia* + driver libraries" + COMPAT_LATER
    return "/dev/nvidia* device nodes and driver libraries of the host" + COMPAT_LATER


def choose_access(gpus, requested: str, gpu: HostGpuAccess | None, user_env: dict[str, str], where: str,
                  driver: str | None = None) -> Access | None:
    """How a Docker engine on one host reaches the GPUs `gpus` asks for (all, a count or a device list; not none),
    with container.gpu_mode `requested`; None when that depends on what the host has and it has not said yet (a dry
    run: `gpu` None). `driver`: the host's driver version (gpu.host.GpuHost's), which device mode needs."""
    if requested == "cdi" and gpu is not None:
        usable, why = cdi_state(gpu)
        if not usable:
            raise ConfigError(f"{where}: gpu_mode cdi, but {why}")
        mode = "cdi"
    elif requested in ("gpus", "cdi"):
        mode, why = requested, "set in the config"
    elif gpu is None:
        return None
    else:
        mode, why = resolve_gpu_mode(requested, gpu)
    if mode == "devices":
        return device_access(gpus, gpu, user_env, where, why, driver)
    if mode == "cdi" and isinstance(gpus, int):
        raise ConfigError(f"{where}: CDI (chosen for this host) takes gpus: all or a device list, not a count")
    return Access(mode, why)
