"""Run inside an image by `dockerlaunch verify`; prints one JSON object (the facts; the host judges them).

Standard library only, plus what verify mounts read-only beside the image (never installed into it): elfscan.py
next to this file, pyelftools (DL_PYELFTOOLS) and cuobjdump (DL_CUOBJDUMP). Environment:
  DL_LABELS   the image's labels as JSON ({} for an image without dockerlaunch labels)
  DL_CHECKS   comma-separated subset of: symbols, load, archs, pip, imports, dists (default: all)
Every step runs in its own child process or catches its own errors, so one broken piece never hides the others.

Why one file: ~620 lines, copied into a temporary folder and mounted read-only into an image it knows
nothing of, with elfscan.py its only companion; every module more is one more file to ship, mount and keep in step.
"""

import glob
import importlib.machinery
import importlib.metadata as md
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LABELS = json.loads(os.environ.get("DL_LABELS") or "{}")
CHECKS = set((os.environ.get("DL_CHECKS") or "symbols,load,archs,pip,imports,dists").split(","))
EXT = re.compile(r"\.(cpython|pypy)[-\w.]*\.so$")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("DL_")}
# where a Python package keeps the libraries it loads before its extensions (the loader then finds them by soname)
CUDA_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib",
             "/usr/local/cuda/targets/sbsa-linux/lib")


def site_dirs():
    """The folders Python packages live in: site-packages and any extra sys.path folder outside the stdlib."""
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    out = []
    cands = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    for d in cands:
        if not d or not os.path.isdir(d):
            continue
        real = os.path.realpath(d)
        if real in stdlib or real.endswith("lib-dynload") or real == os.path.realpath(HERE) or real == "/":
            continue
        if any(real == o or real.startswith(o + os.sep) for o in out):
            continue
        out = [o for o in out if not o.startswith(real + os.sep)] + [real]
    return out


def rel(path, roots):
    real = os.path.realpath(path) if os.path.exists(path) else path
    for r in roots:
        if real.startswith(r + os.sep):
            return real[len(r) + 1:]
    return real


def dist_files(roots):
    """realpath of each installed shared object -> 'name version' of the distribution whose RECORD lists it."""
    out = {}
    for dist in md.distributions(path=roots):
        name = dist.metadata["Name"]
        for f in dist.files or ():
            s = str(f)
            if ".so" not in s:
                continue
            try:
                out[os.path.realpath(str(f.locate()))] = f"{re.sub(r'[-_.]+', '-', name).lower()} {dist.version}"
            except (OSError, ValueError):
                pass
    return out


def installed_dists():
    out = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return out


def ldcache():
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            r = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return r.stdout
    return ""


def run_child(code, args, timeout, env=None):
    """A Python child; (exit status, stdout, stderr), -9 on timeout."""
    try:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                           env=env or CLEAN_ENV)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -9, partial, f"timed out after {timeout} s"


# ---------------------------------------------------------------- symbols (elfscan, with pyelftools)


def import_elfscan():
    """elfscan.py (beside this file) with the mounted pyelftools; raises ImportError where it cannot run."""
    for path in (os.environ.get("DL_PYELFTOOLS"), HERE):
        if path and path not in sys.path:
            sys.path.insert(0, path)
    import elfscan

    return elfscan


def scan_symbols(roots, libs, dist_of):
    import glob

    try:
        elfscan = import_elfscan()
    except ImportError as e:
        return {"error": f"pyelftools could not be imported here ({e})"}

    package_dirs = []
    for r in roots:
        for g in elfscan.PACKAGE_LIB_GLOBS:
            package_dirs += [d for d in sorted(glob.glob(os.path.join(r, g))) if d not in package_dirs]
    package_dirs += [d for d in CUDA_DIRS if os.path.isdir(d)]
    global_objs = [sys.executable] + [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    t0 = time.time()
    res = elfscan.Resolver(ld_library_path=[p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p],
                           package_dirs=package_dirs, ldcache=elfscan.parse_ldconfig(ldcache()),
                           global_objects=global_objs, scanned=libs)
    out = elfscan.findings(res, libs, lambda p: rel(p, roots), dist_of, elfscan.is_extension)
    probe = os.path.realpath(sys.executable)
    res.load(probe)
    driver = {name: res.find(name, probe).path for name in ("libcuda.so.1", "libnvidia-ml.so.1")}
    out["driver"] = driver
    return {**out, "seconds": round(time.time() - t0, 1)}


# ---------------------------------------------------------------- machine code (cuobjdump)


def cubin_cache():
    try:
        with open(os.environ["DL_CUBIN_CACHE"]) as f:
            return json.load(f)
    except (KeyError, OSError, ValueError):
        return {}


def list_cubins(paths, roots, new_entries):
    """cuobjdump --list-elf --list-ptx of each library; a file seen before (same path, size and mtime) is taken from
    the cache the launcher mounted, which holds what this same image's earlier scans said (never another image's),
    and what was read here goes back to it in new_entries."""
    tool = os.environ.get("DL_CUOBJDUMP")
    if not tool or not os.path.exists(tool):
        return {"error": "cuobjdump was not mounted"}
    out, cache = {}, cubin_cache()
    for p in paths:
        st = os.stat(p)
        key = f"{os.path.realpath(p)}|{st.st_size}|{st.st_mtime_ns}"
        if key in cache:
            out[rel(p, roots)] = cache[key]
            continue
        try:
            r = subprocess.run([tool, "--list-elf", "--list-ptx", p], capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            out[rel(p, roots)] = {"error": str(e)}
            continue
        text = r.stdout + r.stderr
        elf = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.cubin\b", text)))
        ptx = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.ptx\b", text)))
        entry = {"elf": elf, "ptx": ptx}
        if r.returncode != 0 and not elf and not ptx:
            if "does not contain device code" in text:
                entry["none"] = True
            else:
                entry["error"] = text.strip().splitlines()[-1][:300] if text.strip() else f"exit {r.returncode}"
        out[rel(p, roots)] = entry
        if "error" not in entry:
            new_entries[key] = entry
    return out


# ---------------------------------------------------------------- loading every library for real

LOAD_CHILD = r"""
import ctypes, json, os, sys
try:
    import torch  # noqa: F401  (what every stack's extension is loaded after)
except BaseException as e:
    print("T " + json.dumps(f"{type(e).__name__}: {e}"), flush=True)
jobs = json.loads(sys.stdin.read())
for path, preload in jobs:
    print("S " + json.dumps(path), flush=True)
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOW)
        print("O " + json.dumps([path, []]), flush=True)
        continue
    except OSError as e:
        first = str(e)
    used = []
    for p in preload:
        try:
            ctypes.CDLL(p, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            used.append(p)
        except OSError:
            pass
    try:
        if not used:
            raise OSError(first)
        ctypes.CDLL(path, mode=os.RTLD_NOW)
        print("O " + json.dumps([path, used]), flush=True)
    except OSError as e:
        print("E " + json.dumps([path, str(e)]), flush=True)
"""


def load_all(libs, preloads, timeout_each=120):
    """dlopen(RTLD_NOW) each library in a child that imported torch first; a library that fails with an undefined
    symbol is tried again after the scanned libraries that define its symbols are loaded RTLD_GLOBAL (what torch and
    TE do). A child that dies or hangs is restarted after the library it was loading."""
    results, todo, torch_error = {}, list(libs), None
    while todo:
        proc = subprocess.Popen([sys.executable, "-c", LOAD_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=CLEAN_ENV)
        lines = []
        cond = threading.Condition()

        def reader(proc=proc, lines=lines, cond=cond):
            for line in proc.stdout:
                with cond:
                    lines.append(line)
                    cond.notify()
            with cond:
                lines.append(None)
                cond.notify()

        threading.Thread(target=reader, daemon=True).start()
        proc.stdin.write(json.dumps([[p, preloads.get(p, [])] for p in todo]))
        proc.stdin.close()
        current, done_here, i = None, set(), 0
        deadline = time.time() + 300  # importing torch
        while True:
            with cond:
                while i >= len(lines) and time.time() < deadline:
                    cond.wait(timeout=1)
                if i >= len(lines):
                    proc.kill()
                    proc.wait()
                    results[current or "<import torch>"] = {"ok": False, "error": "hung (no answer in time)"}
                    break
                line = lines[i]
                i += 1
            if line is None:
                break
            kind, payload = line[0], json.loads(line[2:])
            if kind == "T":
                torch_error = payload
            elif kind == "S":
                current, deadline = payload, time.time() + timeout_each
            elif kind in "OE":
                path, detail = payload
                results[path] = {"ok": True, "preloaded": detail} if kind == "O" else {"ok": False, "error": detail}
                done_here.add(path)
                current = None
        code = proc.wait()
        if current is not None and current not in results:
            err = proc.stderr.read().strip().splitlines()[-1:] if proc.stderr else []
            results[current] = {"ok": False, "error": f"the process died loading it (exit {code}) "
                                                      f"{err[0][:200] if err else ''}".strip()}
        remaining = [p for p in todo if p not in results]
        if remaining == todo:  # no progress at all (python itself broken): stop, say so once
            for p in todo:
                results[p] = {"ok": False, "error": f"the load test could not start (exit {code})"}
            break
        todo = remaining
    return results, torch_error


# ---------------------------------------------------------------- imports

IMPORT_CHILD = r"""
import importlib, json, sys
for mod in sys.argv[1:]:
    print("S " + json.dumps(mod), flush=True)
    try:
        importlib.import_module(mod)
        print("R " + json.dumps({"ok": True}), flush=True)
    except BaseException as e:
        chain, seen, cur = [], set(), e
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            chain.append(f"{type(cur).__name__}: {cur}")
            cur = cur.__cause__ or cur.__context__
        print("R " + json.dumps({"ok": False, "error": chain[0], "chain": chain}), flush=True)
"""


def import_modules(mods, timeout=900):
    """Import the modules in order in one process, as a program does (torch first, so what it loads globally is
    there for the next); a module whose import kills or hangs the process is named, and the rest go on in a new one."""
    out, todo = {}, list(mods)
    while todo:
        code, stdout, stderr = run_child(IMPORT_CHILD, todo, timeout=timeout)
        current = None
        for line in stdout.splitlines():
            if line.startswith("S "):
                current = json.loads(line[2:])
            elif line.startswith("R ") and current is not None:
                out[current] = json.loads(line[2:])
                current = None
        if current is not None:
            tail = (stderr.strip().splitlines() or [f"exit {code}"])[-1]
            why = f"timed out after {timeout} s" if code == -9 else f"the import process died (exit {code}): {tail}"
            out[current] = {"ok": False, "error": why[:300], "chain": []}
        remaining = [m for m in todo if m not in out]
        if remaining == todo:
            tail = (stderr.strip().splitlines() or [f"exit {code}"])[-1]
            for m in todo:
                out[m] = {"ok": False, "error": f"python could not start (exit {code}): {tail[:300]}", "chain": []}
            break
        todo = remaining
    return {m: out[m] for m in mods}


# ---------------------------------------------------------------- every import order, and which copy each loads

# CUDA's user-space libraries: the ones a pip wheel and the system (an nvidia/cuda base) may both carry
CUDA_SONAME = re.compile(r"^lib(cublas|cublasLt|cudart|cudnn[\w]*|nccl|nvrtc[\w-]*|curand|cusparse|cusparseLt|cufft|"
                         r"cufftw|cusolver|cusolverMg|nvJitLink|cupti|nvToolsExt|nvshmem_host|cufile)\.so\.\d+$")

ORDER_CHILD = r"""
import importlib, json, sys
out = {"imports": []}
for mod in sys.argv[1:]:
    try:
        importlib.import_module(mod)
        out["imports"].append([mod, None])
    except BaseException as e:
        out["imports"].append([mod, f"{type(e).__name__}: {e}"[:500]])
        break
with open("/proc/self/maps") as f:
    out["maps"] = sorted({line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6
                          and ".so" in line.split(None, 5)[5]})
print("O " + json.dumps(out), flush=True)
"""


def soname_of(path):
    """libcublasLt.so.13.3.0.5 -> libcublasLt.so.13 (the name the loader asks for), None for other files."""
    m = re.match(r"^(lib[\w.+-]*?\.so\.\d+)(\.[\d.]+)?$", os.path.basename(path))
    return m.group(1) if m and CUDA_SONAME.match(m.group(1)) else None


def cuda_copies(roots, dist_of):
    """soname -> each distinct file (by realpath) that a loader could take for it: pip wheels under site-packages,
    and the system's (ld.so.cache, LD_LIBRARY_PATH, /usr/local/cuda*), with the distribution or version of each."""
    cands, first = [], {}
    for r in roots:
        for pattern in ("nvidia/*/lib/lib*.so.*", "nvidia/*/*/lib/lib*.so.*", "torch/lib/lib*.so.*"):
            cands += [(p, "pip") for p in glob.glob(os.path.join(r, pattern))]
    for line in ldcache().splitlines():
        m = re.match(r"^\s*(\S+) \(.*\) => (\S+)$", line)
        if m:
            cands.append((m.group(2), "ld.so.cache"))
            first.setdefault(m.group(1), os.path.realpath(m.group(2)))  # what the loader takes for that name
    dirs = [("LD_LIBRARY_PATH", d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [("/usr/local/cuda", d) for d in CUDA_DIRS] + \
        [("/usr/local/cuda", d) for d in glob.glob("/usr/local/cuda-*/lib64") + glob.glob("/usr/local/cuda-*/lib")]
    for where, d in dirs:
        cands += [(p, where) for p in glob.glob(os.path.join(d, "lib*.so.*"))]
    out = {}
    for path, where in cands:
        so = soname_of(path)
        if not so or not os.path.exists(path):
            continue
        real = os.path.realpath(path)
        pip = any(real.startswith(r + os.sep) for r in roots)
        entry = out.setdefault(so, {}).setdefault(real, {"path": real, "where": where, "dist": dist_of.get(real)})
        if pip:
            entry["where"] = "pip"
        elif where == "ld.so.cache" and entry["where"] != "pip":
            entry["where"] = where  # found several ways: name the loader's own
    for so, files in out.items():
        if so in first and first[so] in files:
            files[first[so]]["loader"] = True  # a process that has not loaded the soname yet gets this copy
    return {so: sorted(files.values(), key=lambda e: e["path"]) for so, files in out.items() if len(files) > 1}


def import_orders(comps, timeout=900):
    """Each component imported alone in a fresh process, then TE before torch and torch before TE (where the stack
    has TE), each with the image's own environment; per run, what failed and which file of each CUDA soname the
    process mapped (/proc/self/maps)."""
    te = next((c for c in comps if c.startswith("transformer_engine")), None)
    orders = [[c] for c in comps]
    if te and "torch" in comps:
        orders += [[te, "torch"], ["torch", te]]
    runs = []
    for order in orders:
        code, stdout, stderr = run_child(ORDER_CHILD, order, timeout=timeout)
        line = next((ln for ln in stdout.splitlines() if ln.startswith("O ")), None)
        if line is None:
            tail = (stderr.strip().splitlines() or [f"exit {code}"])[-1]
            runs.append({"order": order, "died": f"exit {code}: {tail}"[:400], "loaded": {}})
            continue
        res = json.loads(line[2:])
        failed = next(([m, e] for m, e in res["imports"] if e), None)
        loaded = {}
        for p in res["maps"]:
            so = soname_of(p)
            if so:
                loaded[so] = os.path.realpath(p)
        runs.append({"order": order, "failed": failed, "loaded": loaded})
    return runs


def pip_check():
    """pip check's output; for each distribution it calls 'not supported on this platform', the tags its WHEEL file
    claims and the Python extensions it really holds (a wrong tag in a wheel's metadata is not a wrong binary)."""
    code, stdout, stderr = run_child("import runpy, sys; sys.argv = ['pip', 'check']; runpy.run_module('pip', "
                                     "run_name='__main__')", [], timeout=600)
    if code != 0 and "No module named pip" in stderr:
        return {"error": "pip is not installed in the image"}
    unsupported = {}
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for m in re.finditer(r"^(\S+) (\S+) is not supported on this platform", stdout, re.M):
        try:
            dist = md.distribution(m.group(1))
        except md.PackageNotFoundError:
            continue
        tags = [ln.split(":", 1)[1].strip() for ln in (dist.read_text("WHEEL") or "").splitlines()
                if ln.startswith("Tag:")]
        files = [str(f) for f in dist.files or ()]
        exts = [f for f in files if EXT.search(f) or f.endswith(".abi3.so")]
        unsupported[m.group(1)] = {"tags": tags, "extensions": exts[:20],
                                   "foreign": [f for f in exts if not f.endswith(suffixes)][:20]}
    return {"rc": code, "output": stdout + (stderr if code not in (0, 1) else ""), "unsupported": unsupported,
            "constraint": constraint_file()}


def constraint_file():
    """The image's PIP_CONSTRAINT (how many pins it keeps, whether pip can read it) and the overrides keep_pins.py
    made true in installed metadata; None when the image sets none."""
    path = os.environ.get("PIP_CONSTRAINT")
    if not path:
        return None
    out = {"path": path, "pins": None, "applied": []}
    try:
        with open(path) as f:
            out["pins"] = sum(1 for line in f if line.split("#")[0].strip())
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    try:
        with open("/opt/dockerlaunch/overrides-applied.txt") as f:
            out["applied"] = [line.strip() for line in f if line.strip()]
    except OSError:
        pass
    return out


def megatron_clone():
    clone = os.environ.get("MEGATRON_LM_PATH")
    if not (LABELS.get("ai.dockerlaunch.pin.megatron_lm") and clone):
        return None
    try:
        text = open(os.path.join(clone, "megatron/core/package_info.py")).read()
        mm = [int(re.search(p + r"\s*=\s*(\d+)", text).group(1)) for p in ("MAJOR", "MINOR")]
        pip_mm = [int(x) for x in md.version("megatron-core").split(".")[:2]]
        return [pip_mm, mm]
    except (OSError, AttributeError, ValueError, md.PackageNotFoundError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


COMPAT_NOTE = ".note.cuda.fwd_compatibility"  # what cuda-compat's libcuda says it serves (nvidia-container-toolkit
# reads the same section: its cmd/nvidia-cdi-hook/cudacompat/cuda-elf-header.go)
SHT_NOTE = 7


def elf_note(path, section):
    """(name, descriptor) of the first note in ELF section `section` of `path`, read with the standard library
    from the section headers alone (a compat libcuda is tens of MB; this reads a few KB); None where it has none."""
    import struct
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ValueError("not an ELF file")
        end, is64 = "<" if ident[5] == 1 else ">", ident[4] == 2
        head = struct.Struct(end + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"))
        fields = head.unpack(f.read(head.size))
        shoff, shentsize, shnum, shstrndx = fields[5], fields[10], fields[11], fields[12]
        entry = struct.Struct(end + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII"))
        if not shoff or not shnum or shnum > 65535 or shentsize < entry.size or shstrndx >= shnum:
            return None
        sections = []
        for i in range(shnum):
            f.seek(shoff + i * shentsize)
            sections.append(entry.unpack(f.read(entry.size)))
        names = sections[shstrndx]
        f.seek(names[4])
        strtab = f.read(min(names[5], 1 << 20))
        for name, kind, _, _, offset, size, _, _, align, _ in sections:
            if kind != SHT_NOTE or strtab[name:strtab.find(b"\0", name)].decode("latin-1") != section:
                continue
            f.seek(offset)
            data = f.read(min(size, 1 << 16))
            namesz, descsz, _ = struct.unpack(end + "III", data[:12])
            step = max(int(align), 4)
            start = 12 + (namesz + step - 1) // step * step
            return data[12:12 + namesz].rstrip(b"\0").decode("latin-1"), data[start:start + descsz].rstrip(b"\0")
    return None


def cuda_compat():
    """Each cuda-compat folder as nvidia/cuda lays it out (/usr/local/cuda/compat, /usr/local/cuda-X.Y/compat): its
    libcuda.so.<version> and that library's note; what the image's environment says of it (NVIDIA_REQUIRE_CUDA,
    CUDA_VERSION, LD_LIBRARY_PATH) and the /etc/ld.so.conf.d files that name a compat folder."""
    found = []
    for d in sorted(set(glob.glob("/usr/local/cuda/compat") + glob.glob("/usr/local/cuda-*/compat"))):
        libs = sorted(p for p in glob.glob(os.path.join(d, "libcuda.so.*"))
                      if re.search(r"libcuda\.so\.\d+\.\d+(\.\d+)*$", p) and os.path.isfile(p))
        if not libs:
            continue
        item = {"dir": d, "real": os.path.realpath(d), "files": [os.path.basename(p) for p in libs]}
        try:
            note = elf_note(os.path.realpath(libs[-1]), COMPAT_NOTE)
            if note is not None and note[0] == "NVIDIA Corporation":
                item["note"] = json.loads(note[1].decode("utf-8", "replace"))
        except (OSError, ValueError) as e:
            item["note_error"] = str(e)[:200]
        found.append(item)
    conf = []
    for path in sorted(glob.glob("/etc/ld.so.conf.d/*.conf")):
        try:
            with open(path) as f:
                if any(re.fullmatch(r"/usr/local/cuda(-[\d.]+)?/compat/?", line.strip()) for line in f):
                    conf.append(path)
        except OSError:
            pass
    env = {k: os.environ.get(k) for k in ("NVIDIA_REQUIRE_CUDA", "CUDA_VERSION", "LD_LIBRARY_PATH")}
    return {"dirs": found, "env": env, "ld_conf": conf}


def main():
    t0 = time.time()
    roots = site_dirs()
    extra = os.environ.get("MEGATRON_LM_PATH")
    scan_roots = roots + ([os.path.realpath(extra)] if extra and os.path.isdir(extra) else [])
    res = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable, "roots": scan_roots,
           "timings": {}}
    libs, skipped = [], []
    try:
        elfscan = import_elfscan()
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        for p in elfscan.walk_libraries(scan_roots):
            if EXT.search(p) and not p.endswith(suffixes):
                skipped.append([rel(p, scan_roots), "a Python extension for another interpreter"])
            else:
                libs.append(p)
    except ImportError as e:
        res["symbols"] = {"error": f"pyelftools could not be imported here ({e})"}
    res["libraries"] = len(libs)
    res["skipped"] = skipped
    dist_of = dist_files(scan_roots)
    if "dists" in CHECKS:
        res["dists"] = installed_dists()
        res["mcore_clone"] = megatron_clone()
    if "symbols" in CHECKS and "symbols" not in res:
        t = time.time()
        res["symbols"] = scan_symbols(scan_roots, libs, dist_of)
        res["timings"]["symbols"] = round(time.time() - t, 1)
    if "archs" in CHECKS:
        t = time.time()
        if "symbols" in res and "error" not in res["symbols"]:
            device = res["symbols"].get("device", [])
        else:
            try:
                device = [p for p in libs if import_elfscan().has_device_code(p)]
            except ImportError:
                device = []
        res["cubin_cache_new"] = {}
        res["cubins"] = list_cubins(device, scan_roots, res["cubin_cache_new"])
        res["device_dists"] = {rel(p, scan_roots): dist_of.get(os.path.realpath(p)) for p in device}
        res["timings"]["archs"] = round(time.time() - t, 1)
    if "load" in CHECKS and libs:
        t = time.time()
        # the scanned libraries a package would have loaded globally before each one: the providers elfscan saw
        loads, torch_error = load_all(libs, res.get("symbols", {}).get("preloads", {}))
        res["loads"] = {rel(p, scan_roots): v for p, v in loads.items() if not v.get("ok") or v.get("preloaded")}
        res["loads_ok"] = sum(1 for v in loads.values() if v.get("ok"))
        res["load_torch_error"] = torch_error
        res["timings"]["load"] = round(time.time() - t, 1)
    if "pip" in CHECKS:
        t = time.time()
        res["pip_check"] = pip_check()
        res["timings"]["pip"] = round(time.time() - t, 1)
    if "imports" in CHECKS:
        t = time.time()
        comps = [c for c in re.split(r"[,\s]+", LABELS.get("ai.dockerlaunch.components", "")) if c]
        res["imports"] = import_modules(comps)
        res["timings"]["imports"] = round(time.time() - t, 1)
        t = time.time()
        res["import_orders"] = import_orders(comps)
        res["cuda_copies"] = cuda_copies(scan_roots, dist_of)
        res["timings"]["import_orders"] = round(time.time() - t, 1)
    try:
        res["compat"] = cuda_compat()
    except Exception as e:  # noqa: BLE001 -- one broken piece never hides the others
        res["compat"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    res["timings"]["total"] = round(time.time() - t0, 1)
    print(json.dumps(res))


main()
