"""What CUDA code needs of a GPU and its driver: one place for the rules verify, build and doctor all apply. The
tables are NVIDIA's, each row as published (tests/data/nvidia-tables/ holds the text each was read from, and a
test per row); docs/GPU.md says which and up to when."""

from __future__ import annotations

import re


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); '' -> ()."""
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


# NVIDIA's CUDA Toolkit release notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions" (the driver each
# toolkit release shipped with: Linux x86_64, Windows x86_64), as published with CUDA 13.2 GA:
# https://docs.nvidia.com/cuda/archive/13.2.0/cuda-toolkit-release-notes/index.html (read 2026-11-27; the rows of
# 13.2 Update 1 and later could not be read: tests/data/nvidia-tables/cuda-toolkit-driver-versions.txt).
TOOLKIT_DRIVERS = (
    ("13.2 GA", "595.45.04", None), ("13.1 Update 1", "590.48.01", None), ("13.1 GA", "590.44.01", None),
    ("13.0 Update 2", "580.95.05", None), ("13.0 Update 1", "580.82.07", None), ("13.0 GA", "580.65.06", None),
    ("12.9 Update 1", "575.57.08", "576.57"), ("12.9 GA", "575.51.03", "576.02"),
    ("12.8 Update 1", "570.124.06", "572.61"), ("12.8 GA", "570.26", "570.65"),
    ("12.6 Update 3", "560.35.05", "561.17"), ("12.6 Update 2", "560.35.03", "560.94"),
    ("12.6 Update 1", "560.35.03", "560.94"), ("12.6 GA", "560.28.03", "560.76"),
    ("12.5 Update 1", "555.42.06", "555.85"), ("12.5 GA", "555.42.02", "555.85"),
    ("12.4 Update 1", "550.54.15", "551.78"), ("12.4 GA", "550.54.14", "551.61"),
    ("12.3 Update 1", "545.23.08", "546.12"), ("12.3 GA", "545.23.06", "545.84"),
    ("12.2 Update 2", "535.104.05", "537.13"), ("12.2 Update 1", "535.86.09", "536.67"),
    ("12.2 GA", "535.54.03", "536.25"), ("12.1 Update 1", "530.30.02", "531.14"), ("12.1 GA", "530.30.02", "531.14"),
    ("12.0 Update 1", "525.85.12", "528.33"), ("12.0 GA", "525.60.13", "527.41"), ("11.8 GA", "520.61.05", "520.06"),
    ("11.7 Update 1", "515.48.07", "516.31"), ("11.7 GA", "515.43.04", "516.01"),
    ("11.6 Update 2", "510.47.03", "511.65"), ("11.6 Update 1", "510.47.03", "511.65"),
    ("11.6 GA", "510.39.01", "511.23"), ("11.5 Update 2", "495.29.05", "496.13"),
    ("11.5 Update 1", "495.29.05", "496.13"), ("11.5 GA", "495.29.05", "496.04"),
    ("11.4 Update 4", "470.82.01", "472.50"), ("11.4 Update 3", "470.82.01", "472.50"),
    ("11.4 Update 2", "470.57.02", "471.41"), ("11.4 Update 1", "470.57.02", "471.41"),
    ("11.4.0 GA", "470.42.01", "471.11"), ("11.3.1 Update 1", "465.19.01", "465.89"),
    ("11.3.0 GA", "465.19.01", "465.89"), ("11.2.2 Update 2", "460.32.03", "461.33"),
    ("11.2.1 Update 1", "460.32.03", "461.09"), ("11.2.0 GA", "460.27.03", "460.82"),
    ("11.1.1 Update 1", "455.32", "456.81"), ("11.1 GA", "455.23", "456.38"),
    ("11.0.3 Update 1", "450.51.06", "451.82"), ("11.0.2 GA", "450.51.05", "451.48"),
    ("11.0.1 RC", "450.36.06", "451.22"), ("10.2.89", "440.33", "441.22"),
    ("10.1 (10.1.105 general release, and updates)", "418.39", "418.96"), ("10.0.130", "410.48", "411.31"),
    ("9.2 (9.2.148 Update 1)", "396.37", "398.26"), ("9.2 (9.2.88)", "396.26", "397.44"),
    ("9.1 (9.1.85)", "390.46", "391.29"), ("9.0 (9.0.76)", "384.81", "385.54"),
    ("8.0 (8.0.61 GA2)", "375.26", "376.51"), ("8.0 (8.0.44)", "367.48", "369.30"),
    ("7.5 (7.5.16)", "352.31", "353.66"), ("7.0 (7.0.28)", "346.46", "347.62"),
)
TABLES_READ = "2026-11-27"  # when the tables above and below were read from NVIDIA's pages


def release_cuda(label: str) -> str:
    """A Table 3 label's CUDA major.minor: '13.0 Update 2' -> '13.0', '11.4.0 GA' -> '11.4'."""
    return ".".join(re.match(r"(\d+)\.(\d+)", label).groups())


def _ga_drivers() -> dict[str, str]:
    """major.minor -> the Linux driver of its first release (its GA row; else, where Table 3 names none, the
    release with the oldest driver)."""
    out: dict[str, tuple[bool, tuple[int, ...], str]] = {}
    for label, linux, _ in TOOLKIT_DRIVERS:
        key = (" GA" not in f" {label}", version_tuple(linux), linux)
        mm = release_cuda(label)
        if mm not in out or key < out[mm]:
            out[mm] = key
    return {mm: v[2] for mm, v in out.items()}


# Minor-version compatibility (Table 2 of the same notes, and the CUDA Compatibility guide's
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): the driver branches that run
# every release of a CUDA major, short of PTX JIT of newer code and new APIs. (first branch, first branch past it)
MINOR_COMPAT = {"13": (580, None), "12": (525, 580), "11": (450, 525)}
# What an image of a CUDA major needs of the driver: its first GA's driver (Table 3: "CUDA 13.0 GA", "CUDA 12.0 GA");
# for 11.x the driver Table 2's footnote *** names for minor-version compatibility across 11.x.
DRIVER_MIN = {"13": "580.65.06", "12": "525.60.13", "11": "450.80.02"}
# The driver each toolkit major.minor shipped with (its GA row of Table 3): below it, minor-version compatibility.
TOOLKIT_DRIVER = _ga_drivers()
# The newest CUDA each driver branch runs without forward compatibility: what nvidia-smi's "CUDA Version" says for
# it. From Table 3 (the branch of each toolkit's driver; R580 the 13.0 GA's, R595 the 13.2 GA's, ...) and, where
# Table 3 as read stops, from the CUDA of each branch's own cuda-compat in NVIDIA's driver manifests
# (https://developer.download.nvidia.com/compute/nvidia-driver/redist/redistrib_610.57.04.json: 13.3,
# .../redistrib_620.70.06.json: 13.5; tests/data/nvidia-tables/driver-cuda-compat-manifests.txt). Not read: R615/R616.
BRANCH_CUDA_COMPAT = ((620, "13.5"), (610, "13.3"))


def _branch_cuda() -> tuple[tuple[int, str], ...]:
    """(branch, the newest CUDA it runs), newest branch first."""
    newest: dict[int, str] = dict(BRANCH_CUDA_COMPAT)
    for label, linux, _ in TOOLKIT_DRIVERS:
        branch, cuda = version_tuple(linux)[0], release_cuda(label)
        if branch not in newest or version_tuple(cuda) > version_tuple(newest[branch]):
            newest[branch] = cuda
    return tuple(sorted(newest.items(), reverse=True))


BRANCH_CUDA = _branch_cuda()


def branch_cuda(driver: str | None) -> tuple[str | None, bool]:
    """(the newest CUDA the tables say this driver's branch runs, whether its branch is in them): '580.95.05' ->
    ('13.0', True); '615.20' -> ('13.3', False) (R610's, the newest branch below it: a lower bound)."""
    have = version_tuple(driver)
    if not have:
        return None, False
    for branch, cuda in BRANCH_CUDA:
        if have[0] >= branch:
            return cuda, have[0] == branch
    return None, False


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
                   own: str | None = None, host_cuda: str | None = None) -> tuple[str, str] | None:
    """(verdict, why) when a host's driver cannot run (FAIL) or may not fully run (WARN) an image of CUDA `cuda`
    ('13.0'); None when it runs it. Who decides, first to last: the image's own word (`need`/`own`: its labels
    driver-min and driver-toolkit), then the CUDA the host's nvidia-smi reports (`host_cuda`: its "CUDA Version",
    the newest CUDA this driver runs), then NVIDIA's tables above. `has_compat`: the image ships cuda-compat
    (forward compatibility, data-center GPUs only), which lets an older branch run a newer CUDA: WARN, never PASS."""
    have = version_tuple(driver)
    want = version_tuple(cuda)[:2]
    if not have or len(want) < 2:
        return None
    mm, major = f"{want[0]}.{want[1]}", str(want[0])
    host = version_tuple(host_cuda)[:2]
    runs = f"{host[0]}.{host[1]}" if len(host) == 2 else branch_cuda(driver)[0]
    if need and have < version_tuple(need):
        return _too_old(cuda, runs, f"R{version_tuple(need)[0]}+", has_compat)
    if own and have < version_tuple(own):
        return ("WARN", f"runs {cuda} through minor-version compatibility (the toolkit's own driver is {own}+): "
                        "PTX JIT of newer code and the newest APIs may not work")
    if len(host) == 2:
        if host[0] < want[0]:
            floor = DRIVER_MIN.get(major)
            return _too_old(cuda, runs, f"R{version_tuple(floor)[0]}+" if floor else f"a driver of CUDA {major}.x",
                            has_compat)
        if host[0] > want[0] or host >= want:
            return None
        return ("WARN", f"runs CUDA {runs} (nvidia-smi), older than the image's {cuda}: it runs through "
                        f"minor-version compatibility, short of PTX JIT of code newer than {runs} and APIs new in "
                        f"{cuda}; a driver of CUDA {mm}+ runs all of it")
    floor = DRIVER_MIN.get(major) or (TOOLKIT_DRIVER.get(mm) if want[0] < 11 else None)
    if floor is None:
        known = max(DRIVER_MIN, key=int)
        return ("WARN", f"CUDA {major}.x is in none of NVIDIA's tables as read {TABLES_READ} (they end at "
                        f"{known}.x) and nvidia-smi did not report the CUDA this driver runs (<= {runs or '?'} by "
                        "the tables): it may not run the image")
    if have < version_tuple(floor):
        return _too_old(cuda, runs, f"R{version_tuple(floor)[0]}+", has_compat)
    toolkit = TOOLKIT_DRIVER.get(mm)
    if toolkit:
        if have < version_tuple(toolkit):
            return ("WARN", f"runs {cuda} through minor-version compatibility (the toolkit's own driver is "
                            f"{toolkit}+): PTX JIT of newer code and the newest APIs may not work")
        return None
    # a release newer than Table 3 as read: the branch table says what this driver runs
    if runs and version_tuple(runs) >= want:
        return None
    if branch_cuda(driver)[1]:
        return ("WARN", f"R{have[0]} runs CUDA {runs} (NVIDIA's tables; nvidia-smi did not report it): the image's "
                        f"{cuda} runs through minor-version compatibility, short of PTX JIT of newer code and the "
                        "newest APIs")
    return ("WARN", f"R{have[0]} is in none of NVIDIA's tables as read {TABLES_READ} (the branch below it runs "
                    f"{runs or '?'}) and nvidia-smi did not report its CUDA: the image's {cuda} may run only "
                    "through minor-version compatibility, short of PTX JIT of newer code and the newest APIs")


def _too_old(cuda: str, runs: str | None, needs: str, has_compat: bool) -> tuple[str, str]:
    if has_compat:
        return ("WARN", f"runs CUDA <= {runs or '?'}; the image needs {cuda} ({needs}) and ships cuda-compat: "
                        "forward compatibility holds only on data-center GPUs of a supported branch")
    return ("FAIL", f"runs CUDA <= {runs or 'none of 12.x/13.x'}; the image needs {cuda} ({needs})")


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
