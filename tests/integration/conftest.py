"""A real 2-node simulated cluster for the whole session (real dockerd, sshd, paramiko)."""

import io
import os
import secrets
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from dockerlaunch import engine as enginelib
from dockerlaunch import sim
from dockerlaunch.job.load import load_config
from tests import cli


def _leftovers(client, cluster: str | None) -> list[str]:
    label = {"label": sim.SIM_LABEL if cluster is None else f"{sim.SIM_LABEL}={cluster}"}
    return (
        [f"container {c.name}" for c in client.containers.list(all=True, filters=label, ignore_removed=True)]
        + [f"network {n.name}" for n in client.networks.list(filters=label)]
        + [f"volume {v.name}" for v in client.volumes.list(filters=label)]
    )


@pytest.fixture(scope="session", autouse=True)
def _registry_cap():
    """The launcher's registry lives in the user's cache (capped at 30 GB): the suite's pushes of random images
    would fill it run after run on a small CI disk. 4 GB holds any one test's images (eviction keeps the blobs of
    the push just made); a test that asks another cap sets its own, and a caller's own setting wins."""
    from dockerlaunch.transfer.layer_cache import CAP_ENV
    if CAP_ENV in os.environ:
        yield
        return
    os.environ[CAP_ENV] = "4"
    try:
        yield
    finally:
        os.environ.pop(CAP_ENV, None)


QUIET_ENV = "DOCKERLAUNCH_TEST_ENGINE_QUIET"  # the pid of scripts/test's second pytest process


def _started(pid: str) -> str | None:
    """A live process's start time (clock ticks after boot), None once it has ended (gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


# read as this process starts, beside the other: a pid its parent reaped may be another process's by the time the
# tests that wait for it run
_OTHER = (os.environ.get(QUIET_ENV, ""), _started(os.environ[QUIET_ENV]) if os.environ.get(QUIET_ENV, "").isdigit()
          else None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The tests marked `alone` run last: those that count this machine's engine reads (the kernel's rchar of
    dockerd and containerd, whoever asked them) and those that stage pushes on the nodes (their disk is this
    machine's: a host stages only with room to spare). scripts/test runs the image tests in a second process on the
    same engine and disk: its builds and saves in the count made a thin push read 145 MB instead of 8, and its
    images on the disk left a cut push nothing staged (13.6 GiB free, 13.6 GiB needed)."""
    alone = [i for i in items if i.get_closest_marker("alone")]
    items[:] = [i for i in items if not i.get_closest_marker("alone")] + alone


@pytest.fixture(autouse=True)
def _engine_quiet(request):
    """An `alone` test waits until the other test process has ended (QUIET_ENV: its pid, known by the start
    time it had when this process began; unset, this process is the only one)."""
    pid, started = _OTHER
    if not request.node.get_closest_marker("alone") or not pid:
        return
    import time

    assert pid.isdigit(), f"{QUIET_ENV}={pid!r}: the pid of the other test process"
    deadline = time.monotonic() + 1800
    while started is not None and _started(pid) == started:
        assert time.monotonic() < deadline, f"{QUIET_ENV}={pid}: the other test process has not ended in 30 min"
        time.sleep(2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A push whose cache was cold leaves a fill of the layer cache running in the background (push.fill_later):
    it ends with the test that started it, before the next test's counters or its cache (tmp_path) are read."""
    yield
    from dockerlaunch.sim.measure import wait_fills

    left = wait_fills(timeout=600)
    assert not left, f"layer-cache fills still running 10 min after the test: pids {left}"


@pytest.fixture(scope="session")
def engine():
    if os.environ.get("DOCKERLAUNCH_SKIP_INTEGRATION") == "1":
        pytest.skip("DOCKERLAUNCH_SKIP_INTEGRATION=1")
    return enginelib.engine()  # fails (not skips) with the fix when no engine runs: CI must have one


def _inside_nodes(client, cluster: str) -> list[str]:
    """Containers left inside the nodes' own engines (job, probe or listener containers of any test)."""
    out = []
    for node in client.containers.list(filters={"label": f"{sim.SIM_LABEL}={cluster}"}):
        code, text = node.exec_run(["docker", "ps", "-a", "--format", "{{.Names}}"])
        assert code == 0, text
        out += [f"{node.name}: {n}" for n in text.decode().split()]
    return out


@pytest.fixture(scope="session")
def sim_cluster(engine, tmp_path_factory):
    """Yields (cluster name, config path, layout). Removed at the end; asserts nothing is left, on this machine
    or inside the nodes."""
    state = tmp_path_factory.mktemp("state")
    previous = os.environ.get("DOCKERLAUNCH_STATE_DIR")
    os.environ["DOCKERLAUNCH_STATE_DIR"] = str(state)  # subprocesses of the CLI find the cluster's state here
    name = f"dlt{os.getpid()}"
    # scripts/test's second process names another /16 here: two clusters on one engine may not share a subnet
    subnet = f"{os.environ.get('DOCKERLAUNCH_TEST_SIM_NET', '172.30')}.{100 + os.getpid() % 100}.0/24"
    config_path = state / "cluster.yaml"
    demo = sim.build_demo_image()  # cached by content hash: built once per machine
    sim.create(nodes=2, cluster=name, subnet=subnet, config_out=str(config_path), seed_images=(demo,))
    try:
        yield name, config_path, sim.node_layout(name, 2, subnet)
        assert _inside_nodes(engine, name) == []
    finally:
        sim.remove(name)
        if previous is None:
            os.environ.pop("DOCKERLAUNCH_STATE_DIR", None)
        else:
            os.environ["DOCKERLAUNCH_STATE_DIR"] = previous
        assert _leftovers(engine, name) == []
        # anything else this session made under its name (test_benchmarks checks its own dlbench clusters)
        assert [x for x in _leftovers(engine, None) if name in x] == []


@pytest.fixture(scope="session")
def cluster_config(sim_cluster):
    return load_config(str(sim_cluster[1]))


@pytest.fixture(scope="session")
def tools_image(cluster_config):
    return cluster_config.image


@pytest.fixture(scope="session")
def demo_image(sim_cluster):
    return sim.build_demo_image()


@pytest.fixture(scope="session")
def remotes(cluster_config):
    from dockerlaunch.hosts.ssh import Remote
    from dockerlaunch.hosts.targets import resolve_target

    out = [Remote(resolve_target(h, cluster_config.ssh)) for h in cluster_config.hosts]
    yield out
    for r in out:
        r.close()


@pytest.fixture
def job_containers(remotes):
    """Job containers left on any host, by job name (asked over SSH, as a user would)."""
    from dockerlaunch.backends.docker.dockerhost import DockerHost

    def find(job: str) -> list[str]:
        return [f"{r.name}:{s.name}:{s.status}" for r in remotes for s in DockerHost(r).job_containers(job)]

    return find


@pytest.fixture
def fresh_image(engine, tools_image):
    """A local image no node has: the tools image plus a layer of random bytes."""
    made = []

    def make(mb: int = 8, scratch: bool = False) -> str:
        """scratch: only the random layer (for tests of bundles and streams that never run the image: a few MB
        to save and load instead of the tools image's ~270 MB)."""
        tag = f"dlt-dist/{secrets.token_hex(4)}:1"
        if scratch:
            ctx = io.BytesIO()
            with tarfile.open(fileobj=ctx, mode="w") as t:
                for name, data in (("Dockerfile", b"FROM scratch\nCOPY blob token /\n"),
                                   ("blob", os.urandom(mb << 20)), ("token", secrets.token_hex(8).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
            ctx.seek(0)
            engine.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
        else:
            dockerfile = (f"FROM {tools_image}\n"
                          f"RUN head -c {mb}M /dev/urandom > /blob && echo {secrets.token_hex(8)} > /token\n")
            engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="host", rm=True)
        made.append(tag)
        return tag

    yield make
    for tag in made:
        try:
            engine.images.remove(tag, force=True)
        except Exception:
            pass


@dataclass
class CpuStack:
    tag: str
    log: str  # the build's output
    wheelhouse: Path
    base_image: str


@pytest.fixture(scope="session")
def cpu_stack(engine, tmp_path_factory):
    """The pinned `cpu` stack as a new user builds it: `fetch` a wheelhouse, then `build --offline` from it
    (once per session; the build and the ms-swift tests share it). Removed at the end."""
    from dockerlaunch.images.stacks import load_matrix

    def dl(*args):
        return cli.dl(*args, timeout=1800)

    base = sim.ensure_base_image(engine)  # no registry here: the local Debian image (debootstrap if needed)
    wheelhouse = tmp_path_factory.mktemp("wheelhouse")
    f = dl("fetch", "--stack", "cpu", "-o", str(wheelhouse))
    assert f.returncode == 0, f.stderr[-2000:]
    r = dl("build", "--stack", "cpu", "--wheelhouse", str(wheelhouse), "--offline", "--base-image", base)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    tag = load_matrix().get("cpu").tag
    yield CpuStack(tag, log, wheelhouse, base)
    try:
        engine.images.remove(tag, force=True)
    except Exception:
        pass


CUDA_STACK = "swift4.6-mcore0.19-cu13-py313"  # the recommended stack: its cuda stage needs no registry


@dataclass
class CudaStage:
    tag: str
    log: str


@pytest.fixture(scope="session")
def cuda_stage(engine):
    """`dockerlaunch build --stack <recommended> --stage cuda`, as a user's first step: a Debian base made with
    debootstrap and the CUDA 13 toolkit from its locked PyPI wheels. A failed download fails here (the build needs
    PyPI and a Debian mirror)."""
    tag = "dltest/cuda-stage:slice"
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "build", "--stack", CUDA_STACK, "--stage", "cuda",
                        "--tag", tag], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    yield CudaStage(tag, r.stdout)
    subprocess.run(["docker", "rmi", tag], capture_output=True)
