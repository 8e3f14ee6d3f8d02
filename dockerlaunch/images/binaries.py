"""`stacks check --binaries`: the lock's binaries checked before any image exists, with verify's own resolver.

The TE/cuBLAS break passed every metadata check and was found by running `nm` on the wheels by hand. Here each
binary wheel of the lock is downloaded once (checked against the lock's sha256), its shared objects' dynamic
tables and cubin lists are kept (by the wheel's sha256, in the cache's tables/) and the wheel is deleted; then
elfscan's Resolver runs over those tables laid out as the image's site-packages would hold them, on top of what
the base supplies: a made base's recorded tables (Dockerfiles/bases/, `dockerlaunch stacks base-tables`), or
"not checked here" for a registry base. What the build compiles (TE's torch binding, apex, flash-attn from its
sdist) exists only in the image: verify checks it there.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from dockerlaunch import hints, shipped
from dockerlaunch.cache import cache_root, replacing
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.images import index as idx
from dockerlaunch.images import lock as locks
from dockerlaunch.images import verify as v
from dockerlaunch.images import verify_judges as judges
from dockerlaunch.images import verify_tools as tools
from dockerlaunch.images.stacks import DEBIAN_PYTHON, Stack
from dockerlaunch.images.verify_judges import ERROR, FAIL, NOTE, PASS, VERDICTS, WARN

FORMAT = 1
SITE = "/opt/venv/lib/python{python}/site-packages"  # train.Dockerfile's venv
BASES = "bases"  # under Dockerfiles/: a made base's recorded tables, <suite>-<arch>.json.gz


class BinariesError(DockerlaunchError):
    exit_code = 1


def tables_root() -> Path:
    return cache_root() / "tables"


def load_elfscan():
    """scripts/elfscan.py as a module, with the hash-pinned pyelftools verify mounts into images."""
    if "dl_elfscan" in sys.modules:
        return sys.modules["dl_elfscan"]
    tool = str(tools.ensure_tool(tools.PYELFTOOLS))
    if tool not in sys.path:
        sys.path.insert(0, tool)
    mod = types.ModuleType("dl_elfscan")
    sys.modules["dl_elfscan"] = mod  # dataclasses look their module up
    exec(compile(shipped.script("dockerlaunch.images", "elfscan.py"), "elfscan.py", "exec"), mod.__dict__)
    return mod


def is_binary_wheel(filename: str) -> bool:
    """A wheel for a platform (it may hold shared objects); a py3-none-any wheel holds none that load."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return any(t.platform != "any" for t in tags)


def installed_path(member: str) -> str | None:
    """Where a wheel's member lands under site-packages (None: outside it, or not installed)."""
    m = re.match(r"^[^/]+\.data/(purelib|platlib|data|scripts|headers)/(.*)$", member)
    if m:
        return m.group(2) if m.group(1) in ("purelib", "platlib") else None
    return member


# ---------------------------------------------------------------- one wheel's tables


@dataclass
class Costs:
    downloaded: int = 0  # bytes
    read: int = 0  # wheels read now (not from the cache)
    seconds: float = 0.0


def _table_path(sha256: str) -> Path:
    return tables_root() / f"{sha256}.json.gz"


def cached_table(sha256: str) -> dict | None:
    path = _table_path(sha256)
    try:
        with gzip.open(path, "rt") as f:
            table = json.load(f)
    except (OSError, ValueError, EOFError):
        return None
    return table if table.get("format") == FORMAT else None


def _save_table(table: dict) -> None:
    with replacing(_table_path(table["sha256"])) as raw, gzip.open(raw, "wt") as f:
        json.dump(table, f, separators=(",", ":"))


def _no_space(where: Path, what: str) -> BinariesError:
    free = shutil.disk_usage(where).free / 1e9 if where.exists() else 0
    return BinariesError(f"stacks check --binaries: no space left in {where} while {what} ({free:.1f} GB free): "
                         "free some, or point DOCKERLAUNCH_CACHE_DIR at a larger disk (a CUDA stack's largest "
                         "wheel needs ~2 GB there while it is read)")


def cubins_of(cuobjdump: str | None, path: str) -> dict:
    """cuobjdump --list-elf --list-ptx of one file, as verify records it."""
    if not cuobjdump:
        return {"error": "no cuobjdump for this machine's architecture"}
    try:
        r = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", path], capture_output=True, text=True,
                           timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    text = r.stdout + r.stderr
    elf = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.cubin\b", text)))
    ptx = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.ptx\b", text)))
    entry: dict = {"elf": elf, "ptx": ptx}
    if r.returncode != 0 and not elf and not ptx:
        if "does not contain device code" in text:
            entry["none"] = True
        else:
            entry["error"] = text.strip().splitlines()[-1][:300] if text.strip() else f"exit {r.returncode}"
    return entry


def read_wheel(wheel: Path, entry: locks.Entry, sha256: str, elfscan, cuobjdump: str | None, work: Path) -> dict:
    """The dynamic tables and cubin lists of every shared object in one wheel (each member unpacked alone, read,
    deleted: a CUDA wheel's largest library is ~1 GB)."""
    objects, cubins, errors = {}, {}, {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            dest = installed_path(info.filename)
            if info.is_dir() or dest is None or not elfscan.is_shared_object_name(os.path.basename(dest)):
                continue
            tmp = work / f"member-{os.getpid()}.so"
            try:
                with z.open(info) as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                with open(tmp, "rb") as fh:
                    if fh.read(4) != b"\x7fELF":
                        continue  # a linker script or a text file named .so
                try:
                    obj = elfscan.read_elf(str(tmp))
                except Exception as e:  # noqa: BLE001 - pyelftools raises many kinds on a broken file
                    errors[dest] = f"{type(e).__name__}: {e}"
                    continue
                objects[dest] = elfscan.obj_to_dict(obj)
                if obj.device_code:
                    cubins[dest] = cubins_of(cuobjdump, str(tmp))
            finally:
                tmp.unlink(missing_ok=True)
    return {"format": FORMAT, "name": entry.name, "version": entry.version, "filename": wheel.name,
            "sha256": sha256, "objects": objects, "cubins": cubins, "errors": errors}


def cached_choice(entry: locks.Entry, tags) -> dict | None:
    """The cached table of the file the stack's Python and platform would install, if one is cached (a lock lists
    every Python's files: a table made for another Python's wheel is not this one's)."""
    cached = [t for h in entry.hashes if (t := cached_table(h.removeprefix("sha256:")))]
    if not cached:
        return None
    best = idx.choose(entry, [idx.IndexFile(t["filename"], t["filename"], t["sha256"]) for t in cached], tags)
    return next(t for t in cached if t["sha256"] == best.sha256) if best is not None else None


def wheel_table(entry: locks.Entry, files: list[idx.IndexFile], tags, elfscan, cuobjdump: str | None,
                costs: Costs, log: Callable[[str], None]) -> dict:
    """The entry's table: from the cache (by one of the lock's hashes), else made from the file chosen for the
    stack's Python and platform (downloaded or copied from --find-links, hash-checked as it comes, read, deleted)."""
    cached = cached_choice(entry, tags)
    if cached is not None:
        return cached
    f = idx.choose(entry, files, tags)
    if f is None:
        raise idx.FetchError(f"{entry.name}=={entry.version}: no file with one of the lock's hashes for this Python "
                             "and platform")
    if not f.filename.endswith(".whl") or not is_binary_wheel(f.filename):
        table = {"format": FORMAT, "name": entry.name, "version": entry.version, "filename": f.filename,
                 "sha256": f.sha256, "kind": "sdist" if not f.filename.endswith(".whl") else "pure", "objects": {},
                 "cubins": {}, "errors": {}}
        _save_table(table)
        return table
    root = tables_root()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".wheel-", dir=root))
    t0 = time.monotonic()
    try:
        # a find-links file too is copied while it is hashed and the copy is read: the path hashed to choose it
        # may hold other bytes by the time it is opened again
        local = not f.url.startswith(("http:", "https:"))
        if not local:
            log(f"{entry.name} {entry.version}: downloading {f.filename}")
        path = idx.download(f, work)
        if not local:
            costs.downloaded += path.stat().st_size
        table = read_wheel(path, entry, f.sha256, elfscan, cuobjdump, work)
        table["kind"] = "binary"
        table["seconds"] = round(time.monotonic() - t0, 1)
        _save_table(table)
        costs.read += 1
        return table
    except idx.NoSpace:  # the download, or the copy of a --find-links file, filled the disk
        raise _no_space(root, f"reading {f.filename}") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _no_space(root, f"reading {f.filename}") from None
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- what the base supplies


def base_tables_path(stack: Stack, dockerfiles: Path) -> Path | None:
    if not stack.base:
        return None
    return dockerfiles / BASES / f"{stack.base.debian}-amd64.json.gz"


def read_base(path: Path) -> dict:
    try:
        with gzip.open(path, "rt") as f:
            return json.load(f)
    except FileNotFoundError:
        raise BinariesError(f"{path} is missing: record the base's tables with "
                            f"{hints.dockerlaunch('stacks', 'base-tables', '--stack', 'NAME', hint='binaries.record')} "
                            "(needs Docker; makes the base with debootstrap if it is not here)") from None
    except (OSError, ValueError, EOFError) as e:
        raise BinariesError(f"{path} cannot be read ({e}): record it again with "
                            f"{hints.dockerlaunch('stacks', 'base-tables', '--stack', 'NAME', hint='binaries.record')}"
                            ) from None


def record_base(stack: Stack, dockerfiles: Path, docker: str = "docker",
                log: Callable[[str], None] | None = None) -> Path:
    """Run base_tables.py in the stack's made base and keep its answer (gzip JSON) in Dockerfiles/bases/."""
    from dockerlaunch.images import base as bases

    if not stack.base:
        raise BinariesError(f"stack {stack.name} builds FROM {stack.base_image}, a registry base: its tables are not "
                            "recorded (verify checks the built image)")
    tag, versions = bases.ensure_base(stack.base.debian, docker=docker, log=log)
    pyelf = tools.ensure_tool(tools.PYELFTOOLS)
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-base-tables-") as tmp:
        scripts = v.scripts_folder(Path(tmp), "base_tables.py", "elfscan.py")
        r = v._docker(tool_argv(tag, [f"{v.MOUNT}/scripts/base_tables.py"],
                                entrypoint=f"python{DEBIAN_PYTHON[stack.base.debian]}",
                                labels={"dockerlaunch.probe": "1"}, env={"DL_PYELFTOOLS": f"{v.MOUNT}/py"},
                                mounts=[BindMount(str(pyelf), f"{v.MOUNT}/py", True),
                                        BindMount(str(scripts), f"{v.MOUNT}/scripts", True)], docker=docker),
                      timeout=900)
    if r.returncode != 0:
        raise BinariesError(f"recording the tables of base {tag} failed (exit {r.returncode}): "
                            f"{(r.stderr.strip().splitlines() or [''])[-1][:300]}")
    data = json.loads(r.stdout)
    data.update({"format": FORMAT, "base": tag, "versions": versions, "recorded": time.strftime("%Y-%m-%d"),
                 "how": hints.dockerlaunch("stacks", "base-tables", "--stack", stack.name, hint="binaries.how")})
    path = base_tables_path(stack, dockerfiles)
    assert path is not None
    with replacing(path) as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:  # same base, same bytes
        f.write(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    return path


# ---------------------------------------------------------------- the check


@dataclass
class BinaryReport(judges.VerifyReport):
    costs: dict = field(default_factory=dict)

    def summary(self) -> str:
        n = self.counts()
        return f"stacks check --binaries {self.image}: " + \
            ", ".join(f"{n[x]} {x}" for x in VERDICTS if n[x] or x in (PASS, FAIL))

    def render(self) -> str:
        return super().render().rsplit("\n", 1)[0] + f"\nbinaries {self.image}: {self.outcome}"


def package_dirs(site: str, paths: list[str], elfscan) -> list[str]:
    """The folders of the virtual site-packages that match verify's package globs, in verify's order."""
    dirs = sorted({os.path.dirname(p) for p in paths})
    out: list[str] = []
    for g in elfscan.PACKAGE_LIB_GLOBS:
        out += [d for d in dirs if fnmatch(d, f"{site}/{g}") and d not in out]
    return out


def check(stack: Stack, lock: locks.Lock, dockerfiles: Path, *, archs: list[str], archs_source: str,
          find_links: tuple[str, ...] = (), index_url: str | None = None, offline: bool = False,
          log: Callable[[str], None] | None = None) -> BinaryReport:
    """Rows as verify writes them, for the lock as the image would install it."""
    from dockerlaunch.images import wheels
    from dockerlaunch.images.build_argv import flash_drop
    from dockerlaunch.images.fetch import lock_sources

    log = log or (lambda msg: None)
    t0 = time.monotonic()
    report = BinaryReport(stack.name)
    elfscan = load_elfscan()
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    tool = tools.CUOBJDUMP.get(machine)
    cuobjdump = str(tools.ensure_tool(tool) / "cuobjdump") if tool else None
    indexes, folders = lock_sources(lock)
    if index_url:
        indexes = [index_url, *indexes[1:]]
    indexes = [] if offline else (indexes or [locks.DEFAULT_INDEX])
    torch = lock.get("torch")
    if not offline and stack.torch_index_url and torch and "+" in torch.version:
        indexes.append(stack.torch_index_url)
    folders = [*find_links, *(d for d in folders if os.path.isdir(d))]
    tags = idx.target_tags(stack.python)
    compiled = wheels.compiled_names(stack, lock) | flash_drop(stack)
    costs = Costs()
    tables, unreadable, not_cached = [], [], []
    for e in lock.entries:
        if e.name in compiled:
            continue
        cached = cached_choice(e, tags)
        if cached is not None:  # read before: no folder listed (hashing its files) and no index asked
            tables.append(cached)
            continue
        try:
            listing = [f for d in folders for f in idx.folder_files(d, e.name)]
            if not idx.choose(e, listing, tags):
                if offline:
                    not_cached.append(f"{e.name}=={e.version}")
                    continue
                for index in indexes:
                    try:
                        listing = list(idx.index_files(index, e.name))
                    except idx.FetchError as err:  # unreachable: every other entry would say the same
                        raise BinariesError(f"stacks check --binaries {stack.name}: {err}; the tables read so far "
                                            "are kept: run again when it can be reached, or use --offline with "
                                            "--find-links DIR") from None
                    if idx.choose(e, listing, tags):
                        break
            tables.append(wheel_table(e, listing, tags, elfscan, cuobjdump, costs, log))
        except idx.FetchError as err:
            unreadable.append(str(err))
    if not_cached:
        report.add("wheels", ERROR, f"not checked: {len(not_cached)} distributions have no tables in the cache and "
                                    f"--offline forbids a download ({judges._first(not_cached, 4)}): run once without "
                                    "--offline, or pass --find-links DIR holding their files")
    for line in unreadable:
        report.add("wheels", ERROR, f"not checked: {line}")
    if not_cached or unreadable:  # half a site-packages would pass or fail for the wrong reasons
        report.add("symbols", ERROR, "not run: the lock's binaries are not all here (rows above)")
        return _with_costs(report, costs, t0)

    site = SITE.format(python=stack.python)
    objects, dist_of, cubins, clashes = {}, {}, {}, []
    for t in tables:
        dist = f"{t['name']} {t['version']}"
        for member, od in t["objects"].items():
            path = f"{site}/{member}"
            if path in dist_of and dist_of[path] != dist:
                clashes.append(f"{member} ({dist_of[path]} and {dist})")
            objects[path] = elfscan.obj_from_dict(path, od)
            dist_of[path] = dist
        for member, c in t["cubins"].items():
            cubins[member] = c
        for member, err in t.get("errors", {}).items():
            report.add(f"symbols {member}", ERROR, f"not checked: {t['filename']} holds it, and it could not be "
                                                   f"read as ELF ({err})")
    libs = sorted(objects)
    links: dict[str, str] = {}
    ldcache: dict[str, list[str]] = {}
    global_objects: list[str] = []
    base_path = base_tables_path(stack, dockerfiles)
    if base_path is not None:
        base = read_base(base_path)
        for p, od in base["objects"].items():
            objects.setdefault(p, elfscan.obj_from_dict(p, od))
        links.update(base["links"])
        ldcache = elfscan.parse_ldconfig(base.get("ldconfig", ""))
        global_objects = [base["python"]]
        if stack.cuda:  # what train.Dockerfile's layer 0-cuda links: CUDA_HOME into the toolkit's wheels
            cu = f"{site}/nvidia/cu{stack.cuda.split('.')[0]}"
            links.update({"/usr/local/cuda": cu, f"{cu}/lib64": "lib"})
        from dockerlaunch.images import base as bases

        want = bases.stack_base_tag(stack)
        made = ", ".join(f"{k} {val}" for k, val in sorted(base.get("versions", {}).items()))
        if base.get("base") != want:
            report.add("base", WARN, f"the tables in {base_path.name} were recorded from {base.get('base')}, the "
                                     f"stack's base is now {want}: record them again ({base.get('how')})")
        else:
            report.add("base", NOTE, f"{base.get('base')} ({made}): {len(base['objects'])} system objects from "
                                     f"its recorded tables ({base_path.name}, {base.get('recorded')})")
    res = elfscan.TableResolver(objects, links, package_dirs=package_dirs(site, libs, elfscan), ldcache=ldcache,
                                global_objects=global_objects, scanned=libs)
    sym = elfscan.findings(res, libs, lambda p: p[len(site) + 1:] if p.startswith(site + "/") else p,
                           {res._real(p): d for p, d in dist_of.items()}, elfscan.is_extension)
    if base_path is None:
        from_base = _registry_base(sym, {os.path.basename(p) for p in libs} |
                                   {o.soname for p in libs if (o := objects[p]).soname})
        if from_base:
            report.add("base", NOTE, f"{stack.base_image} is a registry base, not checked here: "
                                     f"{len(from_base)} libraries the wheels need come from it "
                                     f"({judges._first(sorted(from_base), 6)}); verify checks them in the built image")
    sym["driver"] = {}
    judges.judge_symbols(report, sym, None, None, len(libs), [site])
    dists = {p[len(site) + 1:]: d for p, d in dist_of.items()}
    judges.judge_archs(report, cubins, archs, dists, archs_source)
    for line in clashes[:3]:
        report.add("wheels: same file", WARN, f"two wheels install {line}: the one installed last wins")
    names = sorted(n for n in compiled if lock.get(n))
    kinds = {k: sum(1 for t in tables if t.get("kind") == k) for k in ("binary", "pure", "sdist")}
    report.add("wheels", NOTE,
               f"{len(tables)} of the lock's {len(lock.entries)} distributions: {kinds['binary']} binary wheels "
               f"({len(libs)} libraries), {kinds['pure']} pure, {kinds['sdist']} sdists; compiled by the build, so "
               f"checked by verify in the image: {', '.join(names) or 'none'}")
    return _with_costs(report, costs, t0)


def _with_costs(report: BinaryReport, costs: Costs, t0: float) -> BinaryReport:
    costs.seconds = time.monotonic() - t0
    report.costs = {"downloaded_gb": round(costs.downloaded / 1e9, 2), "wheels_read": costs.read,
                    "minutes": round(costs.seconds / 60, 1), "tables_mb": round(_tables_size() / 1e6, 1)}
    return report


def _registry_base(sym: dict, in_wheels: set[str]) -> set[str]:
    """On a registry base: drop what its libraries would answer (they are not here to read); return their names."""
    from_base: set[str] = set()
    for info in sym["findings"].values():
        if "error" in info:
            continue
        base_libs = {m["name"] for m in info["missing_libraries"]
                     if m["name"] not in in_wheels and not judges._is_driver_lib(m["name"])}  # the driver: its own row
        if not base_libs:
            continue
        from_base |= base_libs
        info["missing_libraries"] = [m for m in info["missing_libraries"] if m["name"] not in base_libs]
        info["missing_symbols"] = [m for m in info["missing_symbols"]
                                   if m.get("expected") and m["expected"] not in base_libs]
    for key in [k for k, info in sym["findings"].items()
                if not any(info.get(x) for x in ("error", "missing_libraries", "missing_symbols", "missing_versions"))]:
        del sym["findings"][key]
        sym["clean"] += 1
    return from_base


def _tables_size() -> int:
    root = tables_root()
    return sum(p.stat().st_size for p in root.glob("*.json.gz")) if root.is_dir() else 0
