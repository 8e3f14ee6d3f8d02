"""What the launch and fault tests share: run the CLI, variants of the sim config, `up` in the background."""

import atexit
import contextlib
import os
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from dockerlaunch.cache import cache_root
from tests import cli

# The CLI runs in a scratch folder, so what it writes by default (`up`'s dockerlaunch-logs/) stays out of the checkout.
SCRATCH = tempfile.mkdtemp(prefix="dlt-cwd-")
atexit.register(shutil.rmtree, SCRATCH, True)


@contextlib.contextmanager
def own_sim_state(tmp_path_factory, prefix: str):
    """A sim cluster's state (keys, known_hosts, config) in a folder of its own, as DOCKERLAUNCH_STATE_DIR."""
    state = tmp_path_factory.mktemp(prefix)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKERLAUNCH_STATE_DIR", str(state))
        yield state


def dl(*args, timeout=300, cwd=None, env=None):
    """tests/cli.py's, in a scratch folder by default (no ./dockerlaunch.yaml of the caller's is read)."""
    return cli.dl(*args, timeout=timeout, cwd=cwd or SCRATCH, env=env)


def until(predicate, timeout: float, step: float = 0.2) -> float | None:
    """Seconds until `predicate()` held, or None if it never did within `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def job_name():
    return f"t{secrets.token_hex(3)}"


def variant(sim_cluster, tmp_path, **changes) -> str:
    """A copy of the sim cluster config with some top-level sections changed."""
    data = yaml.safe_load(open(sim_cluster[1]))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / f"cfg-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def default_signals() -> None:
    """In the child, before exec: the signals the tests send, as a terminal gives them. A suite started as a
    background job of a non-interactive shell (`cmd &`) inherits SIGINT and SIGQUIT ignored, one started under
    `nohup` SIGHUP, and `up` keeps an ignored SIGINT or SIGHUP ignored (on purpose: `nohup dockerlaunch up &`):
    the tests that send them would then see `up` not react."""
    import signal

    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def start_up(*args: str) -> tuple[subprocess.Popen, "queue.Queue[str]", list[str]]:
    """`dockerlaunch up` in the background; its output lines arrive on a queue (and in a list, for messages),
    so a silent `up` cannot block a test past its deadline."""
    return start_cli("up", *args)


def start_cli(*args: str, new_session: bool = False) -> tuple[subprocess.Popen, "queue.Queue[str]", list[str]]:
    """The CLI in the background with the signals as a terminal gives them (`new_session`: leading a session of
    its own, so its process group holds only it and what it started); its output lines on a queue and in a list."""
    p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=SCRATCH, preexec_fn=default_signals,
                         start_new_session=new_session)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def pump():
        for line in p.stdout:
            seen.append(line)
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return p, lines, seen


def wait_for_ready(lines: "queue.Queue[str]", want: set[str], timeout: float) -> set[str]:
    """Read until every `ready R` in `want` was seen or the deadline passes; returns what was seen."""
    import time

    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while seen != want and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        m = re.search(r"\bready (\d+)$", line.strip())
        if m:
            seen.add(m.group(1))
    return seen


def stop_up(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(timeout=30)


def env_files_on(remote) -> list[str]:
    """dockerlaunch's secret folders in the host's /tmp (ls' own failure fails the test)."""
    r = remote.run(["sh", "-c", "ls -a /tmp"])
    assert r.ok, r.stderr
    return [f for f in r.stdout.split() if f.startswith("dockerlaunch-") and (f.endswith(".env.d") or
                                                                              f.endswith(".env"))]


def probe_containers_on(remote) -> list[str]:
    r = remote.run(["docker", "ps", "-a", "--filter", "label=dockerlaunch.probe=1", "--format", "{{.Names}}"])
    assert r.ok, r.stderr
    return r.stdout.split()


def containers_on(remote, job: str) -> list[str]:
    """The job's containers on one host (asked over SSH, as a user would)."""
    from dockerlaunch.backends.docker.dockerhost import DockerHost

    return [st.name for st in DockerHost(remote).job_containers(job)]


def nc_listeners(remote) -> list[str]:
    """PIDs of `nc -l` on the host; pgrep's own failure (exit > 1) fails the test instead of reading as none."""
    r = remote.run(["pgrep", "-f", "^nc -l"])
    assert r.exit_status in (0, 1), f"pgrep failed on {remote.name}: {r.stderr}"
    return r.stdout.split()


TORCH_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)) + ("manylinux2014_x86_64",
                                                                                  "manylinux1_x86_64", "linux_x86_64")


def torch_wheels() -> Path:
    """torch 2.11.0 and its CUDA 13 wheels for Python 3.13 as pip resolves them (torch pins cuBLAS 13.1.0.3),
    downloaded once per machine into the cache's test-wheels/torch-2.11.0/ (~2.6 GB)."""

    dest = cache_root() / "test-wheels" / "torch-2.11.0"
    dest.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--only-binary=:all:",
                        "--python-version", "3.13", *[a for p in TORCH_PLATFORMS for a in ("--platform", p)],
                        "-q", "-d", str(dest), "torch==2.11.0"], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return dest


@contextlib.contextmanager
def local_containerd_engine(client, root: Path):
    """A second engine for the launcher, Docker 28 with containerd's image store (the store Docker 29 makes the
    default), from the sim's own 28 node image: a container sharing this machine's network and pid namespace (so
    the launcher's registry on 127.0.0.1 is its 127.0.0.1, and `engine_reads` counts its dockerd and containerd),
    its socket in `root` for the docker group. Yields its DOCKER_HOST; the container and its data go at the end."""
    import docker

    from dockerlaunch.sim import images as sim_images
    from dockerlaunch.sim.layout import ENGINES, NODE_CAPS

    nodes, _ = sim_images.ensure_images(client, kinds=[ENGINES["28-containerd"]])
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    name = f"dlt-c8d-{secrets.token_hex(3)}"
    data = client.volumes.create(name)
    gid = os.stat("/var/run/docker.sock").st_gid if os.path.exists("/var/run/docker.sock") else 0
    start = ('mkdir -p /etc/docker && echo \'{"features": {"containerd-snapshotter": true}}\' > /etc/docker/daemon.json'
             ' && exec dockerd -H unix:///run/c8d/docker.sock --group "$1" --bridge none --iptables=false'
             ' --ip6tables=false --exec-root /run/c8d-exec --pidfile /run/c8d-exec/dockerd.pid')
    box = client.containers.run(
        nodes["28-containerd"], ["-c", start, "sh", str(gid)], entrypoint=["sh"], name=name, detach=True,
        network_mode="host", pid_mode="host", cgroupns="host", init=True, cap_add=list(NODE_CAPS),
        security_opt=["seccomp=unconfined", "apparmor=unconfined"], device_cgroup_rules=["a *:* rwm"],
        volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                 data.name: {"bind": "/var/lib/docker", "mode": "rw"}, str(root): {"bind": "/run/c8d", "mode": "rw"}})
    host = f"unix://{root}/docker.sock"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                info = docker.DockerClient(base_url=host).info()
                break
            except docker.errors.DockerException:
                box.reload()
                if box.status != "running" or time.monotonic() > deadline:
                    pytest.fail(f"the containerd-store dockerd did not start: {box.logs()[-800:]!r}")
                time.sleep(0.3)
        assert "io.containerd.snapshotter" in str(info.get("DriverStatus")), info.get("DriverStatus")
        yield host
    finally:
        box.remove(force=True)
        data.remove(force=True)


# A sim node as a GPU host as far as its probe can tell, for the GPU tests (the stand-in nvidia-smi of
# tests/gpu_standin.py is put beside it by each test): dummy /dev/nvidia0 and /dev/nvidiactl and stub driver
# libraries, so that the job's GPU container starts in device mode.
GPU_LIBDIR = "/usr/lib/x86_64-linux-gnu"
GPU_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
GPU_HOST_SETUP = ("ldconfig && rm -f /dev/nvidia0 /dev/nvidiactl && mknod -m 666 /dev/nvidia0 c 195 0 && "
                  "mknod -m 666 /dev/nvidiactl c 195 255")
GPU_HOST_TEARDOWN = f"rm -f /dev/nvidia0 /dev/nvidiactl {' '.join(f'{GPU_LIBDIR}/{s}' for s in GPU_LIBS)}; ldconfig"


def tar_files(files: dict[str, tuple[bytes, int]]) -> bytes:
    """{name: (bytes, mode)} as a tar archive, for a container's put_archive."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def put_stub_driver(node, tmp: Path) -> None:
    """The GPU_LIBS as stub shared libraries (gcc) in the node's GPU_LIBDIR; GPU_HOST_SETUP then registers them."""
    (tmp / "stub.c").write_text("int dl_stub(void) { return 0; }\n")
    libs = {}
    for soname in GPU_LIBS:
        out = tmp / soname
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(tmp / "stub.c")],
                       check=True)
        libs[soname] = (out.read_bytes(), 0o755)
    node.put_archive(GPU_LIBDIR, tar_files(libs))


def ids_on_nodes(remotes, ref: str) -> list[str | None]:
    """Each host's Image ID for `ref` (None where it has no such image)."""
    out = []
    for r in remotes:
        res = r.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
        out.append(res.stdout.strip() if res.ok else None)
    return out
