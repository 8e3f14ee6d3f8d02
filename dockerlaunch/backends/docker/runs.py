"""A run's folder on the launcher: DIR/<job>-<time>/attempt-N/rank<R>-<host>.log and attempts.jsonl.

The evidence of why each attempt ended stays after the containers are gone: `status` reads the attempts, and
`logs` of a finished job reads the saved per-rank files instead of asking engines that no longer have them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.recovery import AttemptRecord

ATTEMPTS = "attempts.jsonl"
_RANK_FILE = re.compile(r"^rank(\d+)-(.+)\.log$")


def safe_host(address: str) -> str:
    return address.replace("/", "_").replace(":", "_")


@dataclass
class RunFolder:
    root: Path

    @classmethod
    def create(cls, log_dir: str, job: str) -> RunFolder:
        base = Path(log_dir) / f"{job}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        root, n = base, 1
        while root.exists():  # two runs of one job in the same second
            n += 1
            root = base.with_name(f"{base.name}.{n}")
        return cls(root)  # made with its first attempt: a launch refused before any start leaves no folder

    def _make_root(self) -> None:
        """The run's folder, 0700: rank logs and attempts.jsonl may hold what a rank printed of its environment."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)  # whatever the umask

    def attempt_dir(self, attempt: int) -> Path:
        self._make_root()
        d = self.root / f"attempt-{attempt}"
        d.mkdir(mode=0o700, exist_ok=True)
        return d

    def record(self, rec: AttemptRecord) -> None:
        self._make_root()
        fd = os.open(self.root / ATTEMPTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(rec.to_json() + "\n")

    def attempts(self) -> list[AttemptRecord]:
        path = self.root / ATTEMPTS
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(AttemptRecord.from_json(line))
            except (ValueError, TypeError):
                continue  # a line cut by a killed launcher
        return out

    def attempt_numbers(self) -> list[int]:
        return sorted(int(p.name[8:]) for p in self.root.glob("attempt-*") if p.name[8:].isdigit())

    def rank_files(self, attempt: int) -> Iterator[tuple[int, str, Path]]:
        """(rank, host as in the file name, path) of one attempt, rank order."""
        found = []
        for p in (self.root / f"attempt-{attempt}").glob("rank*.log"):
            m = _RANK_FILE.match(p.name)
            if m:
                found.append((int(m[1]), m[2], p))
        return iter(sorted(found))


def runs_of(log_dir: str, job: str) -> list[RunFolder]:
    """The job's run folders under DIR, oldest first (a job `a` does not see job `a-b`'s)."""
    d = Path(log_dir)
    if not d.is_dir():
        return []
    name = re.compile(rf"^{re.escape(job)}-\d{{8}}-\d{{6}}(\.\d+)?$")
    found = [p for p in d.iterdir() if p.is_dir() and name.match(p.name)]

    def when(p: Path) -> tuple[str, int]:
        stamp, _, n = p.name[len(job) + 1:].partition(".")
        return stamp, int(n or 1)

    return [RunFolder(p) for p in sorted(found, key=when)]


_RUN_NAME = re.compile(r"^(.+)-(\d{8}-\d{6})(\.\d+)?$")


def saved_jobs(log_dir: str) -> dict[str, str]:
    """Jobs whose runs `up` saved under DIR: {job name: its latest run's time, `YYYYmmdd-HHMMSS`}, by name."""
    d = Path(log_dir)
    if not d.is_dir():
        return {}
    found: dict[str, str] = {}
    for p in d.iterdir():
        m = _RUN_NAME.match(p.name)
        if m and p.is_dir():
            found[m[1]] = max(found.get(m[1], ""), m[2])
    return dict(sorted(found.items()))


def latest_run(log_dir: str, job: str) -> RunFolder | None:
    runs = runs_of(log_dir, job)
    return runs[-1] if runs else None


def saved_attempt(log_dir: str, job: str, attempt: int | None) -> tuple[RunFolder, int]:
    """The latest run's folder and the attempt asked for (default: its last), or one line saying what is missing."""
    run = latest_run(log_dir, job)
    if run is None:
        raise ConfigError(f"job {job}: no containers on the hosts and no saved logs under {log_dir}/ "
                          "(`up --log-dir` writes them; pass the same --log-dir here)")
    numbers = run.attempt_numbers()
    if not numbers:
        raise ConfigError(f"{run.root}: no attempt folders in it")
    if attempt is None:
        return run, numbers[-1]
    if attempt not in numbers:
        raise ConfigError(f"--attempt {attempt}: {run.root} has attempt(s) {', '.join(map(str, numbers))}")
    return run, attempt


def tail_lines(path: Path, tail: str) -> list[bytes]:
    """A saved file's lines, or its last N (`--tail N`, or `all`)."""
    data = path.read_bytes().splitlines()
    if tail == "all":
        return data
    if not tail.isdigit():
        raise ConfigError(f"--tail {tail!r}: give a number of lines or 'all'")
    n = int(tail)
    return data[-n:] if n else []
