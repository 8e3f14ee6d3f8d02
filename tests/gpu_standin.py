"""Stand-in `nvidia-smi`s (the only stand-ins the project allows, while no GPU is lent): shell scripts with their
outputs inside them, so that they also answer where bind-mounted alone (doctor's GPU container in device mode mounts
the host's nvidia-smi under /usr/local/nvidia/bin).

`script(case)`: a case of tests/data/nvidia-smi/, written from NVIDIA's formats, answering the probe's commands.

`replay(folder)`: a real output of tests/data/nvidia-smi/real/ (issue 51), answering whatever the probe asks of it:
- A folder with `stdout.txt` + `exit` (an error) answers EVERY command with that stdout and exit status, except
  where the error is a rejected field (`Field "x" is not a valid field to query.`): then only a --query-gpu that
  names that field is rejected, on stdout with exit 2 as the real driver does, and one without it is answered.
- `--help-query-gpu`: the folder's help-query-gpu.txt (a recorded excerpt that stops before the memory fields is
  continued with the core fields, less a rejected one); with no help recorded, a help that knows every field the
  folder's data holds plus the probe's core fields (CORE), less a rejected one.
- `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`: a field the help does not list prints `Field "f" is not a
  valid field to query.` on stdout, exit 2 (the first unknown field only: real behaviour). Otherwise a header (each
  field's first name, as nvidia-smi prints it for an alias too, with its unit in brackets, ` [MiB]`, also under
  nounits) unless noheader, then one line per GPU. Each value comes from query-gpu-full.csv (by header name, or by
  the command SOURCE.md gives for a file printed without header), else query-gpu.csv (the probe's old 12 columns,
  QUERY_GPU's order), else q.txt or q-x.xml where a field maps simply (Q_MAP: name, memory, persistence, MIG, ECC
  sums, remapped rows, fabric, PCIe link, clocks event reasons; the index is the GPU's place), else `[N/A]` (bare
  `N/A` for fabric.*): a field the driver knows but the data lacks. That last case is what makes a replay partly
  written: nvidia-smi would have printed a value there. With nounits a value loses its unit (`81559 MiB` -> `81559`).
- `-q`: q.txt as recorded (an excerpt stays one, but one that starts inside a GPU's block gets the `GPU <bus>` line
  every -q prints before it, on EXCERPT_BUS, the bus --query-gpu prints for that GPU too); else a minimal -q built
  from the folder's data: Driver Version, CUDA Version, Attached GPUs, and per GPU whose bus is known a `GPU <bus>`
  line with its Product Name (and its Fabric State/Status where the data holds them). `-q -x`: q-x.xml.
- `-L`: L.txt, else built from the data (`GPU 0: NAME (UUID: GPU-00000000-0000-0000-0000-000000000000)`).
- `--query-compute-apps=...`: the fields asked of compute-apps.csv (gpu_bus_id,pid,used_memory[,process_name]: the
  probe asks the first three), else no output, exit 0.
- anything else: a line on stderr saying it is not recorded, exit 2.
The driver version, the CUDA version and the number of GPUs come from the outputs, else from SOURCE.md's `driver:`,
`cuda:` and `gpus:` lines where those begin with a version (or `N/A`, `Not Found` for CUDA) or a count. A folder whose
SOURCE.md has a `smi: FOLDER` line holds no nvidia-smi output of its own: it answers with that folder's (a kernel
log of one source paired with the nvidia-smi output of another, said so in its SOURCE.md).

`dmesg(folder)`: the folder's kernel log, dmesg.txt (the lines as `dmesg` prints them, `[seconds since boot] text`),
printed whatever is asked, except `--version`: not util-linux (exit 1, as busybox's dmesg answers), so the probe
reads the log as through syslog(2). A folder without dmesg.txt has a kernel log with nothing in it (no output,
exit 0): the machine running the tests must not lend its own."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

CASES = Path(__file__).parent / "data" / "nvidia-smi"
# real/: outputs recorded on real GPUs, from public sources (issue 51), in a layout of their own (SOURCE.md, ...)
WRITTEN = sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name != "real")
QUERY_GPU = ("index", "pci.bus_id", "name", "compute_cap", "driver_version", "memory.used", "memory.total",
             "persistence_mode", "mig.mode.current", "ecc.errors.uncorrected.volatile.total",
             "ecc.errors.uncorrected.aggregate.total", "remapped_rows.pending")


def _heredoc(text: str) -> str:
    return f"cat <<'DL_SMI_EOF'\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}DL_SMI_EOF\n"


def script(case: str, pid: int | None = None) -> str:
    """`pid`: the process the case's compute-apps line names instead of its recorded 4242 (a real one, so that the
    probe's `ps` finds its owner)."""
    d = CASES / case
    status = (d / "exit").read_text().strip() if (d / "exit").exists() else "0"
    out = "\n".join([
        "#!/bin/sh",
        f"# stand-in nvidia-smi (tests only): case {case} of tests/data/nvidia-smi, written from NVIDIA's formats",
        'case "$1" in',
        "  -L)", _heredoc((d / "L.txt").read_text()), "    ;;",
        "  -q)", _heredoc((d / "q.txt").read_text()), "    ;;",
        "  --query-compute-apps=*)",
        _heredoc((d / "compute-apps.csv").read_text().replace(", 4242,", f", {pid}," if pid else ", 4242,")),
        "    ;;",
        # a driver that knows exactly the case's columns: its help lists them, a query prints a header (as
        # --format=csv without noheader does) and then the columns asked for, by name
        "  --help-query-gpu)",
        _heredoc("".join(f'"{f}"\n' for f in QUERY_GPU)), "    ;;",
        "  --query-gpu=*)",
        f"    cols='{','.join(QUERY_GPU)}'",
        "    want=${1#--query-gpu=}",
        # (a failing driver prints its error alone, no header)
        f"    case \"$2\" in *noheader*) hdr=0 ;; *) hdr={int(status == '0')} ;; esac",
        "    " + _heredoc((d / "query-gpu.csv").read_text()).replace(
            "cat <<'DL_SMI_EOF'", "cat <<'DL_SMI_EOF' | awk -F', ' -v cols=\"$cols\" -v want=\"$want\" -v hdr=\"$hdr\" "
            "'BEGIN {n = split(cols, c, \",\"); m = split(want, w, \",\"); for (i = 1; i <= m; i++) {k[i] = 0; "
            "for (j = 1; j <= n; j++) if (c[j] == w[i]) k[i] = j; if (!k[i]) {print \"Field \\\"\" w[i] "
            "\"\\\" is not a valid field to query.\"; exit 2}} if (hdr) {s = \"\"; for (i = 1; i <= m; i++) "
            "s = s (i > 1 ? \", \" : \"\") w[i]; print s}} NF < n {print; next} "
            "{s = \"\"; for (i = 1; i <= m; i++) s = s (i > 1 ? \", \" : \"\") $k[i]; print s}' || exit 2", 1),
        "    ;;",
        '  *) echo "stand-in nvidia-smi: $* is not recorded" >&2; exit 2 ;;',
        "esac",
        f"exit {status}",
        "",
    ])
    return out


def install(directory: Path, case: str, pid: int | None = None) -> Path:
    """The stand-in as `directory/nvidia-smi`, executable."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(script(case, pid))
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Replays of real outputs (tests/data/nvidia-smi/real/, issue 51)

REAL = CASES / "real"
REAL_FOLDERS = sorted(p.name for p in REAL.iterdir() if p.is_dir()) if REAL.is_dir() else []
CORE = QUERY_GPU  # the fields a help written for a folder without a recorded one always knows (the probe's core)
NA_WORDS = ("N/A", "Not Supported", "Unknown Error", "Insufficient Permissions", "GPU requires reset",
            "Requested functionality has been deprecated")
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "memory.reserved": "MiB"}
_PROPERTY = re.compile(r'^"[A-Za-z0-9_.]+"( or "[A-Za-z0-9_.]+")*\s*$')
_REJECTED = re.compile(r'^Field "([^"]+)" is not a valid field to query\.')
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)*$")
_EOF = "DL_SMI_EOF"
EXCERPT_BUS = "00000000:00:00.0"  # the bus of a GPU whose -q excerpt does not show it (the replay prints it in both)

# `-q`'s keys (a path of section names) and `-q -x`'s elements for each field that maps simply; "~" marks a sum
_REASONS = {"gpu_idle": ("Idle", "gpu_idle"), "applications_clocks_setting": ("Applications Clocks Setting",
            "applications_clocks_setting"), "sw_power_cap": ("SW Power Cap", "sw_power_cap"),
            "hw_slowdown": ("HW Slowdown", "hw_slowdown"), "hw_thermal_slowdown": ("HW Thermal Slowdown",
            "hw_thermal_slowdown"), "hw_power_brake_slowdown": ("HW Power Brake Slowdown", "hw_power_brake_slowdown"),
            "sw_thermal_slowdown": ("SW Thermal Slowdown", "sw_thermal_slowdown"),
            "sync_boost": ("Sync Boost", "sync_boost")}
Q_MAP: dict[str, tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]] = {
    "name": ((("Product Name",),), ("product_name",)),
    "uuid": ((("GPU UUID",),), ("uuid",)),
    "serial": ((("Serial Number",),), ("serial",)),
    "persistence_mode": ((("Persistence Mode",),), ("persistence_mode",)),
    "mig.mode.current": ((("MIG Mode", "Current"),), ("mig_mode/current_mig",)),
    "mig.mode.pending": ((("MIG Mode", "Pending"),), ("mig_mode/pending_mig",)),
    "memory.total": ((("FB Memory Usage", "Total"),), ("fb_memory_usage/total",)),
    "memory.used": ((("FB Memory Usage", "Used"),), ("fb_memory_usage/used",)),
    "memory.free": ((("FB Memory Usage", "Free"),), ("fb_memory_usage/free",)),
    "memory.reserved": ((("FB Memory Usage", "Reserved"),), ("fb_memory_usage/reserved",)),
    "compute_mode": ((("Compute Mode",),), ("compute_mode",)),
    "pstate": ((("Performance State",),), ("performance_state",)),
    "ecc.mode.current": ((("ECC Mode", "Current"),), ("ecc_mode/current_ecc",)),
    "ecc.errors.uncorrected.volatile.total": ((("ECC Errors", "Volatile", "~"),), ("ecc_errors/volatile/~",)),
    "ecc.errors.uncorrected.aggregate.total": ((("ECC Errors", "Aggregate", "~"),), ("ecc_errors/aggregate/~",)),
    "remapped_rows.correctable": ((("Remapped Rows", "Correctable Error"),), ("remapped_rows/remapped_row_corr",)),
    "remapped_rows.uncorrectable": ((("Remapped Rows", "Uncorrectable Error"),),
                                    ("remapped_rows/remapped_row_unc",)),
    "remapped_rows.pending": ((("Remapped Rows", "Pending"),), ("remapped_rows/remapped_row_pending",)),
    "remapped_rows.failure": ((("Remapped Rows", "Remapping Failure Occurred"),),
                              ("remapped_rows/remapped_row_failure",)),
    "fabric.state": ((("Fabric", "State"),), ("fabric/state",)),
    "fabric.status": ((("Fabric", "Status"),), ("fabric/status",)),
    "fabric.cliqueId": ((("Fabric", "CliqueId"),), ("fabric/cliqueId",)),
    "fabric.clusterUuid": ((("Fabric", "ClusterUUID"),), ("fabric/clusterUuid",)),
    "fabric.health.summary": ((("Fabric", "Health", "Summary"),), ("fabric/health/summary",)),
    "fabric.health.bandwidth": ((("Fabric", "Health", "Bandwidth"),), ("fabric/health/bandwidth",)),
    "pcie.link.gen.current": ((("PCI", "GPU Link Info", "PCIe Generation", "Current"),),
                              ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",)),
    "pcie.link.gen.max": ((("PCI", "GPU Link Info", "PCIe Generation", "Max"),),
                          ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",)),
    "pcie.link.width.current": ((("PCI", "GPU Link Info", "Link Width", "Current"),),
                                ("pci/pci_gpu_link_info/link_widths/current_link_width",)),
    "pcie.link.width.max": ((("PCI", "GPU Link Info", "Link Width", "Max"),),
                            ("pci/pci_gpu_link_info/link_widths/max_link_width",)),
    **{f"clocks_event_reasons.{k}": (((("Clocks Event Reasons", q), ("Clocks Throttle Reasons", q))),
                                     (f"clocks_event_reasons/clocks_event_reason_{x}",
                                      f"clocks_throttle_reasons/clocks_throttle_reason_{x}"))
       for k, (q, x) in _REASONS.items()},
}


def _aliases() -> dict[str, tuple[str, ...]]:
    """Every field name any recorded --help-query-gpu lists -> its names, the one nvidia-smi prints first (a
    `"a" or "b"` line: `a`; the newer name where one driver lists a field alone and a later one with an alias)."""
    groups: list[list[str]] = []
    for help_file in sorted(REAL.glob("*/help-query-gpu.txt")):
        for names in _properties(help_file.read_text()):
            hit = [g for g in groups if set(g) & set(names)]
            merged = list(dict.fromkeys([*names, *(n for g in hit for n in g)]))
            groups = [g for g in groups if g not in hit] + [merged]
    return {n: tuple(g) for g in groups for n in g}


def _properties(text: str) -> list[list[str]]:
    return [re.findall(r'"([^"]+)"', line) for line in text.splitlines() if _PROPERTY.match(line)]


def _canon(name: str, aliases: dict[str, tuple[str, ...]]) -> str:
    return aliases.get(name, (name,))[0]


def _na(field: str, value: str) -> str:
    """A -q value as --query-gpu prints it: unavailable values in brackets (fabric.* bare, as R550+ print them)."""
    value = value.strip()
    if value in NA_WORDS or value == "":
        return value if field.startswith("fabric.") or not value else f"[{value}]"
    if field.startswith("pcie.link.width.") and value.endswith("x"):
        return value[:-1]
    return value


def _parse_q(text: str) -> tuple[dict[tuple[str, ...], str], list[tuple[str | None, dict[tuple[str, ...], str]]]]:
    """`nvidia-smi -q` -> (its top-level keys, [(bus id, {path of section names: value}) per GPU]). An excerpt
    that starts inside a GPU's block (no `GPU <bus>` line) is one GPU, on EXCERPT_BUS."""
    top: dict[tuple[str, ...], str] = {}
    gpus: list[tuple[str | None, dict[tuple[str, ...], str]]] = []
    stack: list[tuple[int, str]] = []
    headed = re.search(r"^GPU [0-9A-Fa-f]", text, re.M) is not None
    for line in text.splitlines():
        if not line.strip() or line.startswith("=="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", line)
        if m:
            gpus.append((m.group(1), {}))
            stack = []
            continue
        if indent == 0:
            key, sep, value = line.partition(" : ") if " : " in line else line.partition(":")
            if sep:
                top[(key.strip(),)] = value.strip()
            continue
        if not gpus:
            if headed:  # a top-level section's lines (vGPU Driver Capability)
                continue
            gpus.append((EXCERPT_BUS, {}))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        kv = re.match(r"^\s*(.+?)\s*: ?(.*)$", line)
        names = tuple(n for _, n in stack)
        if kv and not line.rstrip().endswith(":"):
            gpus[-1][1][(*names, kv.group(1))] = kv.group(2).strip()
        else:
            stack.append((indent, line.strip().rstrip(":").strip()))
    return top, gpus


def _q_value(field: str, paths: tuple[tuple[str, ...], ...], keys: dict[tuple[str, ...], str]) -> str | None:
    for path in paths:
        if path[-1] == "~":  # the uncorrectable counts of one ECC section, summed (older drivers: Double Bit Total)
            section = path[:-1]
            found = [v for k, v in keys.items() if k[:-1] == section and "uncorrectable" in k[-1].lower()]
            if not found and (*section, "Double Bit", "Total") in keys:
                found = [keys[(*section, "Double Bit", "Total")]]
            if found:
                return _sum(field, found)
            continue
        if path in keys:
            return _na(field, keys[path])
        for n in range(1, len(path)):  # a section printed flat ("Remapped Rows : N/A" under MIG)
            if path[:n] in keys:
                return _na(field, keys[path[:n]])
    return None


def _sum(field: str, values: list[str]) -> str:
    if all(v.strip().isdigit() for v in values):
        return str(sum(int(v) for v in values))
    return _na(field, next(v for v in values if not v.strip().isdigit()))


def _xml_gpus(text: str) -> tuple[dict[str, str], list[tuple[str | None, dict[str, str]]]]:
    """`nvidia-smi -q -x` -> (driver and CUDA version, [(bus id, {field: value}) per GPU]) for the fields of Q_MAP."""
    root = ET.fromstring(text)
    top = {"Driver Version": (root.findtext("driver_version") or "").strip(),
           "CUDA Version": (root.findtext("cuda_version") or "").strip()}
    gpus = []
    for g in root.findall("gpu"):
        values: dict[str, str] = {}
        for field, (_, xpaths) in Q_MAP.items():
            for xp in xpaths:
                if xp.endswith("/~"):
                    section = g.find(xp[:-2])
                    if section is None:
                        continue
                    found = [(c.text or "") for c in section if "uncorrectable" in c.tag]
                    if not found and section.find("double_bit/total") is not None:
                        found = [section.findtext("double_bit/total") or ""]
                    if found:
                        values[field] = _sum(field, found)
                        break
                    continue
                e = g.find(xp)
                if e is None and g.find(xp.split("/")[0]) is not None and len(g.find(xp.split("/")[0])) == 0:
                    e = g.find(xp.split("/")[0])  # a section printed flat: <remapped_rows>N/A</remapped_rows>
                if e is not None:
                    values[field] = _na(field, e.text or "")
                    break
        gpus.append((g.get("id") or g.findtext("pci/pci_bus_id"), values))
    return top, gpus


def _csv(text: str, fields: list[str] | None, aliases: dict[str, tuple[str, ...]]
         ) -> tuple[list[str], dict[str, str], list[list[str]]]:
    """A --query-gpu CSV -> (canonical field names, {field: unit}, rows). `fields`: the command's names, for a file
    printed with noheader."""
    lines = [line for line in text.splitlines() if line.strip()]
    first = [c.strip() for c in lines[0].split(", ")] if lines else []
    if first and all(re.match(r"^[a-z][A-Za-z0-9_.]*( \[[^]]+\])?$", c) for c in first):
        labels, lines = first, lines[1:]
    else:
        labels = list(fields or [])
    names, units = [], {}
    for label in labels:
        m = re.match(r"^(\S+)(?: \[([^]]+)\])?$", label)
        name = _canon(m.group(1), aliases)
        names.append(name)
        if m.group(2) or name in UNITS:
            units[name] = m.group(2) or UNITS[name]
    rows = [[c.strip() for c in line.split(", ")] for line in lines]
    for row in rows:
        if len(row) != len(names):
            raise ValueError(f"{len(row)} values under {len(names)} columns: {row}")
    return names, units, rows


def _with_unit(value: str, unit: str | None) -> str:
    return f"{value} {unit}" if unit and re.match(r"^-?\d+(\.\d+)?$", value) else value


class _Replay:
    """What one real folder knows: its fields (by canonical name) and each GPU's values, with units."""

    def __init__(self, folder: str):
        d = smi_folder(folder)
        self.d, self.folder = d, folder
        aliases = _aliases()
        self.aliases = aliases
        source = (d / "SOURCE.md").read_text()
        meta = {k: v.strip() for k, _, v in (line.partition(":") for line in source.splitlines()) if v}
        read = lambda name: (d / name).read_text() if (d / name).exists() else None  # noqa: E731
        self.stdout, self.exit = read("stdout.txt"), (read("exit") or "0").strip()
        m = _REJECTED.match(self.stdout or "")
        self.rejected = m.group(1) if m else None
        self.units: dict[str, str] = {}
        sources: list[list[dict[str, str]]] = []  # per source, per GPU: {field: value with unit}
        full = read("query-gpu-full.csv")
        if full is not None:
            said = re.search(r"--query-gpu=([A-Za-z0-9_.,]+) --format=csv,noheader", source)
            names, units, rows = _csv(full, said.group(1).split(",") if said else None, aliases)
            self.units.update(units)
            sources.append([{n: _with_unit(v, units.get(n)) for n, v in zip(names, row)} for row in rows])
        probe12 = read("query-gpu.csv")
        if probe12 is not None:
            _, _, rows = _csv(probe12, list(QUERY_GPU), aliases)
            self.units.update({n: u for n, u in UNITS.items() if n in QUERY_GPU})
            sources.append([{n: _with_unit(v, UNITS.get(n)) for n, v in zip(QUERY_GPU, row)} for row in rows])
        q, xml = read("q.txt"), read("q-x.xml")
        self.q, self.xml = q, xml
        top: dict[str, str] = {}
        if q is not None:
            qtop, qgpus = _parse_q(q)
            top = {k[0]: v for k, v in qtop.items()}
            from_q = []
            for bus, keys in qgpus:
                vals = {f: v for f, (paths, _) in Q_MAP.items() if (v := _q_value(f, paths, keys)) is not None}
                if bus:
                    vals["pci.bus_id"] = bus
                from_q.append(vals)
            sources.append(from_q)
        elif xml is not None:
            top, xgpus = _xml_gpus(xml)
            sources.append([{**vals, **({"pci.bus_id": bus} if bus else {})} for bus, vals in xgpus])
        for source_rows in sources[-1:] if (q or xml) else []:
            for vals in source_rows:
                for f in list(vals):
                    if f in UNITS:
                        self.units[f] = UNITS[f]
        # the driver and CUDA the source printed (SOURCE.md's first word, where it is a version)
        driver = (top.get("Driver Version") or "").split(" ")[0]
        said_driver = meta.get("driver", "").split(" ")[0]
        self.driver = driver if _VERSION.match(driver) else said_driver if _VERSION.match(said_driver) else None
        cuda = top.get("CUDA Version")
        said_cuda = meta.get("cuda", "")
        self.cuda = cuda if cuda else next((w for w in ("N/A", "Not Found") if said_cuda.startswith(w)),
                                           said_cuda.split(" ")[0] if re.match(r"^\d+\.\d+\b", said_cuda) else None)
        counted = next((len(s) for s in sources if s), None)
        if counted is None:
            said_gpus = re.match(r"^(\d+) x", meta.get("gpus", ""))
            counted = int(said_gpus.group(1)) if said_gpus else 0
        self.gpus: list[dict[str, str]] = []
        for i in range(counted):
            vals: dict[str, str] = {}
            for s in reversed(sources):  # the first source that holds a field wins
                if i < len(s):
                    vals.update({k: v for k, v in s[i].items()})
            vals.setdefault("index", str(i))
            if self.driver:
                vals.setdefault("driver_version", self.driver)
            vals.setdefault("count", str(counted))
            self.gpus.append(vals)
        held = list(dict.fromkeys(f for g in self.gpus for f in g))
        help_text = read("help-query-gpu.txt")
        self.help_added: list[str] = []
        if help_text is not None:
            self.known = [names for names in _properties(help_text)]
            listed = {n for names in self.known for n in names}
            if "memory.used" not in listed:  # an excerpt of the help: it goes on with the fields every driver knows
                self.help_added = [f for f in dict.fromkeys([*CORE, *held]) if f not in listed and f != self.rejected]
                self.known += [[f] for f in self.help_added]
        else:
            self.help_added = [f for f in dict.fromkeys([*held, *CORE]) if f != self.rejected]
            self.known = [list(aliases.get(f, (f,))) for f in self.help_added]
        self.help = help_text

    def columns(self) -> list[str]:
        return list(dict.fromkeys(names[0] for names in self.known))


def replay(folder: str) -> str:
    """A POSIX sh script standing in for `nvidia-smi` (it runs under dash on the sim's nodes), answering from one
    folder of tests/data/nvidia-smi/real/ whatever the probe asks, by the rules in this module's docstring."""
    r = _Replay(folder)
    head = ["#!/bin/sh", f"# stand-in nvidia-smi (tests only): replays tests/data/nvidia-smi/real/{folder}, a real "
            "output (tests/gpu_standin.py: replay)"]
    if r.stdout is not None and r.rejected is None:
        return "\n".join([*head, _heredoc(r.stdout), f"exit {int(r.exit)}", ""])
    for g in r.gpus:
        for v in g.values():
            if "\t" in v or "\n" in v:
                raise ValueError(f"{folder}: a value holds a tab or a line break: {v!r}")
    cols = r.columns()
    table = ["#names"]
    for names in r.known:
        for n in names:
            table.append(f"{n}\t{cols.index(names[0]) + 1}")
    table.append("#header")
    table.append("\t".join(f"{c} [{r.units[c]}]" if c in r.units else c for c in cols))
    table.append("#units")
    table.append("\t".join(r.units.get(c, "") for c in cols))
    table.append("#rows")
    for g in r.gpus:
        table.append("\t".join(g.get(c, "N/A" if c.startswith("fabric.") else "[N/A]") for c in cols))
    data = "\n".join(table) + "\n"
    if _EOF in data:
        raise ValueError(f"{folder}: the data holds {_EOF}")
    gpu_awk = (
        "awk -v want=\"$fields\" -v fmt=\"$fmt\" 'BEGIN {FS = \"\\t\"; m = split(want, w, \",\")} "
        "/^#/ {sec = $0; next} sec == \"#names\" {col[$1] = $2; next} "
        "sec == \"#header\" {nh = split($0, head, \"\\t\"); next} sec == \"#units\" {split($0, unit, \"\\t\"); next} "
        "sec == \"#rows\" {rows[++n] = $0; next} "
        "END {for (i = 1; i <= m; i++) {if (!(w[i] in col)) {printf \"Field \\\"%s\\\" is not a valid field to "
        "query.\\n\\n\", w[i]; exit 2} k[i] = col[w[i]]} "
        "if (fmt !~ /noheader/) {s = \"\"; for (i = 1; i <= m; i++) s = s (i > 1 ? \", \" : \"\") head[k[i]]; "
        "print s} "
        "for (r = 1; r <= n; r++) {split(rows[r], v, \"\\t\"); s = \"\"; for (i = 1; i <= m; i++) {x = v[k[i]]; "
        "u = \" \" unit[k[i]]; if (fmt ~ /nounits/ && u != \" \" && length(x) > length(u) && "
        "substr(x, length(x) - length(u) + 1) == u) x = substr(x, 1, length(x) - length(u)); "
        "s = s (i > 1 ? \", \" : \"\") x} print s}}'"
    )
    apps = (r.d / "compute-apps.csv").read_text() if (r.d / "compute-apps.csv").exists() else ""
    apps_awk = (
        "awk -v want=\"$fields\" -v fmt=\"$fmt\" 'BEGIN {m = split(want, w, \",\"); "
        "split(\"gpu_bus_id pid used_memory process_name\", known, \" \"); "
        "for (i = 1; i <= m; i++) {f = w[i]; if (f == \"used_gpu_memory\") f = \"used_memory\"; "
        "if (f == \"name\") f = \"process_name\"; k[i] = 0; for (j = 1; j <= 4; j++) if (known[j] == f) k[i] = j; "
        "if (!k[i] && f !~ /^(timestamp|gpu_name|gpu_serial|gpu_uuid)$/) {printf \"Field \\\"%s\\\" is not a "
        "valid field to query.\\n\\n\", w[i]; bad = 1; exit 2} "
        "h[i] = (f == \"used_memory\" ? \"used_gpu_memory [MiB]\" : f)} "
        "if (fmt !~ /noheader/) {s = \"\"; for (i = 1; i <= m; i++) s = s (i > 1 ? \", \" : \"\") h[i]; print s}} "
        "{rest = $0; for (j = 1; j <= 3; j++) {p = index(rest, \", \"); c[j] = p ? substr(rest, 1, p - 1) : rest; "
        "rest = p ? substr(rest, p + 2) : \"\"} c[4] = rest; "
        "if (fmt !~ /nounits/ && c[3] ~ /^[0-9]+$/) c[3] = c[3] \" MiB\"; s = \"\"; "
        "for (i = 1; i <= m; i++) s = s (i > 1 ? \", \" : \"\") (k[i] ? c[k[i]] : \"[N/A]\"); print s} "
        "END {if (bad) exit 2}'"
    )
    if r.help is not None:
        help_text = r.help + ("" if r.help.endswith("\n") else "\n")
    else:
        help_text = 'List of valid properties to query for the switch "--query-gpu":\n\n'
    for f in r.help_added:
        names = [n for n in r.aliases.get(f, (f,))] if r.help is None else [f]
        help_text += " or ".join(f'"{n}"' for n in names) + "\n" + \
            f"(stand-in: the replay of {folder} knows this field)\n\n"
    if (r.d / "L.txt").exists():
        listing = (r.d / "L.txt").read_text()
    else:
        listing = "".join(f"GPU {g.get('index', i)}: {g.get('name', '[N/A]')} (UUID: "
                          f"{g.get('uuid', f'GPU-00000000-0000-0000-0000-{i:012d}')})\n"
                          for i, g in enumerate(r.gpus))
    if r.q is not None:
        q = r.q
        if not re.search(r"^GPU [0-9A-Fa-f]", q, re.M):  # an excerpt from inside a GPU's block: its header back
            q = re.sub(r"^(?= )", f"GPU {EXCERPT_BUS}\n", q, count=1, flags=re.M)
    else:
        w = 42
        q = "\n==============NVSMI LOG==============\n\n"
        if r.driver:
            q += f"{'Driver Version':<{w}}: {r.driver}\n"
        if r.cuda:
            q += f"{'CUDA Version':<{w}}: {r.cuda}\n"
        q += f"\n{'Attached GPUs':<{w}}: {len(r.gpus)}\n"
        for g in r.gpus:
            bus = g.get("pci.bus_id", "")
            if not re.match(r"^[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$", bus):
                continue
            q += f"GPU {bus}\n    {'Product Name':<{w - 4}}: {g.get('name', 'N/A')}\n"
            if "fabric.state" in g or "fabric.status" in g:
                q += "    Fabric\n" + "".join(f"        {k:<{w - 8}}: {g.get(f, 'N/A')}\n"
                                             for k, f in (("State", "fabric.state"), ("Status", "fabric.status")))
    xml = ["    if [ -n \"$xml\" ]; then", "  " + _heredoc(r.xml) if r.xml is not None else
           f"      echo 'stand-in nvidia-smi: -q -x is not recorded for {folder}' >&2; exit 2", "    else",
           "  " + _heredoc(q), "    fi"]
    body = [
        "mode= fields= fmt=csv xml=",
        'for a in "$@"; do',
        "  case $a in",
        "    -L|--list-gpus) mode=L ;;",
        "    -q|--query) mode=q ;;",
        "    -x|--xml-format) xml=1 ;;",
        "    --help-query-gpu) mode=help ;;",
        "    --query-gpu=*) mode=gpu; fields=${a#--query-gpu=} ;;",
        "    --query-compute-apps=*) mode=apps; fields=${a#--query-compute-apps=} ;;",
        "    --format=*) fmt=${a#--format=} ;;",
        "    *) mode=unknown ;;",
        "  esac",
        "done",
        "case $mode in",
        "  L)", _heredoc(listing), "    ;;",
        "  q)", *xml, "    ;;",
        "  help)", _heredoc(help_text), "    ;;",
        "  gpu)", _heredoc(data).replace(f"<<'{_EOF}'", f"<<'{_EOF}' | {gpu_awk}", 1), "    exit $?", "    ;;",
        "  apps)", _heredoc(apps).replace(f"<<'{_EOF}'", f"<<'{_EOF}' | {apps_awk}", 1), "    exit $?",
        "    ;;",
        f'  *) echo "stand-in nvidia-smi: $* is not recorded for {folder}" >&2; exit 2 ;;',
        "esac",
        "exit 0",
        "",
    ]
    return "\n".join([*head, *body])


def smi_folder(folder: str) -> Path:
    """The folder whose nvidia-smi outputs `folder` answers with: its own, or the one its SOURCE.md's `smi:` names."""
    d = REAL / folder
    said = re.search(r"^smi: *(\S+) *$", (d / "SOURCE.md").read_text(), re.M)
    return REAL / said.group(1) if said else d


def dmesg(folder: str) -> str:
    """A POSIX sh script standing in for `dmesg` on the host of `folder`: its dmesg.txt (by the module's docstring)."""
    log = REAL / folder / "dmesg.txt"
    text = log.read_text() if log.exists() else ""
    if _EOF in text:
        raise ValueError(f"{folder}: dmesg.txt holds {_EOF}")
    return "\n".join([
        "#!/bin/sh",
        f"# stand-in dmesg (tests only): the kernel log of tests/data/nvidia-smi/real/{folder} (tests/gpu_standin.py: "
        "dmesg)",
        'case "$1" in --version|-V) echo "dmesg: unrecognized option: $1" >&2; exit 1 ;; esac',
        *([_heredoc(text).rstrip("\n")] if text else []),
        "exit 0",
        "",
    ])


def _install(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def install_dmesg(directory: Path, folder: str) -> Path:
    """The kernel log of a real folder as `directory/dmesg`, executable."""
    return _install(directory, "dmesg", dmesg(folder))


def install_replay(directory: Path, folder: str) -> Path:
    """The replay of a real folder as `directory/nvidia-smi`, executable."""
    return _install(directory, "nvidia-smi", replay(folder))
