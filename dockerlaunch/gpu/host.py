"""Which GPUs a host has and in what state, typed: read from nvidia-smi by gpu/smi.py (the probe's answer, or a
`--query-gpu` run for a build), judged by gpu/needs.py and gpu/health.py. None is "unknown" everywhere: a field the
driver does not know, or printed as `[N/A]`/`[Not Supported]`, is None and never an error that hides the others.
How a container reaches these GPUs (runtime, CDI, device nodes) is gpu/access.py's question."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Compute capability by model name, for drivers without the `compute_cap` field (R470 and older: "Field
# "compute_cap" is not a valid field to query", TensorRT-LLM#735, candle#733). NVIDIA's "CUDA GPU Compute Capability"
# table, https://developer.nvidia.com/cuda-gpus, read 2026-11-27 (its rows below 8.6's "NVIDIA RTX A2000" from a copy
# of it: tests/data/nvidia-tables/cuda-gpus.txt), each model as NVIDIA writes it.
CUDA_GPUS = {
    "12.1": ("NVIDIA GB10 (DGX Spark)",),
    "12.0": (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "NVIDIA RTX PRO 5000 Blackwell",
        "NVIDIA RTX PRO 4500 Blackwell", "NVIDIA RTX PRO 4000 Blackwell", "NVIDIA RTX PRO 4000 Blackwell SFF Edition",
        "NVIDIA RTX PRO 2000 Blackwell", "GeForce RTX 5090", "GeForce RTX 5080", "GeForce RTX 5070 Ti",
        "GeForce RTX 5070", "GeForce RTX 5060 Ti", "GeForce RTX 5060", "GeForce RTX 5050",
    ),
    "11.0": ("Jetson T5000", "Jetson T4000"),
    "10.3": ("NVIDIA GB300", "NVIDIA B300"),
    "10.0": ("NVIDIA GB200", "NVIDIA B200"),
    "9.0": ("NVIDIA GH200", "NVIDIA H200", "NVIDIA H100"),
    "8.9": (
        "NVIDIA L4", "NVIDIA L40", "NVIDIA L40S", "NVIDIA RTX 6000 Ada", "NVIDIA RTX 5000 Ada", "NVIDIA RTX 4500 Ada",
        "NVIDIA RTX 4000 Ada", "NVIDIA RTX 4000 SFF Ada", "NVIDIA RTX 2000 Ada", "GeForce RTX 4090", "GeForce RTX 4080",
        "GeForce RTX 4070 Ti", "GeForce RTX 4070", "GeForce RTX 4060 Ti", "GeForce RTX 4060", "GeForce RTX 4050",
    ),
    "8.7": ("Jetson AGX Orin", "Jetson Orin NX", "Jetson Orin Nano"),
    "8.6": (
        "NVIDIA A40", "NVIDIA A10", "NVIDIA A16", "NVIDIA A2", "NVIDIA RTX A6000", "NVIDIA RTX A5000",
        "NVIDIA RTX A4000", "NVIDIA RTX A3000", "NVIDIA RTX A2000", "GeForce RTX 3090 Ti", "GeForce RTX 3090",
        "GeForce RTX 3080 Ti", "GeForce RTX 3080", "GeForce RTX 3070 Ti", "GeForce RTX 3070", "GeForce RTX 3060 Ti",
        "GeForce RTX 3060", "GeForce RTX 3050 Ti", "GeForce RTX 3050",
    ),
    "8.0": ("NVIDIA A100", "NVIDIA A30"),
    "7.5": (
        "NVIDIA T4", "QUADRO RTX 8000", "QUADRO RTX 6000", "QUADRO RTX 5000", "QUADRO RTX 4000", "QUADRO RTX 3000",
        "QUADRO  T2000", "NVIDIA T1200", "NVIDIA T1000", "NVIDIA T600", "NVIDIA T500", "NVIDIA T400",
        "GeForce GTX 1650 Ti", "NVIDIA TITAN RTX", "GeForce RTX 2080 Ti", "GeForce RTX 2080", "GeForce RTX 2070",
        "GeForce RTX 2060",
    ),
}
# NVIDIA's "Legacy CUDA GPU Compute Capability" table, https://developer.nvidia.com/cuda-legacy-gpus, read 2026-11-27
# down to 5.0's "GeForce 940M" (tests/data/nvidia-tables/cuda-gpus.txt).
CUDA_LEGACY_GPUS = {
    "7.2": ("Jetson AGX Xavier", "Jetson Xavier NX"),
    "7.0": ("NVIDIA V100", "Quadro GV100", "NVIDIA TITAN V"),
    "6.2": ("Jetson TX2",),
    "6.1": (
        "Tesla P40", "Tesla P4", "Quadro P6000", "Quadro P5200", "Quadro P5000", "Quadro P4200", "Quadro P4000",
        "Quadro P3200", "Quadro P3000", "Quadro P2200", "Quadro P2000", "Quadro P1000", "Quadro P620", "Quadro P600",
        "Quadro P500", "Quadro P400", "P620", "P520", "NVIDIA TITAN Xp", "NVIDIA TITAN X", "GeForce GTX 1080 Ti",
        "GeForce GTX 1080", "GeForce GTX 1070 Ti", "GeForce GTX 1070", "GeForce GTX 1060", "GeForce GTX 1050",
    ),
    "6.0": ("Tesla P100", "Quadro GP100"),
    "5.3": ("Jetson Nano",),
    "5.2": (
        "Tesla M60", "Tesla M40", "Quadro M6000 24GB", "Quadro M6000", "Quadro M5000", "Quadro M4000", "Quadro M2000",
        "Quadro M5500M", "Quadro M2200", "Quadro M620", "GeForce GTX TITAN X", "GeForce GTX 980 Ti", "GeForce GTX 980",
        "GeForce GTX 970", "GeForce GTX 960", "GeForce GTX 950", "GeForce GTX 980M", "GeForce GTX 970M",
        "GeForce GTX 965M", "GeForce 910M",
    ),
    "5.0": (
        "Quadro K2200", "Quadro K1200", "Quadro K620", "Quadro M1200", "Quadro M520", "Quadro M5000M", "Quadro M4000M",
        "Quadro M3000M", "Quadro M2000M", "Quadro M1000M", "Quadro K620M", "Quadro M600M", "Quadro M500M",
        "NVIDIA NVS 810", "GeForce GTX 750 Ti", "GeForce GTX 750", "GeForce GTX 960M", "GeForce GTX 950M",
        "GeForce 940M",
    ),
}
# Names nvidia-smi prints that NVIDIA's tables word otherwise ("Jetson T5000" prints "NVIDIA Thor"), and models they
# omit: public nvidia-smi output, not NVIDIA's tables (tests/data/nvidia-tables/nvidia-smi-names.txt says whose).
SMI_NAMES = {
    "12.1": ("NVIDIA GB10",), "11.0": ("NVIDIA Thor",), "9.0": ("NVIDIA H20", "NVIDIA H800"), "8.9": ("NVIDIA L20",),
    "8.6": ("NVIDIA A10G",), "8.0": ("NVIDIA A800",),
}


def model_tokens(name: str) -> tuple[str, ...]:
    """A model name as words to match: lower case, no parenthesis, no 'NVIDIA'/'Tesla' (nvidia-smi prints 'Tesla
    T4' for NVIDIA's 'NVIDIA T4', 'NVIDIA GeForce RTX 4090' for its 'GeForce RTX 4090')."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"\([^)]*\)", " ", name.lower()))
    return tuple(w for w in words if w not in ("nvidia", "tesla"))


# every name, longest first: the most specific one that matches wins ("GeForce GTX TITAN X" over "NVIDIA TITAN X")
_BY_NAME = sorted(((model_tokens(n), cap) for table in (CUDA_GPUS, CUDA_LEGACY_GPUS, SMI_NAMES)
                   for cap, names in table.items() for n in names), key=lambda t: -len(t[0]))


def cap_of_model(name: str | None) -> str | None:
    """The compute capability the tables give the model `name` ('NVIDIA A100-SXM4-80GB' -> '8.0'): the longest
    table name whose words stand together in it ('Quadro RTX 5000' is not 'NVIDIA RTX 5000 Ada'), or None."""
    have = model_tokens(name or "")
    for words, cap in _BY_NAME:
        if any(have[i:i + len(words)] == words for i in range(len(have) - len(words) + 1)):
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
        """The compute capability to build and judge for: nvidia-smi's, else the model's (cap_of_model)."""
        return self.compute_cap or cap_of_model(self.name)

    @property
    def arch_source(self) -> str:
        return "nvidia-smi" if self.compute_cap else "the model's name" if self.arch else "unknown"


@dataclass(frozen=True)
class Holder:
    """A process nvidia-smi lists on a GPU (`--query-compute-apps`): before a job starts, none of them is the job's.
    Its name and its parent's are the kernel's (/proc/PID/comm, 15 characters at most), read on the host by the
    probe; never nvidia-smi's process_name, the command line its owner writes."""

    bus_id: str
    pid: int
    owner: str  # '' where the probe could not tell
    used_mib: int | None  # None under MIG on drivers that print [N/A] per process
    name: str  # '' where the probe could not read it
    parent_name: str | None = None  # the parent's /proc/PID/comm; None: the parent was not read
    parent_root: bool = False  # the parent runs as root (real and effective uid 0, /proc/PID/status)


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
