"""`--on HOST`: compile a stack's packages on a cluster host, where the cores (and GPUs) are.

A laptop or CI box has a few cores; a GPU host has 100+. The compile is the wheel cache's own (images/compiles.py),
only its place moves: the builder image goes to the host the way `push` sends any image (only the layers it
lacks), the source goes as a checked tree, the container runs on the host's engine with its build folder on the
host's disk (so a killed compile resumes there too), and the finished wheel comes back into this machine's cache
with its sha256. The key is the builder image's and the stack's, not the host's, so the wheel then serves local
builds and every other host without compiling again. It lives with the transfers because that is most of what it
does, and because only this layer may use both the image side and the hosts.
"""

from __future__ import annotations

import hashlib
import logging
import re
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dockerlaunch.cache import replacing
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.errors import DockerlaunchError, HostError
from dockerlaunch.gpu import smi
from dockerlaunch.gpu.cuda import version_tuple
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.images import compiles  # the compiling half of the wheel cache (images/compiles.py)
from dockerlaunch.images.compiles import CONTAINER_DIR, Place, Sample
from dockerlaunch.images.wheels import Entry, WheelError

_LOG = logging.getLogger(__name__)

WHEEL_NAME = re.compile(r"[A-Za-z0-9_.+-]+\.whl")
POLL = 2.0  # seconds between looks at the container's state


class OnHost(compiles.Here):
    """Compiles on one cluster host's engine, over an SSH connection `up` would use (same host-key policy)."""

    def __init__(self, remote: Remote, client=None, log: Callable[[str], None] | None = None):
        self.remote = remote
        self.what = f"host {remote.name}"
        self.client = client  # this machine's engine (docker SDK): the builder image is sent from it
        self.log = log or (lambda msg: _LOG.info("%s", msg))
        self._home: str | None = None
        self._sent: set[str] = set()

    def _run(self, argv: list[str], what: str, timeout: float = 120) -> str:
        return self.remote.check(argv, what, timeout=timeout).stdout

    def gpu_archs(self) -> list[str]:
        """The host's GPUs' compute capabilities, each once: what the build compiles for without --cuda-archs."""
        r = self.remote.run(["sh", "-c", smi.CAPS_QUERY], timeout=30)
        try:
            return sorted(set(smi.parse_compute_caps(r.exit_status, r.stdout)), key=version_tuple)
        except smi.CapsUnknown as e:
            if e.missing or e.no_gpu:  # a build server without GPUs: the build's default, said by the build
                return []
            raise HostError(self.remote.name, f"{e.why}: pass --cuda-archs", step="asking the host for its GPUs' "
                            "compute capability") from None

    def default_jobs(self, gb_per_job: float) -> tuple[int, str | None]:
        out = self._run(["sh", "-c", "nproc; cat /proc/meminfo"], "reading its cores and memory")
        first, _, meminfo = out.partition("\n")
        return compiles.default_jobs(gb_per_job, meminfo, int(first) if first.strip().isdigit() else 1)

    @property
    def home(self) -> str:
        if self._home is None:
            out = self._run(["sh", "-c", 'printf "%s" "$HOME"'], "finding its home folder").strip()
            if not out.startswith("/"):
                raise DockerlaunchError(f"host {self.remote.name}: $HOME is {out!r}, not a folder: the build folder "
                                        "goes to $HOME/.cache/dockerlaunch/compiled")
            self._home = out
        return self._home

    def ensure_builder(self, builder: str) -> None:
        """The builder image on the host, by Image ID (only the layers it lacks travel)."""
        if builder in self._sent:
            return
        from dockerlaunch.engine import engine
        from dockerlaunch.transfer.image_facts import local_image
        from dockerlaunch.transfer.push import push_to_host
        from dockerlaunch.transfer.push_plan import PushState

        client = self.client or engine()
        image = local_image(client, builder)
        self.log(f"builder image {builder} ({image.size / 1e9:.1f} GB) to {self.what}: sending the layers it lacks")
        t0 = time.monotonic()
        result = push_to_host(client, self.remote, image)
        if result.status == PushState.FAILED:
            raise WheelError(f"{self.what}: cannot send the builder image {builder}: {result.detail}")
        sent = f"{result.bytes_sent / 1e6:.0f} MB sent" if result.bytes_sent else "nothing to send"
        self.log(f"builder image on {self.what}: {result.status} ({sent}, {time.monotonic() - t0:.0f} s)")
        self._sent.add(builder)

    def place(self, entry: Entry, builder: str) -> Place:
        self.ensure_builder(builder)
        return HostPlace(entry, self, builder)


class HostPlace(Place):
    """A key's build folder on the host ($HOME/.cache/dockerlaunch/compiled/<key folder>/build); every file
    operation in it runs in a builder container, as the compile does (its files are root's)."""

    def __init__(self, entry: Entry, on: OnHost, builder: str):
        self.entry, self.on, self.remote, self.builder = entry, on, on.remote, builder
        self.host = on.remote.name
        self.where = f" on {on.what}"
        self.dir = f"{on.home}/.cache/dockerlaunch/compiled/{entry.folder.name}/build"
        self.name = compiles.container_name(entry, where=self.host)

    def docker(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        r = self.remote.run(["docker", *args], timeout=timeout)
        return r.exit_status, (r.stdout if r.ok else r.stderr or r.stdout)

    @property
    def mount(self) -> str:
        return self.dir

    def _in_builder(self, script: str, *args: str, stdin=None, what: str, timeout: float = 600) -> str:
        r = self.remote.run(tool_argv(self.builder, ["-c", script, "sh", *args], entrypoint="sh", stdin=True,
                                      mounts=[BindMount(self.dir, CONTAINER_DIR)]), timeout=timeout, stdin=stdin)
        if not r.ok:
            raise WheelError(f"{self.on.what}: {what}: {r.last_line()[:300]}")
        return r.stdout

    def prepare(self, source: Path) -> None:
        marker = self.remote.run(["cat", f"{self.dir}/src/.dockerlaunch-source"], timeout=60)
        if marker.ok and marker.stdout.strip() == source.name:
            return  # unpacked by an earlier run: its objects stay, ninja resumes
        with tempfile.TemporaryDirectory(prefix="dockerlaunch-src-") as tmp:
            compiles.unpack(source, Path(tmp) / "src")  # checked here: no member leaves the folder
            archive = Path(tmp) / "src.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(Path(tmp) / "src", arcname="src")
            self.on.log(f"{source.name}: sending the source tree to {self.on.what} "
                        f"({archive.stat().st_size / 1e6:.0f} MB)")
            with open(archive, "rb") as f:
                self._in_builder(f'cd {CONTAINER_DIR} && rm -rf src src.tmp && mkdir src.tmp && tar -x -C src.tmp '
                                 '&& mv src.tmp/src src && rmdir src.tmp', stdin=f, what="unpacking the source")

    def clear_dist(self) -> None:
        self._in_builder(f"rm -rf {CONTAINER_DIR}/dist && mkdir {CONTAINER_DIR}/dist", what="emptying dist/")

    def progress(self) -> tuple[int, int]:
        r = self.remote.run(["sh", "-c", PROGRESS_SCRIPT, "sh", self.dir], timeout=120)
        return compiles.count_objects(parse_progress(r.stdout)) if r.ok else (0, 0)

    def log_text(self) -> str:
        r = self.remote.run(["cat", f"{self.dir}/log"], timeout=300)
        return r.stdout if r.ok else ""

    def log_path(self) -> str:
        return f"{self.dir}/log on {self.on.what}"

    def wheel_names(self) -> list[str]:
        r = self.remote.run(["ls", f"{self.dir}/dist"], timeout=60)
        return sorted(n for n in r.stdout.split() if WHEEL_NAME.fullmatch(n)) if r.ok else []

    def take_wheel(self, name: str) -> Path:
        """The wheel into this machine's cache, checked against the sha256 the host computes of its copy."""
        if not WHEEL_NAME.fullmatch(name):
            raise WheelError(f"{self.on.what}: {name!r} is not a wheel file name")
        r = self.remote.run(["sha256sum", f"{self.dir}/dist/{name}"], timeout=300)
        want = r.stdout.split()[0] if r.ok and r.stdout.split() else None
        dist = self.entry.folder / "build" / "dist"
        digest = hashlib.sha256()
        with replacing(dist / name) as f:
            def write(data: bytes) -> None:
                f.write(data)
                digest.update(data)

            err = bytearray()
            status = self.remote.stream(["cat", f"{self.dir}/dist/{name}"], write, err.extend, timeout=3600)
            if status != 0 or (want and digest.hexdigest() != want):
                why = err.decode(errors="replace").strip()[-200:] or (
                    f"sha256 {digest.hexdigest()} here, {want} on the host" if status == 0 else f"exit {status}")
                raise WheelError(f"{self.on.what}: fetching {name} failed: {why}")
        self.on.log(f"{name}: fetched from {self.on.what} ({(dist / name).stat().st_size / 2**20:.0f} MB, "
                    f"sha256 {digest.hexdigest()})")
        return dist / name

    def sampler(self, cid: str) -> Sample:
        sample = Sample()
        paths = [f"/sys/fs/cgroup/{p.format(id=cid)}" for pair in compiles.CGROUP_FILES for p in pair]

        def run() -> None:
            while not sample.stop.is_set():
                r = self.remote.run(["sh", "-c", CGROUP_SCRIPT, "sh", *paths], timeout=60)
                mem, _, cpu = r.stdout.partition("@@dl-cpu\n")
                if not r.ok or not mem:
                    return
                sample.take(mem, cpu)
                sample.stop.wait(5)

        threading.Thread(target=run, daemon=True, name="dl-compile-sample").start()
        return sample

    def wait(self, every: float, tick: Callable[[], None]) -> int:
        last = time.monotonic()
        while True:
            code, state = self.docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", self.name)
            if code != 0:
                return 1  # removed under us: the caller reports the log's error
            running, _, exit_code = state.strip().partition(" ")
            if running != "true":
                return int(exit_code) if exit_code.lstrip("-").isdigit() else 1
            if time.monotonic() - last >= every:
                tick()
                last = time.monotonic()
            time.sleep(POLL)


# Each build.ninja below the build folder with its .ninja_log (see compiles.ninja_progress), between markers.
PROGRESS_SCRIPT = r'''cd "$1" 2>/dev/null || exit 0
find src/build -path 'src/build/temp*' -name build.ninja 2>/dev/null | sort | while read -r f; do
  printf '@@dl-ninja\n'; cat "$f"; printf '@@dl-log\n'; cat "$(dirname "$f")/.ninja_log" 2>/dev/null
done'''

# The first of the (memory.stat, cpu) pairs that exists: the container's cgroup on v1 or v2.
CGROUP_SCRIPT = r'''while [ $# -ge 2 ]; do
  if [ -r "$1" ]; then cat "$1"; printf '@@dl-cpu\n'; cat "$2"; exit 0; fi; shift 2
done'''


def parse_progress(text: str) -> list[tuple[str, str]]:
    files = []
    for part in text.split("@@dl-ninja\n")[1:]:
        ninja, _, log_text = part.partition("@@dl-log\n")
        files.append((ninja, log_text))
    return files
