"""A compiled package into a wheel: one container of the stack's builder stage, outside BuildKit, per key.

Each key has its own build folder that survives the container, so a compile that is killed resumes from the
objects it finished (ninja skips them); progress is counted from ninja's files and the cgroup's figures. `Place`
is where a compile runs: this machine's engine (`Here`), or a cluster host's (transfer/host_compile.py's OnHost).
`ensure_wheel` is the one entry: the cached wheel when its key matches (images/wheels.py), else compiled now.
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dockerlaunch.cache import cache_root
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.images import lock as locks
from dockerlaunch.images.archs import local_gpu_archs
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.sources import WheelError, get_source
from dockerlaunch.images.wheels import (
    KNOWN_OBJECTS,
    BuilderFacts,
    Compiled,
    Entry,
    adopt,
    entry_for,
    key_fields,
    other_entries,
    source_of,
)
from dockerlaunch.tars import open_untrusted

_LOG = logging.getLogger(__name__)

CONTAINER_DIR = "/dl/build"  # where a key's build folder is mounted: the same path every time, so ninja resumes


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
            else:  # Pythons before the extraction filters (3.10.12, 3.11.4, 3.12 have them; requires-python
                # says >=3.10, and 3.10.0-3.10.11 are still about): the same refusals, by hand, stricter (no hard
                # link, no `..` in a symlink); tests/unit/images/test_wheels.py runs both branches
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
