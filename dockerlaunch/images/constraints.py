"""Compatibility rules between pins, each with its upstream source (../shared/research/stacks.md).

A rule sees one Stack and returns None or what is wrong. `error` rules stop `build` (unless
--force); `warn` rules are printed. Rules that need the installed tree run in `verify`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from dockerlaunch.images.stacks import Stack


def V(s: str) -> Version:
    return Version(s)


def minor(s: str) -> tuple[int, int]:
    v = V(s)
    return v.major, v.minor


@dataclass(frozen=True)
class Rule:
    id: str
    rule: str
    source: str
    check: Callable[[Stack], str | None]
    severity: str = "error"


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


def torch_cuda(stack: Stack) -> str | None:
    """CUDA major.minor of the torch wheel, from `+cuXYZ` or the index URL's cuXYZ."""
    for text in (stack.torch, stack.torch_index_url or ""):
        m = re.search(r"cu(\d+)(\d)\b", text)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


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
    got = ref_version(s.megatron_lm.ref)
    if got is not None and got != want:
        return (f"megatron_lm ref {s.megatron_lm.ref} is {got[0]}.{got[1]} "
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
    got = ref_version(s.megatron_lm.ref)
    if got is not None and got != minor(s.megatron_core):
        return (f"pip megatron-core {s.megatron_core} is {minor(s.megatron_core)[0]}.{minor(s.megatron_core)[1]} "
                f"but the clone {s.megatron_lm.ref} is {got[0]}.{got[1]}")
    return None


def _apex_cuda(s: Stack) -> str | None:
    if not s.apex:
        return None
    tc = torch_cuda(s)
    if tc is None:
        return f"cannot tell torch {s.torch}'s CUDA (set torch_index_url .../cuXYZ) to compare with nvcc {s.cuda}"
    if tc != s.cuda:
        return f"apex builds with nvcc {s.cuda} but torch is built for CUDA {tc}"
    return None


def _te_cuda(s: Stack) -> str | None:
    if s.transformer_engine and s.cuda and V(s.cuda) < V("12.1"):
        return f"TE needs CUDA >= 12.1, the base has {s.cuda}"
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
         "ms-swift 3.x reads importlib.metadata.version('megatron-core') for gates (stacks.md rule 9)", _pip_vs_clone),
    Rule("apex-cuda", "apex's nvcc major.minor == torch.version.cuda",
         "NVIDIA/apex setup.py check_cuda_torch_binary_vs_bare_metal; ms-swift #4414", _apex_cuda),
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
]


def check_stack(stack: Stack, rules: list[Rule] | None = None) -> list[Violation]:
    out = []
    for rule in rules or RULES:
        detail = rule.check(stack)
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
