"""A stand-in `docker` CLI that answers the engine questions of the real host scripts (observe.sh, probe.sh) with
what a saved real `docker info` says (tests/data/docker-info/: each file's first lines say where it is from and
what was cut), and records what it was asked. Nothing here runs SELinux: an engine that labels containers is seen
only through these outputs, the sim's engines take the `docker run` flags for real (tests/integration/).

`security_options(name)`: the API's SecurityOptions list of a saved output, as its CLI printed it.
`install(directory, options, ...)`: the stand-in at `directory/docker`; its calls go to `directory/calls`, one line
each (the arguments joined by a blank).
`mounts(directory, enforce)`: a mounts table (probe.sh's DL_PROBE_MOUNTS) with selinuxfs mounted under
`directory/selinuxfs`, whose `enforce` says `enforce` (1 enforcing, 0 permissive); `enforce=None`: no selinuxfs.
"""

import json
import shlex
from pathlib import Path

DOCKER_INFO = Path(__file__).parent / "data" / "docker-info"
SAVED = sorted(p.name for p in DOCKER_INFO.glob("*.txt"))
IMAGE_ID = "sha256:" + "5e" * 32


def security_options(name: str) -> list[str]:
    """The API's SecurityOptions list as `docker info` printed it (what users paste). The 1.12 CLI prints the list as
    the daemon gave it, space-separated after `Security Options:`; from 1.13 on, docker/cli's prettyPrintServerInfo
    prints each option's name one level deeper and its profile as `Profile: X`, one more (a WARNING line beside it),
    which a 1.13+ daemon sent as `name=NAME[,profile=X]`."""
    lines = [line for line in (DOCKER_INFO / name).read_text().splitlines() if not line.startswith("# ")]
    for i, line in enumerate(lines):
        head = line.strip()
        if not head.startswith("Security Options:"):
            continue
        rest = head.removeprefix("Security Options:").strip()
        if rest:
            return rest.split()
        indent = len(line) - len(line.lstrip())
        out: list[str] = []
        for sub in lines[i + 1:]:
            depth = len(sub) - len(sub.lstrip())
            if not sub.strip() or depth <= indent:
                break
            if depth == indent + 1:
                out.append(f"name={sub.strip()}")
            elif sub.strip().startswith("Profile: "):
                out[-1] += f",profile={sub.strip().removeprefix('Profile: ')}"
        return out
    raise AssertionError(f"{name}: no Security Options in the output")


def script(options: list[str] | None, calls: Path, version: str = "28.5.2", image: bool = True) -> str:
    """`options` None: an engine whose `docker info` fails (no answer)."""
    info = json.dumps({"ServerVersion": version, "DockerRootDir": "/var/lib/docker", "SecurityOptions": options})
    answer_info = ('echo ' + shlex.quote(info) if options is not None else "exit 1")
    answer_options = ('echo ' + shlex.quote(json.dumps(options)) if options is not None else "exit 1")
    return "\n".join([
        "#!/bin/sh",
        "# stand-in docker (tests only): the engine of a saved real `docker info` (tests/docker_standin.py)",
        f'echo "$*" >> {shlex.quote(str(calls))}',
        'case "$1 $2 $3" in',
        f"  'version --format {{{{.Server.Version}}}}') echo {shlex.quote(version)} ;;",
        f"  'info --format {{{{json .}}}}') {answer_info} ;;",
        f"  'info --format {{{{json .SecurityOptions}}}}') {answer_options} ;;",
        "  'info --format {{.DockerRootDir}}') echo /var/lib/docker ;;",
        "  'image inspect --format')",
        f"    {'' if image else 'exit 1'}",
        '    case "$4" in',
        f"      '{{{{.Id}}}}') echo {IMAGE_ID} ;;",
        "      *) echo null ;;",
        "    esac ;;",
        '  *) echo "stand-in docker: $* is not recorded" >&2; exit 2 ;;',
        "esac",
        "",
    ])


def install(directory: Path, options: list[str] | None, **kw) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "docker"
    path.write_text(script(options, directory / "calls", **kw))
    path.chmod(0o755)
    return path


def asked(directory: Path) -> list[str]:
    calls = directory / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def mounts(directory: Path, enforce: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    table = directory / "mounts"
    lines = ["proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
             "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0"]
    if enforce is not None:
        fs = directory / "selinuxfs"
        fs.mkdir(exist_ok=True)
        (fs / "enforce").write_text(enforce)
        lines.append(f"selinuxfs {fs} selinuxfs rw,nosuid,noexec,relatime 0 0")
    table.write_text("\n".join(lines) + "\n")
    return table
