"""Secret env files (container.env_files) on the hosts: read here, written on a host only for the length of its
`docker run` (a folder of its own, made by the command that writes it), and stale ones from killed launchers removed."""

from __future__ import annotations

import secrets
from pathlib import Path

from dockerlaunch.backends.docker.session import Session
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig


def read_env_files(config: ClusterConfig) -> bytes:
    data = b""
    for path in config.container.env_files:
        p = Path(path).expanduser()
        try:
            content = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"container.env_files: cannot read {p}: {e.strerror}") from None
        data += content if content.endswith(b"\n") or not content else content + b"\n"
    return data


def env_file_glob(job: str) -> str:
    return f"dockerlaunch-{job}-*.env.d"  # job names are [A-Za-z0-9_.-]: no shell metacharacters


def stale_env_files_argv(job: str) -> list[str]:
    """Removes secret folders an earlier run left behind (its launcher was killed before it could): only this
    login's own (another user's name-alike in /tmp is not ours, even for root), never following a link."""
    return ["sh", "-c", 'find /tmp -maxdepth 1 -name "$1" -type d -user "$(id -u)" -exec rm -rf {} +; exit 0', "sh",
            env_file_glob(job)]


def remove_stale_env_files(session: Session, job: str) -> None:
    session.fleet.each(lambda h: h.remote.run(stale_env_files_argv(job), timeout=30))


def env_file_paths(session: Session, job: str) -> dict[int, tuple[str, ...]]:
    """Where each host's secret file goes (in a folder of its own, made by the same command that writes it);
    known before the start, so an interrupted start is cleaned up."""
    token = secrets.token_hex(8)
    return {hp.rank: (f"/tmp/dockerlaunch-{job}-{hp.rank}-{token}.env.d/env",) for hp in session.plan.hosts}


def remove_env_files(session: Session, paths: dict[int, tuple[str, ...]]) -> None:
    def rm(h):
        if paths.get(h.rank):
            h.remote.run(["rm", "-rf", *(p.rsplit("/", 1)[0] for p in paths[h.rank])], timeout=30)

    session.fleet.each(rm)
