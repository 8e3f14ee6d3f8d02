"""What CUDA code needs of a GPU and its driver: one place for the rules verify (an image's cubins against the
architectures asked for), build (the driver labels) and doctor (an image against each host's GPUs and driver)
all apply. Sources: docs/STACKS.md, Facts: Driver minimums; NVIDIA's CUDA C++ Programming Guide, "Binary
Compatibility" and "PTX Compatibility", and the CUDA Compatibility guide."""

from __future__ import annotations

import re

# What an image of a CUDA major needs of the host's driver (the major's minimum: 13.x from 13.0 GA's driver; 12.x
# from R525 through minor-version compatibility), and the driver each toolkit release shipped with (below it,
# minor-version compatibility holds short of PTX JIT of newer code and new APIs).
DRIVER_MIN = {"13": "580.65.06", "12": "525.60.13"}
TOOLKIT_DRIVER = {"12.6": "560.28.03", "12.8": "570.26", "13.0": "580.65.06"}
# The newest CUDA each driver branch runs without forward compatibility (NVIDIA's CUDA Toolkit release notes, table
# "CUDA Toolkit and Corresponding Driver Versions"): what nvidia-smi's "CUDA Version" says for that branch.
BRANCH_CUDA = ((580, "13.0"), (575, "12.9"), (570, "12.8"), (560, "12.6"), (555, "12.5"), (550, "12.4"),
               (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0"))


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); '' -> ()."""
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


def cubin_covers(cubins: list[str], arch: str) -> bool:
    """Whether one of `cubins` (sm_90, sm_90a, sm_100f, ...) runs on compute capability `arch` ('9.0'): a plain or
    family cubin of the same major and a minor not above it; an arch-specific (a) cubin only on exactly its own."""
    major, minor = arch.split(".")
    minor_n, want_suffix = int(re.match(r"\d+", minor).group()), minor[len(re.match(r"\d+", minor).group()):]
    for c in cubins:
        m = re.match(r"^sm_(\d+)(\d)([af]?)$", c)
        if not m or m.group(1) != major:
            continue
        c_minor, suffix = int(m.group(2)), m.group(3)
        if want_suffix == "a":
            if c_minor == minor_n and suffix == "a":
                return True
        elif suffix == "a":
            if c_minor == minor_n:
                return True
        elif c_minor <= minor_n:
            return True
    return False


def ptx_covers(ptx: list[str], arch: str) -> bool:
    """Whether PTX for one of `ptx` (compute_80, sm_80 as cuobjdump names it) can be compiled by the driver for
    `arch`: PTX of an architecture not newer than the GPU's (an arch-specific one only for its own); the driver must
    also be at least as new as the toolkit that wrote the PTX, which `driver_problem` judges."""
    want = tuple(int(x) for x in re.findall(r"\d+", arch))
    for p in ptx:
        m = re.match(r"^(?:sm|compute)_(\d+)(\d)([af]?)$", p)
        if not m:
            continue
        have = (int(m.group(1)), int(m.group(2)))
        if m.group(3) == "a" and have != want:
            continue
        if have <= want:
            return True
    return False


def archs_as_cubins(archs: list[str]) -> tuple[list[str], list[str]]:
    """An image's cuda-archs label ('8.0;9.0', '9.0+PTX', '9.0a') as the (cubins, ptx) its compiled packages hold."""
    cubins, ptx = [], []
    for a in archs:
        a = a.strip()
        m = re.match(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", a, re.I)
        if not m:
            continue
        cubins.append(f"sm_{m.group(1)}{m.group(2)}{m.group(3)}")
        if m.group(4):
            ptx.append(f"compute_{m.group(1)}{m.group(2)}")
    return cubins, ptx


def driver_problem(driver: str, cuda: str, has_compat: bool = False, need: str | None = None,
                   own: str | None = None) -> tuple[str, str] | None:
    """(verdict, why) when a host's driver cannot run (FAIL) or may not fully run (WARN) an image of CUDA `cuda`
    ('13.0'); None when it runs it. `has_compat`: the image ships cuda-compat (forward compatibility, data-center GPUs
    only), which lets an older branch run a newer CUDA. `need`/`own`: the image's own word for its driver minimum
    and its toolkit's driver (labels driver-min, driver-toolkit), else the tables above."""
    have = version_tuple(driver)
    major = cuda.split(".")[0]
    need = need or DRIVER_MIN.get(major)
    if not have or need is None:
        return None
    runs = next((c for branch, c in BRANCH_CUDA if have[0] >= branch), None)
    if have < version_tuple(need):
        if has_compat:
            return ("WARN", f"runs CUDA <= {runs or '?'}; the image needs {cuda} (R{need.split('.')[0]}+) and ships "
                            "cuda-compat: forward compatibility holds only on data-center GPUs of a supported branch")
        return ("FAIL", f"runs CUDA <= {runs or 'none of 12.x/13.x'}; the image needs {cuda} (R{need.split('.')[0]}+)")
    own = own or TOOLKIT_DRIVER.get(cuda)
    if own and have < version_tuple(own):
        return ("WARN", f"runs {cuda} through minor-version compatibility (the toolkit's own driver is {own}+): "
                        "PTX JIT of newer code and the newest APIs may not work")
    return None


def runtime_cuda(dists: dict[str, str | None]) -> str | None:
    """The CUDA an image's Python stack is built for, from its CUDA runtime wheel (nvidia-cuda-runtime 13.0.96 ->
    '13.0'; nvidia-cuda-runtime-cu12 12.8.90 -> '12.8')."""
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        v = version_tuple(dists.get(name))
        if len(v) >= 2:
            return f"{v[0]}.{v[1]}"
    return None


# Forward compatibility (NVIDIA's CUDA Compatibility guide, "Forward Compatibility"): the image's cuda-compat
# libcuda runs a newer CUDA over an older kernel driver, on data-center GPUs of the branches it lists only; on
# other GPUs CUDA fails with error 804 (cudaErrorCompatNotSupportedOnDevice), and a compat libcuda older than the
# kernel driver fails with 803 (cudaErrorSystemDriverMismatch).
CONSUMER = re.compile(r"GeForce|TITAN|Quadro|\bRTX\b(?!.*\bServer\b)", re.I)


def data_center(name: str) -> bool:
    """Whether forward compatibility can hold on a GPU of this model name (not GeForce, TITAN, Quadro or a
    workstation RTX; an RTX PRO Server Edition is a data-center part)."""
    return not CONSUMER.search(name or "")


def compat_problem(compat: str, branches: tuple[int, ...] | list[int], driver: str, gpu_names: list[str],
                   cuda: str | None = None, estimated: bool = False, on_path: str = "") -> tuple[str, str] | None:
    """(verdict, why) for an image whose cuda-compat `compat` (its libcuda's driver version) is loaded over the
    host's `driver`: WARN where forward compatibility holds, FAIL naming the CUDA error where it cannot.

    When it is loaded (the caller decides; gpu.needs does): where the host's driver is older than the image's CUDA
    needs (dockerlaunch's device mode then puts the compat folder first; the container toolkit's enable-cuda-compat
    hook adds it when its branch is newer than the host's), or on every host when the image itself names the folder
    on the loader's path (`on_path`: its LD_LIBRARY_PATH, an /etc/ld.so.conf.d file). Only then does a compat
    library older than the host's driver matter, and then it is 803: the toolkit never loads an older one on its own.
    `estimated`: `compat` is not the file's version but the one its CUDA shipped with (the image's environment, no
    verify record): only a newer host branch is then a certain 803. A compat library serves its own branch (its ELF
    note lists it) and the older `branches` it names."""
    have, own = version_tuple(driver), version_tuple(compat)
    if not have:
        return None
    what = f"CUDA {cuda}" if cuda else "CUDA"
    where = f" and the image puts it on the loader's path ({on_path})" if on_path else ""
    if own and (have[0] > own[0] if estimated else have > own):
        return ("FAIL", f"the image's cuda-compat ({compat}{', from its CUDA' if estimated else ''}) is older than "
                        f"the host's driver{where}: CUDA fails with error 803 (system driver mismatch) wherever it is "
                        "loaded; " + ("take it off LD_LIBRARY_PATH (the toolkit loads it only where it is newer), or "
                                      "rebuild on a newer CUDA base" if on_path else "rebuild on a newer CUDA base"))
    consumer = sorted({n for n in gpu_names if not data_center(n)})
    if consumer:
        return ("FAIL", f"{what} only through forward compatibility (the image's cuda-compat {compat}{where}), which "
                        f"does not hold on {consumer[0]}: CUDA error 804 (forward compatibility not supported on this "
                        "device); upgrade the driver" + (" or take the compat folder off LD_LIBRARY_PATH"
                                                         if on_path else ""))
    served = sorted({*branches, *own[:1]})
    if branches and have[0] not in served:
        return ("FAIL", f"the image's cuda-compat {compat} serves branches {', '.join(f'R{b}' for b in served)}, "
                        f"not R{have[0]}: CUDA error 804 (forward compatibility not supported); upgrade the driver "
                        "to a listed branch or newer")
    return ("WARN", f"{what} via forward compatibility (compat {compat} over R{have[0]}): data-center GPUs of a "
                    "listed branch only; the job must load the image's compat folder first (dockerlaunch's device "
                    "mode does; the container toolkit's enable-cuda-compat hook does where the host's branch is older)")
