"""Compatibility rules between pins, each with its upstream source; the facts they rest on, with how each was
checked, are in docs/STACKS.md ("Facts the rules rest on").

A rule sees one Stack and returns None or what is wrong. `error` rules stop `build` (unless
--force); `warn` rules are printed. Rules that need the installed tree run in `verify`.

Some rules also read the stack's lock (`Rule.lock`): what the image really installs, where the stack's pins
leave it open (the CUDA the index's torch is built for, the cuBLAS it pulls, which TE core wheel comes with
TE's torch binding). `check_stack(stack, lock=...)` runs them; without a lock, rules that need one are skipped.

Why one file: ~630 lines, but a list of independent rules, each a few lines with its source beside it; one
place to read every rule (and its evidence) matters more than the file's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from dockerlaunch import hints
from dockerlaunch.images.lock import CUDA_RUNTIME, Lock
from dockerlaunch.images.stacks import GitPin, Stack


def V(s: str) -> Version:
    return Version(s)


def minor(s: str) -> tuple[int, int]:
    v = V(s)
    return v.major, v.minor


# How a rule uses the stack's lock: not at all (check(stack)); when there is one (check(stack, lock), lock None
# without one); or only with one (check(stack, lock); skipped, no violation, without a lock).
NO_LOCK, USES_LOCK, NEEDS_LOCK = "no", "uses", "needs"


@dataclass(frozen=True)
class Rule:
    id: str
    rule: str
    source: str
    check: Callable[..., str | None]
    severity: str = "error"
    lock: str = NO_LOCK


@dataclass(frozen=True)
class Violation:
    stack: str
    rule: Rule
    detail: str

    def line(self) -> str:
        return f"{self.stack}: [{self.rule.id}] {self.detail} -- rule: {self.rule.rule} (source: {self.rule.source})"


# ---------------------------------------------------------------- helpers (pure)


def te_flash_attn_ceiling(te: str) -> str | None:
    """The newest flash-attn 2 that a TE release accepts (else TE silently disables FA2)."""
    m = minor(te)
    if (2, 3) <= m <= (2, 5):
        return "2.7.4.post1"
    if (2, 6) <= m <= (2, 9):
        return "2.8.1"
    if (2, 10) <= m <= (2, 18):
        return "2.8.3"  # so 2.8.3.post1/post2 already disable FA2
    return None


def te_flash_attn_below(te: str) -> str | None:
    """TE 2.19+ accept flash-attn 2 below a version (`< 2.8.4`) rather than up to one."""
    return "2.8.4" if minor(te) >= (2, 19) else None


def swift_caps(swift: str) -> dict[str, str]:
    """Upper bounds (exclusive) that an ms-swift release's own wheel METADATA puts on the framework pins. Its docs
    say otherwise in places (4.6 docs: peft < 0.20); pip enforces the wheel's."""
    m = minor(swift)
    if m == (4, 5):
        return {"transformers": "5.17", "peft": "0.21", "trl": "1.0"}
    if m == (4, 6):
        return {"transformers": "5.20", "peft": "0.21", "trl": "1.0"}
    return {}


def swift_megatron_branch(swift: str) -> tuple[int, int] | None:
    """The Megatron-LM core_r0.X branch that ms-swift 3.x clones (swift/megatron/init.py); None for 4.x."""
    v = V(swift)
    if v.major >= 4:
        return None
    if (3, 5) <= (v.major, v.minor) <= (3, 6):
        return (0, 12)
    if (3, 7) <= (v.major, v.minor) <= (3, 9):
        return (0, 13)
    if (v.major, v.minor) == (3, 10) or v.release[:3] == (3, 11, 0):
        return (0, 14)
    if V("3.11.1") <= v < V("3.13"):
        return (0, 15)
    return None


def swift_mcore_range(swift: str) -> tuple[str, str | None] | None:
    """[low, high) of megatron-core that an ms-swift line supports (its docs' tables)."""
    m = minor(swift)
    if (3, 7) <= m <= (3, 8):
        return "0.12", None
    if (3, 11) <= m <= (4, 0):
        return "0.12", "0.16"
    if m == (4, 1):
        return "0.12", "0.17"
    if m == (4, 2):
        return "0.15", "0.18"
    if m == (4, 4):  # the 4.4.x wheels' METADATA says >=0.15; mcore-bridge caps <0.20
        return "0.15", "0.20"
    if (4, 3) <= m <= (4, 6):
        return "0.16", "0.20"
    return None


APEX_WITH_AMP = {"e13873debc4699d39c6861074b9a3b2a02327f92"}


def swift_bridge_floor(swift: str) -> str | None:
    """mcore-bridge that ms-swift 4.4+ Megatron needs (its [megatron] extra)."""
    v = V(swift)
    if v >= V("4.5.3"):
        return "1.6.3"
    if v >= V("4.5"):
        return "1.6.2"
    if v >= V("4.4"):
        return "1.4.0"
    return None


def extra_version(stack: Stack, name: str) -> str | None:
    for pin in stack.extra:
        n, _, version = pin.partition("==")
        if n.lower().replace("_", "-") == name:
            return version
    return None


def ref_version(ref: str) -> tuple[int, int] | None:
    """`core_v0.13.0` / `core_r0.15.0` / `v0.13.1` -> (0, 13); a commit -> None (checked by verify)."""
    m = re.search(r"(\d+)\.(\d+)(\.\d+)?$", ref)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pin_version(pin: GitPin) -> tuple[int, int] | None:
    """A git pin's major.minor: from its ref, or for a commit from the tag it had when pinned (`tag:`)."""
    return ref_version(pin.ref) or (ref_version(pin.tag) if pin.tag else None)


def cu_suffix(text: str) -> str | None:
    """`2.9.0+cu128` / `.../whl/cu130` -> `12.8` / `13.0`."""
    m = re.search(r"cu(\d+)(\d)\b", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def lock_cuda(lock: Lock) -> tuple[str, str] | None:
    """CUDA major.minor of the torch a lock installs, and what in the lock says so: torch's own `+cuXYZ`; else the
    CUDA runtime wheel torch pulls (nvidia-cuda-runtime-cu12 12.8.90 -> 12.8; nvidia-cuda-runtime 13.0.96 -> 13.0;
    the suffixed ones first: on a made base the toolkit brings the unsuffixed CUDA 13 one); else cuda-toolkit (what
    torch >= 2.11 from PyPI depends on, exactly: torch 2.11.0 -> cuda-toolkit 13.0.2)."""
    torch = lock.get("torch")
    if torch and cu_suffix(torch.version):
        return cu_suffix(torch.version), f"the lock's torch {torch.version}"
    for name in [*CUDA_RUNTIME, "cuda-toolkit"]:
        e = lock.get(name)
        if e:
            return major_minor(e.version), f"the lock's {name} {e.version}"
    return None


def torch_cuda_from(stack: Stack, lock: Lock | None = None) -> tuple[str, str] | None:
    """CUDA major.minor of the torch the image installs, and where that was read: the pin's `+cuXYZ`, the lock
    (what is installed), then the torch_index_url's cuXYZ. None when none of them tells."""
    if cu_suffix(stack.torch):
        return cu_suffix(stack.torch), f"torch {stack.torch}"
    found = lock_cuda(lock) if lock is not None else None
    if found:
        return found
    if stack.torch_index_url and cu_suffix(stack.torch_index_url):
        return cu_suffix(stack.torch_index_url), f"torch_index_url {stack.torch_index_url}"
    return None


def torch_cuda(stack: Stack, lock: Lock | None = None) -> str | None:
    """CUDA major.minor of the torch wheel: from `+cuXYZ`, the lock (torch 2.11.0 from PyPI pulls
    nvidia-cuda-runtime 13.0.x: CUDA 13.0), or the index URL's cuXYZ. On a made base without a lock, the stack's
    cuda_toolkit: `stacks lock` refuses a torch whose CUDA runtime is not the stack's cuda (lock.cuda_problem), and
    the toolkit's major.minor is the stack's cuda (stacks.py)."""
    found = torch_cuda_from(stack, lock)
    if found:
        return found[0]
    if stack.base is not None and stack.cuda_toolkit:
        return major_minor(stack.cuda_toolkit)
    return None


def nvcc_cuda(stack: Stack) -> tuple[str, str] | None:
    """The nvcc that compiles apex, TE's binding and flash-attn: the base image's CUDA, or on a made base the PyPI
    cuda-toolkit release installed as /usr/local/cuda."""
    if stack.cuda_toolkit:
        return major_minor(stack.cuda_toolkit), f"cuda_toolkit {stack.cuda_toolkit}"
    if stack.cuda:
        return stack.cuda, "the base image's"
    return None


def torch_release(stack: Stack) -> tuple[int, int]:
    v = V(stack.torch.split("+")[0])
    return v.major, v.minor


def te_dev_pin(mcore: str) -> tuple[str, str] | None:
    return {(0, 14): ("2.6", "2.8"), (0, 15): ("2.9", "2.10"), (0, 16): ("2.9", "2.12")}.get(minor(mcore))


# ---------------------------------------------------------------- rules


def _fa_te(s: Stack) -> str | None:
    if not (s.transformer_engine and s.flash_attn):
        return None
    ceiling = te_flash_attn_ceiling(s.transformer_engine)
    if V(s.flash_attn) < V("2.1.1"):
        return f"flash-attn {s.flash_attn} is below TE's floor 2.1.1"
    if ceiling and V(s.flash_attn) > V(ceiling):
        return f"flash-attn {s.flash_attn} is above TE {s.transformer_engine}'s ceiling {ceiling}"
    below = te_flash_attn_below(s.transformer_engine)
    if below and V(s.flash_attn) >= V(below):
        return f"flash-attn {s.flash_attn} is not below {below}, TE {s.transformer_engine}'s bound"
    return None


def _python_jammy(s: Stack) -> str | None:
    if s.base_image and "ubuntu22.04" in s.base_image and s.python == "3.11":
        return ("Ubuntu 22.04's python3.11 package is 3.11.0~rc1 (jammy-updates universe), a release candidate: "
                "prefer a Python 3.12 stack on Ubuntu 24.04, or a base with a released 3.11")
    return None


def _swift_caps(s: Stack) -> str | None:
    for name, cap in swift_caps(s.ms_swift).items():
        have = getattr(s, name)
        if have and V(have) >= V(cap):
            return f"ms-swift {s.ms_swift} requires {name} < {cap}, the stack has {have}"
    return None


def _te_torch(s: Stack) -> str | None:
    if s.transformer_engine and V(s.torch.split("+")[0]) < V("2.1"):
        return f"TE {s.transformer_engine} needs torch >= 2.1, not {s.torch}"
    return None


def _python(s: Stack) -> str | None:
    py = V(s.python)
    if s.transformer_engine and V(s.transformer_engine) >= V("2.9") and py < V("3.10"):
        return f"TE {s.transformer_engine} needs python >= 3.10"
    if V(s.megatron_core) >= V("0.17") and py < V("3.12"):
        return f"megatron-core {s.megatron_core} needs python >= 3.12, not {s.python}"
    if V(s.megatron_core) >= V("0.13") and py < V("3.10"):
        return f"megatron-core {s.megatron_core} needs python >= 3.10"
    return None


def _mcore_torch(s: Stack) -> str | None:
    if V(s.megatron_core) >= V("0.15.3") and V(s.torch.split("+")[0]) < V("2.6.0"):
        return f"megatron-core {s.megatron_core} needs torch >= 2.6.0, not {s.torch}"
    return None


def _numpy(s: Stack) -> str | None:
    needs = V(s.megatron_core) < V("0.16") or V(s.ms_swift).major == 3
    if not needs:
        return None
    if s.numpy is None:
        return f"numpy must be pinned < 2.0 (megatron-core {s.megatron_core}, ms-swift {s.ms_swift})"
    if V(s.numpy) >= V("2.0"):
        return f"numpy {s.numpy} must be < 2.0 with megatron-core {s.megatron_core} / ms-swift {s.ms_swift}"
    return None


def _clone_branch(s: Stack) -> str | None:
    want = swift_megatron_branch(s.ms_swift)
    if want is None:
        return None
    if s.megatron_lm is None:
        return (f"ms-swift {s.ms_swift} clones Megatron-LM core_r{want[0]}.{want[1]}.0 at run time: "
                f"bake it (megatron_lm: ref core_v{want[0]}.{want[1]}.x) so MEGATRON_LM_PATH works offline")
    got = pin_version(s.megatron_lm)
    if got is not None and got != want:
        return (f"megatron_lm {s.megatron_lm.tag or s.megatron_lm.ref} is {got[0]}.{got[1]} "
                f"but ms-swift {s.ms_swift} expects {want[0]}.{want[1]}")
    return None


def _mcore_range(s: Stack) -> str | None:
    r = swift_mcore_range(s.ms_swift)
    if r is None:
        return None
    low, high = r
    mc = V(s.megatron_core)
    if mc < V(low) or (high and mc >= V(high)):
        return f"megatron-core {s.megatron_core} is outside [{low}, {high or 'any'}) for ms-swift {s.ms_swift}"
    return None


def _pip_vs_clone(s: Stack) -> str | None:
    if s.megatron_lm is None:
        return None
    got = pin_version(s.megatron_lm)
    if got is not None and got != minor(s.megatron_core):
        return (f"pip megatron-core {s.megatron_core} is {minor(s.megatron_core)[0]}.{minor(s.megatron_core)[1]} "
                f"but the clone {s.megatron_lm.tag or s.megatron_lm.ref} is {got[0]}.{got[1]}")
    return None


def _apex_cuda(s: Stack, lock: Lock | None = None) -> str | None:
    if not s.apex:
        return None
    nvcc, where = nvcc_cuda(s) or (s.cuda, "the stack's")
    found = torch_cuda_from(s, lock)
    if found is None:
        if torch_cuda(s, lock) is not None:
            return None  # a made base without its lock: torch is locked to cuda_toolkit (toolkit-torch reads it)
        return (f"cannot tell torch {s.torch}'s CUDA (set torch_index_url .../cuXYZ, or check with the stack's "
                f"lock) to compare with nvcc {nvcc}")
    tc, how = found
    if tc != nvcc:
        return f"apex builds with nvcc {nvcc} ({where}) but torch is built for CUDA {tc} ({how})"
    return None


def _te_cuda(s: Stack) -> str | None:
    if s.transformer_engine and s.cuda and V(s.cuda) < V("12.1"):
        return f"TE needs CUDA >= 12.1, the stack's CUDA is {s.cuda}"
    return None


def _te_dev_pin(s: Stack) -> str | None:
    if not s.transformer_engine:
        return None
    pin = te_dev_pin(s.megatron_core)
    if pin and not (V(pin[0]) <= V(s.transformer_engine) < V(pin[1])):
        return (f"megatron-core[dev] {s.megatron_core} pins TE [{pin[0]}, {pin[1]}), "
                f"the stack has {s.transformer_engine}")
    return None


def _apex_amp(s: Stack) -> str | None:
    if s.apex and V(s.transformers) < V("4.53.0") and s.apex.ref not in APEX_WITH_AMP:
        return (f"transformers {s.transformers} imports apex.amp at module level, but apex {s.apex.ref[:12]} "
                "is after its removal (use e13873debc4699d39c6861074b9a3b2a02327f92)")
    return None


def _pyarrow(s: Stack) -> str | None:
    if s.numpy is None or V(s.numpy) >= V("2.0"):
        return None
    pa = extra_version(s, "pyarrow")
    if pa is None or V(pa) >= V("26"):
        return f"numpy {s.numpy} needs pyarrow < 26 pinned in extra (pyarrow 26 requires NumPy 2 at import)"
    return None


def _te_cu13(s: Stack) -> str | None:
    if s.transformer_engine and s.cuda and V(s.cuda).major >= 13 and V(s.transformer_engine) < V("2.9"):
        return f"CUDA {s.cuda} needs TE >= 2.9 (first transformer-engine-cu13 core), not {s.transformer_engine}"
    return None


def _bridge(s: Stack) -> str | None:
    floor = swift_bridge_floor(s.ms_swift)
    if floor is None:
        return None
    have = extra_version(s, "mcore-bridge")
    if have is None or V(have) < V(floor):
        return f"ms-swift {s.ms_swift} Megatron needs mcore-bridge >= {floor} in extra (have {have})"
    return None


# ---------------------------------------------------------------- rules on the lock (the binaries' facts)

# TE's core wheels (libtransformer_engine.so and its kernels), one per CUDA major; linked to libcudart.so.<major>
# and libcublas.so.<major>.
TE_CORES = {"transformer-engine-cu12": 12, "transformer-engine-cu13": 13}
CUBLAS_FOR_TE = "13.2"  # first nvidia-cublas whose libcublasLt exports cublasLtGroupedMatrixLayoutInit_internal
CUBLAS_FOR_GROUPED_GEMM = "13.3"  # TE >= 2.14's grouped GEMM checks the run-time cuBLAS
CUBLAS_FIX = "13.3.0.5"


def locked_torch(s: Stack, lock: Lock) -> str:
    """The torch version the lock installs (the stack's pin, unless the lock is stale)."""
    torch = lock.get("torch")
    return torch.version if torch else s.torch


def _cublas_fix(s: Stack) -> str:
    return (f"add `overrides: [nvidia-cublas=={CUBLAS_FIX}]` to stack {s.name} in Dockerfiles/stacks.yaml, then run "
            + hints.dockerlaunch("stacks", "lock", "--stack", s.name, hint="lock.again"))


def _te_cu13_and_cublas(lock: Lock) -> tuple[str, str] | None:
    """(TE core version, nvidia-cublas version) for a lock with the CUDA 13 TE core and a CUDA 13 cuBLAS. The CUDA 12
    core is built against cuBLAS 12, where TE's cuBLASLt grouped GEMM is compiled out (`#if CUBLAS_VERSION >=
    ...`); a CUDA 13 core without a CUDA 13 cuBLAS is te-core-cuda's."""
    te, cublas = lock.get("transformer-engine-cu13"), lock.get("nvidia-cublas")
    if te is None or cublas is None:
        return None
    return te.version, cublas.version


def _te_cublas(s: Stack, lock: Lock) -> str | None:
    found = _te_cu13_and_cublas(lock)
    if found is None or V(found[0]) < V("2.13.0") or V(found[1]) >= V(CUBLAS_FOR_TE):
        return None
    te, cublas = found
    torch = locked_torch(s, lock)
    return (f"the lock's TE core transformer-engine-cu13 {te} needs nvidia-cublas >= {CUBLAS_FOR_TE} "
            f"(libtransformer_engine.so needs cublasLtGroupedMatrixLayoutInit_internal, which libcublasLt exports "
            f"from 13.2), the lock has nvidia-cublas {cublas} (torch {torch}'s exact pin unless overridden), so "
            f"`import transformer_engine.pytorch` fails with an undefined symbol: {_cublas_fix(s)}")


def _te_cublas_grouped(s: Stack, lock: Lock) -> str | None:
    found = _te_cu13_and_cublas(lock)
    if found is None or V(found[0]) < V("2.14") or V(found[1]) >= V(CUBLAS_FOR_GROUPED_GEMM):
        return None
    te, cublas = found
    return (f"TE {te}'s grouped GEMM (MoE experts) wants cuBLAS >= {CUBLAS_FOR_GROUPED_GEMM} at run time, the lock "
            f"has nvidia-cublas {cublas}: {_cublas_fix(s)}")


def _te_core_cuda(s: Stack, lock: Lock) -> str | None:
    cores = [(name, e) for name in TE_CORES if (e := lock.get(name))]
    found = torch_cuda_from(s, lock)
    if not cores or (found is None and s.cuda is None):
        return None
    tc, how = found or (s.cuda, "the stack's cuda")
    torch, torch_major = locked_torch(s, lock), int(tc.split(".")[0])
    for name, e in cores:
        if TE_CORES[name] != torch_major:
            return (f"the lock's TE core is {name} {e.version}, built for CUDA {TE_CORES[name]}, but torch "
                    f"{torch} is a CUDA {torch_major} build (CUDA {tc}: {how}; the stack's cuda {s.cuda}): "
                    f"libtransformer_engine.so would need libcudart.so.{TE_CORES[name]} and "
                    f"libcublas.so.{TE_CORES[name]} beside torch's CUDA {torch_major} libraries: use a torch built "
                    f"for CUDA {TE_CORES[name]}, or a TE release whose torch binding pulls the CUDA {torch_major} "
                    "core (transformer-engine-torch's sdist metadata names the core it needs)")
    return None


def _toolkit_torch(s: Stack, lock: Lock) -> str | None:
    if s.base is None or not s.cuda_toolkit:
        return None
    found = torch_cuda_from(s, lock)
    if found is None:
        return None  # no CUDA in the lock at all: lock.problems says it is not this stack's
    tc, how = found
    tk = major_minor(s.cuda_toolkit)
    if tc == tk:
        return None
    why = ("torch refuses to build an extension with an nvcc of another CUDA major"
           if tc.split(".")[0] != tk.split(".")[0] else
           "apex refuses an nvcc whose major.minor is not torch.version.cuda")
    toolkit = lock.get("cuda-toolkit")
    want = toolkit.version if toolkit and major_minor(toolkit.version) == tc else f"{tc}.x"
    return (f"cuda_toolkit {s.cuda_toolkit} (nvcc {tk}) but torch {locked_torch(s, lock)} is built for CUDA {tc} "
            f"({how}): {why}; "
            f"set cuda: \"{tc}\" and cuda_toolkit: {want} (torch's own cuda-toolkit), or pin a torch built for "
            f"CUDA {tk}")


# ---------------------------------------------------------------- C++20 (torch >= 2.15)

TORCH_CXX20 = (2, 15)  # its ATen headers: `#error C++20 or later compatible compiler is required to use ATen.`
FLASH_ATTN_CXX17_LAST = "2.8.3.post2"  # setup.py forces -std=c++17; no release after it yet
# apex commits compiled against torch 2.15 (docs/STACKS.md, Facts: the C++ standard): before f199212d (#1985,
# lerp) and 1bcf66dc (#2006, group norm's forced C++17) they fail.
APEX_CXX17 = {"e13873debc4699d39c6861074b9a3b2a02327f92", "10417aceddd7d5d05d7cbf7b0fc2daad1105f8b4"}
APEX_CXX20 = {"6424da3b4faa6c8f062da4a48c424fff3f02d42d"}


def _cxx17_torch(s: Stack) -> str | None:
    if torch_release(s) < TORCH_CXX20:
        return None
    why = f"torch {s.torch} builds extensions as C++20 and its headers refuse anything below"
    if s.flash_attn and V(s.flash_attn) <= V(FLASH_ATTN_CXX17_LAST):
        return (f"flash-attn {s.flash_attn}'s setup.py forces -std=c++17 but {why} (no flash-attn release "
                f"fixes it; the last checked is {FLASH_ATTN_CXX17_LAST}): use torch < 2.15")
    if s.apex and s.apex.ref in APEX_CXX17:
        return (f"apex {s.apex.ref[:8]} predates f199212d/1bcf66dc (group_norm forces -std=c++17, distributed "
                f"Adam's lerp is ambiguous in C++20) but {why}: pin apex 6424da3b4faa6c8f062da4a48c424fff3f02d42d "
                "or later")
    return None


def _cxx20_apex(s: Stack) -> str | None:
    if torch_release(s) < TORCH_CXX20 or not s.apex or s.apex.ref in APEX_CXX17 | APEX_CXX20:
        return None
    return (f"apex {s.apex.ref[:12]} is unchecked against torch {s.torch}'s C++20: commits before f199212d and "
            "1bcf66dc fail (e13873de, 10417ace), 6424da3b compiles")


RULES: list[Rule] = [
    Rule("fa-te", "flash-attn within TE's supported range (floor 2.1.1; ceiling by TE minor: 2.10-2.18 <= 2.8.3, "
         "2.19+ < 2.8.4)",
         "NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/utils.py "
         "FlashAttentionUtils.max_version", _fa_te),
    Rule("te-torch", "TE 2.3-2.18 needs torch >= 2.1", "NVIDIA/TransformerEngine build_tools/pytorch.py", _te_torch),
    Rule("python", "python >= 3.10 for TE >= 2.9 and megatron-core >= 0.13; >= 3.12 for megatron-core >= 0.17",
         "TE build_tools/utils.py; NVIDIA/Megatron-LM pyproject.toml, README", _python),
    Rule("mcore-torch", "megatron-core >= 0.15.3 needs torch >= 2.6.0",
         "NVIDIA/Megatron-LM pyproject.toml", _mcore_torch),
    Rule("numpy", "numpy < 2.0 with megatron-core <= 0.15.x and with ms-swift 3.x Megatron",
         "modelscope/ms-swift swift/megatron/argument/megatron_args.py require_version", _numpy),
    Rule("swift-clone",
         "ms-swift 3.x clones a fixed Megatron-LM branch unless MEGATRON_LM_PATH points at a baked clone",
         "modelscope/ms-swift swift/megatron/init.py; ms-swift #4866, #6033", _clone_branch),
    Rule("swift-mcore", "megatron-core within the range that the ms-swift release documents",
         "modelscope/ms-swift docs Megatron-SWIFT Quick-start (v3.7.3 .. v4.5.2)", _mcore_range),
    Rule("mcore-clone", "pip megatron-core major.minor == the baked Megatron-LM clone's",
         "ms-swift 3.x reads importlib.metadata.version('megatron-core') for gates (docs/STACKS.md, Facts: "
         "ms-swift 3.x and Megatron-LM)", _pip_vs_clone),
    Rule("apex-cuda", "apex's nvcc major.minor == torch.version.cuda",
         "NVIDIA/apex setup.py check_cuda_torch_binary_vs_bare_metal; ms-swift #4414", _apex_cuda, lock=USES_LOCK),
    Rule("te-cuda", "TE needs CUDA >= 12.1", "NVIDIA/TransformerEngine v2.10 docs/installation.rst", _te_cuda),
    Rule("apex-amp", "transformers <= 4.52.4 imports apex.amp at module level: apex must predate amp's removal",
         "NVIDIA/apex PR #1896; modelscope/ms-swift#4176; transformers 4.51.3 trainer.py", _apex_amp),
    Rule("numpy-pyarrow", "numpy < 2 needs pyarrow < 26", "pyarrow 26.0.1 import check (requires NumPy >= 2.0)",
         _pyarrow),
    Rule("te-cu13", "CUDA 13 images need TE >= 2.9, installed with the core_cu13 extra",
         "PyPI transformer-engine-cu13 (first release 2.9.0); TE 2.10+ METADATA extras", _te_cu13),
    Rule("swift-bridge",
         "ms-swift >= 4.4 Megatron needs mcore-bridge (>= 1.4.0; 4.5.0-4.5.2 >= 1.6.2; >= 4.5.3 >= 1.6.3)",
         "modelscope/ms-swift wheel METADATA [megatron] extra", _bridge),
    Rule("swift-caps", "the framework pins below the bounds of ms-swift's own wheel (4.5: transformers < 5.17; "
         "4.6: transformers < 5.20; both peft < 0.21, trl < 1.0)",
         "modelscope/ms-swift 4.5.3 and 4.6.0 wheel METADATA Requires-Dist", _swift_caps),
    Rule("python-jammy", "the base's own Python is a release, not a candidate",
         "archive.ubuntu.com dists/jammy-updates/universe Packages: python3.11 3.11.0~rc1-1~22.04.1 (2026-11-24)",
         _python_jammy, severity="warn"),
    Rule("te-mcore-dev", "megatron-core[dev]'s TE pin (advisory: ms-swift docs recommend other TE versions)",
         "NVIDIA/Megatron-LM pyproject.toml [dev] extra", _te_dev_pin, severity="warn"),
    Rule("cxx17-torch", "torch >= 2.15 builds extensions as C++20: no flash-attn <= 2.8.3.post2 (its setup.py forces "
         "-std=c++17), no apex before f199212d/1bcf66dc",
         "torch 2.15 ATen headers (#error C++20 or later ...; pytorch#176659); flash-attn 2.8.3/2.8.3.post2 setup.py; "
         "NVIDIA/apex #1985 (f199212d), #2006 (1bcf66dc); compiled here (docs/STACKS.md, Facts: the C++ standard)",
         _cxx17_torch),
    Rule("cxx20-apex", "with torch >= 2.15, an apex commit that was compiled as C++20 (6424da3b); others are "
         "unchecked", "docs/STACKS.md, Facts: the C++ standard (apex 10417ace fails, 6424da3b compiles against "
         "torch 2.15.0)",
         _cxx20_apex, severity="warn"),
    Rule("te-cublas", "the lock's TE core transformer-engine-cu13 >= 2.13.0 needs nvidia-cublas >= 13.2",
         "nm -D libtransformer_engine.so (needs cublasLtGroupedMatrixLayoutInit_internal) vs libcublasLt.so.13 "
         "(exports it from nvidia-cublas 13.2); NVIDIA/TransformerEngine#2504", _te_cublas, lock=NEEDS_LOCK),
    Rule("te-cublas-grouped", "TE >= 2.14's grouped GEMM wants nvidia-cublas >= 13.3 at run time",
         "NVIDIA/TransformerEngine transformer_engine/common/gemm/cublaslt_grouped_gemm.cu "
         "(CUBLAS_GROUPED_GEMM_VERSION 130300: 'requires cuBLAS 13.3+')", _te_cublas_grouped, severity="warn",
         lock=NEEDS_LOCK),
    Rule("te-core-cuda", "the lock's TE core wheel (transformer-engine-cu12/-cu13) is for torch's CUDA major",
         "PyPI transformer-engine-cu12/-cu13 (libtransformer_engine.so links libcudart.so.<major>, "
         "libcublas.so.<major>); transformer-engine-torch 2.16.1 sdist METADATA (transformer_engine_cu13)",
         _te_core_cuda, lock=NEEDS_LOCK),
    Rule("toolkit-torch", "on a made base, cuda_toolkit's major.minor == the CUDA of the locked torch",
         "NVIDIA/apex setup.py check_cuda_torch_binary_vs_bare_metal; torch.utils.cpp_extension (another CUDA "
         "major is refused); torch 2.11.0 METADATA (cuda-toolkit==13.0.2)", _toolkit_torch, lock=NEEDS_LOCK),
]


def check_stack(stack: Stack, rules: list[Rule] | None = None, lock: Lock | None = None) -> list[Violation]:
    """Every rule's violations for `stack`. With `lock` (lock.read of the stack), the rules that read it run too;
    without one they are skipped, no violation."""
    out = []
    for rule in rules or RULES:
        if rule.lock == NO_LOCK:
            detail = rule.check(stack)
        elif rule.lock == NEEDS_LOCK and lock is None:
            continue
        else:
            detail = rule.check(stack, lock)
        if detail:
            out.append(Violation(stack.name, rule, detail))
    return out


# ---------------------------------------------------------------- flash-attn prebuilt wheels


def flash_attn_wheel(stack: Stack) -> str | None:
    """File name of a prebuilt flash-attn wheel on its GitHub release, or None (then: source build).

    Prebuilt wheels exist for CUDA 12 only: 2.7.4.post1 for torch 2.2-2.6; 2.8.0.post2-2.8.2 for torch
    2.4-2.7; 2.8.3(.post1) for torch 2.4-2.8 (Dao-AILab/flash-attention setup.py get_wheel_url).
    """
    if not (stack.flash_attn and stack.cuda) or V(stack.cuda).major != 12:
        return None
    fa, t = V(stack.flash_attn), V(stack.torch.split("+")[0])
    tm = (t.major, t.minor)
    ok = (
        (fa == V("2.7.4.post1") and (2, 2) <= tm <= (2, 6))
        or (V("2.8.0.post2") <= fa <= V("2.8.2") and (2, 4) <= tm <= (2, 7))
        or (fa in (V("2.8.3"), V("2.8.3.post1")) and (2, 4) <= tm <= (2, 8))
    )
    if not ok:
        return None
    py = stack.python.replace(".", "")
    return f"flash_attn-{stack.flash_attn}+cu12torch{tm[0]}.{tm[1]}cxx11abiTRUE-cp{py}-cp{py}-linux_x86_64.whl"


def flash_attn_wheel_url(stack: Stack) -> str | None:
    name = flash_attn_wheel(stack)
    if not name:
        return None
    return f"https://github.com/Dao-AILab/flash-attention/releases/download/v{stack.flash_attn}/{name}"
