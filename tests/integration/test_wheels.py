"""The CI slice of the CUDA build, for real: the recommended stack's `cuda` stage (a Debian base made with
debootstrap, the CUDA 13 toolkit from its locked PyPI wheels, no registry) compiles and links sm_90 code, and a
compiled package goes through the wheel cache: built once, reused, refused for another key, resumed after a kill."""

import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from dockerlaunch.images import compiles, wheels
from dockerlaunch.images import lock as locks
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix
from tests.integration.conftest import CUDA_STACK as STACK

pytestmark = pytest.mark.integration

TINY = Path(__file__).parent / "data" / "tinycuda"


def docker(*args, check=True, timeout=600, **kw):
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)
    assert not check or r.returncode == 0, (args, r.stderr[-2000:])
    return r


def test_the_cuda_stage_has_nvcc_13_0_as_cuda_home(cuda_stage):
    r = docker("run", "--rm", "--network", "none", cuda_stage.tag, "bash", "-c",
               "nvcc --version && echo CUDA_HOME=$CUDA_HOME && readlink -f /usr/local/cuda")
    assert "release 13.0, V13.0.88" in r.stdout and "CUDA_HOME=/usr/local/cuda" in r.stdout
    assert r.stdout.rstrip().endswith("/opt/venv/lib/python3.13/site-packages/nvidia/cu13")


def test_the_toolkits_headers_have_one_fixed_mtime(cuda_stage):
    """What a builder layer installs gets the zip epoch as mtime (`settle`): a builder stage rebuilt from the same
    lock then has the same header times, so a resumed compile keeps its objects (ninja rebuilds every object
    whose headers look newer than its log entry: a rebuilt builder once cost flash-attn 34 objects, ~50 min)."""
    r = docker("run", "--rm", "--network", "none", cuda_stage.tag, "bash", "-c",
               "stat -c '%Y %n' /usr/local/cuda/include/cuda.h /usr/local/cuda/bin/nvcc; "
               "find /usr/local/cuda/include/ -type f | wc -l; "
               "find /usr/local/cuda/include/ -type f -newer /opt/dockerlaunch/pip-env.sh | wc -l")
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:2]] == ["315532800"] * 2, r.stdout
    assert int(lines[2]) > 1000 and int(lines[3]) == 0, r.stdout  # every header of the toolkit (cccl's too)


def test_the_cuda_stage_compiles_and_links_sm90(cuda_stage, tmp_path):
    """nvcc from PyPI's wheels, laid out as /usr/local/cuda: an executable (cudart_static from lib64) and a shared
    library (-lcudart from lib), each with an sm_90 cubin; no GPU needed."""
    (tmp_path / "k.cu").write_text(
        '#include <cub/cub.cuh>\n#include <cstdio>\n'
        '__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\n'
        'extern "C" int run(float *x) { twice<<<1, 32>>>(x); return cudaGetLastError(); }\n'
        'int main() { printf("%d\\n", CUB_VERSION > 0); return 0; }\n')
    script = ("cd /w && nvcc -arch=sm_90 -o app k.cu && nvcc -arch=sm_90 -shared -Xcompiler -fPIC -lcudart "
              "-o libk.so k.cu && ./app && ls -l /usr/local/cuda/lib64/libcudart_static.a")
    r = docker("run", "--rm", "--network", "none", "-v", f"{tmp_path}:/w", cuda_stage.tag, "bash", "-c", script)
    assert r.stdout.splitlines()[0] == "1"
    for f in ("app", "libk.so"):
        assert b"sm_90" in (tmp_path / f).read_bytes()  # the cubin's arch string is in the fatbin


# ---------------------------------------------------------------- the wheel cache, on a tiny real package


@pytest.fixture(scope="module")
def tiny_builder(cuda_stage, tmp_path_factory):
    """The cuda stage plus setuptools and wheel (what the builder stage's build layer has): enough to compile
    the tiny package, without torch's 3 GB."""
    ctx = tmp_path_factory.mktemp("tiny-builder")
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary", ":all:",
                    "-q", "-d", str(ctx), "setuptools==80.9.0", "wheel==0.45.1"], check=True, timeout=300)
    (ctx / "Dockerfile").write_text(f"FROM {cuda_stage.tag}\nCOPY *.whl /tmp/w/\n"
                                    "RUN pip install --no-index /tmp/w/*.whl && rm -rf /tmp/w\n")
    tag = "dltest/tiny-builder:slice"
    docker("build", "--network", "host", "-t", tag, str(ctx), env={**os.environ, "DOCKER_BUILDKIT": "1"})
    yield tag
    docker("rmi", tag, check=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_sdist(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("tiny") / "dltiny-0.1.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(TINY, arcname="dltiny-0.1", filter=lambda t: None if "__pycache__" in t.name else t)
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def tiny(sdist: tuple[Path, str], archs: str = "90", delay: str = "0") -> wheels.Compiled:
    return wheels.Compiled("dltiny", "0.1", "5-flash", sdist[0].name, sdist[1], "sdist",
                           (("TINY_CUDA_ARCHS", archs), ("TINY_DELAY", delay)), 1.0)


def ensure(pkg, builder, sdist_dir, logs, **kw):
    facts = wheels.probe_builder(builder)
    lock = locks.read(load_matrix().get(STACK), default_dockerfiles_dir())
    return compiles.ensure_wheel(pkg, facts, lock, builder, wheelhouse=sdist_dir, index_url=None, offline=True,
                               max_jobs=1, log=logs.append, **kw)


def wheelhouse_with(sdist, tmp_path) -> Path:
    wh = tmp_path / "wh"
    (wh / "5-flash").mkdir(parents=True)
    shutil.copy(sdist[0], wh / "5-flash" / sdist[0].name)
    return wh


def test_a_compiled_wheel_is_built_once_and_reused(tiny_builder, tiny_sdist, cache, tmp_path, monkeypatch):
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    logs: list[str] = []
    wheel, sha = ensure(tiny(tiny_sdist), tiny_builder, wh, logs)
    assert wheel.name.startswith("dltiny-0.1-cp313-cp313-") and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha
    assert any("compiling in dltest/tiny-builder:slice with MAX_JOBS=1" in ln for ln in logs), logs
    entry = wheels.Entry(wheel.parents[2])
    assert entry.done["objects"] == 6 and entry.done["objects_this_run"] == 6 and entry.done["cpu_s"] > 0
    logs.clear()
    again, sha2 = ensure(tiny(tiny_sdist), tiny_builder, wh, logs)  # a second build: nothing compiles
    assert (again, sha2) == (wheel, sha)
    assert any("nothing to compile" in ln for ln in logs) and not any("compiling in" in ln for ln in logs), logs
    # the cached wheel's bytes are checked against its record before use
    wheel.write_bytes(wheel.read_bytes() + b"x")
    with pytest.raises(wheels.WheelError, match=r"changed since it was built \(recorded sha256 "):
        ensure(tiny(tiny_sdist), tiny_builder, wh, [])
    # another architecture is another key: compiled again, and the log says why the cached wheel did not fit
    logs.clear()
    other, _ = ensure(tiny(tiny_sdist, archs="89"), tiny_builder, wh, logs)
    assert other != wheel
    assert any("not used: flags: TINY_CUDA_ARCHS=90 (want 89)" in ln for ln in logs), logs
    # carried to another machine in the wheelhouse (`wheels build -o`): taken, with its key, compiling nothing
    carried = wheels.export(wheels.Entry(other.parents[2]), wh / "compiled")
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "other-machine"))
    facts = wheels.probe_builder(tiny_builder)
    lock = locks.read(load_matrix().get(STACK), default_dockerfiles_dir())
    entry = wheels.entry_for(tiny(tiny_sdist, archs="89"), wheels.key_fields(tiny(tiny_sdist, archs="89"), facts, lock))
    untrusted: list[str] = []  # its record came with it: not an anchor unless the user says so
    assert wheels.adopt(entry, wh / "compiled" / entry.folder.name, untrusted.append, trusted=False) is None
    assert "pass --trust-carried-wheels if you made that wheelhouse" in untrusted[0]
    logs.clear()
    taken, sha3 = ensure(tiny(tiny_sdist, archs="89"), tiny_builder, wh, logs, trust_carried=True)
    assert sha3 == hashlib.sha256(carried.read_bytes()).hexdigest() and taken.is_file()
    assert any(f"taken from {wh / 'compiled'}" in ln for ln in logs) and not any("compiling in" in ln for ln in logs)


def test_every_part_of_the_key_changes_it(tiny_sdist):
    """A wheel built for another torch, CUDA, Python, compiler, glibc, source or architecture is never used: each
    part changes the key, and why_not names it."""
    facts = wheels.BuilderFacts("img", "3.13.5", "2.41", "14.2.0", "V13.0.88", "2.11.0+cu130", "13.0")
    lock = locks.read(load_matrix().get(STACK), default_dockerfiles_dir())
    base = wheels.key_fields(tiny(tiny_sdist), facts, lock)
    variants = {
        "python": facts.__class__(**{**facts.__dict__, "python": "3.13.6"}),
        "glibc": facts.__class__(**{**facts.__dict__, "glibc": "2.42"}),
        "gcc": facts.__class__(**{**facts.__dict__, "gcc": "14.3.0"}),
        "nvcc": facts.__class__(**{**facts.__dict__, "nvcc": "V13.0.90"}),
        "torch": facts.__class__(**{**facts.__dict__, "torch": "2.12.0+cu130"}),
        "torch-cuda": facts.__class__(**{**facts.__dict__, "torch_cuda": "13.2"}),
    }
    for part, other in variants.items():
        fields = wheels.key_fields(tiny(tiny_sdist), other, lock)
        assert wheels.key_digest(fields) != wheels.key_digest(base), part
        assert wheels.why_not(base, fields).startswith(f"{part} "), (part, wheels.why_not(base, fields))
    for part, pkg in {"source-sha256": tiny((tiny_sdist[0], "0" * 64)),
                      "flags": tiny(tiny_sdist, archs="80;90")}.items():
        fields = wheels.key_fields(pkg, facts, lock)
        assert wheels.why_not(base, fields).startswith(f"{part}"), part
    cpu_lock = locks.read(load_matrix().get("cpu"), default_dockerfiles_dir())  # no 0-cuda layer: the base's CUDA
    assert "cuda-toolkit the base image's (want cuda-toolkit==13.0.2 " in wheels.why_not(
        base, wheels.key_fields(tiny(tiny_sdist), facts, cpu_lock))
    # another cuBLAS (its headers are in the toolkit's include folder on a made base) is another key
    other_cublas = dataclasses.replace(lock, entries=tuple(
        dataclasses.replace(e, version="13.4.1.3") if e.name == "nvidia-cublas" else e for e in lock.entries))
    assert wheels.why_not(base, wheels.key_fields(tiny(tiny_sdist), facts, other_cublas)).startswith("build-env ")
    assert "MAX_JOBS" not in str(base)  # parallelism changes no byte


def test_a_killed_compile_resumes_from_its_objects(tiny_builder, tiny_sdist, cache, tmp_path, engine):
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    pkg = tiny(tiny_sdist, delay="3")  # 3 s before each of the 6 objects: time to kill it halfway
    errors: list[BaseException] = []
    logs: list[str] = []

    def first():
        try:
            ensure(pkg, tiny_builder, wh, logs)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    entry = None
    for _ in range(600):
        folders = list((cache / "compiled").glob("dltiny-0.1-*"))
        if folders and compiles.ninja_progress(folders[0] / "build")[0] >= 2:
            entry = wheels.Entry(folders[0])
            break
        t.join(0.2)
    assert entry is not None, logs
    docker("kill", compiles.container_name(entry))
    t.join(120)
    assert errors and isinstance(errors[0], wheels.WheelError), (errors, logs)
    assert "run again to resume from the" in str(errors[0]) and "failed (exit 137)" in str(errors[0])
    done_before = compiles.ninja_progress(entry.folder / "build")[0]
    assert 2 <= done_before < 6
    logs.clear()
    wheel, _ = ensure(pkg, tiny_builder, wh, logs)
    info = entry.done
    assert wheel.is_file() and info["objects"] == 6 and info["objects_this_run"] == 6 - done_before, info
    assert any(f"resuming at {done_before}/6 objects" in ln for ln in logs), logs


# A launcher as a user runs it, in its own process, so that it can be killed as a user's Ctrl-C or a closed
# terminal kills one (argv: builder, sdist, its sha256, wheelhouse, archs, delay; the cache from the environment).
LAUNCHER = """
import sys
from pathlib import Path
from tests.integration import test_wheels as t
builder, sdist, sha, wh, archs, delay = sys.argv[1:]
wheel, got = t.ensure(t.tiny((Path(sdist), sha), archs, delay), builder, Path(wh), [])
print(wheel, got)
"""


def killed_launcher(builder, sdist, wh, cache: Path, archs: str, delay: str) -> tuple[wheels.Entry, str]:
    """A launcher in its own process, SIGKILLed once its compile has built an object: (key folder, container)."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, builder, str(sdist[0]), sdist[1], str(wh), archs,
                             delay], cwd=Path(__file__).parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        return running_compile(cache)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def running_compile(cache: Path, objects: int = 1, timeout: float = 300) -> tuple[wheels.Entry, str]:
    """The key folder and container ID of the compile under way once it has built `objects` objects."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folders = list((cache / "compiled").glob("dltiny-0.1-*"))
        if folders and compiles.ninja_progress(folders[0] / "build")[0] >= objects:
            entry = wheels.Entry(folders[0])
            return entry, docker("inspect", "--format", "{{.Id}}", compiles.container_name(entry)).stdout.strip()
        time.sleep(0.2)
    raise AssertionError(f"no compile reached {objects} object(s) in {timeout} s")


def compiles_of(entry: wheels.Entry) -> list[str]:
    """IDs of every container, running or not, that compiles this key."""
    return docker("ps", "-aq", "--no-trunc", "--filter", f"label=ai.dockerlaunch.compile={entry.folder.name}")\
        .stdout.split()


def test_a_second_launcher_waits_for_the_first_and_compiles_nothing(tiny_builder, tiny_sdist, cache, tmp_path):
    """Two launchers, one key: the second waits on the key's lock, then takes the first one's wheel."""
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    pkg = tiny(tiny_sdist, archs="87", delay="1")
    first_logs: list[str] = []
    results: dict[str, tuple] = {}
    first = threading.Thread(target=lambda: results.update(first=ensure(pkg, tiny_builder, wh, first_logs)))
    first.start()
    entry, cid = running_compile(cache)
    second_logs: list[str] = []
    results["second"] = ensure(pkg, tiny_builder, wh, second_logs)  # blocks until the first is done
    first.join(300)
    assert results["first"] == results["second"] and results["first"][0].is_file(), results
    assert any("another dockerlaunch is compiling this key" in ln and "waiting for it" in ln
               for ln in second_logs), second_logs
    assert not any("compiling in" in ln for ln in second_logs), second_logs
    assert entry.done["objects_this_run"] == 6 and compiles_of(entry) == [], entry.done  # one compile, removed


def test_a_compile_of_a_killed_launcher_is_waited_for_not_doubled(tiny_builder, tiny_sdist, cache, tmp_path):
    """The launcher is killed (SIGKILL: nothing of it runs again); its compile container goes on. The next launcher
    waits for that container, starts no other, and takes its wheel."""
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    entry, cid = killed_launcher(tiny_builder, tiny_sdist, wh, cache, "86", "2")
    assert compiles_of(entry) == [cid]
    logs: list[str] = []
    seen: set[str] = set()
    watching = threading.Event()

    def watch():  # every compile container of the key while the launcher waits
        while not watching.is_set():
            seen.update(compiles_of(entry))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        wheel, sha = ensure(tiny(tiny_sdist, "86", "2"), tiny_builder, wh, logs)
    finally:
        watching.set()
        watcher.join(30)
    assert any(f"a compile of this key is already running ({compiles.container_name(entry)}); waiting for it" in ln
               for ln in logs), logs
    assert not any("compiling in" in ln for ln in logs), logs
    assert seen <= {cid}, seen  # never a second container
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sha == entry.done["sha256"]
    assert compiles_of(entry) == []


def test_the_finished_compile_of_a_killed_launcher_is_adopted(tiny_builder, tiny_sdist, cache, tmp_path):
    """The launcher dies; its compile finishes alone. The next launcher takes that wheel and compiles nothing."""
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    entry, cid = killed_launcher(tiny_builder, tiny_sdist, wh, cache, "75", "1")
    assert docker("wait", cid, timeout=300).stdout.strip() == "0"
    assert not entry.done  # nobody recorded it
    logs: list[str] = []
    wheel, sha = ensure(tiny(tiny_sdist, "75", "1"), tiny_builder, wh, logs)
    assert any("the compile of an earlier, stopped launcher finished; taking its wheel" in ln for ln in logs), logs
    assert not any("compiling in" in ln for ln in logs), logs
    assert wheel.is_file() and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha == entry.done["sha256"]
    assert compiles_of(entry) == []  # the finished container was removed


def test_a_source_that_is_not_the_locked_one_stops_the_compile(tiny_builder, tiny_sdist, cache, tmp_path):
    wh = wheelhouse_with(tiny_sdist, tmp_path)
    swapped = wh / "5-flash" / tiny_sdist[0].name
    swapped.write_bytes(swapped.read_bytes() + b"\0")
    with pytest.raises(wheels.WheelError) as e:
        ensure(tiny(tiny_sdist), tiny_builder, wh, [])
    msg = str(e.value)
    assert "does not match the lock (expected sha256 " + tiny_sdist[1] in msg and len(msg.splitlines()) == 1
    assert not list((cache / "compiled").glob("*/build/dist/*.whl"))  # nothing compiled from it


def test_a_registry_base_that_cannot_be_had_is_one_line_before_anything_runs(engine):
    """No registry here: a stack FROM nvidia/cuda fails before BuildKit (whose error is 18 lines of `failed to
    solve`), naming the image and the way out."""
    s = load_matrix().get("swift4.6-mcore0.19-cu13")
    if docker("image", "inspect", s.base_image, check=False).returncode == 0:
        pytest.fail(f"{s.base_image} is on this engine: this test needs an engine without it")
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "build", "--stack", s.name, "--cuda-archs", "9.0"],
                       capture_output=True, text=True, timeout=900)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1, r.stderr
    assert err[0].startswith(f"error: base image {s.base_image} is not on this engine and cannot be pulled (")
    assert "swift4.6-mcore0.19-cu13-py313" in err[0] and "failed to solve" not in r.stdout + r.stderr


# ---------------------------------------------------------------- --on HOST: where the cores are


def test_a_wheel_compiled_on_a_host_serves_local_builds_and_other_hosts(tiny_builder, tiny_sdist, cache, tmp_path,
                                                                         cluster_config, remotes):
    """`wheels build --on HOST`, on the sim's nodes (real sshd, real engines): the builder image goes to node 0,
    the compile runs there, the wheel comes back into this machine's cache with its sha256; this machine and
    node 1 then compile nothing (the key is the builder's and the stack's, not the host's)."""
    from dockerlaunch.transfer.host_compile import OnHost

    wh = wheelhouse_with(tiny_sdist, tmp_path)
    logs: list[str] = []
    node0 = OnHost(remotes[0], log=logs.append)
    assert node0.gpu_archs() == []  # the sim has no GPUs: `build` then says 9.0 and why
    wheel, sha = ensure(tiny(tiny_sdist), tiny_builder, wh, logs, where=node0)
    assert any(f"compiling on host {remotes[0].name} in {tiny_builder}" in ln for ln in logs), logs
    assert any(ln.startswith(f"{wheel.name}: fetched from host {remotes[0].name}") for ln in logs), logs
    info = wheels.Entry(wheel.parents[2]).done
    assert info["host"] == remotes[0].name and info["objects"] == 6 and info["sha256"] == sha
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sha
    # the container is gone from the host; its build folder stays there (a later run resumes from it)
    ps = remotes[0].run(["docker", "ps", "-aq", "--filter", "label=ai.dockerlaunch.compile"])
    assert ps.ok and ps.stdout.strip() == ""
    # this machine: the same key, nothing to compile
    logs.clear()
    assert ensure(tiny(tiny_sdist), tiny_builder, wh, logs) == (wheel, sha)
    assert any("nothing to compile" in ln for ln in logs) and not any("compiling" in ln for ln in logs), logs
    # node 1: nothing to compile, and no builder image sent there
    logs.clear()
    assert ensure(tiny(tiny_sdist), tiny_builder, wh, logs, where=OnHost(remotes[1], log=logs.append)) == (wheel, sha)
    assert any("nothing to compile" in ln for ln in logs) and not any("builder image" in ln for ln in logs), logs
    # another architecture on node 0: the builder is there already (nothing sent), a new key compiles
    logs.clear()
    other, _ = ensure(tiny(tiny_sdist, archs="89"), tiny_builder, wh, logs, where=node0)
    assert other != wheel and any("compiling on host" in ln for ln in logs), logs
    assert not any("sending the layers" in ln for ln in logs), logs
    # the host-side build folders are root's (the compile's): removed through a container, as they were made
    r = remotes[0].run(["docker", "run", "--rm", "-v", f"{node0.home}/.cache/dockerlaunch:/c", "--entrypoint", "rm",
                        tiny_builder, "-rf", "/c/compiled"])
    assert r.ok, r.stderr
    remotes[0].run(["docker", "rmi", tiny_builder])


def test_on_an_unreachable_host_is_one_line_before_anything_builds(engine, tmp_path):
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "wheels", "build", "--stack", STACK, "--cuda-archs",
                        "9.0", "--on", "127.0.0.1:9"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env={**os.environ, wheels.CACHE_ENV: str(tmp_path / "cache")})
    err = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(err) == 1 and "127.0.0.1" in err[0], (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "builder stage" not in r.stdout


# ---------------------------------------------------------------- the cluster's architectures (build --hosts)


def test_build_for_a_cluster_compiles_for_exactly_its_gpus(sim_cluster, engine, tiny_builder, tiny_sdist, cache,
                                                            tmp_path):
    """node1 answers as an H100 host (9.0), node2 as an A100 host (8.0), through stand-in nvidia-smis asked over SSH
    (tests/gpu_standin.py): the build plans the union, says where it came from, and the tiny package compiled with
    that plan holds cubins for exactly sm_80 and sm_90. A host without nvidia-smi is one line, not a 9.0 guess."""
    from dockerlaunch.images import verify_tools
    from tests import gpu_standin
    from tests.integration.helpers import dl
    from tests.integration.helpers import tar_files as _tar

    nodes = [engine.containers.get(n.name) for n in sim_cluster[2]]
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    for node, case in zip(nodes, ("h100-healthy", "a100")):
        node.put_archive("/usr/local/bin", _tar({"nvidia-smi": (gpu_standin.script(case).encode(), 0o755)}))
    try:
        r = dl("build", "--stack", STACK, "--config", str(sim_cluster[1]), "--dry-run", timeout=300)
        nodes[1].exec_run(["rm", "-f", "/usr/local/bin/nvidia-smi"])
        missing = dl("build", "--stack", STACK, "--config", str(sim_cluster[1]), "--dry-run", timeout=300)
        only1 = dl("build", "--stack", STACK, "--config", str(sim_cluster[1]), "--hosts", ip1, "--dry-run",
                   timeout=300)
    finally:
        for node in nodes:
            node.exec_run(["rm", "-f", "/usr/local/bin/nvidia-smi"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"# compiling for compute capability 8.0;9.0 (the GPUs of {ip1} (9.0 x2), {ip2} (8.0 x2))" in r.stdout
    assert "--label ai.dockerlaunch.cuda-archs=8.0;9.0" in r.stdout.replace("'", "")
    assert "TORCH_CUDA_ARCH_LIST=8.0;9.0" in r.stdout and "FLASH_ATTN_CUDA_ARCHS=80;90" in r.stdout
    assert missing.returncode != 0 and "docker build" not in missing.stdout
    assert missing.stderr.strip().splitlines()[-1] == (
        f"error: host {ip2}: asking the host for its GPUs' compute capability failed: has no nvidia-smi (no NVIDIA "
        "driver): leave it out of --hosts, or pass --cuda-archs"), missing.stderr
    assert only1.returncode == 0 and f"(the GPUs of {ip1} (9.0 x2))" in only1.stdout, only1.stderr

    # the plan's architectures, compiled for real
    archs = r.stdout.split("# compiling for compute capability ", 1)[1].split(" ", 1)[0].split(";")
    wheel, _ = ensure(tiny(tiny_sdist, archs=wheels.arch_numbers(archs)), tiny_builder,
                      wheelhouse_with(tiny_sdist, tmp_path), [])
    with zipfile.ZipFile(wheel) as z:
        [member] = [m for m in z.namelist() if m.endswith(".so")]
        (tmp_path / "lib.so").write_bytes(z.read(member))
    # each of the package's six kernels has a cubin for exactly the plan's architectures (the library also holds
    # the CUDA runtime's own sm_75 code, linked from libcudart_static: not the package's)
    tool = verify_tools.ensure_tool(verify_tools.CUOBJDUMP["amd64"]) / "cuobjdump"
    dumped = subprocess.run([str(tool), "--dump-elf-symbols", str(tmp_path / "lib.so")], capture_output=True,
                            text=True)
    kernels: dict[str, set[str]] = {}
    for block in re.split(r"(?=arch = sm_\d+)", dumped.stdout)[1:]:
        arch = re.match(r"arch = (sm_\d+)", block).group(1)
        for k in set(re.findall(r"\b(scale\d)\b", block)):
            kernels.setdefault(k, set()).add(arch)
    assert kernels == {f"scale{i}": {"sm_80", "sm_90"} for i in range(6)}, dumped.stdout[-3000:]
