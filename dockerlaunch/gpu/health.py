"""Whether a host's GPUs are fit to start a job on: one `gpu health` finding (pure). Every rule carries its source.

- Holders: before a job starts, no process on its GPUs is the job's. A process holding more than FOREIGN_MIB is a
  leftover, MPS's server aside: a process of that name (the kernel's, /proc/PID/comm: 15 characters) whose parent
  is root's nvidia-cuda-mps-control (the control daemon starts each server as its client's uid; any user can name
  a process so, none can make root's daemon its parent). Under MIG, drivers before R590 print `[N/A]` per process:
  the GPU's own memory.used is what the processes on it hold
  (tests/data/nvidia-smi/real/h100-sxm-mig-590.48.01-exporter-load).
- ECC and row remapping (NVML: nvmlDeviceGetRemappedRows, nvmlRowRemapperHistogramValues_t): an uncorrectable
  error since the driver loaded, a pending remap, a remap that failed, or a bank with no reserved row left fail.
- NVSwitch fabric: NVML reports it on Hopper and later (State Completed / Status Success, Health Summary); an HGX
  A100 says N/A even with the fabric manager running (bottlerocket#3873), so there the manager's own state is read.
- XIDs (NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors): FATAL_XIDS need a reset or a drain; one is a
  FAIL only when it is newer than the driver's load (a reboot or module reload clears it), or, where the user sets a
  window (diagnostics.xid_window), inside it; else a WARN: an old XID must not block a GPU forever. Others (13,
  31, 43, 45: an application's fault) WARN. A fatal one on a bus none of the host's GPUs is on WARNs naming the
  bus: it says nothing of the GPUs a job would get (the probe reads only lines the NVIDIA module printed).
- Clock event reasons (NVML nvmlClocksEventReasons): thermal and power-brake slowdowns WARN naming the GPU."""

from __future__ import annotations

from dockerlaunch.gpu.host import Gpu, GpuHost, Holder, same_bus
from dockerlaunch.gpu.needs import gpus_named
from dockerlaunch.verdict import Finding, Verdict

FOREIGN_MIB = 1024  # GPU memory a process that is not the job's may hold before the GPU counts as taken
# MPS's server and its control daemon, as the kernel names them (/proc/PID/comm keeps 15 characters: both
# nvidia-cuda-mps-server and nvidia-cuda-mps-control are nvidia-cuda-mps there)
MPS = "nvidia-cuda-mps-server"[:15]
MPS_CONTROL = "nvidia-cuda-mps-control"[:15]
# 48 double-bit ECC; 63/64 row remapper event/failure; 74 NVLink; 79 fallen off the bus; 92-95 ECC rate and
# (un)contained errors; 119/120 GSP timeout/error
FATAL_XIDS = {48: "double-bit ECC error", 63: "row remapping event", 64: "row remapping failure", 74: "NVLink error",
              79: "GPU has fallen off the bus", 92: "high single-bit ECC rate", 93: "non-fatal violation of the "
              "provisioned InfoROM wear limit", 94: "contained ECC error", 95: "uncontained ECC error",
              119: "GSP RPC timeout", 120: "GSP error"}
# NVML's clock event reasons that mean the GPU is slowed by its hardware, not by choice
SLOWDOWNS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
             0x80: "HW power brake slowdown"}
FABRIC_MANAGER_UP = ("active", "running", "activating")


# kernel.dmesg_restrict (1 by default on Debian and on Ubuntu since 20.10; Documentation/admin-guide/sysctl/
# kernel.rst): the kernel log, where the driver writes XIDs, is root's (CAP_SYSLOG) only
XIDS_UNSEEN = ("XIDs not checked: this login cannot read the kernel log (kernel.dmesg_restrict; root or CAP_SYSLOG "
               "can: `sudo dmesg | grep Xid`)")


def judge(host: GpuHost, xid_window_s: float | None = None) -> Finding:
    fails: list[str] = []
    warns: list[str] = []
    _holders(host, fails, warns)
    for g in host.gpus:
        _memory(g, fails, warns)
        _fabric(g, fails, warns)
        slow = [name for bit, name in SLOWDOWNS.items() if g.throttle and g.throttle & bit]
        if slow:
            warns.append(f"GPU {g.index}: clocks held down ({', '.join(slow)}): check its cooling and power")
    _fabric_manager(host, fails, warns)
    off = [g for g in host.gpus if g.persistence == "Disabled"]
    if off:
        warns.append(f"persistence mode off on {gpus_named(off)} (every start pays the driver's initialisation: "
                     "nvidia-smi -pm 1)")
    mig = [g for g in host.gpus if g.mig == "Enabled"]
    if mig:
        warns.append(f"MIG is on for {gpus_named(mig)}: the job sees MIG instances, not whole GPUs")
    _xids(host, xid_window_s, fails, warns)
    unseen = [XIDS_UNSEEN] if host.xids is None else []  # said in every verdict: a login without root sees no XID
    if fails:
        return Finding("gpu health", Verdict.FAIL, "; ".join(fails + warns + list(host.errors) + unseen))
    if host.errors:
        return Finding("gpu health", Verdict.ERROR, "could not check: " + "; ".join(host.errors))
    if warns:
        return Finding("gpu health", Verdict.WARN, "; ".join(warns + unseen))
    used = len(host.holders)
    return Finding("gpu health", Verdict.PASS, f"{len(host.gpus)} GPU(s): no memory held by other processes"
                   + (f" ({used} small or MPS)" if used else "") + ", no uncorrectable ECC errors or pending remaps"
                   + (", fabric Completed" if any(g.fabric_state for g in host.gpus) else "")
                   + (f", fabric manager {host.fabric_manager}" if host.nvswitches and host.fabric_manager else "")
                   + (f"; {XIDS_UNSEEN}" if host.xids is None else f", no fatal XID {_since(xid_window_s)}"))


def mps_server(h: Holder) -> bool:
    """MPS's server: so named, and started by root's MPS control daemon (the server runs as its client's uid)."""
    return h.name == MPS and h.parent_name == MPS_CONTROL and h.parent_root


def _who(h: Holder) -> str:
    return f"{h.name or '?'}{', user ' + h.owner if h.owner else ''}"


def _holders(host: GpuHost, fails: list[str], warns: list[str]) -> None:
    for g in host.gpus:
        on = [h for h in host.holders if same_bus(h.bus_id, g.bus_id) and not mps_server(h)]
        big = [h for h in on if (h.used_mib or 0) > FOREIGN_MIB]
        for h in big:
            fails.append(f"GPU {g.index} holds {h.used_mib} MiB of pid {h.pid} ({_who(h)}), not this job's: a "
                         f"leftover of another job? stop it (kill {h.pid}) or give the job other GPUs")
        if big or (g.memory_used_mib or 0) <= FOREIGN_MIB:
            continue
        if any(h.used_mib is None for h in on):  # per-process memory [N/A] (MIG before R590): the GPU's count is theirs
            names = ", ".join(f"pid {h.pid} ({_who(h)})" for h in on[:3])
            fails.append(f"GPU {g.index}{' (MIG)' if g.mig == 'Enabled' else ''} holds {g.memory_used_mib} MiB used "
                         f"by {names}" + (f" and {len(on) - 3} more" if len(on) > 3 else "") + ", not this job's: "
                         f"stop them (kill {' '.join(str(h.pid) for h in on[:3])}) or give the job other GPUs")
        elif g.mig == "Enabled" and not on:  # a desktop's graphics processes are never listed: only MIG is asked
            warns.append(f"GPU {g.index} (MIG): {g.memory_used_mib} MiB in use and no compute process listed (one in "
                         "a VM, or nvidia-smi cannot see it)")
    orphans = [h for h in host.holders if (h.used_mib or 0) > FOREIGN_MIB and not host.gpu(h.bus_id)
               and not mps_server(h)]
    for h in orphans:
        fails.append(f"the GPU at {h.bus_id} holds {h.used_mib} MiB of pid {h.pid} ({_who(h)}), not this "
                     f"job's: a leftover of another job? stop it (kill {h.pid}) or give the job other GPUs")


def _memory(g: Gpu, fails: list[str], warns: list[str]) -> None:
    if g.ecc_volatile:
        fails.append(f"GPU {g.index}: {g.ecc_volatile} uncorrectable ECC errors since the driver loaded: drain the "
                     f"host and reset the GPU (nvidia-smi -r -i {g.index})")
    if g.remap_failure:
        fails.append(f"GPU {g.index}: a row remapping failed (Remapping Failure Occurred: Yes): its memory cannot be "
                     "repaired in the field: drain the host and replace the GPU")
    elif g.remap_banks_exhausted:
        fails.append(f"GPU {g.index}: {g.remap_banks_exhausted} memory bank(s) have no reserved row left (row "
                     "remapper histogram None): the next uncorrectable error there cannot be remapped; drain the host")
    if g.remap_pending:
        fails.append(f"GPU {g.index}: a row remap is pending: reset the GPU (nvidia-smi -r -i {g.index}) or reboot "
                     "before use")
    if g.ecc_aggregate:
        warns.append(f"GPU {g.index}: {g.ecc_aggregate} uncorrectable ECC errors over its life")


def _fabric(g: Gpu, fails: list[str], warns: list[str]) -> None:
    if g.fabric_state is not None and (g.fabric_state != "Completed" or
                                       (g.fabric_status is not None and g.fabric_status != "Success")):
        fails.append(f"GPU {g.index}: NVSwitch fabric {g.fabric_state}/{g.fabric_status or '?'} (CUDA says \"system "
                     "not yet initialized\"): start the fabric manager (systemctl start nvidia-fabricmanager) and "
                     "wait for Completed/Success")
    elif g.fabric_health is not None and g.fabric_health.lower() == "unhealthy":
        # the fabric is up (Completed/Success); Health is R570's finer word: a multi-node NVLink domain may refuse
        # the GPU (mnnvl-fabric-health-unhealthy-dra-driver626), one node's job still runs
        warns.append(f"GPU {g.index}: NVSwitch fabric Health Unhealthy (State {g.fabric_state}/{g.fabric_status}): "
                     "multi-node NVLink may refuse this GPU; check the fabric manager's log and the switches")


def _fabric_manager(host: GpuHost, fails: list[str], warns: list[str]) -> None:
    """HGX A100 and other NVSwitch systems whose GPUs do not report fabric state through NVML."""
    if not host.nvswitches or any(g.fabric_state for g in host.gpus):
        return
    fm = host.fabric_manager
    if fm in FABRIC_MANAGER_UP:
        return
    if fm is None:
        warns.append(f"{host.nvswitches} NVSwitch device(s) and the GPUs report no fabric state: could not tell "
                     "whether nvidia-fabricmanager runs (no systemctl or pgrep)")
        return
    fails.append(f"{host.nvswitches} NVSwitch device(s) but nvidia-fabricmanager is {fm}: CUDA fails with \"system "
                 "not yet initialized\" (error 802) until it trains the fabric: systemctl start nvidia-fabricmanager")


def _xids(host: GpuHost, window_s: float | None, fails: list[str], warns: list[str]) -> None:
    if not host.xids:
        return
    fresh: dict[tuple[int, int], int] = {}
    stray: dict[tuple[int, str], int] = {}
    old: dict[int, int] = {}
    for x in host.xids:
        # the load line gone from the log's ring buffer means it is older than every line still there
        newer = x.at_s is not None and (
            (host.driver_loaded_s is None or x.at_s >= host.driver_loaded_s) if window_s is None
            else host.uptime_s is not None and x.at_s >= host.uptime_s - window_s)
        if x.code in FATAL_XIDS and newer:
            g = host.gpu(x.bus)
            if g is None:  # no GPU of this host is there: nothing to reset, and none a job would get
                stray[(x.code, x.bus)] = stray.get((x.code, x.bus), 0) + 1
            else:
                fresh[(x.code, g.index)] = fresh.get((x.code, g.index), 0) + 1
        else:
            old[x.code] = old.get(x.code, 0) + 1
    for (code, index), n in sorted(fresh.items()):
        fails.append(f"GPU {index}: XID {code} ({FATAL_XIDS[code]}) x{n} {_since(window_s)} (dmesg): drain the host "
                     f"and reset the GPU, or reboot")
    for (code, bus), n in sorted(stray.items()):
        warns.append(f"XID {code} ({FATAL_XIDS[code]}) x{n} {_since(window_s)} (dmesg) on PCI {bus}, where none of "
                     f"this host's {len(host.gpus)} GPU(s) is: not judged (a GPU gone from the bus is no longer "
                     "listed: compare `nvidia-smi -L` with `sudo dmesg | grep Xid`)")
    if old:
        since = (f", before the last {_span(window_s)} or of an application's fault" if window_s is not None
                 else " before the driver's last load or of an application's fault"
                 if host.driver_loaded_s is not None else "")
        warns.append("XID errors since boot (dmesg" + since + "): "
                     + ", ".join(f"{code} x{n}" for code, n in sorted(old.items())))


def _since(window_s: float | None) -> str:
    """What a fresh XID is newer than: the driver's load, or the window the user set (diagnostics.xid_window)."""
    return "since the driver loaded" if window_s is None else \
        f"in the last {_span(window_s)} (diagnostics.xid_window)"


def _span(s: float) -> str:
    """600 -> '10 minutes', 86400 -> '1 day', 90 -> '90 s'."""
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= n and s % n == 0:
            return f"{int(s // n)} {unit}{'' if s == n else 's'}"
    return f"{s:g} s"
