"""dockerlaunch's own py-spy (a static binary, installed with dockerlaunch) staged in a job's folder on a host, for
images that have none: `dump`'s sidecar runs it beside a rank, and the gang supervisor of a detached job runs it
from its read-only mount when the job hangs (`up` stages it before the start, with job.hang_timeout)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from dockerlaunch.hosts.ssh import Remote

OWNED = """owned() { [ "$(ls -ldn "$1" 2>/dev/null | awk '{print $3}')" = "$(id -u)" ]; }; """


def local_pyspy() -> Path | None:
    """The py-spy installed with dockerlaunch (its wheel is a dependency), else one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("py-spy")
    return Path(found) if found else None


def stage_pyspy(remote: Remote, job_dir: str, root: str, binary: Path) -> str:
    """Copied once per host and version into JOB_DIR/bin (the name holds its hash; a half-copied file never has
    that name), into the job's own folder: the shared parent is world-writable, and a binary planted there would
    run with SYS_PTRACE beside the ranks. Returns its path on the host."""
    data = binary.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:12]
    path = f"{job_dir}/bin/py-spy-{digest}"
    if remote.run(["sh", "-c", OWNED + 'test -x "$1" && owned "$1" && owned "${1%/*}"', "sh", path], timeout=30).ok:
        return path
    remote.check(
        # the shared parent, where this makes it, is sticky and world-writable as diagdir.sh makes it
        ["sh", "-c", OWNED + '{ [ -d "$2" ] || { mkdir -p "$2" && chmod 1777 "$2"; }; } && mkdir -p "${1%/*}" '
         '&& owned "${1%/*}" && cat > "$1.$$" && chmod 755 "$1.$$" && mv -f "$1.$$" "$1"', "sh", path, root],
        "copying py-spy to the host", timeout=300, stdin=data)
    return path
