"""nvidia-smi's words -> gpu.host.GpuHost (pure). Tested on real outputs from public sources
(tests/data/nvidia-smi/real/, each with its address) and on the written cases beside them.

What the drivers print, as those outputs show it:
- `--query-gpu=F,... --format=csv,nounits` prints a header (`memory.used [MiB]`) and a line per GPU; a field the
  driver does not know fails the whole query with `Field "F" is not a valid field to query.` on stdout, exit 2
  (R470 and `compute_cap`; R465 and `remapped_rows.*`): the probe asks only what `--help-query-gpu` lists and drops a
  rejected field and asks again, so one unknown field costs only itself (docs/GPU.md has the table).
- unavailable values: `[N/A]`, bare `N/A` (`fabric.*`), empty, `[Not Supported]` (older drivers), `[Unknown Error]`,
  `[Insufficient Permissions]`, `[GPU requires reset]`, `[Requested functionality has been deprecated]` (R590).
- `-q`: `Driver Version`/`CUDA Version`, on R610 with ` [Deprecated; ...]` after them and `KMD Version`/`CUDA UMD
  Version` beside; a vGPU host says `CUDA Version : Not Found`; the key column is 42 or 55 wide (split at the first
  colon). Per GPU a `Fabric` block (State, Status, Health/Summary) on Hopper and later; an HGX A100 says N/A there
  even with the fabric manager running (bottlerocket#3873).
- an NVML/driver mismatch prints `Failed to initialize NVML: Driver/library version mismatch` and, since R535 or so,
  `NVML library version: N` (the library's, not the driver's), exit 18."""

from __future__ import annotations

import re

from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.gpu.host import Gpu, GpuHost, Holder, Xid, parse_cap, same_bus

NA = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU requires reset|Not Found|"
                r"Requested functionality has been deprecated)\]?$", re.I)

# what the probe asks, in this order; a field missing from --help-query-gpu is left out (gpu.host's None). Not
# driver_version: the driver is the host's, read once, from -q (parse_q)
QUERY = ("index", "pci.bus_id", "name", "memory.used", "memory.total", "persistence_mode",
         "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total", "compute_cap",
         "mig.mode.current", "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.histogram.none",
         "clocks_event_reasons.active", "clocks_throttle_reasons.active", "pcie.link.gen.current",
         "pcie.link.width.current", "pcie.link.gen.max", "pcie.link.width.max")
# older names nvidia-smi still answers to (R535 renamed clocks_throttle_reasons to clocks_event_reasons)
ALIASES = {"clocks_throttle_reasons.active": "clocks_event_reasons.active", "gpu_bus_id": "pci.bus_id",
           "gpu_name": "name"}


def value(text: str | None) -> str | None:
    text = (text or "").strip()
    return None if not text or NA.match(text) else text


def _int(text: str | None) -> int | None:
    v = value(text)
    m = re.match(r"^-?\d+(\.\d+)?", v or "")
    return int(float(m.group())) if m else None


def _on(text: str | None) -> str | None:
    v = value(text)
    return None if v is None else "Enabled" if v.lower() in ("enabled", "on", "yes") else "Disabled"


def _yes(text: str | None) -> bool | None:
    v = value(text)
    return None if v is None else v.lower() in ("yes", "1", "true")


def _hex(text: str | None) -> int | None:
    v = value(text)
    try:
        return int(v, 16) if v else None
    except ValueError:
        return None


def driver_version(text: str | None) -> str | None:
    """A driver version ('610.43.02 [Deprecated; ...]' -> '610.43.02'), or None (NVML errors print there)."""
    m = re.match(r"^\s*(\d+\.\d+(?:\.\d+)*)(\s|$)", text or "")
    return m.group(1) if m else None


def _field(name: str) -> str:
    name = re.sub(r"\s*\[[^\]]*\]$", "", name.strip())  # the unit nvidia-smi puts in the header: [MiB]
    return ALIASES.get(name, name)


def parse_query(lines: list[str]) -> tuple[Gpu, ...]:
    """`--query-gpu=... --format=csv,nounits` (header first) -> one Gpu per line, each column by its header name;
    a line that is not a GPU's (a warning a wrapper printed) is skipped."""
    header: list[str] | None = None
    gpus = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if header is None:
            if "index" in [_field(p) for p in parts]:
                header = [_field(p) for p in parts]
            continue
        if len(parts) != len(header):
            continue
        row = dict(zip(header, parts))
        if not (row.get("index") or "").isdigit() or not row.get("pci.bus_id"):
            continue
        gpus.append(Gpu(
            index=int(row["index"]), bus_id=row["pci.bus_id"], name=row.get("name", ""),
            compute_cap=parse_cap(value(row.get("compute_cap"))),
            memory_used_mib=_int(row.get("memory.used")), memory_total_mib=_int(row.get("memory.total")),
            persistence=_on(row.get("persistence_mode")), mig=_on(row.get("mig.mode.current")),
            ecc_volatile=_int(row.get("ecc.errors.uncorrected.volatile.total")),
            ecc_aggregate=_int(row.get("ecc.errors.uncorrected.aggregate.total")),
            remap_pending=_yes(row.get("remapped_rows.pending")), remap_failure=_yes(row.get("remapped_rows.failure")),
            remap_banks_exhausted=_int(row.get("remapped_rows.histogram.none")),
            pcie=(_int(row.get("pcie.link.gen.current")), _int(row.get("pcie.link.width.current")),
                  _int(row.get("pcie.link.gen.max")), _int(row.get("pcie.link.width.max"))),
            throttle=_hex(row.get("clocks_event_reasons.active"))))
    return tuple(gpus)


class CapsUnknown(DockerlaunchError):
    """nvidia-smi could not tell a GPU's compute capability; `missing`: there is no nvidia-smi at all; `no_gpu`: it
    listed no GPU (its driver not loaded, or none there)."""

    def __init__(self, why: str, missing: bool = False, no_gpu: bool = False):
        super().__init__(why)
        self.why, self.missing, self.no_gpu = why, missing, no_gpu


def parse_compute_caps(status: int | None, out: str) -> list[str]:
    """CAPS_QUERY's answer -> each GPU's compute capability ('9.0'), nvidia-smi's or else its model's (a driver
    without the compute_cap field). The one reading of compute capability, and its one policy for "unknown": a GPU
    whose capability neither tells, no GPU listed, or nvidia-smi's own error raise CapsUnknown (a build must not
    guess 9.0 for a GPU it could not read); callers say what that means where they are."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if status == 127 or any("nvidia-smi: not found" in line or "command not found" in line for line in lines):
        raise CapsUnknown("has no nvidia-smi (no NVIDIA driver)", missing=True)
    gpus = parse_query(lines)
    if not gpus:
        why = next((line for line in lines if re.search(r"fail|error|unable", line, re.I)),
                   lines[-1] if lines else f"exit status {status}, no GPU listed")
        raise CapsUnknown(f"nvidia-smi listed no GPU ({why})", no_gpu=True)
    unknown = [g for g in gpus if g.arch is None]
    if unknown:
        raise CapsUnknown(f"nvidia-smi did not tell the compute capability of GPU {unknown[0].index} "
                          f"({unknown[0].name}), and the model is not in NVIDIA's table")
    return [g.arch or "" for g in gpus]


# one query for every driver: the second form where the driver does not know compute_cap (R470)
CAPS_QUERY = ("nvidia-smi --query-gpu=index,pci.bus_id,name,compute_cap --format=csv,nounits 2>&1 || "
              "nvidia-smi --query-gpu=index,pci.bus_id,name --format=csv,nounits 2>&1")


def parse_q(lines: list[str]) -> tuple[str | None, str | None, dict[str, tuple[str | None, ...]]]:
    """The probe's filtered `nvidia-smi -q` -> (driver, CUDA version, {bus id: (fabric state, status, health)}): the
    one reading of the driver's version (`Driver Version`, `KMD Version` on R610+) and of the CUDA it runs."""
    driver = cuda = None
    fabric: dict[str, list[str | None]] = {}
    current = None
    for line in lines:
        key, _, val = line.partition(":")
        key = key.strip()
        if key in ("Driver Version", "KMD Version"):
            driver = driver or driver_version(val)
        elif key in ("CUDA Version", "CUDA UMD Version"):
            m = re.match(r"^\s*(\d+\.\d+)(\s|$)", val)
            cuda = cuda or (m.group(1) if m else None)
        elif line.startswith("GPU "):
            current = line[4:].strip()
            fabric[current] = [None, None, None]
        elif current and key in ("State", "Status", "Summary"):
            fabric[current][("State", "Status", "Summary").index(key)] = value(val)
    return driver, cuda, {k: tuple(v) for k, v in fabric.items()}


def count_gpus(listing: str) -> int:
    """`nvidia-smi -L` -> the GPUs it lists: a `GPU N: ...` line each (a MIG device is an indented line under its
    GPU's). The one reading of a listing here: a probe container's, which may have no shell; probe.sh counts its
    host's with the same rule (`grep -c '^GPU '`), where it runs."""
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def parse_holder(line: str, parents: dict[int, tuple[str, str, str]] | None = None) -> Holder | None:
    """probe.sh's `bus,pid,owner,used_memory,name` (the owner read with ps on the host, the name from /proc/PID/comm),
    with its parent's `real uid, effective uid, name` from `parents` (parse_parent)."""
    parts = line.split(",", 4)
    if len(parts) < 5 or not parts[1].strip().isdigit():
        return None
    pid = int(parts[1])
    ruid, euid, parent = (parents or {}).get(pid, ("", "", None))
    return Holder(bus_id=parts[0].strip(), pid=pid, owner=parts[2].strip(), used_mib=_int(parts[3]),
                  name=parts[4].strip(), parent_name=parent, parent_root=ruid == euid == "0")


def parse_parent(line: str) -> tuple[int, tuple[str, str, str]] | None:
    """probe.sh's `smi_parent=PID RUID EUID NAME`: a holder's parent, its real and effective uid and its name."""
    m = re.fullmatch(r"(\d+) (\d+) (\d+) ?(.*)", line, re.S)
    return (int(m.group(1)), (m.group(2), m.group(3), m.group(4).strip())) if m else None


def parse_xid(line: str) -> Xid | None:
    """probe.sh's `SECONDS BUS CODE` (SECONDS `-` where the log line has no time)."""
    m = re.match(r"^(-|\d+(?:\.\d+)?) (\S+) (\d+)$", line.strip())
    if not m:
        return None
    return Xid(code=int(m.group(3)), bus=m.group(2), at_s=None if m.group(1) == "-" else float(m.group(1)))


def _float(text: str | None) -> float | None:
    try:
        return float((text or "").strip()) if (text or "").strip() else None
    except ValueError:
        return None


def parse(kv: dict[str, list[str]]) -> GpuHost | None:
    """probe.sh's smi_*, xid and fabric lines -> GpuHost; None where it printed none (no nvidia-smi on the host, or
    a host that gets no GPUs: not asked). The host's GPU count is probe.sh's `gpus=`, read by probe.py alone."""
    one = lambda k: (kv.get(k) or [""])[0]  # noqa: E731
    if not any(k.startswith("smi_") for k in kv):
        return None
    driver, cuda, fabric = parse_q(kv.get("smi_q", []))
    gpus = []
    for g in parse_query(kv.get("smi_gpu", [])):
        state, status, health = next((v for bus, v in fabric.items() if same_bus(bus, g.bus_id)), (None, None, None))
        gpus.append(Gpu(**{**g.__dict__, "fabric_state": state, "fabric_status": status, "fabric_health": health}))
    xids = None
    if one("xid_readable"):
        xids = tuple(x for x in (parse_xid(line) for line in kv.get("xid", [])) if x is not None)
    nvswitches = one("nvswitches")
    parents = dict(p for p in (parse_parent(x) for x in kv.get("smi_parent", [])) if p is not None)
    return GpuHost(
        driver=driver, cuda=cuda, gpus=tuple(gpus),
        vgpu_manager=any(re.match(r"^CUDA Version\s*:\s*Not Found\s*$", q) for q in kv.get("smi_q", [])),
        holders=tuple(h for h in (parse_holder(x, parents) for x in kv.get("smi_app", [])) if h is not None),
        errors=tuple(kv.get("smi_error", [])), unknown_fields=tuple(dict.fromkeys(kv.get("smi_unknown", []))),
        xids=xids, driver_loaded_s=_float(one("driver_loaded")), uptime_s=_float(one("uptime")),
        nvswitches=int(nvswitches) if nvswitches.isdigit() else None, fabric_manager=one("fabric_manager") or None)
