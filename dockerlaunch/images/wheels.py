"""Compile once: a stack's compiled packages (TE's torch binding, apex, flash-attn) as cached wheels.

These three compiles are what makes a CUDA image take hours (flash-attn alone ~1.8 h on 2 cores at one
architecture). Compiled inside `RUN` steps they start again whenever a layer above them changes or BuildKit's cache
is lost. Here each one is compiled in a container of the stack's builder stage, outside BuildKit, into a wheel
kept in a local cache under a key of everything that changes its bytes (source hash, torch, CUDA, Python, compiler,
glibc, architectures, flags). The image then installs the wheel with its recorded sha256, so a rebuild or a second
stack with the same torch/CUDA/Python compiles nothing. Each key has its own build folder that survives the
container, so a compile that is killed resumes from the objects it finished (ninja skips them).

Why one file of ~800 lines: the key, the cache, the compile container and its resumable build folder are one
mechanism (`Place`: here or on a host through transfer/host_compile.py); each part is only correct with the
others beside it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dockerlaunch.cache import cache_root
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu import smi
from dockerlaunch.gpu.cuda import version_tuple
from dockerlaunch.images import index as idx
from dockerlaunch.images import lock as locks
from dockerlaunch.images import sources
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir, shipped_dockerfiles_dir
from dockerlaunch.tars import open_untrusted

_LOG = logging.getLogger(__name__)

FORMAT = 1
CACHE_ENV = "DOCKERLAUNCH_CACHE_DIR"  # cache.cache_root's: one cache folder for everything dockerlaunch rebuilds
SOURCE_DIRS_ENV = "DOCKERLAUNCH_SOURCE_DIRS"  # folders holding source archives (e.g. a vendored apex), ':'-separated
CONTAINER_DIR = "/dl/build"  # where a key's build folder is mounted: the same path every time, so ninja resumes


class WheelError(DockerlaunchError):
    pass


# ---------------------------------------------------------------- what compiles, and with which settings


@dataclass(frozen=True)
class Compiled:
    """One compiled package of a stack: its source, the layer it belongs to and the settings of its build."""

    name: str  # distribution name, normalized (transformer-engine-torch, flash-attn, apex)
    version: str
    layer: str
    source: str  # file name of the sdist or archive
    source_sha256: str  # the lock's sha256 of the sdist; for archives, stacks.yaml's tree hash
    kind: str  # "sdist" (hash of the file) or "archive" (hash of the unpacked tree)
    env: tuple[tuple[str, str], ...]  # build settings that change the wheel's bytes
    gb_per_job: float  # peak memory of one compile job (measured; see benchmarks/RESULTS.md)
    url: str | None = None  # where an archive comes from when no local copy has it
    lists_grow: bool = False  # its build writes one build.ninja per extension as it reaches it (apex)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


# Whole object counts measured on finished builds, for packages whose build lists its objects one extension at a
# time (the count seen mid-build is not the total): apex 6424da3b with APEX_CPP_EXT=1 APEX_CUDA_EXT=1, 12
# extensions (benchmarks/RESULTS.md, "CUDA build"). A finished build of the same package and version in this
# cache's history wins over this table.
KNOWN_OBJECTS = {("apex", "6424da3b4faa"): 37}


def arch_numbers(archs: list[str]) -> str:
    return ";".join(a.replace(".", "") for a in archs)


def compiled_packages(stack: Stack, lock: locks.Lock, archs: list[str], flash_prebuilt: bool) -> list[Compiled]:
    """What the stack compiles, smallest first (TE's binding ~10 min, apex, flash-attn ~2 h on 2 cores): a short
    compile that fails should not wait behind a long one."""
    out = []
    arch_list = ";".join(archs)
    te = lock.get("transformer-engine-torch")
    if stack.transformer_engine and te:
        out.append(Compiled(
            te.name, te.version, "3-te", f"transformer_engine_torch-{te.version}.tar.gz", _one_hash(te), "sdist",
            (("NVTE_FRAMEWORK", "pytorch"), ("NVTE_PYTORCH_FORCE_BUILD", "TRUE"),
             ("NVTE_BUILD_USE_NVIDIA_WHEELS", "1"), ("NVTE_CUDA_ARCHS", arch_numbers(archs)),
             ("TORCH_CUDA_ARCH_LIST", arch_list), ("NVTE_BUILD_THREADS_PER_JOB", "1"),
             *((("NVTE_WITH_NCCL_EP", "0"),) if nccl_ep_off(stack) else ())),
            3.5))
    if stack.apex:
        out.append(Compiled(
            "apex", stack.apex.ref[:12], "4-apex", stack.apex.archive_name, stack.apex.sha256 or "", "archive",
            (("APEX_CPP_EXT", "1"), ("APEX_CUDA_EXT", "1"), ("TORCH_CUDA_ARCH_LIST", arch_list),
             ("NVCC_APPEND_FLAGS", f"--threads {min(len(archs), 4)}")),
            3.0, url=stack.apex.archive_url, lists_grow=True))
    fa = lock.get("flash-attn")
    if stack.flash_attn and fa and not flash_prebuilt:
        out.append(Compiled(
            fa.name, fa.version, "5-flash", f"flash_attn-{fa.version}.tar.gz", _one_hash(fa), "sdist",
            (("FLASH_ATTENTION_FORCE_BUILD", "TRUE"), ("FLASH_ATTN_CUDA_ARCHS", arch_numbers(archs)),
             ("TORCH_CUDA_ARCH_LIST", arch_list), ("NVCC_THREADS", str(min(len(archs), 4)))),
            6.5))
    return out


def compiled_names(stack: Stack, lock: locks.Lock) -> frozenset[str]:
    """The lock's distributions that are compiled here, not installed from the index (left out of lock parts)."""
    names = {"transformer-engine-torch"} if stack.transformer_engine else set()
    if stack.flash_attn and lock.get("flash-attn"):
        names.add("flash-attn")
    return frozenset(names)


def _one_hash(entry: locks.Entry) -> str:
    """An sdist-only release has one file, so one hash; more would mean wheels exist, which need no compile."""
    return entry.hashes[0].removeprefix("sha256:") if entry.hashes else ""


def nccl_ep_off(stack: Stack) -> bool:
    """TE 2.17-2.19 include torch's symm_mem nccl_dev_cap.hpp when NVTE_WITH_NCCL_EP is on (their default) and
    fail to build against torch < 2.11 (NVIDIA-NeMo/Export-Deploy#720; 2.20 guards it with __has_include)."""
    if not stack.transformer_engine:
        return False
    te = tuple(int(x) for x in stack.transformer_engine.split(".")[:2])
    torch = tuple(int(x) for x in stack.torch.split("+")[0].split(".")[:2])
    return (2, 17) <= te < (2, 20) and torch < (2, 11)


# ---------------------------------------------------------------- the builder's facts and the key

FACTS_PROBE = r"""
import json, os, subprocess, sys, sysconfig
out = {"python": sys.version.split()[0], "glibc": os.confstr("CS_GNU_LIBC_VERSION").split()[-1]}
try:
    out["gcc"] = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
except OSError:
    out["gcc"] = ""
try:
    r = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    out["nvcc"] = next((ln.split(",")[-1].strip() for ln in r.splitlines() if "release" in ln), "")
except OSError:
    out["nvcc"] = ""
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda or ""
except Exception as e:
    out["torch"] = "unimportable: " + str(e)[:200]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class BuilderFacts:
    image: str
    python: str
    glibc: str
    gcc: str
    nvcc: str
    torch: str
    torch_cuda: str


def probe_builder(image: str, docker: str = "docker") -> BuilderFacts:
    try:
        r = subprocess.run(tool_argv(image, ["-c", FACTS_PROBE], entrypoint="python", docker=docker),
                           capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise WheelError(f"the builder image {image} did not answer in 300 s (is the engine overloaded?)") from None
    try:
        data = json.loads((r.stdout.strip().splitlines() or ["{}"])[-1])
    except json.JSONDecodeError:
        data = {}
    if r.returncode != 0 or not data:
        raise WheelError(f"cannot read the builder image {image}: {(r.stderr or r.stdout).strip()[-300:]}")
    if data["torch"].startswith("unimportable"):  # a package that needs torch fails in its compile, saying so
        data["torch"] = data["torch_cuda"] = ""
    if not data.get("nvcc"):
        raise WheelError(f"the builder image {image} has no nvcc on PATH: compiled packages need the CUDA toolkit")
    return BuilderFacts(image, **{k: data.get(k, "") for k in ("python", "glibc", "gcc", "nvcc", "torch",
                                                                 "torch_cuda")})


def key_fields(pkg: Compiled, facts: BuilderFacts, lock: locks.Lock) -> dict:
    """Everything that changes the wheel's bytes. Not the base image's name (the compiler and glibc it has are
    here) and not MAX_JOBS (parallelism changes no object)."""
    def hashes(name: str) -> str:
        e = lock.get(name)  # the release's files (one of them is installed), as one digest
        return f"{e.version} files {hashlib.sha256(' '.join(sorted(e.hashes)).encode()).hexdigest()[:16]}" if e else ""

    fields = {
        "format": FORMAT, "package": pkg.name, "version": pkg.version, "source-sha256": pkg.source_sha256,
        "python": facts.python, "glibc": facts.glibc, "gcc": facts.gcc, "nvcc": facts.nvcc,
        "torch": f"{facts.torch} ({hashes('torch')})", "torch-cuda": facts.torch_cuda,
        "cuda-toolkit": " ".join(f"{e.name}=={e.version}" for e in lock.layer("0-cuda")) or "the base image's",
        # what else the compile reads: the CUDA libraries' headers torch's pulls (on a made base they land in the
        # toolkit's include folder), and what writes the wheel (setuptools, wheel) or binds it (pybind11)
        "build-env": " ".join(f"{e.name}=={e.version}" for e in lock.entries if e.layer in ("1-torch", "2-build")
                              and (e.name.startswith("nvidia-") or e.name in ("setuptools", "wheel", "pybind11"))),
        "flags": dict(pkg.env),
    }
    if pkg.name == "transformer-engine-torch":  # links TE's core library and compiles against cuDNN's frontend
        fields["te-core"] = hashes(f"transformer-engine-cu{facts.torch_cuda.split('.')[0]}")
        fields["cudnn-frontend"] = hashes("nvidia-cudnn-frontend")
    if pkg.name == "apex" and lock.get("nvidia-cuda-profiler-api"):  # its megatron kernels include the header
        fields["cuda-profiler-api"] = hashes("nvidia-cuda-profiler-api")
    return fields


def key_digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def why_not(want: dict, have: dict) -> str:
    """Which fields of a cached wheel's key differ from the wanted one: `archs 8.0;9.0 != 9.0`."""
    diffs = []
    for k in sorted(set(want) | set(have)):
        if want.get(k) != have.get(k):
            if isinstance(want.get(k), dict) and isinstance(have.get(k), dict):
                inner = [f"{f}={have[k].get(f)!s} (want {want[k].get(f)!s})"
                         for f in sorted(set(want[k]) | set(have[k])) if want[k].get(f) != have[k].get(f)]
                diffs.append(f"{k}: " + ", ".join(inner))
            else:
                diffs.append(f"{k} {have.get(k)} (want {want.get(k)})")
    return "; ".join(diffs)


# ---------------------------------------------------------------- the cache


@dataclass
class Entry:
    """One key's folder: build/ (source, objects, log: mounted in the compile container), wheel.json once done."""

    folder: Path

    @property
    def key(self) -> dict:
        return json.loads((self.folder / "key.json").read_text())

    @property
    def done(self) -> dict | None:
        try:
            info = json.loads((self.folder / "wheel.json").read_text())
        except (OSError, ValueError):
            return None
        wheel = self.folder / "build" / "dist" / info.get("file", "")
        return info if wheel.is_file() else None

    @property
    def wheel(self) -> Path:
        info = self.done
        if not info:
            raise WheelError(f"{self.folder}: no finished wheel")
        return self.folder / "build" / "dist" / info["file"]


def entry_for(pkg: Compiled, fields: dict, root: Path | None = None) -> Entry:
    root = root or cache_root()
    folder = root / "compiled" / f"{pkg.name}-{pkg.version}-{key_digest(fields)[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    key_file = folder / "key.json"
    if not key_file.exists():
        key_file.write_text(json.dumps(fields, indent=1, sort_keys=True) + "\n")
    return Entry(folder)


def other_entries(pkg: Compiled, fields: dict, root: Path | None = None) -> list[tuple[Path, str]]:
    """Finished wheels of the same package under other keys, each with why it does not fit."""
    out = []
    for folder in sorted((root or cache_root()).glob(f"compiled/{pkg.name}-*")):
        e = Entry(folder)
        try:
            if e.done and e.key != fields:
                out.append((folder, why_not(fields, e.key)))
        except (OSError, ValueError):
            continue
    return out


# ---------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """A file a build needs that is pinned by content: an sdist (sha256 of the file, from the lock) or a source
    archive (sha256 of its unpacked tree, from stacks.yaml)."""

    what: str  # for messages: "flash-attn 2.8.3 source", "Megatron-LM ea651a3b source"
    layer: str  # the wheelhouse folder that `fetch` puts it in
    filename: str
    sha256: str
    kind: str  # "sdist" | "file" (sha256 of the file) | "archive" (sha256 of the unpacked tree)
    url: str | None = None  # an archive's or file's upstream URL; sdists are found on the index by their hash
    index_name: str = ""  # the distribution's name on the index (sdists)


def source_of(pkg: Compiled) -> Source:
    return Source(f"{pkg.label} source", pkg.layer, pkg.source, pkg.source_sha256, pkg.kind, pkg.url, pkg.name)


def source_candidates(src: Source, wheelhouse: Path | None) -> list[Path]:
    """Where a pinned source may already be: the wheelhouse, the download cache, the site's own folders
    (DOCKERLAUNCH_SOURCE_DIRS), then the copies vendored with dockerlaunch (Dockerfiles/sources: every archive in a
    checkout, the recommended stack's in the wheel). Each is checked against the pin before use."""
    dirs = [wheelhouse / src.layer] if wheelhouse else []
    dirs += [cache_root() / "sources"]
    dirs += [Path(d) for d in os.environ.get(SOURCE_DIRS_ENV, "").split(":") if d]
    dirs += vendored_dirs()
    return [d / src.filename for d in dict.fromkeys(dirs)]


def vendored_dirs() -> list[Path]:
    """The Dockerfiles/sources folders: of the matrix in use (DOCKERLAUNCH_DOCKERFILES or the shipped one) and,
    where that is a site's own matrix, the one shipped with dockerlaunch too."""
    return list(dict.fromkeys([default_dockerfiles_dir() / "sources", shipped_dockerfiles_dir() / "sources"]))


def get_source(src: Source, wheelhouse: Path | None, index_url: str | None, offline: bool,
               log: Callable[[str], None], dest_dir: Path | None = None) -> Path:
    """The source file, checked against its pin; downloaded (into `dest_dir`, default the cache) when no local
    copy has it. A copy that does not match its pin stops here, naming both hashes."""
    own = [cache_root() / "sources", *vendored_dirs()]  # folders only dockerlaunch and this user write
    for cand in source_candidates(src, wheelhouse) + ([dest_dir / src.filename] if dest_dir else []):
        if cand.is_file():
            use = cand if cand.parent in own else _private_copy(cand)
            try:
                check_source(src, use)
            except DockerlaunchError:
                if use != cand:
                    use.unlink(missing_ok=True)
                raise
            if use != cand:  # checked as a copy of ours, and only the copy is used: a shared folder's file could
                # be swapped between a check and the unpacking
                final = cache_root() / "sources" / src.filename
                use.replace(final)
                use = final
            if src.kind == "archive":  # where a non-PyPI source came from is worth a line (vendored, a site's own)
                log(f"{src.what}: {cand} (its tree matches the pin" + (f"; copied to {use})" if use != cand else ")"))
            return use
    if src.kind == "file" and not src.sha256:
        raise WheelError(f"{src.what} {src.url} is not pinned by hash: download it once where you trust the "
                         "network, check it, and put its sha256 in stacks.yaml (flash_attn_wheel_sha256); nothing "
                         "unverified is installed")
    if offline:
        raise WheelError(f"{src.what} {src.filename} ({_pin_words(src)}) is not vendored with dockerlaunch and "
                         f"--offline forbids a download: {_put_it_words(src)}")
    dest = (dest_dir or cache_root() / "sources") / src.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"{src.what}: downloading {src.filename}")
    if src.kind == "archive":  # its pin is the unpacked tree's hash: checked below, after the download
        _download(src, dest)
    else:  # the file's own hash: checked as it arrives
        try:
            f = sdist_file(src, index_url) if src.url is None else idx.IndexFile(src.filename, src.url, src.sha256)
            idx.download(idx.IndexFile(src.filename, f.url, src.sha256), dest.parent)
        except idx.FetchError as e:
            raise WheelError(f"{src.what}: {e}") from None
    try:
        check_source(src, dest)
    except DockerlaunchError:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _private_copy(path: Path) -> Path:
    """A copy of `path` in the cache's sources folder, read once, under a name nobody else uses."""
    folder = cache_root() / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
    return Path(tmp)


def check_source(src: Source, path: Path) -> None:
    if src.kind == "archive":
        if not src.sha256:
            raise WheelError(f"{src.what}: stacks.yaml gives no sha256 for it, so {path.name} cannot be checked: "
                             f"add sha256: {sources.tree_sha256(path)} if this file is the one you trust")
        sources.check_archive(path, src.what, src.sha256)
        return
    if not src.sha256:
        raise WheelError(f"{src.what} {src.filename} is not pinned by hash, so it cannot be checked; pin it "
                         f"(sha256 {file_sha256(path)} is what {path} holds, if that file is the one you trust)")
    got = file_sha256(path)
    if got != src.sha256:
        pin = "the lock" if src.kind == "sdist" else "its pin"
        raise WheelError(f"{src.what}: {path} does not match {pin} (expected sha256 {src.sha256}, got {got}); "
                         "delete it and fetch again")


def sdist_file(src: Source, index_url: str | None) -> idx.IndexFile:
    """The sdist on the index's simple page, found by the lock's hash (`pip download` cannot fetch these sdists:
    their setup.py imports torch to make metadata)."""
    index = index_url or locks.DEFAULT_INDEX
    for f in idx.index_files(index, src.index_name):
        if f.sha256 == src.sha256:
            return f
    raise WheelError(f"{src.what}: {idx.redact(index)} has no file with the lock's sha256 {src.sha256}")


def _download(src: Source, dest: Path) -> None:
    part = dest.with_name(dest.name + ".part")
    try:
        with idx.open_url(idx.request(src.url), timeout=120) as r, open(part, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except idx.NET_ERRORS as e:
        part.unlink(missing_ok=True)
        raise WheelError(f"{src.what} {src.filename} ({_pin_words(src)}) is not vendored with dockerlaunch and "
                         f"{idx.redact(src.url)} cannot be reached ({getattr(e, 'reason', e)}): "
                         f"{_put_it_words(src)}") from None
    part.replace(dest)


def _pin_words(src: Source) -> str:
    return f"{'tree ' if src.kind == 'archive' else ''}sha256 {src.sha256 or 'not pinned'}"


def _put_it_words(src: Source) -> str:
    """The one fix for a source that is neither here nor reachable: where to put the file."""
    where = f"from {idx.redact(src.url)} " if src.url else ""
    return (f"download it {where}on a machine that can, and put it in {cache_root() / 'sources'} (or in a "
            f"folder named by {SOURCE_DIRS_ENV}); it is checked against that sha256 before use")


def unpack(src: Path, dest: Path) -> None:
    """The source into build/src (its one top folder stripped), once: a resumed compile keeps its objects."""
    marker = dest / ".dockerlaunch-source"
    if marker.is_file() and marker.read_text().strip() == src.name:
        return
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with open_untrusted(src, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Pythons before the extraction filters (3.11.3, 3.10.11): the same refusals, by hand
                for m in tar.getmembers():
                    if m.name.startswith("/") or ".." in Path(m.name).parts or m.islnk() or m.isdev() or (
                            m.issym() and (m.linkname.startswith("/") or ".." in Path(m.linkname).parts)):
                        raise tarfile.TarError(f"member {m.name} would leave the source folder")
                tar.extractall(tmp)
    except (OSError, tarfile.TarError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WheelError(f"cannot unpack {src}: {e}") from None
    tops = list(tmp.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        raise WheelError(f"{src}: a source archive holds one top folder, this one {len(tops)} entries")
    tops[0].rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    marker.write_text(src.name + "\n")


# ---------------------------------------------------------------- compiling


def default_jobs(gb_per_job: float, meminfo: str | None = None, cpus: int | None = None) -> tuple[int, str | None]:
    """(MAX_JOBS, warning): one job per core, at most as many as the available memory holds; a warning when not
    even one job fits, said before an hour of compiling ends in the OOM killer."""
    cpus = cpus or os.cpu_count() or 1
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            return 1, None
    m = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M)
    avail = int(m.group(1)) / 2**20 if m else 16.0
    jobs = max(1, min(cpus, int(avail // gb_per_job)))
    warn = None
    if avail < gb_per_job:
        warn = (f"one compile job needs ~{gb_per_job:.1f} GB and {avail:.1f} GB is available: it will likely be "
                "killed for memory; free memory, or build on a bigger machine")
    return jobs, warn


def ninja_progress(build: Path) -> tuple[int, int]:
    """(objects built, objects in build.ninja) of a setuptools/torch ninja build below `build`; (0, 0) before
    build.ninja exists. Packages with several extensions (apex) write one build.ninja per extension as they reach
    it, so their total grows as the build goes."""
    files = []
    for ninja in sorted(build.glob("src/build/temp*/**/build.ninja")):
        try:
            log_text = (ninja.parent / ".ninja_log").read_text(errors="replace")
        except OSError:
            log_text = ""
        files.append((ninja.read_text(errors="replace"), log_text))

    def exists(target: str) -> bool:
        return target.startswith(CONTAINER_DIR) and Path(str(build) + target[len(CONTAINER_DIR):]).exists()

    return count_objects(files, exists)


def count_objects(files: list[tuple[str, str]], exists: Callable[[str], bool] = lambda _: True) -> tuple[int, int]:
    """(done, total) over (build.ninja, .ninja_log) texts: an object counts once ninja logged its command as
    finished (one cut off mid-write is in the folder but not in the log) and, where it can be seen, it exists."""
    done = total = 0
    for ninja, log_text in files:
        logged = {ln.split("\t")[3] for ln in log_text.splitlines() if ln.count("\t") >= 4}
        for line in ninja.splitlines():
            m = re.match(r"^build (\S+\.o): ", line)
            if m:
                total += 1
                if m.group(1) in logged and exists(m.group(1)):
                    done += 1
    return done, total


def first_error(log: str) -> str:
    """The failing file and its first error, out of thousands of warning lines."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s*FAILED: (?:\[code=\d+\] )?(\S+)", line)
        if m:
            target = re.sub(r"^.*/build/temp[^/]*/", "", m.group(1))  # the object, below the build's temp folder
            errs = [ln.strip() for ln in lines[i + 1:i + 400] if re.search(r"\berror\b", ln) and "FAILED" not in ln]
            what = errs[0] if errs else (lines[i + 2].strip() if len(lines) > i + 2 else "")
            return f"{target}: {what.replace(CONTAINER_DIR + '/src/', '')[:300]}"
    errs = [ln.strip() for ln in lines if re.match(r"^\s*(error|ERROR|RuntimeError|OSError|\S+Error):", ln.strip())]
    return (errs[-1] if errs else (lines[-1].strip() if lines else "no output"))[:300]


@dataclass
class Sample:
    peak_rss: int = 0
    cpu_ns: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def take(self, memory_stat: str, cpu: str) -> None:
        """One reading of a container's cgroup: memory.stat (v1 total_rss, v2 anon) and cpuacct.usage (ns) or
        cpu.stat (usage_usec)."""
        m = re.search(r"^(?:total_rss|anon) (\d+)$", memory_stat, re.M)
        if m:
            self.peak_rss = max(self.peak_rss, int(m.group(1)))
        m = re.search(r"usage_usec (\d+)", cpu)
        if m:
            self.cpu_ns = int(m.group(1)) * 1000
        elif cpu.split() and cpu.split()[0].isdigit():
            self.cpu_ns = int(cpu.split()[0])


# cgroup v1 (docker/<id>) or v2 (system.slice/docker-<id>.scope, or docker/<id> with the cgroupfs driver)
CGROUP_FILES = (("memory/docker/{id}/memory.stat", "cpuacct/docker/{id}/cpuacct.usage"),
                ("system.slice/docker-{id}.scope/memory.stat", "system.slice/docker-{id}.scope/cpu.stat"),
                ("docker/{id}/memory.stat", "docker/{id}/cpu.stat"))


def _sample(cid: str, s: Sample) -> None:
    paths = next(((Path("/sys/fs/cgroup", m.format(id=cid)), Path("/sys/fs/cgroup", c.format(id=cid)))
                  for m, c in CGROUP_FILES if Path("/sys/fs/cgroup", m.format(id=cid)).exists()), None)
    while paths is not None and not s.stop.is_set():
        try:
            s.take(paths[0].read_text(), paths[1].read_text())
        except (OSError, ValueError, IndexError):
            break
        s.stop.wait(2)


def compile_command(pkg: Compiled, jobs: int) -> str:
    env = " ".join(f"{k}={_sh(v)}" for k, v in (*pkg.env, ("MAX_JOBS", str(jobs))))
    site = '"$(python -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"'
    extra = ""
    if pkg.name == "transformer-engine-torch":  # cuDNN's frontend headers are in site-packages/include
        extra = f"CPLUS_INCLUDE_PATH={site}/include "
    return (f"cd {CONTAINER_DIR}/src && {extra}{env} pip wheel -v --no-build-isolation --no-deps --no-index "
            f"-w {CONTAINER_DIR}/dist . > {CONTAINER_DIR}/log 2>&1")


def _sh(v: str) -> str:
    import shlex

    return shlex.quote(v)


def container_name(entry: Entry, where: str = "") -> str:
    """One name per key folder (and host): two caches on one engine (two users, the test suite) never share a
    container."""
    return "dockerlaunch-compile-" + hashlib.sha256((where + str(entry.folder.resolve())).encode()).hexdigest()[:16]


class Place:
    """Where a compile runs: this machine's engine (here), or a cluster host's over SSH (images/host_compile.py).
    The compile is the same; what differs is how docker is called and where the build folder lives."""

    where = ""  # " on HOST", for messages
    host: str | None = None  # recorded in wheel.json when the compile ran on a cluster host

    def __init__(self, entry: Entry, docker: str = "docker"):
        self.entry, self.docker_cli = entry, docker
        self.build = entry.folder / "build"
        self.name = container_name(entry)

    def docker(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        r = subprocess.run([self.docker_cli, *args], capture_output=True, text=True, timeout=timeout)
        return r.returncode, (r.stdout if r.returncode == 0 else r.stderr or r.stdout)

    @property
    def mount(self) -> str:
        return str(self.build)

    def prepare(self, source: Path) -> None:
        self.build.mkdir(exist_ok=True)
        unpack(source, self.build / "src")

    def clear_dist(self) -> None:
        shutil.rmtree(self.build / "dist", ignore_errors=True)
        (self.build / "dist").mkdir()

    def progress(self) -> tuple[int, int]:
        return ninja_progress(self.build)

    def log_text(self) -> str:
        return (self.build / "log").read_text(errors="replace") if (self.build / "log").exists() else ""

    def wheel_names(self) -> list[str]:
        return sorted(w.name for w in (self.build / "dist").glob("*.whl"))

    def take_wheel(self, name: str) -> Path:
        return self.build / "dist" / name

    def sampler(self, cid: str) -> Sample:
        sample = Sample()
        threading.Thread(target=_sample, args=(cid, sample), daemon=True).start()
        return sample

    def wait(self, every: float, tick: Callable[[], None]) -> int:
        waiter = subprocess.Popen([self.docker_cli, "wait", self.name], stdout=subprocess.PIPE, text=True)
        while True:
            try:
                out, _ = waiter.communicate(timeout=every)
                return int((out or "1").strip() or 1)
            except subprocess.TimeoutExpired:
                tick()

    def log_path(self) -> str:
        return str(self.build / "log")


def local_gpu_archs(run=subprocess.run) -> list[str]:
    """The compute capabilities of this machine's GPUs, each once ([] where it has no nvidia-smi or its driver does
    not answer: the build then compiles for 9.0 and says so); a GPU whose capability is unknown is an error."""
    try:
        r = run(["sh", "-c", smi.CAPS_QUERY], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    try:
        caps = smi.parse_compute_caps(r.returncode, r.stdout)
    except smi.CapsUnknown as e:
        if e.missing or e.no_gpu:
            return []
        raise DockerlaunchError(f"this machine's GPUs: {e.why}: pass --cuda-archs") from None
    return sorted(set(caps), key=version_tuple)


class Here:
    """Compiles on this machine's engine. The other place is a cluster host (transfer/host_compile.py's OnHost)."""

    what = "this machine"

    def __init__(self, docker: str = "docker"):
        self.docker = docker

    def gpu_archs(self) -> list[str]:
        return local_gpu_archs()

    def place(self, entry: Entry, builder: str) -> Place:
        return Place(entry, self.docker)

    def default_jobs(self, gb_per_job: float) -> tuple[int, str | None]:
        return default_jobs(gb_per_job)


def compile_wheel(pkg: Compiled, entry: Entry, builder: str, source: Path, jobs: int, docker: str = "docker",
                  log: Callable[[str], None] | None = None, every: float = 30.0, place: Place | None = None) -> dict:
    """Compile `pkg` into a wheel in a container of `builder`, its build folder mounted from the cache; returns
    wheel.json's record. One compile per key folder at a time (a lock file: a second launcher waits for the
    first); a container of the folder still running (a launcher killed earlier) is waited for, not doubled."""
    log = log or (lambda msg: _LOG.info("%s", msg))
    place = place or Place(entry, docker)
    fd = os.open(entry.folder / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{pkg.label}: another dockerlaunch is compiling this key ({entry.folder}); waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
            if entry.done:
                return entry.done
        return _compile_locked(pkg, entry, builder, source, jobs, place, log, every)
    finally:
        os.close(fd)


def _compile_locked(pkg: Compiled, entry: Entry, builder: str, source: Path, jobs: int, place: Place,
                    log: Callable[[str], None], every: float) -> dict:
    place.prepare(source)
    name = place.name
    code, state = place.docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name)
    running, _, exit_code = state.strip().partition(" ") if code == 0 else ("", "", "")
    if running == "true":
        log(f"{pkg.label}: a compile of this key is already running{place.where} ({name}); waiting for it")
    else:
        place.docker("rm", "-f", name)
        if exit_code == "0" and place.wheel_names():
            log(f"{pkg.label}: the compile of an earlier, stopped launcher finished{place.where}; taking its wheel")
            done = place.progress()
            return _record(pkg, entry, place.take_wheel(place.wheel_names()[-1]), 0.0, Sample(), jobs, done,
                           done[0], log, place.host)
        place.clear_dist()
        done0, total0 = place.progress()
        of = "" if pkg.lists_grow else f"/{total0}"  # a total that grows is no total (see _progress_line)
        resumed = f", resuming at {done0}{of} objects" if done0 else ""
        log(f"{pkg.label}: compiling{place.where} in {builder} with MAX_JOBS={jobs} "
            f"({', '.join(f'{k}={v}' for k, v in pkg.env)}){resumed}; build folder {place.mount}")
        code, out = place.docker(*tool_argv(builder, ["-c", compile_command(pkg, jobs)], entrypoint="bash",
                                            name=name, labels={labels_.COMPILE: entry.folder.name},
                                            mounts=[BindMount(place.mount, CONTAINER_DIR)], detach=True)[1:])
        if code != 0:
            raise WheelError(f"{pkg.label}: cannot start the compile container{place.where}: {out.strip()[:300]}")
    cid = place.docker("inspect", "--format", "{{.Id}}", name)[1].strip()
    sample = place.sampler(cid)
    history = _history(pkg)
    t0 = time.monotonic()
    start_done = place.progress()[0]

    def tick() -> None:
        done, total = place.progress()
        log(_progress_line(pkg, done, total, start_done, time.monotonic() - t0, history))

    try:
        code = place.wait(every, tick)
    except BaseException:
        place.docker("rm", "-f", name)  # objects stay: the next run resumes
        raise
    finally:
        sample.stop.set()
    wall = time.monotonic() - t0
    text = place.log_text()
    place.docker("rm", "-f", name)
    names = place.wheel_names()
    done = place.progress()
    if code != 0 or not names:
        raise WheelError(f"compile of {pkg.label}{place.where} failed (exit {code}) at {first_error(text)}; whole "
                         f"log: {place.log_path()}; run again to resume from the {done[0]} objects built")
    return _record(pkg, entry, place.take_wheel(names[-1]), wall, sample, jobs, done, start_done, log, place.host)


def _record(pkg: Compiled, entry: Entry, wheel: Path, wall: float, sample: Sample, jobs: int,
            progress: tuple[int, int], start_done: int, log: Callable[[str], None], host: str | None = None) -> dict:
    """wheel.json (the cache's record: the wheel's sha256 and the compile's figures) and a line in history.jsonl."""
    done, total = progress
    info = {"file": wheel.name, "sha256": file_sha256(wheel), "size": wheel.stat().st_size,
            "wall_s": round(wall, 1), "cpu_s": round(sample.cpu_ns / 1e9, 1), "peak_rss": sample.peak_rss,
            "objects": total, "objects_this_run": done - start_done, "jobs": jobs,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **({"host": host} if host else {})}
    (entry.folder / "wheel.json").write_text(json.dumps(info, indent=1) + "\n")
    with open(cache_root() / "compiled" / "history.jsonl", "a") as f:
        f.write(json.dumps({"package": pkg.name, "version": pkg.version, "archs": dict(pkg.env), **info}) + "\n")
    log(f"{pkg.label}: {info['file']} ({info['size'] / 2**20:.0f} MB) in {wall / 60:.1f} min, "
        f"{info['cpu_s'] / 60:.0f} CPU-min, peak {sample.peak_rss / 2**30:.1f} GB")
    return info


def _history(pkg: Compiled) -> dict | None:
    """The last finished build of this package and version: its CPU time makes the first estimate."""
    path = cache_root() / "compiled" / "history.jsonl"
    last = None
    try:
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("package") == pkg.name and rec.get("version") == pkg.version and rec.get("objects"):
                last = rec
    except (OSError, ValueError):
        pass
    return last


def _progress_line(pkg: Compiled, done: int, total: int, start_done: int, elapsed: float,
                   history: dict | None) -> str:
    """`done/total objects, time, ~left`; where the build lists its objects one extension at a time, the total is
    a finished build's (history, else KNOWN_OBJECTS), or said to be unknown, with no estimate on a moving total."""
    if pkg.lists_grow:
        whole = (history or {}).get("objects") or KNOWN_OBJECTS.get((pkg.name, pkg.version))
        if whole and whole >= total:
            total = whole
        elif done or total:
            return (f"{pkg.label}: {done} objects built, {elapsed / 60:.0f} min (the total is not known until "
                    "the build reaches its last extension: no estimate yet)")
    if not total:
        return f"{pkg.label}: preparing the build ({elapsed / 60:.0f} min)"
    left = ""
    ran = done - start_done
    if ran > 0:
        left = f", ~{math.ceil(elapsed / ran * (total - done) / 60)} min left at this rate"
    elif history and history.get("wall_s"):
        left = f", ~{math.ceil(history['wall_s'] / history['objects'] * (total - done) / 60)} min left (last build)"
    return f"{pkg.label}: {done}/{total} objects, {elapsed / 60:.0f} min{left}"


def export(entry: Entry, dest: Path) -> Path:
    """A finished key (its key, record and wheel) into `dest/<key folder>/`, for a wheelhouse carried elsewhere."""
    out = dest / entry.folder.name
    out.mkdir(parents=True, exist_ok=True)
    for name in ("key.json", "wheel.json"):
        shutil.copy2(entry.folder / name, out / name)
    shutil.copy2(entry.wheel, out / entry.wheel.name)
    return out / entry.wheel.name


def adopt(entry: Entry, carried: Path, log: Callable[[str], None], trusted: bool) -> dict | None:
    """A wheel that `wheels build -o` put in a wheelhouse: taken into the cache when its key is the one wanted, its
    bytes are the ones its record names, and the user said to trust the wheelhouse's records (they travel with the
    wheels, so they are no independent anchor: whoever could swap a wheel could edit its record)."""
    try:
        key = json.loads((carried / "key.json").read_text())
        info = json.loads((carried / "wheel.json").read_text())
    except (OSError, ValueError):
        return None
    if key != entry.key:
        log(f"{carried}: not used: {why_not(entry.key, key)}")
        return None
    name = str(info.get("file", ""))
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", name):
        raise WheelError(f"{carried / 'wheel.json'}: names {name!r}, not a wheel file beside it")
    if not trusted:
        log(f"{carried / name}: a compiled wheel carried in the wheelhouse (sha256 {info.get('sha256')}), not used: "
            "its record came with it; pass --trust-carried-wheels if you made that wheelhouse")
        return None
    wheel = carried / name
    got = file_sha256(wheel) if wheel.is_file() else "missing"
    if got != info.get("sha256"):
        raise WheelError(f"{wheel}: does not match its record (sha256 {info.get('sha256')}, got {got}): the "
                         "carried wheel was changed; build it again (dockerlaunch wheels build -o)")
    dist = entry.folder / "build" / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, dist / wheel.name)
    shutil.copy2(carried / "wheel.json", entry.folder / "wheel.json")
    log(f"{info['file']}: taken from {carried.parent} (key {entry.folder.name[-16:]}, sha256 {got})")
    return entry.done


def ensure_wheel(pkg: Compiled, facts: BuilderFacts, lock: locks.Lock, builder: str, *, wheelhouse: Path | None,
                 index_url: str | None, offline: bool, max_jobs: int | None, docker: str = "docker",
                 log: Callable[[str], None] | None = None, trust_carried: bool = False,
                 where: Here | None = None) -> tuple[Path, str]:
    """(wheel, sha256) of `pkg` for this builder: the cached one when its key matches, else compiled now (here, or
    where `where` says: a cluster host). A cached wheel whose bytes no longer match its record is refused."""
    log = log or (lambda msg: _LOG.info("%s", msg))
    fields = key_fields(pkg, facts, lock)
    entry = entry_for(pkg, fields)
    info = entry.done
    if not info and wheelhouse is not None:
        info = adopt(entry, wheelhouse / "compiled" / entry.folder.name, log, trust_carried)
    if info:
        got = file_sha256(entry.wheel)
        if got != info["sha256"]:
            raise WheelError(f"{pkg.label}: the cached wheel {entry.wheel} changed since it was built (recorded "
                             f"sha256 {info['sha256']}, now {got}); delete {entry.folder} to compile it again")
        log(f"{pkg.label}: cached wheel {info['file']} (key {entry.folder.name[-16:]}, built {info.get('built')}): "
            "nothing to compile")
        return entry.wheel, info["sha256"]
    for folder, why in other_entries(pkg, fields):
        log(f"{pkg.label}: cached wheel {folder.name} not used: {why}")
    source = get_source(source_of(pkg), wheelhouse, index_url, offline, log)
    where = where or Here(docker)
    jobs, warn = (max_jobs, None) if max_jobs else where.default_jobs(pkg.gb_per_job)
    if warn:
        log(f"{pkg.label}: warning: {warn}")
    info = compile_wheel(pkg, entry, builder, source, jobs, docker=docker, log=log, place=where.place(entry, builder))
    return entry.wheel, info["sha256"]
