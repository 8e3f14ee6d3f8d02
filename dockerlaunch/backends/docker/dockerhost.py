"""Docker on a remote host, through its SSH runner (Ray's DockerCommandRunner on SSHCommandRunner).

Everything goes through the docker CLI on the host, argv quoted by `Remote`; job containers are
found by label, so the launcher keeps no state of its own (like torchx's docker scheduler).
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass

from dockerlaunch.backends.docker import script
from dockerlaunch.container import ContainerSpec
from dockerlaunch.docker_run import run_argv
from dockerlaunch.errors import DockerError
from dockerlaunch.hosts.fleet import Host
from dockerlaunch.hosts.ssh import Remote, Result
from dockerlaunch.job.plan import LABEL_HOST, LABEL_JOB, LABEL_RANK, LABEL_RUN


@dataclass(frozen=True)
class ContainerState:
    """One container as `docker inspect` describes it: one job's (`up`, `status`, `down`) or any job's (`ps`)."""

    name: str
    rank: int | None
    status: str  # created | running | exited | ...
    exit_code: int
    started_at: str
    finished_at: str
    id: str = ""
    host: str | None = None  # LABEL_HOST: the host that started it
    job: str | None = None  # LABEL_JOB: None on a container without it
    image: str = ""  # the reference it was started from
    created: str = ""  # ISO time, the host's clock
    run: str | None = None  # LABEL_RUN: the launch it belongs to (a supervised run's records: <job folder>/runs/<run>)

    @property
    def state(self) -> str:
        """`running`, `exited 3`, `created`, ..."""
        return f"{self.status} {self.exit_code}" if self.status in ("exited", "dead") else self.status

    def to_dict(self) -> dict:
        """`status --output json`'s keys (the label facts and the id stay out)."""
        return {"name": self.name, "rank": self.rank, "status": self.status, "exit_code": self.exit_code,
                "started_at": self.started_at, "finished_at": self.finished_at}


def parse_inspect(text: str) -> list[ContainerState]:
    """`docker inspect` JSON -> states in rank order (pure; tested on fixture output): the one parser of it."""
    text = text.strip()
    if not text:
        return []
    out = []
    for c in json.loads(text):
        state = c.get("State") or {}
        config = c.get("Config") or {}
        labels = config.get("Labels") or {}
        rank = labels.get(LABEL_RANK)
        out.append(
            ContainerState(
                name=c.get("Name", "").lstrip("/"),
                rank=int(rank) if rank is not None and rank.isdigit() else None,
                status=state.get("Status", "unknown"),
                exit_code=int(state.get("ExitCode") or 0),
                started_at=state.get("StartedAt", ""),
                finished_at=state.get("FinishedAt", ""),
                id=c.get("Id", ""),
                host=labels.get(LABEL_HOST),
                job=labels.get(LABEL_JOB),
                image=config.get("Image") or c.get("Image", ""),
                created=c.get("Created", ""),
                run=labels.get(LABEL_RUN),
            )
        )
    return sorted(out, key=lambda s: (s.rank is None, s.rank, s.name))


LEFTOVERS = 3  # listing_script's exit status when the job has containers on the engine


def listing_script(job: str) -> str:
    """The job's containers on the engine, as `docker inspect` JSON; exits LEFTOVERS when there are any (a step of
    `up`'s first round trip that then stops, so nothing is prepared beside a running job)."""
    label = shlex.quote(f"{LABEL_JOB}={job}")
    return (f"ids=$(docker ps -aq --filter label={label}) || exit 1\n"
            f'[ -z "$ids" ] && exit 0\ndocker inspect $ids && exit {LEFTOVERS}\nexit 4')


def parse_listing(host: str, job: str, r: Result) -> list[ContainerState]:
    # a container removed between `ps` and `inspect` (a watchdog, `--rm`) is simply gone: inspect still prints
    # the others and exits 1
    vanished = r.exit_status == 4 and r.stderr.strip() and all(
        "No such object" in line or "No such container" in line for line in r.stderr.strip().splitlines())
    if r.exit_status not in (0, LEFTOVERS) and not vanished:
        raise DockerError(host, r.last_line(), step=f"listing containers of job {job}", exit_status=r.exit_status)
    return parse_inspect(r.stdout)


# stdin -> $1, a file in its own new folder (mkdir: fails if anything, a planted FIFO, link or folder, is at that
# name; 0700, so nothing can be put beside the file or opened in its place), then the command, then the folder is
# removed, also when the command is cut off. `set -C` alone still opens a FIFO planted at the file's name.
WITH_ENV_FILE = ("p=$1; d=${p%/*}; shift\n"
                 "(umask 077 && mkdir \"$d\") || exit 125\n"
                 "trap 'rm -rf \"$d\"' EXIT; trap 'exit 129' HUP INT TERM\n"
                 '(umask 077 && set -C && cat >"$p") || exit 125\n"$@"')


def with_env_file(path: str, argv: list[str]) -> list[str]:
    return ["sh", "-c", WITH_ENV_FILE, "sh", path, *argv]


class DockerHost:
    """The docker CLI on one host (Ray's DockerCommandRunner over its SSH runner)."""

    def __init__(self, remote: Remote):
        self.remote = remote

    @classmethod
    def on(cls, host: Host) -> DockerHost:
        return cls(host.connection())

    @property
    def name(self) -> str:
        return self.remote.name

    def docker(self, *args: str, timeout: float | None = 120.0, stdin=None) -> Result:
        return self.remote.run(["docker", *args], timeout=timeout, stdin=stdin)

    def image_id(self, image: str) -> str | None:
        r = self.docker("image", "inspect", "--format", "{{.Id}}", image, timeout=30)
        return r.stdout.strip() if r.ok else None

    def job_containers(self, job: str) -> list[ContainerState]:
        return parse_listing(self.name, job, self.remote.run(listing_script(job), timeout=60))

    def run_container(self, spec: ContainerSpec, env_file: tuple[str, bytes] | None = None,
                      gang_secret: str | None = None) -> str:
        """`docker run -d`; `env_file` (path, secret lines) is written for `--env-file` by the same command and
        removed when `docker run` returns (one round trip; the secrets never sit on the host between steps).
        `gang_secret`: a supervised job's (spec.supervisor), handed to the container in the same round trip
        (scripts/start.sh); the answer then ends with its `gang=...` line."""
        argv, stdin = run_argv(spec), None
        if gang_secret is not None:
            stdin = gang_secret.encode() + b"\n" + (env_file[1] if env_file else b"")
            argv = ["sh", "-c", script("start.sh"), "start.sh", env_file[0] if env_file else "-", spec.name, "1",
                    *argv]
        elif env_file:
            argv, stdin = with_env_file(env_file[0], argv), env_file[1]
        r = self.remote.run(argv, timeout=300, stdin=stdin)
        if not r.ok:
            raise DockerError(self.name, r.last_line(), step=f"starting container {spec.name}",
                              exit_status=r.exit_status)
        return r.stdout.strip()

    def remove(self, names: list[str], grace: int = 3) -> None:
        """Stop (SIGTERM, then SIGKILL after `grace` s) and remove; missing containers are fine."""
        if not names:
            return
        quoted = " ".join(shlex.quote(n) for n in names)
        self.remote.run(
            f"docker stop -t {int(grace)} {quoted} >/dev/null 2>&1; docker rm -f {quoted} >/dev/null 2>&1; true",
            timeout=grace + 60,
        )

    def wait(self, name: str, timeout: float | None = None) -> int:
        r = self.docker("wait", name, timeout=timeout)
        if not r.ok:
            raise DockerError(self.name, r.last_line(), step=f"waiting for {name}", exit_status=r.exit_status)
        return int(r.stdout.strip().splitlines()[-1])

    def follow_logs(
        self, name: str, on_data: Callable[[bytes], None], follow: bool = True, stop: threading.Event | None = None,
        tail: str = "all",
    ) -> int:
        args = ["docker", "logs", "--tail", tail] + (["--follow"] if follow else []) + [name]
        if not follow or tail != "all":
            return self.remote.stream(args, on_data, on_data, stop=stop)
        got = [0, 0]  # bytes of stdout, of stderr

        def out(data: bytes) -> None:
            got[0] += len(data)
            on_data(data)

        def err(data: bytes) -> None:
            got[1] += len(data)
            on_data(data)

        status = self.remote.stream(args, out, err, stop=stop)
        if status != 0 or (stop is not None and stop.is_set()):
            return status
        # Docker 20.10's `logs --follow` can end when the container stops before it has read the end of the log
        # (seen: 9514 of 20000 lines, exit status 0, with several containers of an engine ending at once). The
        # stopped container's full log is complete: what follow missed is what lies past the bytes it gave.
        catch_up = ('docker logs "$1" 2>/dev/null | tail -c "+$2"; '
                    'docker logs "$1" 2>&1 >/dev/null | tail -c "+$3" >&2')
        return self.remote.stream(["sh", "-c", catch_up, "sh", name, str(got[0] + 1), str(got[1] + 1)],
                                  on_data, on_data, stop=stop)
