"""Which GPU architectures a build compiles for: --cuda-archs as written, what the stack's nvcc can target, and
this machine's GPUs (the default, else 9.0: every architecture more multiplies the compile time)."""

from __future__ import annotations

import re
import subprocess

from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.gpu import smi
from dockerlaunch.gpu.cuda import version_tuple
from dockerlaunch.images.stacks import Stack


def parse_cuda_archs(text: str | None) -> list[str]:
    """`8.0;9.0`, `80,90` or `9.0+PTX` -> ["8.0", "9.0"]; a one-line error for anything else."""
    if not text:
        return []
    out = []
    for part in re.split(r"[;,\s]+", text.strip()):
        m = re.fullmatch(r"(\d{1,2})\.?(\d)(\+PTX|a)?", part)
        if not m:
            raise ConfigError(f"--cuda-archs {text!r}: {part!r} is not a compute capability; write e.g. 8.0;9.0")
        out.append(f"{m.group(1)}.{m.group(2)}")
    return out


DEFAULT_ARCH = "9.0"  # H100/H200: one architecture, since each one more multiplies flash-attn's hours


# What nvcc can target (sm_XY cubins), by CUDA release, each row its release's change as NVIDIA wrote it
# (tests/data/nvidia-tables/cuda-archs.txt, read 2026-11-27). 13.0: "Offline compilation and library support for
# [Maxwell, Pascal, Volta] have been removed" (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html
# #deprecated-architectures); its set is what CUDA 13.3's `nvcc --list-gpu-code` prints (a third party's record).
# 12.9: "adds compiler target support for SM architecture 10.3 ... and 12.1"; 12.8: "adds compiler support for ...
# SM_100, SM_101, SM_120"; 11.8: "introduces support for both the Hopper and Ada Lovelace GPU families"
# (https://docs.nvidia.com/cuda/cuda-features-archive/index.html). The older architectures of the 11.8 and 12.x rows
# are the earlier table's, not checked against NVIDIA's text.
ARCHS_BY_CUDA = [
    ((13, 0), {"7.5", "8.0", "8.6", "8.7", "8.8", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}),
    ((12, 9), {"5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0",
               "10.0", "10.1", "10.3", "12.0", "12.1"}),
    ((12, 8), {"5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0",
               "10.0", "10.1", "12.0"}),
    ((11, 8), {"3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7",
               "8.9", "9.0"}),
]
# The newest release whose list was read: a newer one may target architectures the table lacks (third parties say
# 13.4 adds Rubin, 10.7), so past it only an architecture older than every one of the newest row is refused.
ARCHS_READ_UP_TO = (13, 3)


def _cap(arch: str) -> tuple[int, ...]:
    return tuple(int(x) for x in arch.split("."))


def arch_problem(stack: Stack, arch: str) -> str | None:
    """Why nvcc of the stack's CUDA cannot compile for `arch` (None when it can, or when the tables cannot tell)."""
    if not stack.cuda:
        return None
    cuda = tuple(int(x) for x in stack.cuda.split("."))
    known = next((archs for since, archs in ARCHS_BY_CUDA if cuda >= since), None)
    if known is None or arch in known:
        return None
    if cuda > ARCHS_READ_UP_TO and _cap(arch) > min(_cap(a) for a in known):
        return None
    return (f"--cuda-archs {arch}: CUDA {stack.cuda}'s nvcc cannot target compute capability {arch} (it can: "
            f"{', '.join(sorted(known, key=_cap))})")


def check_archs(stack: Stack, archs: list[str]) -> None:
    for a in archs:
        problem = arch_problem(stack, a)
        if problem:
            raise ConfigError(problem)


def local_gpu_archs(run=subprocess.run) -> list[str]:
    """The compute capabilities of this machine's GPUs, each once ([] where it has no nvidia-smi or its driver does
    not answer: the build then compiles for 9.0 and says so); a GPU whose capability is unknown is an error."""
    try:
        r = run(["sh", "-c", smi.CAPS_QUERY], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    try:
        caps = smi.parse_compute_caps(r.returncode, r.stdout)
    except smi.CapsUnknown as e:
        if e.missing or e.no_gpu:
            return []
        raise DockerlaunchError(f"this machine's GPUs: {e.why}: pass --cuda-archs") from None
    return sorted(set(caps), key=version_tuple)
