"""verify's judges: what scripts/verify_image.py found inside an image (its facts, one JSON object) -> a report of
rows (dockerlaunch.verdict.Finding). Pure: the unit tests feed it recorded results; images/verify.py runs the
script and images/binaries.py feeds the same judges tables read from the lock's wheels. The judges:
- symbols: every undefined, non-weak dynamic symbol of every shared object under site-packages is defined by a
  library it loads (DT_NEEDED resolved as ld.so does), by the interpreter, or by a scanned library its package loads
  first with RTLD_GLOBAL; a missing one names the library expected to define it and that library's distribution.
  Every library is also dlopen()ed (RTLD_NOW) after `import torch`, and the loader's own error is shown.
- archs: each library holding device code has a cubin (not only PTX) for every requested architecture
  (label ai.dockerlaunch.cuda-archs or --cuda-archs), read with cuobjdump from PyPI.
- pip check: clean, except the lines the stack's recorded overrides/drops cause (labels ai.dockerlaunch.overrides,
  ai.dockerlaunch.drop), shown as NOTE.
- imports of the stack's modules (ai.dockerlaunch.components); a failure that only says the GPU driver is missing
  is NEEDS-DRIVER, not FAIL.
- versions against the pins (ai.dockerlaunch.pin.*); an image without labels gets its key packages listed.
- cuda-compat (always, it reads a few KB): the version of /usr/local/cuda*/compat/libcuda.so.<version>, the branches
  it serves (its ELF note, else NVIDIA_REQUIRE_CUDA), and whether the image loads it itself; a NOTE row (WARN where
  it does) and the image's record, which doctor judges against each host's driver.

A check that was asked for and could not run (the scan failed, cuobjdump could not read a library, no pip, no
result at all) is a row with verdict ERROR and the reason, never a silent pass: the report is then not ok (verify
exits 1, `build` stamps nothing), and its last line says ERROR.

Why one file: the judges above share one fact format and one report, and each is short; split by judge, every
file would import the same dozen helpers. `judge_symbols` is long for the same reason: one resolution order
(as ld.so resolves), kept in one function so that its order can be read top to bottom.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace

from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu.cuda import cubin_covers, version_tuple
from dockerlaunch.gpu.needs import CudaCompat, compat_on_path, require_branches
from dockerlaunch.images.index import normalize
from dockerlaunch.verdict import Finding, Verdict

CHECKS = ("symbols", "load", "archs", "pip", "imports", "dists")

# the one verdict enum (dockerlaunch.verdict), under short names
PASS, FAIL, WARN, NOTE, SKIP, ERROR, NEEDS_DRIVER = (Verdict.PASS, Verdict.FAIL, Verdict.WARN, Verdict.NOTE,
                                                     Verdict.SKIP, Verdict.ERROR, Verdict.NEEDS_DRIVER)
# every verdict, in the order verify counts them (the JSON's `counts` keys and the summary line)
VERDICTS = (PASS, FAIL, ERROR, WARN, NOTE, NEEDS_DRIVER, SKIP)


# ---------------------------------------------------------------- labels


def parse_pins(text: str | None) -> dict[str, str]:
    """'nvidia-cublas==13.3.0.5 foo==1' -> {'nvidia-cublas': '13.3.0.5', 'foo': '1'} (names normalized)."""
    out = {}
    for item in (text or "").split():
        name, _, version = item.partition("==")
        if name:
            out[normalize(name)] = version
    return out


# ---------------------------------------------------------------- report


@dataclass
class VerifyReport:
    """verify's rows (dockerlaunch.verdict.Finding, one per check) for one image, with what the table abbreviates."""

    image: str
    checks: list[Finding] = field(default_factory=list)
    versions: dict[str, dict] = field(default_factory=dict)  # name -> {"installed": v, "pinned": p or None}
    facts: dict = field(default_factory=dict)  # what the table abbreviates (json only)

    def add(self, check: str, verdict: Verdict, detail: str) -> None:
        self.checks.append(Finding(check, verdict, detail))

    @property
    def ok(self) -> bool:
        """Nothing failed and every check ran (an ERROR is a check that could not run: not a pass)."""
        return not any(c.verdict in (FAIL, ERROR) for c in self.checks)

    @property
    def failed(self) -> list[Finding]:
        return [c for c in self.checks if c.verdict == FAIL]

    @property
    def outcome(self) -> str:
        return FAIL if self.failed else ERROR if any(c.verdict == ERROR for c in self.checks) else PASS

    def counts(self) -> dict[Verdict, int]:
        return {v: sum(1 for c in self.checks if c.verdict == v) for v in VERDICTS}

    def summary(self) -> str:
        n = self.counts()
        return f"verify {self.image}: " + ", ".join(f"{n[v]} {v}" for v in VERDICTS if n[v] or v in (PASS, FAIL))

    def render(self) -> str:
        """The table people read (also what `build` writes into the image)."""
        rows = [("check", "verdict", "detail")] + [(c.check, c.verdict, c.detail) for c in self.checks]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
        return "\n".join(lines + [self.summary(), f"verify: {self.outcome}"])

    def to_dict(self) -> dict:
        return {"image": self.image, "ok": self.ok, "outcome": self.outcome, "counts": self.counts(),
                "checks": [{"check": c.check, "verdict": c.verdict, "detail": c.detail} for c in self.checks],
                "versions": self.versions, "facts": self.facts}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
# ---------------------------------------------------------------- judging the facts (pure)


def _first(items: list[str], n: int = 3) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _is_driver_lib(name: str) -> bool:
    return bool(re.match(r"^lib(cuda|nvidia-[\w.-]+|nvcuvid)\.so(\.\d+)*$", os.path.basename(name)))


def judge_symbols(report: VerifyReport, sym: dict | None, loads: dict | None, loads_ok: int | None,
                  libraries: int, roots: list[str], gpus: bool = False) -> None:
    """Rows for the symbol scan and the load test (one row per broken library, the loader's words attached)."""
    loads = loads or {}
    head = len(report.checks)
    if sym is None and not loads:
        return
    if sym is not None and "error" in sym:
        report.add("symbols", ERROR, f"the symbol scan did not run: {sym['error']}")
    findings = (sym or {}).get("findings", {})
    driver_libs, plugins, broken = [], [], 0
    for lib, info in sorted(findings.items()):
        if "error" in info:
            report.add(f"symbols {lib}", ERROR, f"not checked: it could not be read as ELF ({info['error']})")
            continue
        load = loads.get(lib, {})
        loader = f"; the loader says: {load['error']}" if load and not load.get("ok") else ""
        missing_libs = {m["name"]: m.get("needed_by") for m in info.get("missing_libraries", [])}
        drivers = sorted(n for n in missing_libs if _is_driver_lib(n))
        others = sorted(n for n in missing_libs if not _is_driver_lib(n))
        dist = f" ({info['dist']})" if info.get("dist") else ""
        # a symbol whose expected library is itself missing is that library's absence, not a second problem
        real = [m for m in info.get("missing_symbols", [])
                if not (m.get("expected") in missing_libs or (m.get("expected") is None and missing_libs))]
        problems = []
        if real:
            by_provider: dict[str, list[str]] = {}
            for m in real:
                sym_name = m["symbol"] + (f"@{m['version']}" if m.get("version") else "")
                if m.get("expected"):
                    where = m["expected"]
                    bits = [b for b in (m.get("expected_dist"), m.get("expected_path")) if b]
                    if bits:
                        where += f" ({', '.join(bits)})"
                    elif not m.get("expected_path"):
                        where += " (not found)"
                    key = f"which {where} does not define"
                else:
                    key = "which no library it loads defines (and no needed library's name matches it)"
                by_provider.setdefault(key, []).append(sym_name)
            problems += [f"needs {_first(names)}, {key}" for key, names in by_provider.items()]
        for v in info.get("missing_versions", []):
            where = v["path"] + (f" ({v['dist']})" if v.get("dist") else "")
            problems.append(f"needs version {v['version']} of {v['file']}, which {where} does not define"
                            + (f" (needed by {v['needed_by']})" if v.get("needed_by") != lib else ""))
        # a library nothing links to and no Python imports (a plugin loaded on request, like NVSHMEM's MPI
        # bootstrap) whose own dependencies the image lacks: it cannot load here, and nothing here loads it
        if others and not problems and not info.get("extension") and not info.get("linked_by"):
            plugins.append(f"{lib} ({', '.join(others)})")
            continue
        if others:
            problems.insert(0, f"needs {', '.join(others)}, which the image does not have")
        if problems:
            broken += 1
            report.add(f"symbols {lib}", FAIL, f"{lib}{dist} " + "; ".join(problems) + loader)
        elif drivers:
            driver_libs.append((lib, drivers, len(info.get("missing_symbols", []))))
    driver_present = {k: v for k, v in ((sym or {}).get("driver") or {}).items()}
    if driver_libs:
        names = ", ".join(f"{lib} ({', '.join(d)}, {n} symbols)" for lib, d, n in driver_libs)
        verdict = FAIL if gpus else NEEDS_DRIVER
        report.add("symbols: driver", verdict,
                   f"{names}: the GPU driver's library is not in the image (a GPU host's driver provides it"
                   f"{'; with --gpus it should be here' if gpus else ''}); the symbols it would define are checked "
                   "there, everything else here")
    if plugins:
        report.add("symbols: plugins", NOTE,
                   f"{len(plugins)} libraries that nothing in the image links to need libraries the image lacks "
                   f"(they load only where those are installed): {_first(plugins, 6)}")
    # the loader's verdicts on libraries the scan found clean
    flagged = set(findings)
    for lib, load in sorted(loads.items()):
        if load.get("ok") or lib in flagged:
            continue
        err = load.get("error", "")
        if "libcuda.so" in err and not driver_present.get("libcuda.so.1") and not gpus:
            report.add(f"load {lib}", NEEDS_DRIVER, f"the loader says: {err}")
        else:
            broken += 1
            report.add(f"load {lib}", FAIL, f"dlopen(RTLD_NOW) after import torch: {err}")
    summary = []
    if sym and "error" not in sym and not broken:
        via = sym.get("via_global", 0)
        where = ", ".join(roots) if roots else "site-packages"
        clean = sym.get("clean", libraries)
        others = libraries - clean
        summary.append(Finding("symbols", PASS, f"{clean} of {libraries} libraries under {where}: every undefined "
                                              "symbol is defined by a library they load or by the interpreter"
                                              + (f" ({via} symbols only by libraries their package loads first)"
                                                 if via else "")
                                              + (f"; the other {others} are in the rows below" if others else "")))
    failing = [lib for lib, v in loads.items() if not v.get("ok")]
    explained = {c.check.split(" ", 1)[1] for c in report.checks[head:] if c.verdict == FAIL and " " in c.check}
    if loads_ok is not None and not any(lib in explained for lib in failing) and \
            not any(c.check.startswith("load ") and c.verdict == FAIL for c in report.checks[head:]):
        summary.append(Finding("load", PASS, f"{loads_ok} of {libraries} libraries load with dlopen(RTLD_NOW) after "
                                           "import torch" + ("" if loads_ok == libraries else
                                                             "; the others are in the rows below")))
    report.checks[head:head] = summary


def judge_archs(report: VerifyReport, cubins: dict | None, archs: list[str], dists: dict[str, str | None],
                source: str) -> None:
    if cubins is None:
        return
    if "error" in cubins:
        report.add("archs", ERROR, f"not checked: {cubins['error']}")
        return
    holding = {lib: c for lib, c in cubins.items() if not c.get("none") and "error" not in c}
    none = sorted(lib for lib, c in cubins.items() if c.get("none"))
    report.facts.setdefault("archs", {})["device_code_sections_without_code"] = none
    unread = 0
    for lib, c in sorted(cubins.items()):
        if "error" in c:
            unread += 1
            report.add(f"archs {lib}", ERROR, f"not checked: cuobjdump could not read it ({c['error']})")
    if not holding and unread:
        return  # what the unread ones hold is unknown: neither "no device code" nor a pass
    if not holding:
        if archs:
            report.add("archs", FAIL, f"the image is for {';'.join(archs)} ({source}), but no library in it holds GPU "
                                      "device code (a CPU build of torch?)")
        else:
            report.add("archs", SKIP, "no library holds GPU device code")
        return
    if not archs:
        report.add("archs", SKIP, f"{len(holding)} libraries hold device code, but which architectures to require "
                                  f"is unknown: the image has no {labels_.CUDA_ARCHS} label; pass --cuda-archs "
                                  "(e.g. 9.0)")
        return
    vendor, bad = [], 0
    for lib, c in sorted(holding.items()):
        lacking = [a for a in archs if not cubin_covers(c.get("elf", []), a)]
        if not lacking:
            continue
        dist = dists.get(lib) or ""
        ptx_only = [a for a in lacking if any(p.startswith(f"sm_{a.replace('.', '')}") for p in c.get("ptx", []))]
        what = f"no cubin for {', '.join('sm_' + a.replace('.', '') for a in lacking)}" + \
               (f" (only PTX for {', '.join('sm_' + a.replace('.', '') for a in ptx_only)}: compiled at start-up "
                "by the driver, if at all)" if ptx_only else "") + \
               f"; cubins: {', '.join(c.get('elf', [])) or 'none'}"
        if dist.startswith("nvidia-"):
            vendor.append(f"{lib} ({dist}): {what}")
        else:
            bad += 1
            report.add(f"archs {lib}", FAIL, f"{lib}{f' ({dist})' if dist else ''}: {what}")
    if vendor:
        report.add("archs: NVIDIA's libraries", NOTE,
                   f"{len(vendor)} libraries of nvidia-* wheels (as NVIDIA ships them, not built here) lack a cubin "
                   f"for {';'.join(archs)}: " + "; ".join(vendor))
    if not bad and not unread:
        report.add("archs", PASS, f"{len(holding) - len(vendor)} libraries with device code have a cubin for every "
                                  f"requested architecture ({';'.join(archs)}, from {source})")


def parse_pip_check(output: str) -> list[dict]:
    """pip check's lines as {line, kind, dist, version?, wants?, have?}."""
    out = []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        m = re.match(r"^(\S+) (\S+) has requirement (.+), but you have (\S+) (\S+?)\.?$", line)
        if m:
            want = m.group(3)
            wname = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", want)
            out.append({"line": line, "kind": "version", "dist": m.group(1), "requires": want,
                        "name": normalize(wname.group(1) if wname else m.group(4)), "have": m.group(5)})
            continue
        m = re.match(r"^(\S+) (\S+) requires (\S+?),? which is not installed\.?$", line)
        if m:
            out.append({"line": line, "kind": "missing", "dist": m.group(1), "name": normalize(m.group(3))})
            continue
        m = re.match(r"^(\S+) (\S+) is not supported on this platform\.?$", line)
        if m:
            out.append({"line": line, "kind": "platform", "dist": m.group(1), "version": m.group(2)})
            continue
        out.append({"line": line, "kind": "other"})
    return out


def judge_pip(report: VerifyReport, pip: dict | None, overrides: dict[str, str], drop: list[str],
              dockerlaunch_built: bool = False) -> None:
    if pip is None:
        return
    if "error" in pip:
        report.add("pip check", ERROR, f"did not run: {pip['error']}")
        return
    lines = parse_pip_check(pip.get("output", ""))
    if pip.get("rc") not in (0, 1) and not lines:
        report.add("pip check", FAIL, f"pip check exited {pip.get('rc')}: {pip.get('output', '').strip()[-300:]}")
        return
    drops = {normalize(d) for d in drop}
    unsupported = pip.get("unsupported") or {}
    for item in lines:
        name = item.get("name")
        if item["kind"] == "version" and name in overrides and item["have"] == overrides[name]:
            report.add("pip check", NOTE, f"recorded override {name}=={overrides[name]} (label {labels_.OVERRIDES}): "
                                          f"{item['line']}")
        elif item["kind"] == "missing" and name in drops:
            report.add("pip check", NOTE, f"recorded drop {name} (label {labels_.DROP}): {item['line']}")
        elif item["kind"] == "platform" and item["dist"] in unsupported and not unsupported[item["dist"]]["foreign"]:
            # pip compares the tag in the wheel's WHEEL file (TE's core wheels say cp310-cp310 in a py3-none wheel)
            u = unsupported[item["dist"]]
            exts = (f"its {len(u['extensions'])} Python extension(s) are for this Python" if u["extensions"] else
                    "it holds no Python extension module")
            report.add("pip check", WARN, f"{item['line']}: its WHEEL file claims {', '.join(u['tags']) or 'no tag'}, "
                                          f"but {exts} (checked), so the tag is wrong, not the files")
        else:
            report.add("pip check", FAIL, item["line"])
    if not lines:
        report.add("pip check", PASS, "no broken requirements")
    judge_kept_pins(report, pip.get("constraint"), dockerlaunch_built)


def judge_kept_pins(report: VerifyReport, constraint: dict | None, dockerlaunch_built: bool) -> None:
    """PIP_CONSTRAINT keeps the binary core where the lock put it (train.Dockerfile's top layer): a file pip cannot
    read breaks every install in the image; an image dockerlaunch built without one (older builds) is named."""
    if constraint is None:
        if dockerlaunch_built:
            report.add("pins kept", WARN, "no PIP_CONSTRAINT: a later `pip install` in the image may move torch, TE or "
                                          "the CUDA libraries (built before dockerlaunch kept pins; build it again)")
        return
    if "error" in constraint:
        report.add("pins kept", FAIL, f"PIP_CONSTRAINT={constraint['path']} cannot be read ({constraint['error']}): "
                                      "every `pip install` in the image fails")
        return
    applied = constraint.get("applied") or []
    report.add("pins kept", PASS, f"PIP_CONSTRAINT={constraint['path']} keeps {constraint['pins']} pins"
                                  + (f"; recorded overrides made true in installed metadata: {_first(applied)}"
                                     if applied else ""))


# the driver's user-space libraries that could not be opened (the image must then really lack them)
DRIVER_LIB_ERROR = re.compile(r"(libcuda\.so[.\d]*|libnvidia-ml\.so[.\d]*): cannot open shared object file")
# what CUDA, torch and NVML say when there is no GPU or no kernel driver (a GPU host has both)
NO_GPU_ERROR = re.compile(
    r"Found no NVIDIA driver|NVIDIA driver on your system|no CUDA-capable device|No CUDA GPUs are available|"
    r"CUDA driver initialization failed|cudaErrorNoDevice|cudaErrorInsufficientDriver|CUDA_ERROR_NO_DEVICE|"
    r"NVML Shared Library Not Found|NVMLError_DriverNotLoaded|Driver Not Loaded|"
    r"CUDA driver version is insufficient", re.I)


def only_the_driver(text: str, driver: dict | None, gpus: bool) -> str | None:
    """Why an import error means only that this container has no GPU driver (then NEEDS-DRIVER), else None."""
    if gpus or "undefined symbol" in text:
        return None
    lib = DRIVER_LIB_ERROR.search(text)
    if lib:
        name = lib.group(1) if lib.group(1).count(".so.") else lib.group(1).replace(".so", ".so.1")
        if driver is None:
            return f"the loader found no {name}; whether the image has one is unknown (no symbol scan)"
        if not driver.get(name):
            return f"the loader found no {name} and the image has none (searched as the loader does)"
        return None
    if NO_GPU_ERROR.search(text):
        return "the error says there is no GPU or no kernel driver, as in any container started without GPUs"
    return None


def _file_version(path: str) -> str:
    m = re.search(r"\.so\.(\d+(?:\.\d+)+)$", path)
    return m.group(1) if m else "version unknown"


def judge_import_orders(report: VerifyReport, runs: list[dict] | None, copies: dict | None, driver: dict | None,
                        gpus: bool, failed_main: dict[str, str]) -> None:
    """Each component alone, TE before torch and torch before TE: an import that fails only in some order, and a
    CUDA library loaded from a copy that is not the lock's (a system copy beside the pip wheel's: an nvidia/cuda
    base's /usr/local/cuda, ld.so.cache) are FAILs naming the order and both files; copies that exist twice but
    were never taken from the system are a NOTE (nvidia/cuda devel bases duplicate most CUDA libraries)."""
    if runs is None:
        return
    copies = copies or {}
    head = len(report.checks)
    shadowed: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        order = " before ".join(run["order"]) if len(run["order"]) > 1 else f"{run['order'][0]} alone"
        if run.get("died"):
            report.add(f"import order: {order}", FAIL, f"the import process died ({run['died']})")
            continue
        failed = run.get("failed")
        if failed and failed_main.get(failed[0], "")[:300] != failed[1][:300]:
            why = only_the_driver(failed[1], driver, gpus)
            # a failed dlopen unmaps what it loaded: name the copy the loader takes for each library the error names
            taken = []
            for so in dict.fromkeys(re.findall(r"\blib[\w+-]+\.so\.\d+\b", failed[1])):
                files = copies.get(so, [])
                mine = next((f for f in files if f["where"] == "pip"), None)
                theirs = next((f for f in files if f.get("loader") and f["where"] != "pip"), None)
                if mine and theirs:
                    taken.append(f"the loader resolves {so} through ld.so.cache to {theirs['path']} "
                                 f"({_file_version(theirs['path'])}), not the lock's {mine['path']} "
                                 f"({mine.get('dist') or _file_version(mine['path'])})")
            report.add(f"import order: {order}", NEEDS_DRIVER if why and not taken else FAIL,
                       f"import {failed[0]} fails in this order: {failed[1]}" + "".join(f"; {t}" for t in taken)
                       + (f" — checked: {why}" if why and not taken else ""))
        for so, path in sorted(run.get("loaded", {}).items()):
            files = copies.get(so, [])
            if any(f["where"] == "pip" for f in files) and not any(f["path"] == path and f["where"] == "pip"
                                                                    for f in files):
                shadowed.setdefault((so, path), []).append(order)
    for (so, path), orders in sorted(shadowed.items()):
        files = copies[so]
        mine = next(f for f in files if f["where"] == "pip")
        theirs = next((f for f in files if f["path"] == path), {"where": "elsewhere"})
        report.add(f"import order: {so}", FAIL,
                   f"{_first(orders, 4)} loads {path} ({theirs['where']}, {_file_version(path)}), not the lock's "
                   f"{mine['path']} ({mine.get('dist') or _file_version(mine['path'])}): the library it then runs "
                   "with is not the one the stack was checked with")
    twice = sorted(so for so, files in copies.items() if any(f["where"] == "pip" for f in files)
                   and not any(k[0] == so for k in shadowed))
    if twice:
        report.add("import orders: duplicates", NOTE,
                   f"{len(twice)} CUDA libraries exist both in the lock's wheels and in the system, and no import "
                   f"order took the system's copy: {_first(twice, 6)}")
    if not shadowed and not any(run.get("failed") or run.get("died") for run in runs):
        both = ", TE before torch and torch before TE" if any(len(r["order"]) > 1 for r in runs) else ""
        report.checks.insert(head, Finding("import orders", PASS, f"{len(runs)} runs (each component alone{both}): "
                                                                "every CUDA library came from the lock's wheels"))


def judge_imports(report: VerifyReport, imports: dict | None, driver: dict | None, gpus: bool,
                  broken_libs: list[str]) -> None:
    """An import failing only for want of a GPU is NEEDS-DRIVER, never with --gpus (then it is a FAIL), and only when
    no error in its chain names an undefined symbol and either: the loader could not open libcuda.so.1 or
    libnvidia-ml.so.1 and the image really has no such file (searched as the loader does), or CUDA/torch/NVML say
    there is no GPU or no kernel driver (true of every container started without GPUs)."""
    for mod, r in (imports or {}).items():
        if r.get("ok"):
            report.add(f"import {mod}", PASS, "imported")
            continue
        chain = r.get("chain") or [r.get("error", "")]
        text = " | ".join(chain)
        why = only_the_driver(text, driver, gpus)
        if why:
            report.add(f"import {mod}", NEEDS_DRIVER, f"{r.get('error')} — checked: {why}; no undefined symbol")
        else:
            hint = ""
            if "undefined symbol" in text:
                hint = " (ABI drift: a library built against other versions of what it links)" \
                    if not broken_libs else f" (see symbols {broken_libs[0]})"
            report.add(f"import {mod}", FAIL, text[:600] + hint)


PIN_DISTS = {
    "torch": ["torch"], "flash_attn": ["flash-attn"], "megatron_core": ["megatron-core"], "ms_swift": ["ms-swift"],
    "transformers": ["transformers"], "peft": ["peft"], "trl": ["trl"], "deepspeed": ["deepspeed"],
    "numpy": ["numpy"], "cuda_toolkit": ["cuda-toolkit"],
    "transformer_engine": ["transformer-engine", "transformer-engine-cu13", "transformer-engine-cu12",
                           "transformer-engine-torch"],
}
NOT_VERSIONS = {"base_image", "cuda", "apex", "megatron_lm"}  # refs or CUDA majors, checked elsewhere or not here
KEY_DISTS = ["torch", "transformer-engine", "transformer-engine-cu13", "transformer-engine-cu12",
             "transformer-engine-torch", "flash-attn", "apex", "megatron-core", "ms-swift", "deepspeed",
             "transformers", "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12",
             "nvidia-nccl-cu13", "nvidia-nccl-cu12"]
KEY_MODULES = {"torch": "torch", "transformer-engine-torch": "transformer_engine.pytorch", "flash-attn": "flash_attn",
               "apex": "apex", "megatron-core": "megatron.core", "ms-swift": "swift", "deepspeed": "deepspeed",
               "transformers": "transformers"}


def version_matches(want: str, got: str | None) -> bool:
    """torch 2.13.0 matches 2.13.0+cpu; otherwise exact."""
    return got is not None and (got == want or got.split("+")[0] == want.split("+")[0] and "+" in got)


def judge_versions(report: VerifyReport, labels: dict, dists: dict[str, str] | None, python: str | None,
                   mcore_clone) -> None:
    if dists is None:
        return
    pins = labels_.pins(labels)
    if labels_.STACK not in labels:
        found = {d: dists[d] for d in KEY_DISTS if d in dists}
        report.versions = {d: {"installed": v, "pinned": None} for d, v in found.items()}
        if python:
            report.versions = {"python": {"installed": python, "pinned": None}, **report.versions}
        listed = ", ".join(f"{d} {v}" for d, v in found.items()) or "none of the key packages"
        report.add("versions", NOTE, f"no {labels_.PREFIX}* labels (not built by dockerlaunch), so no pins to "
                                     f"compare; found: python {python}, {listed}")
        return
    for key, want in pins.items():
        if key in NOT_VERSIONS:
            continue
        if key == "python":
            got = ".".join((python or "").split(".")[:2]) or None
            report.versions["python"] = {"installed": python, "pinned": want}
            report.add("version python", PASS if got == want else FAIL, f"pinned {want}, installed {python}")
            continue
        names = PIN_DISTS.get(key, [normalize(key)])
        installed = {n: dists[n] for n in names if n in dists}
        shown = ", ".join(f"{n} {v}" for n, v in installed.items())
        report.versions[key] = {"installed": (shown if len(names) > 1 else installed.get(names[0])) or None,
                                "pinned": want}
        if not installed:
            report.add(f"version {key}", FAIL, f"pinned {want}, not installed ({' / '.join(names)})")
            continue
        bad = {n: v for n, v in installed.items() if not version_matches(want, v)}
        report.add(f"version {key}", FAIL if bad else PASS, f"pinned {want}, installed {shown}")
    if isinstance(mcore_clone, dict):
        report.add("megatron-core pip vs clone", FAIL, mcore_clone.get("error", "unreadable"))
    elif mcore_clone:
        pip_mm, clone_mm = mcore_clone
        report.add("megatron-core pip vs clone", PASS if pip_mm == clone_mm else FAIL,
                   f"pip {pip_mm[0]}.{pip_mm[1]}, clone package_info {clone_mm[0]}.{clone_mm[1]}")


def compat_of_scan(scan: dict | None) -> CudaCompat | None:
    """verify_image.py's reading of the image's cuda-compat -> what doctor and the plan judge: the folder
    /usr/local/cuda resolves to (else the newest), its libcuda's version (file name), the branches it serves (its
    `.note.cuda.fwd_compatibility` ELF note's Driver list; else NVIDIA_REQUIRE_CUDA's brand=tesla,driver>=N), and
    whether the image itself puts it on the loader's path (its LD_LIBRARY_PATH, an /etc/ld.so.conf.d file)."""
    if not isinstance(scan, dict) or not scan.get("dirs"):
        return None

    def version(d: dict) -> str:
        return max((f.removeprefix("libcuda.so.") for f in d["files"]), key=version_tuple)

    cuda_dir = next((d for d in scan["dirs"] if d["dir"] == "/usr/local/cuda/compat"), None)
    d = cuda_dir or max(scan["dirs"], key=lambda d: version_tuple(version(d)))
    note = d.get("note") if isinstance(d.get("note"), dict) else {}
    env = scan.get("env") or {}
    branches = tuple(sorted({int(b) for b in note.get("Driver") or () if str(b).isdigit()}))
    own = version(d)
    # the library's own branch serves itself (its note lists it); the older ones are what forward compatibility adds
    branches = (tuple(b for b in branches if b < version_tuple(own)[0])
                or require_branches(env.get("NVIDIA_REQUIRE_CUDA")))
    folders = {d["dir"], d["real"]}
    on_path = next((compat_on_path(f, env.get("LD_LIBRARY_PATH")) for f in folders
                    if compat_on_path(f, env.get("LD_LIBRARY_PATH"))), "")
    on_path = on_path or next(iter(scan.get("ld_conf") or ()), "")
    return CudaCompat(version=own, branches=branches, path=d["dir"],
                      cuda=str(note["CUDA Version"]) if note.get("CUDA Version") else None, on_path=on_path)


def judge_compat(report: VerifyReport, scan: dict | None) -> CudaCompat | None:
    """A row for the image's cuda-compat, where it has one (doctor judges it against each host's driver)."""
    if isinstance(scan, dict) and "error" in scan:
        report.add("cuda-compat", WARN, f"the image's cuda-compat folders could not be read: {scan['error']}")
        return None
    compat = compat_of_scan(scan)
    if compat is None:
        return None
    d = next(d for d in scan["dirs"] if d["dir"] == compat.path)  # type: ignore[index]
    source = ("its ELF note" if isinstance(d.get("note"), dict) and d["note"].get("Driver") else
              "the image's NVIDIA_REQUIRE_CUDA" if compat.branches else "")
    serves = (f"forward compatibility for {', '.join(f'R{b}' for b in compat.branches)}, from {source}"
              if compat.branches else "no older branch listed (no ELF note, no NVIDIA_REQUIRE_CUDA brand=tesla)")
    unread = f"; its ELF note could not be read ({d['note_error']})" if d.get("note_error") else ""
    line = (f"cuda-compat {compat.version} in {compat.path}" + (f" (CUDA {compat.cuda})" if compat.cuda else "")
            + f": {serves}{unread}")
    if compat.on_path:
        report.add("cuda-compat", WARN, f"{line}; the image puts it on the loader's path ({compat.on_path}), so it "
                                        f"is loaded on every host: on a driver newer than {compat.version} CUDA fails "
                                        "with error 803, on a GeForce GPU with 804 (the container toolkit adds it "
                                        "only where the host's driver is older)")
    else:
        report.add("cuda-compat", NOTE, f"{line}: used only where a host's driver is older than the image's CUDA "
                                        "needs (doctor judges each host's)")
    return compat


# what each check leaves in verify_image.py's result: asked for and absent means it did not run
RESULT_KEYS = {"symbols": "symbols", "load": "loads_ok", "archs": "cubins", "pip": "pip_check", "imports": "imports",
               "dists": "dists"}


def judge(image: str, labels: dict, result: dict, archs: list[str], archs_source: str,
          gpus: bool = False, wanted: tuple[str, ...] = CHECKS) -> VerifyReport:
    """The report from what verify_image.py found (pure: the unit tests feed it recorded results). A check in
    `wanted` that left no result is an ERROR row (a load test with no library to load is not one)."""
    report = VerifyReport(image)
    for check in wanted:
        if RESULT_KEYS[check] not in result and not (check == "load" and not result.get("libraries")):
            report.add(check if check != "pip" else "pip check", ERROR,
                       "did not run: the image's verify script returned no result for it")
    sym = result.get("symbols")
    roots = result.get("roots", [])
    judge_symbols(report, sym, result.get("loads"), result.get("loads_ok"), result.get("libraries", 0), roots,
                  gpus=gpus)
    if result.get("load_torch_error"):
        report.checks = [replace(c, detail=c.detail + f" (import torch itself failed there: "
                                                   f"{result['load_torch_error'][:200]})") if c.check == "load" else c
                         for c in report.checks]
    judge_archs(report, result.get("cubins"), archs, result.get("device_dists", {}), archs_source)
    judge_pip(report, result.get("pip_check"), parse_pins(labels.get(labels_.OVERRIDES)),
              (labels.get(labels_.DROP) or "").split(), dockerlaunch_built=labels_.STACK in labels)
    broken = [c.check.split(" ", 1)[1] for c in report.checks if c.verdict == FAIL and c.check.startswith("symbols ")]
    driver = (sym or {}).get("driver") if sym and "error" not in sym else None
    judge_imports(report, result.get("imports"), driver, gpus, broken)
    judge_import_orders(report, result.get("import_orders"), result.get("cuda_copies"), driver, gpus,
                        {m: r.get("error", "") for m, r in (result.get("imports") or {}).items() if not r.get("ok")})
    judge_versions(report, labels, result.get("dists"), result.get("python"), result.get("mcore_clone"))
    compat = judge_compat(report, result.get("compat"))
    report.facts = {**report.facts, "python": result.get("python"), "roots": roots,
                    "libraries": result.get("libraries"), "skipped": result.get("skipped", []),
                    "cuda_archs": archs, "cuda_archs_from": archs_source, "timings": result.get("timings", {}),
                    "symbols": {k: v for k, v in (sym or {}).items() if k not in ("device", "preloads")},
                    "loads": result.get("loads", {}), "cubins": result.get("cubins"),
                    "labels": bool(labels.get(labels_.STACK))}
    report.facts["compat"] = None if compat is None else compat.to_dict()
    return report
