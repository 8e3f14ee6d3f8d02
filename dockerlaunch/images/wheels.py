"""Compile once: a stack's compiled packages (TE's torch binding, apex, flash-attn) as cached wheels.

These three compiles are what makes a CUDA image take hours (flash-attn alone ~1.8 h on 2 cores at one
architecture). Compiled inside `RUN` steps they start again whenever a layer above them changes or BuildKit's cache
is lost. Here each one is compiled in a container of the stack's builder stage, outside BuildKit, into a wheel
kept in a local cache under a key of everything that changes its bytes (source hash, torch, CUDA, Python, compiler,
glibc, architectures, flags). The image then installs the wheel with its recorded sha256, so a rebuild or a second
stack with the same torch/CUDA/Python compiles nothing.

This module is what compiles, its key and the cache of finished wheels; images/compiles.py runs a compile (here,
or on a host through transfer/host_compile.py) in a key's resumable build folder; images/sources.py finds and
checks the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dockerlaunch import hints
from dockerlaunch.cache import cache_root
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.images import lock as locks
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.sources import Source, WheelError
from dockerlaunch.images.stacks import Stack

FORMAT = 1
CACHE_ENV = "DOCKERLAUNCH_CACHE_DIR"  # cache.cache_root's: one cache folder for everything dockerlaunch rebuilds


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


def source_of(pkg: Compiled) -> Source:
    return Source(f"{pkg.label} source", pkg.layer, pkg.source, pkg.source_sha256, pkg.kind, pkg.url, pkg.name)


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
                         "carried wheel was changed; build it again ("
                         + hints.dockerlaunch("wheels", "build", "--stack", "NAME", "-o",
                                            os.path.abspath(carried.parent.parent), hint="wheels.again") + ")")
    dist = entry.folder / "build" / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, dist / wheel.name)
    shutil.copy2(carried / "wheel.json", entry.folder / "wheel.json")
    log(f"{info['file']}: taken from {carried.parent} (key {entry.folder.name[-16:]}, sha256 {got})")
    return entry.done
