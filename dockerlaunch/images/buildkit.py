"""Which docker CLI builds (`BuildCLI`): BuildKit in the client (18.09 to 22.x) or the buildx plugin (23+, where
the classic builder is all that is left without it), probed on every candidate; a client that cannot is one line
with the fix.

"builder" here is only buildx's word (a buildx builder and its driver); elsewhere in images/ it is the
Dockerfile's builder stage and its image, which compiled packages build in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dockerlaunch.errors import BuildError

DOCKER_CANDIDATES = ("/usr/bin/docker", "/usr/local/bin/docker")  # after `docker` on PATH


BUILDKIT_BUILT_IN = ((18, 9), (23, 0))  # CLI versions with BuildKit in the client itself: [from, to)


BUILDX_FIX = ("apt-get install docker-buildx (from Docker's own apt repository: docker-buildx-plugin), "
              "or put docker-buildx in ~/.docker/cli-plugins")


@dataclass(frozen=True)
class DockerClient:
    """What one docker CLI said about itself (`probe_client`): the facts `choose_cli` decides on."""

    path: str
    version: str | None = None  # `docker --version`: "28.2.2", "20.10.24+dfsg1"
    buildx: str | None = None  # `docker buildx version`, when it ran: "github.com/docker/buildx 0.29.1 ..."
    error: str | None = None  # why the CLI did not run, or is not Docker's
    driver: str | None = None  # the current buildx builder's driver (`docker buildx inspect`): docker, docker-container
    context: str | None = None  # `docker context show`: the name of that context's own (docker-driver) builder

    @property
    def release(self) -> tuple[int, int] | None:
        m = re.match(r"v?(\d+)\.(\d+)", self.version or "")
        return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class BuildxFile:
    """A docker-buildx binary in one of the CLI's plugin folders; `error` says why it did not run."""

    path: str
    error: str | None = None


@dataclass(frozen=True)
class BuildCLI:
    prefix: tuple[str, ...]  # the argv before the build flags
    env: dict[str, str]  # added to the environment
    what: str  # one line for the log

    @property
    def docker(self) -> str:
        return self.prefix[0]


def _buildx_release(line: str) -> str:
    m = re.search(r"\s(v?\d+\.\d+\S*)", line)
    return m.group(1) if m else line


def choose_cli(clients: Sequence[DockerClient], plugins: Sequence[BuildxFile] = ()) -> BuildCLI | str:
    """Pure: the first client with a working buildx plugin, else the first with BuildKit built in; else the one
    line that says what to install (`plugins`: docker-buildx files found, to tell a broken plugin from none)."""
    for c in clients:
        if c.buildx and not c.error:
            what = f"buildx {_buildx_release(c.buildx)} with the docker CLI at {c.path} ({c.version})"
            if c.driver and c.driver != "docker" and c.context:
                # a docker-container (or kubernetes, remote) builder cannot see the engine's images: the made
                # base and the builder stage are local images, so the build uses the engine's own builder
                return BuildCLI((c.path, "buildx", "build", "--builder", c.context, "--load"), {},
                                f"{what}, builder {c.context} (the engine's own: the current builder's driver "
                                f"{c.driver} cannot see local images such as the made base)")
            return BuildCLI((c.path, "buildx", "build", "--load"), {}, what)
    lo, hi = BUILDKIT_BUILT_IN
    for c in clients:
        if not c.error and c.release and lo <= c.release < hi:
            return BuildCLI((c.path, "build"), {"DOCKER_BUILDKIT": "1"},
                            f"the docker CLI at {c.path} ({c.version}, BuildKit built in)")
    if not clients:
        return ("no docker CLI found (looked for docker on PATH, " + ", ".join(DOCKER_CANDIDATES) + "): install "
                "Debian's docker.io (20.10 on Debian 12: BuildKit built in), or a Docker CLI and its buildx plugin")
    parts = []
    need = [c for c in clients if not c.error and c.release and c.release >= hi]
    if need:
        names = " and ".join(f"{c.path} ({c.version})" for c in need)
        clis = "CLIs" if len(need) > 1 else "CLI"
        verb = "need" if len(need) > 1 else "needs"
        broken = [p for p in plugins if p.error]
        running = [p for p in plugins if not p.error]
        if broken:
            fix = f"{broken[0].path} does not run ({broken[0].error}), replace it: {BUILDX_FIX}"
        elif running:
            fix = (f"{running[0].path} runs on its own, but `docker buildx version` fails: replace it with a "
                   f"buildx release that supports this CLI: {BUILDX_FIX}")
        else:
            fix = BUILDX_FIX
        parts.append(f"the docker {clis} at {names} {verb} the buildx plugin for BuildKit: {fix}")
    for c in clients:
        if c.error:
            parts.append(f"the docker CLI at {c.path} does not run ({c.error})")
        elif not c.release:
            parts.append(f"the docker CLI at {c.path} reports no version ({c.version})")
        elif c.release < lo:
            parts.append(f"the docker CLI at {c.path} ({c.version}) is too old for BuildKit: install Debian's "
                         f"docker.io, or a Docker CLI with the buildx plugin")
    return "; ".join(parts)


def _one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _run(argv: list[str], timeout: float = 30) -> tuple[int, str]:
    """(exit status, stdout or else stderr), never raising: a missing or broken binary is status -1."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, f"no answer in {timeout:.0f} s"
    except OSError as e:
        return -1, e.strerror or str(e)
    return r.returncode, r.stdout if r.returncode == 0 else (r.stderr or r.stdout or f"exit status {r.returncode}")


def probe_client(path: str) -> DockerClient:
    """`docker --version` (the client alone, no engine) and `docker buildx version` (~0.2 s)."""
    code, text = _run([path, "--version"])
    if code != 0:
        return DockerClient(path, error=_one_line(text))
    m = re.match(r"Docker version (\S+?),?(\s|$)", text.strip())
    if not m:
        return DockerClient(path, error=f"not Docker's CLI: {_one_line(text, 80)}")
    code, text = _run([path, "buildx", "version"])
    if code != 0 or not text.strip():
        return DockerClient(path, m.group(1))
    _, inspect = _run([path, "buildx", "inspect"])
    driver = re.search(r"^Driver:\s+(\S+)", inspect, re.M)
    code, context = _run([path, "context", "show"])
    return DockerClient(path, m.group(1), buildx=_one_line(text), driver=driver.group(1) if driver else None,
                        context=context.strip() if code == 0 and context.strip() else None)


def plugin_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """Where the docker CLI looks for plugins: $DOCKER_CONFIG/cli-plugins (~/.docker), the config's
    cliPluginsExtraDirs, then the system folders."""
    env = os.environ if env is None else env
    config = env.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    dirs = [os.path.join(config, "cli-plugins")]
    try:
        extra = json.loads(Path(config, "config.json").read_text()).get("cliPluginsExtraDirs") or []
        dirs += [d for d in extra if isinstance(d, str)]
    except (OSError, ValueError, AttributeError):
        pass
    return dirs + ["/usr/local/lib/docker/cli-plugins", "/usr/local/libexec/docker/cli-plugins",
                   "/usr/lib/docker/cli-plugins", "/usr/libexec/docker/cli-plugins"]


def cli_no_proxy(env: Mapping[str, str] | None = None) -> str:
    """The NO_PROXY the docker CLI gives a build's steps: `noProxy` of its config.json's `proxies` (the entry for
    the engine's host, else `default`), as the CLI sets the proxy build args (HTTP_PROXY, NO_PROXY and their
    lower-case twins) from it for every `docker build` and `buildx build`, unless a --build-arg names them. "" for
    none."""
    env = os.environ if env is None else env
    config = env.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        proxies = json.loads(Path(config, "config.json").read_text()).get("proxies")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(proxies, dict):
        return ""
    entry = proxies.get(env.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
    entry = entry if isinstance(entry, dict) else proxies.get("default")
    value = entry.get("noProxy") if isinstance(entry, dict) else None
    return value if isinstance(value, str) else ""


def probe_buildx_files(dirs: list[str] | None = None) -> list[BuildxFile]:
    out = []
    for d in plugin_dirs() if dirs is None else dirs:
        path = os.path.join(d, "docker-buildx")
        if os.path.lexists(path):
            code, text = _run([path, "version"])
            out.append(BuildxFile(path, None if code == 0 else _one_line(text, 100)))
    return out


def docker_candidates() -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for path in (shutil.which("docker"), *DOCKER_CANDIDATES):
        if path and os.path.exists(path) and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            out.append(path)
    return out


def find_cli(candidates: list[str] | None = None) -> BuildCLI:
    """A docker CLI that can run BuildKit builds (`choose_cli` on probed facts), or a one-line BuildError."""
    clients = [probe_client(p) for p in (docker_candidates() if candidates is None else candidates)]
    plugins = [] if any(c.buildx for c in clients) else probe_buildx_files()
    choice = choose_cli(clients, plugins)
    if isinstance(choice, str):
        raise BuildError(choice)
    return choice
