"""Which GPUs a host has and in what state, typed: read from nvidia-smi by gpu/smi.py (the probe's answer, or a
`--query-gpu` run for a build), judged by gpu/needs.py and gpu/health.py. None is "unknown" everywhere: a field the
driver does not know, or printed as `[N/A]`/`[Not Supported]`, is None and never an error that hides the others.
How a container reaches these GPUs (runtime, CDI, device nodes) is job/facts.GpuAccess, another question."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Compute capability by model name, for drivers that do not know the `compute_cap` field (R470 and older: "Field
# "compute_cap" is not a valid field to query", TensorRT-LLM#735, candle#733). NVIDIA's CUDA GPUs table
# (https://developer.nvidia.com/cuda-gpus); first match wins, so longer names come first.
MODEL_CAPS = (
    (r"\bGB300\b|\bB300\b", "10.3"), (r"\bGB200\b|\bB200\b|\bB100\b", "10.0"),
    (r"RTX PRO \d+ Blackwell|RTX 50\d\d", "12.0"),
    (r"\bGH200\b|\bH200\b|\bH100\b|\bH800\b|\bH20\b", "9.0"),
    (r"\bL40S?\b|\bL4\b|\bL20\b|RTX 40\d\d|RTX \d+ Ada|\bAda Generation\b", "8.9"),
    (r"\bA100\b|\bA800\b|\bA30\b", "8.0"),
    (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d\d|RTX A\d+", "8.6"),
    (r"\bV100\b|TITAN V\b", "7.0"),
    (r"\bT4\b|RTX 20\d\d|GTX 16\d\d|Quadro RTX|TITAN RTX", "7.5"),
    (r"\bP100\b", "6.0"), (r"\bP40\b|\bP4\b|GTX 10\d\d|Quadro P\d+|TITAN Xp?\b", "6.1"),
)


def cap_of_model(name: str | None) -> str | None:
    """The compute capability NVIDIA's table gives the model `name` ('NVIDIA A100-SXM4-80GB' -> '8.0'), or None."""
    for pattern, cap in MODEL_CAPS:
        if name and re.search(pattern, name):
            return cap
    return None


def parse_cap(text: str | None) -> str | None:
    """The one reading of a compute capability: '9.0' (nvidia-smi's form) -> '9.0'; anything else -> None."""
    text = (text or "").strip()
    return text if re.fullmatch(r"\d+\.\d+", text) else None


@dataclass(frozen=True)
class Gpu:
    index: int
    bus_id: str
    name: str
    compute_cap: str | None = None  # as nvidia-smi said it ('9.0'); None: the driver does not know the field
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    persistence: str | None = None  # Enabled / Disabled
    mig: str | None = None  # Enabled / Disabled
    ecc_volatile: int | None = None  # uncorrectable, since the driver loaded
    ecc_aggregate: int | None = None  # uncorrectable, over the GPU's life
    remap_pending: bool | None = None
    remap_failure: bool | None = None  # a row remap failed: the memory cannot be repaired in the field
    remap_banks_exhausted: int | None = None  # banks with no spare row left (histogram "None")
    fabric_state: str | None = None  # Completed / In Progress / Not Started; None: no NVSwitch fabric in NVML
    fabric_status: str | None = None  # Success, or NVML's error (Insufficient Resources, ...)
    fabric_health: str | None = None  # Healthy / Unhealthy (R570+ on Hopper and later)
    # PCIe link: generation, width, and the most of each the GPU can do
    pcie: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)
    throttle: int | None = None  # clocks_event_reasons.active, NVML's bit mask

    @property
    def arch(self) -> str | None:
        """The compute capability to build and judge for: nvidia-smi's, else the model's (see MODEL_CAPS)."""
        return self.compute_cap or cap_of_model(self.name)

    @property
    def arch_source(self) -> str:
        return "nvidia-smi" if self.compute_cap else "the model's name" if self.arch else "unknown"


@dataclass(frozen=True)
class Holder:
    """A process nvidia-smi lists on a GPU (`--query-compute-apps`): before a job starts, none of them is the job's."""

    bus_id: str
    pid: int
    owner: str  # '' where the probe could not tell
    used_mib: int | None  # None under MIG on drivers that print [N/A] per process
    name: str


@dataclass(frozen=True)
class Xid:
    """An NVRM Xid line of the kernel log: `[seconds since boot] NVRM: Xid (PCI:bus): code, ...`."""

    code: int
    bus: str
    at_s: float | None  # seconds since boot; None where the log line carries no time


@dataclass(frozen=True)
class GpuHost:
    driver: str | None
    cuda: str | None  # the newest CUDA the driver runs (`CUDA Version`, `CUDA UMD Version` on R610+)
    gpus: tuple[Gpu, ...] = ()
    holders: tuple[Holder, ...] = ()
    errors: tuple[str, ...] = ()  # an nvidia-smi command that failed: "the command: its line that says why"
    unknown_fields: tuple[str, ...] = ()  # --query-gpu fields this driver does not know (asked without them)
    xids: tuple[Xid, ...] | None = None  # None: the kernel log was unreadable
    driver_loaded_s: float | None = None  # when the driver module loaded, seconds since boot (from the same log)
    uptime_s: float | None = None
    nvswitches: int | None = None  # NVSwitch devices the host's driver lists; None: not asked
    fabric_manager: str | None = None  # systemd's word for nvidia-fabricmanager, `running`/`stopped` (ps), None
    vgpu_manager: bool = False  # `CUDA Version : Not Found`: a vGPU host (hypervisor) driver, no CUDA on the host

    def gpu(self, bus_id: str) -> Gpu | None:
        return next((g for g in self.gpus if same_bus(g.bus_id, bus_id)), None)


def same_bus(a: str, b: str) -> bool:
    """'00000000:3B:00.0' and '0000:3b:00.0' are one GPU; the kernel log's '0000:3b:00' names it too."""
    def norm(x: str) -> str:
        x = x.strip().upper()
        x = x if "." in x[-3:] else x + ".0"
        return x[-12:]
    return bool(a and b) and norm(a) == norm(b)
