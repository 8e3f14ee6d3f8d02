"""What probe.sh's nvidia-smi lines say about a host's driver and GPUs, typed (pure; tested on outputs written from
NVIDIA's documented formats, tests/data/nvidia-smi/, until real recordings replace them: scripts/record-nvidia-smi).

The formats: `nvidia-smi --help-query-gpu` and `--help-query-compute-apps` (CSV, `--format=csv,noheader,nounits`:
unsupported fields print `[N/A]` or `[Not Supported]`), and `nvidia-smi -q` (the "CUDA Version" header and, per
GPU, the "Fabric" block with State and Status: Completed/Success once the fabric manager has trained NVSwitch)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    bus_id: str
    name: str
    compute_cap: str | None  # '9.0'
    memory_used_mib: int | None
    memory_total_mib: int | None
    persistence: str | None  # Enabled / Disabled
    mig: str | None  # Enabled / Disabled
    ecc_volatile: int | None  # uncorrectable, since the driver loaded
    ecc_aggregate: int | None  # uncorrectable, over the GPU's life
    remap_pending: bool | None
    fabric_state: str | None = None  # Completed / In Progress / Not Started; None: no NVSwitch fabric
    fabric_status: str | None = None  # Success, or NVML's error


@dataclass(frozen=True)
class App:
    bus_id: str
    pid: int
    owner: str  # '' where the probe could not tell
    used_mib: int | None
    name: str


@dataclass(frozen=True)
class SmiFacts:
    driver: str | None
    cuda: str | None  # the newest CUDA the driver runs ("CUDA Version")
    gpus: tuple[Gpu, ...] = ()
    apps: tuple[App, ...] = ()
    errors: tuple[str, ...] = ()  # an nvidia-smi command that failed: "the command: its last line"
    xids: tuple[tuple[str, int], ...] | None = None  # (code, times) since boot; None: the kernel log was unreadable

    def gpu(self, bus_id: str) -> Gpu | None:
        return next((g for g in self.gpus if _bus(g.bus_id) == _bus(bus_id)), None)


NA = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU requires reset)\]?$", re.I)


def _value(text: str) -> str | None:
    text = text.strip()
    return None if not text or NA.match(text) else text


def _int(text: str) -> int | None:
    v = _value(text)
    try:
        return int(float(v)) if v is not None else None
    except ValueError:
        return None


def _bus(bus_id: str) -> str:
    """'00000000:3B:00.0' and '0000:3b:00.0' are one GPU: the last 12 characters, upper case."""
    return bus_id.strip().upper()[-12:]


def _on(text: str) -> str | None:
    v = _value(text)
    return None if v is None else "Enabled" if v.lower() in ("enabled", "on", "yes") else "Disabled"


def parse_gpu_line(line: str) -> Gpu | None:
    """One `--query-gpu=index,pci.bus_id,name,compute_cap,driver_version,memory.used,memory.total,persistence_mode,
    mig.mode.current,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,
    remapped_rows.pending` line."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 12 or not parts[0].isdigit():
        return None
    pending = _value(parts[11])
    return Gpu(index=int(parts[0]), bus_id=parts[1], name=parts[2], compute_cap=_value(parts[3]),
               memory_used_mib=_int(parts[5]), memory_total_mib=_int(parts[6]), persistence=_on(parts[7]),
               mig=_on(parts[8]), ecc_volatile=_int(parts[9]), ecc_aggregate=_int(parts[10]),
               remap_pending=None if pending is None else pending.lower() in ("yes", "1", "true"))


def parse_app_line(line: str) -> App | None:
    """probe.sh's `bus,pid,owner,used_memory,process_name` (the owner read with ps on the host)."""
    parts = line.split(",", 4)
    if len(parts) < 5 or not parts[1].strip().isdigit():
        return None
    return App(bus_id=parts[0].strip(), pid=int(parts[1]), owner=parts[2].strip(), used_mib=_int(parts[3]),
               name=parts[4].strip())


def parse_smi_q(lines: list[str]) -> tuple[str | None, str | None, dict[str, tuple[str | None, str | None]]]:
    """probe.sh's filtered `nvidia-smi -q` -> (driver, CUDA version, {bus id: (fabric state, fabric status)})."""
    driver = cuda = None
    fabric: dict[str, list[str | None]] = {}
    current = None
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if line.startswith("Driver Version"):
            driver = _driver(_value(value))
        elif line.startswith("CUDA Version"):
            cuda = _value(value) if re.match(r"^\s*\d+\.\d+\s*$", value) else None
        elif line.startswith("GPU "):
            current = _bus(line[4:])
            fabric[current] = [None, None]
        elif current and key in ("State", "Status"):
            fabric[current][0 if key == "State" else 1] = _value(value)
    return driver, cuda, {k: (v[0], v[1]) for k, v in fabric.items()}


def _driver(text: str | None) -> str | None:
    """A driver version, or None (nvidia-smi prints its NVML errors where the value would be)."""
    return text if text and re.match(r"^\d+\.\d+(\.\d+)*$", text.strip()) else None


def parse(kv: dict[str, list[str]]) -> SmiFacts | None:
    """probe.sh's smi_* and xid lines; None where the host has no nvidia-smi."""
    if kv.get("gpus", [""])[0] == "none" or not any(k.startswith("smi_") for k in kv):
        return None
    driver, cuda, fabric = parse_smi_q(kv.get("smi_q", []))
    gpus = []
    for line in kv.get("smi_gpu", []):
        g = parse_gpu_line(line)
        if g is None:
            continue
        state, status = fabric.get(_bus(g.bus_id), (None, None))
        if state is not None or status is not None:
            g = Gpu(**{**g.__dict__, "fabric_state": state, "fabric_status": status})
        gpus.append(g)
        driver = driver or _driver(_value(line.split(",")[4]))
    driver = _driver(driver) or _driver(_value((kv.get("smi_driver") or [""])[0]))
    apps = tuple(a for a in (parse_app_line(x) for x in kv.get("smi_app", [])) if a is not None)
    xids = None
    if kv.get("xid_readable"):
        found = []
        for line in kv.get("xid", []):
            m = re.match(r"^(\d+)\s+Xid \(PCI:[^)]*\): (\d+)", line.strip())
            if m:
                found.append((m.group(2), int(m.group(1))))
        merged: dict[str, int] = {}
        for code, n in found:
            merged[code] = merged.get(code, 0) + n
        xids = tuple(sorted(merged.items(), key=lambda kv_: int(kv_[0])))
    return SmiFacts(driver=driver, cuda=cuda, gpus=tuple(gpus), apps=apps, errors=tuple(kv.get("smi_error", [])),
                    xids=xids)
