"""Missing dynamic symbols, found the way the dynamic loader finds them (run inside an image by verify_image.py;
the unit tests import it on the host). Standard library + pyelftools (mounted read-only by `dockerlaunch verify`).

For every shared object under the scanned folders: each DT_NEEDED name is looked up as glibc's ld.so does
(DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH with $ORIGIN, ld.so.cache, the system folders), plus the folders torch and the
nvidia-* wheels keep their libraries in (a Python package loads those first, so the loader finds them by soname).
Every undefined, non-weak symbol must then be defined, with a matching symbol version, by an object of that closure
or of the global scope (the interpreter and its own libraries), or by another scanned library: torch and
TransformerEngine load their CUDA libraries with RTLD_GLOBAL before their extensions, which `ldd -r` does not know.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection

SO_NAME = re.compile(r"\.so(\.[0-9A-Za-z_]+)*$")
# Libraries of the GPU driver: a GPU host's driver (or the container toolkit) provides them, no image does
DRIVER_LIB = re.compile(r"^lib(cuda|nvidia-[\w.-]+|nvcuvid|nvoptix)\.so(\.\d+)*$")
DRIVER_PREFIXES = {"libcuda.so": ("cu",), "libnvidia-ml.so": ("nvml",)}
EXPORT_BINDS = {"STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE", "STB_LOOS"}
DEVICE_SECTIONS = (".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment")
# The folders torch and the nvidia-* wheels keep their libraries in, under site-packages (searched by soname)
PACKAGE_LIB_GLOBS = ("torch/lib", "nvidia/*/lib", "nvidia/*/lib64", "nvidia/cu13/lib", "nvidia/cu12/lib")
EXT = re.compile(r"\.(cpython|pypy)[-\w.]*\.so$")


@dataclass
class Obj:
    path: str
    machine: str = ""
    elfclass: int = 64
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    undefined: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # (name, version, file)
    defined: dict[str, list[tuple[str | None, bool]]] = field(default_factory=dict)  # name -> [(version, hidden)]
    verneed: dict[str, set[str]] = field(default_factory=dict)  # file -> versions it must define
    verdef: set[str] = field(default_factory=set)
    device_code: bool = False


def is_shared_object_name(name: str) -> bool:
    return bool(SO_NAME.search(name))


def is_extension(path: str) -> bool:
    """A Python extension module (imported, so never an unused plugin): a tagged name, or an untagged foo.so."""
    base = os.path.basename(path)
    return bool(EXT.search(base)) or base.endswith(".abi3.so") or (base.endswith(".so") and not base.startswith("lib"))


def read_elf(path: str) -> Obj:
    """The dynamic facts of one ELF file. Raises ELFError/OSError/ValueError for a file that is not a readable ELF."""
    obj = Obj(path)
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            raise ELFError("not an ELF file")
        fh.seek(0)
        elf = ELFFile(fh)
        obj.machine, obj.elfclass = elf["e_machine"], elf.elfclass
        dynsym = verdef_sec = verneed_sec = versym_sec = None
        for sec in elf.iter_sections():
            if sec.name in DEVICE_SECTIONS and sec["sh_size"] > 0:
                obj.device_code = True
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    kind = tag.entry.d_tag
                    if kind == "DT_NEEDED":
                        obj.needed.append(tag.needed)
                    elif kind == "DT_SONAME":
                        obj.soname = tag.soname
                    elif kind == "DT_RPATH":
                        obj.rpath += [p for p in tag.rpath.split(":") if p]
                    elif kind == "DT_RUNPATH":
                        obj.runpath += [p for p in tag.runpath.split(":") if p]
            elif sec["sh_type"] == "SHT_DYNSYM":
                dynsym = sec
            elif isinstance(sec, GNUVerDefSection):
                verdef_sec = sec
            elif isinstance(sec, GNUVerNeedSection):
                verneed_sec = sec
            elif isinstance(sec, GNUVerSymSection):
                versym_sec = sec
        defs: dict[int, str] = {}
        if verdef_sec is not None:
            for verdef, aux in verdef_sec.iter_versions():
                names = [a.name for a in aux]
                if names and not verdef["vd_flags"] & 0x1:  # VER_FLG_BASE names the file, not a version
                    defs[verdef["vd_ndx"]] = names[0]
                    obj.verdef.add(names[0])
        needs: dict[int, tuple[str, str]] = {}
        if verneed_sec is not None:
            for verneed, aux in verneed_sec.iter_versions():
                for a in aux:
                    needs[a["vna_other"]] = (verneed.name, a.name)
                    if not a["vna_flags"] & 0x2:  # VER_FLG_WEAK: the loader only warns
                        obj.verneed.setdefault(verneed.name, set()).add(a.name)
        if dynsym is None:
            return obj
        versym: tuple[int, ...] = ()
        if versym_sec is not None:
            data = versym_sec.data()
            fmt = ("<" if elf.little_endian else ">") + "H" * (len(data) // 2)
            versym = struct.unpack(fmt, data)
        for i, sym in enumerate(dynsym.iter_symbols()):
            if not sym.name:
                continue
            bind = sym["st_info"]["bind"]
            vs = versym[i] if i < len(versym) else 1
            ndx = vs & 0x7FFF
            if sym["st_shndx"] == "SHN_UNDEF":
                if bind == "STB_GLOBAL":
                    file_ver = needs.get(ndx) if ndx >= 2 else None
                    obj.undefined.append((sym.name, file_ver[1] if file_ver else None,
                                          file_ver[0] if file_ver else None))
            elif bind in EXPORT_BINDS and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED") \
                    and sym["st_info"]["type"] not in ("STT_SECTION", "STT_FILE"):
                version = defs.get(ndx) if ndx >= 2 else None
                obj.defined.setdefault(sym.name, []).append((version, bool(vs & 0x8000)))
    return obj


def has_device_code(path: str) -> bool:
    """Whether the file has a non-empty CUDA fatbin section (section headers only: cheap)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                return False
            fh.seek(0)
            return any(sec.name in DEVICE_SECTIONS and sec["sh_size"] > 0 for sec in ELFFile(fh).iter_sections())
    except (ELFError, OSError, ValueError, struct.error):
        return False


def provides(obj: Obj, name: str, version: str | None) -> bool:
    """Whether `obj` satisfies a reference to `name` (of `version`), as glibc's check_match decides."""
    for def_version, hidden in obj.defined.get(name, ()):
        if version is None:
            if not hidden:
                return True
        elif def_version == version or (def_version is None and not hidden):
            return True
    return False


def lib_stem(soname: str) -> str:
    """libcublasLt.so.13 -> cublasLt; libc10_cuda.so -> c10_cuda."""
    base = os.path.basename(soname)
    base = base[3:] if base.startswith("lib") else base
    return base.split(".so")[0]


def _cxx_namespace(symbol: str) -> str | None:
    m = re.match(r"_ZN[KVr]*(?:St)?(\d+)", symbol)
    if not m:
        return None
    n = int(m.group(1))
    start = m.end()
    return symbol[start:start + n] or None


def expected_provider(symbol: str, version: str | None, verfile: str | None, needed: list[str]) -> str | None:
    """Which library "should" define a missing symbol: the file its version node names (cublasLt...@libcublasLt.so.13
    -> libcublasLt.so.13), else the needed library whose name is the longest prefix of the symbol (or of its C++
    namespace: _ZN3c10... -> libc10.so), else None."""
    if verfile:
        return verfile
    keys = [symbol]
    ns = _cxx_namespace(symbol)
    if ns:
        keys.append(ns)
    best, best_len = None, 0
    for key in keys:
        for lib in needed:
            stem = lib_stem(lib)
            if len(stem) < 2 or len(stem) <= best_len:
                continue
            if key == stem or key.startswith(stem) or key.lower().startswith(stem.lower()):
                best, best_len = lib, len(stem)
    if best is None:
        for lib, prefixes in DRIVER_PREFIXES.items():
            if any(n.startswith(lib) for n in needed) and re.match(rf"^({'|'.join(prefixes)})[A-Z]", symbol):
                return next(n for n in needed if n.startswith(lib))
    return best


def is_python_api(symbol: str) -> bool:
    return symbol.startswith(("Py", "_Py"))


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` -> soname -> paths, in the cache's order (the loader takes the first fitting one)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(3))
    return out


@dataclass
class Found:
    path: str | None
    how: str


class Resolver:
    """Finds DT_NEEDED libraries and decides which undefined symbols nothing provides."""

    def __init__(self, *, ld_library_path: list[str] = (), package_dirs: list[str] = (),
                 ldcache: dict[str, list[str]] | None = None, system_dirs: list[str] | None = None,
                 global_objects: list[str] = (), scanned: list[str] = ()):
        self.ld_library_path = list(ld_library_path)
        self.package_dirs = list(package_dirs)
        self.ldcache = ldcache or {}
        self.system_dirs = system_dirs if system_dirs is not None else [
            "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
        self.objects: dict[str, Obj | None] = {}
        self.errors: dict[str, str] = {}
        self._closures: dict[str, list[str]] = {}
        self._index: dict[str, list[str]] | None = None
        self._linked: dict[str, list[str]] | None = None
        self.scanned = [self._real(p) for p in scanned]
        self._by_soname: dict[str, str] = {}
        for p in self.scanned:
            o = self.load(p)
            if o is not None:
                self._by_soname.setdefault(o.soname or os.path.basename(p), p)
                self._by_soname.setdefault(os.path.basename(p), p)
        self.global_scope: list[str] = []
        for p in global_objects:
            real = self._real(p)
            if self.load(real) is not None:
                self.global_scope += [x for x in self.closure(real) if x not in self.global_scope]

    # ---- the file system (TableResolver answers these from recorded tables instead)
    @staticmethod
    def _real(path: str) -> str:
        return os.path.realpath(path)

    @staticmethod
    def _is_file(path: str) -> bool:
        return os.path.isfile(path)

    def _read(self, real: str) -> Obj:
        return read_elf(real)

    # ---- objects
    def load(self, path: str) -> Obj | None:
        real = self._real(path)
        if real not in self.objects:
            try:
                self.objects[real] = self._read(real)
            except (ELFError, OSError, ValueError, struct.error, KeyError, AttributeError, TypeError) as e:
                self.objects[real] = None
                self.errors[real] = f"{type(e).__name__}: {e}"
        return self.objects[real]

    def _fits(self, path: str, like: Obj) -> Obj | None:
        if not self._is_file(path):
            return None
        o = self.load(path)
        if o is None or (like.machine and (o.machine != like.machine or o.elfclass != like.elfclass)):
            return None
        return o

    @staticmethod
    def _expand(dirs: list[str], origin: str) -> list[str]:
        out = []
        for d in dirs:
            d = d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
            d = d.replace("${LIB}", "lib64").replace("$LIB", "lib64")
            d = d.replace("${PLATFORM}", "x86_64").replace("$PLATFORM", "x86_64")
            out.append(d)
        return out

    def find(self, name: str, requester: str, root: str | None = None) -> Found:
        """Where the loader would find DT_NEEDED `name` of `requester` (whose load chain starts at `root`)."""
        req = self.objects.get(self._real(requester))
        if req is None:
            return Found(None, "requester unreadable")
        if "/" in name:
            return Found(name if self._fits(name, req) else None, "path")
        origin = os.path.dirname(requester)
        candidates: list[tuple[str, str]] = []
        if not req.runpath:  # DT_RPATH counts only where DT_RUNPATH is absent; the chain's root's too
            for p in ([requester] + ([root] if root and root != requester else [])):
                o = self.objects.get(self._real(p))
                if o is not None and not o.runpath:
                    candidates += [(d, "rpath") for d in self._expand(o.rpath, os.path.dirname(p))]
        candidates += [(d, "LD_LIBRARY_PATH") for d in self.ld_library_path]
        candidates += [(d, "runpath") for d in self._expand(req.runpath, origin)]
        candidates += [(d, "package folder") for d in self.package_dirs]
        for d, how in candidates:
            if self._fits(os.path.join(d, name), req):
                return Found(os.path.join(d, name), how)
        for p in self.ldcache.get(name, ()):
            if self._fits(p, req):
                return Found(p, "ld.so.cache")
        for d in self.system_dirs:
            if self._fits(os.path.join(d, name), req):
                return Found(os.path.join(d, name), "system folder")
        p = self._by_soname.get(name)
        if p and self._fits(p, req):
            return Found(p, "loaded by its package (same soname in site-packages)")
        return Found(None, "not found")

    def closure(self, path: str) -> list[str]:
        """The object and every library it loads (breadth first, as the loader orders its search scope)."""
        real = self._real(path)
        cached = self._closures.get(real)
        if cached is not None:
            return cached
        order, seen, queue = [real], {real}, [(path, real)]
        while queue:
            as_named, cur = queue.pop(0)
            o = self.objects.get(cur)
            if o is None:
                continue
            for name in o.needed:
                f = self.find(name, as_named, root=path)
                if f.path is None:
                    continue
                r = self._real(f.path)
                if r not in seen:
                    seen.add(r)
                    order.append(r)
                    queue.append((f.path, r))
        self._closures[real] = order
        return order

    def linked_by(self, path: str) -> list[str]:
        """The other scanned libraries whose closure holds `path` (they make the loader load it)."""
        if self._linked is None:
            self._linked = {}
            for p in self.scanned:
                for q in self.closure(p)[1:]:
                    self._linked.setdefault(q, []).append(p)
        return self._linked.get(self._real(path), [])

    def missing_libraries(self, path: str) -> list[tuple[str, str]]:
        """(needed name, needed by) for every library of the closure the loader cannot find."""
        out = []
        for p in self.closure(path):
            o = self.objects.get(p)
            for name in (o.needed if o else ()):
                if self.find(name, p, root=path).path is None:
                    out.append((name, p))
        return out

    def _defined_index(self) -> dict[str, list[str]]:
        if self._index is None:
            self._index = {}
            for p in self.scanned:
                o = self.objects.get(p)
                for name in (o.defined if o else ()):
                    self._index.setdefault(name, []).append(p)
        return self._index

    def check(self, path: str) -> dict:
        """Findings for one scanned library: missing symbols (with the library expected to define each), missing
        libraries, missing version nodes, and what only a global preload provides."""
        real = self._real(path)
        obj = self.objects.get(real)
        if obj is None:
            return {"error": self.errors.get(real, "unreadable")}
        scope = self.closure(path)
        scope_objs = [self.objects[p] for p in scope + self.global_scope if self.objects.get(p) is not None]
        index = self._defined_index()
        missing, via_global, providers = [], 0, {}
        missing_libs = self.missing_libraries(path)
        for name, version, verfile in obj.undefined:
            if any(provides(o, name, version) for o in scope_objs):
                continue
            extra = [p for p in index.get(name, ()) if p != real and provides(self.objects[p], name, version)]
            if extra:
                via_global += 1
                providers.setdefault(extra[0], 0)
                providers[extra[0]] += 1
                continue
            if is_python_api(name):
                continue
            expected = expected_provider(name, version, verfile, obj.needed)
            found = self.find(expected, path) if expected else Found(None, "")
            missing.append({"symbol": name, "version": version, "expected": expected,
                            "expected_path": found.path})
        bad_versions = []
        for p in scope:
            o = self.objects.get(p)
            for file, versions in (o.verneed.items() if o else ()):
                f = self.find(file, p, root=path)
                dep = self.objects.get(self._real(f.path)) if f.path else None
                if dep is None:
                    continue
                for v in sorted(versions - dep.verdef):
                    bad_versions.append({"file": file, "path": f.path, "version": v, "needed_by": p})
        return {"missing_symbols": missing, "missing_libraries": [{"name": n, "needed_by": b} for n, b in missing_libs],
                "missing_versions": bad_versions, "via_global": via_global,
                "global_providers": dict(sorted(providers.items(), key=lambda kv: -kv[1])),
                "device_code": obj.device_code}


def findings(res: Resolver, libs: list[str], rel, dist_of: dict[str, str], is_extension) -> dict:
    """The scan's result for `libs` as verify judges it (an image's site-packages, or a lock's wheels laid out the
    same way by TableResolver): per broken library what is missing and who would have provided it."""
    out, device, clean, via_global, preloads = {}, [], 0, 0, {}
    for p in libs:
        f = res.check(p)
        key = rel(p)
        if "error" in f:
            out[key] = {"error": f["error"]}
            continue
        if f["device_code"]:
            device.append(p)
        via_global += f["via_global"]
        if f["global_providers"]:
            preloads[p] = list(f["global_providers"])
        for m in f["missing_symbols"]:
            m["expected_dist"] = dist_of.get(res._real(m["expected_path"])) if m["expected_path"] else None
            m["expected_path"] = rel(m["expected_path"]) if m["expected_path"] else None
        for m in f["missing_libraries"]:
            m["needed_by"] = rel(m["needed_by"])
        for m in f["missing_versions"]:
            m["dist"] = dist_of.get(res._real(m["path"]))
            m["needed_by"], m["path"] = rel(m["needed_by"]), rel(m["path"])
        if f["missing_symbols"] or f["missing_libraries"] or f["missing_versions"]:
            out[key] = {k: f[k] for k in ("missing_symbols", "missing_libraries", "missing_versions")}
            out[key]["dist"] = dist_of.get(res._real(p))
            out[key]["linked_by"] = [rel(q) for q in res.linked_by(p)[:3]]
            out[key]["extension"] = is_extension(p)
            out[key]["global_providers"] = {rel(k): v for k, v in f["global_providers"].items()}
        else:
            clean += 1
    return {"findings": out, "clean": clean, "via_global": via_global, "device": device, "preloads": preloads,
            "unreadable": {rel(k): v for k, v in res.errors.items() if k in {res._real(p) for p in libs}}}


# ---------------------------------------------------------------- recorded tables (stacks check --binaries)


def obj_to_dict(obj: Obj, undefined: bool = True) -> dict:
    """An Obj as JSON (what a wheel's or a base's table keeps: kilobytes instead of the library)."""
    d = {"machine": obj.machine, "elfclass": obj.elfclass, "soname": obj.soname, "needed": obj.needed,
         "rpath": obj.rpath, "runpath": obj.runpath,
         "defined": {k: [[ver, hidden] for ver, hidden in v] for k, v in sorted(obj.defined.items())},
         "verneed": {k: sorted(v) for k, v in sorted(obj.verneed.items())}, "verdef": sorted(obj.verdef),
         "device_code": obj.device_code}
    if undefined:
        d["undefined"] = [list(u) for u in obj.undefined]
    return d


def obj_from_dict(path: str, d: dict) -> Obj:
    return Obj(path, machine=d.get("machine", ""), elfclass=d.get("elfclass", 64), soname=d.get("soname"),
               needed=list(d.get("needed", ())), rpath=list(d.get("rpath", ())), runpath=list(d.get("runpath", ())),
               undefined=[tuple(u) for u in d.get("undefined", ())],
               defined={k: [(ver, bool(hidden)) for ver, hidden in v] for k, v in d.get("defined", {}).items()},
               verneed={k: set(v) for k, v in d.get("verneed", {}).items()}, verdef=set(d.get("verdef", ())),
               device_code=bool(d.get("device_code")))


class TableResolver(Resolver):
    """The same resolution over recorded tables instead of files: `objects` maps each absolute path of a virtual
    tree (the image's site-packages as the lock's wheels would fill it, and the base's system folders) to its
    table, `links` each symbolic link of that tree to its target. Nothing on this machine's disk is read."""

    def __init__(self, objects: dict[str, Obj], links: dict[str, str] | None = None, **kw):
        self.table = dict(objects)
        self.links = dict(links or {})
        super().__init__(**kw)

    def _real(self, path: str) -> str:
        parts = [p for p in os.path.normpath(path).split("/") if p]
        out: list[str] = []
        hops = 0
        while parts:
            out.append(parts.pop(0))
            cur = "/" + "/".join(out)
            target = self.links.get(cur)
            if target is not None and hops < 40:
                hops += 1
                out.pop()
                base = "/" if target.startswith("/") else "/" + "/".join(out)
                parts = [p for p in os.path.normpath(os.path.join(base, target)).split("/") if p] + parts
                out = []
        return "/" + "/".join(out)

    def _is_file(self, path: str) -> bool:
        return self._real(path) in self.table

    def _read(self, real: str) -> Obj:
        try:
            return self.table[real]
        except KeyError:
            raise OSError(f"{real}: not in the recorded tables") from None


def walk_libraries(roots: list[str]) -> list[str]:
    """Shared objects under the roots (no symlinks, each file once), by name."""
    found, seen = [], set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for f in sorted(filenames):
                p = os.path.join(dirpath, f)
                if not is_shared_object_name(f) or os.path.islink(p):
                    continue
                real = os.path.realpath(p)
                if real in seen:
                    continue
                seen.add(real)
                found.append(p)
    return found
