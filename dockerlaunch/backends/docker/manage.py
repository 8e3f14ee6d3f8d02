"""The job after `up`: `down`, `status`, `logs` (live, or a finished run's saved files), `exec`."""

from __future__ import annotations

import threading
from typing import BinaryIO

from dockerlaunch.backends.docker.dockerhost import ContainerState, DockerHost
from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.backends.docker.runs import latest_run, saved_attempt, tail_lines
from dockerlaunch.backends.docker.secret_env import remove_stale_env_files
from dockerlaunch.backends.docker.session import Session, existing_job_containers, open_session
from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.hosts.fleet import each
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.recovery import AttemptRecord
from dockerlaunch.reporting import Reporter


def down(config: ClusterConfig, reporter: Reporter | None = None) -> int:
    reporter = reporter or Reporter()
    session = open_session(config)
    try:
        found = existing_job_containers(session, config.job.name)
        by_host: dict[str, list[str]] = {}
        for host, s in found:
            by_host.setdefault(host, []).append(s.name)
        for o in session.fleet.each(lambda h: DockerHost.on(h).remove(by_host.get(h.name, []))).failed:
            raise DockerlaunchError(f"host {o.item.name}: removing containers failed: {o.error}")
        remove_stale_env_files(session, config.job.name)
        reporter.say(f"removed {len(found)} container(s) of job {config.job.name}")
        return 0
    finally:
        session.close()


def status(config: ClusterConfig) -> list[tuple[str, ContainerState]]:
    """(host, container state) of every container of the job, rank order."""
    session = open_session(config)
    try:
        return existing_job_containers(session, config.job.name)
    finally:
        session.close()


def _rank_hosts(session: Session, rank: int | None) -> list[int]:
    n = len(session.fleet.hosts)
    if rank is None:
        return list(range(n))
    if not 0 <= rank < n:
        raise ConfigError(f"--rank {rank}: the job has ranks 0..{n - 1}")
    return [rank]


def logs(config: ClusterConfig, rank: int | None = None, follow: bool = False, tail: str = "all",
         reporter: Reporter | None = None, attempt: int | None = None,
         log_dir: str = "dockerlaunch-logs") -> int:
    """The job's logs from its containers; once they are gone (a finished job), or for `--attempt N`, from the
    per-rank files `up` saved under `log_dir`."""
    reporter = reporter or Reporter()
    if attempt is not None:
        return saved_logs(config, rank, tail, reporter, attempt, log_dir)
    session = open_session(config)
    sinks = []
    stop = threading.Event()
    try:
        ranks = _rank_hosts(session, rank)
        names = {s.name for _, s in existing_job_containers(session, config.job.name)}
        if not any(session.plan.hosts[i].container.name in names for i in ranks):
            session.close()
            return saved_logs(config, rank, tail, reporter, None, log_dir)

        def show(i: int) -> int:
            hp = session.plan.hosts[i]
            sink = LogSink(reporter, hp.rank, hp.address, None)
            sinks.append(sink)
            docker = DockerHost.on(session.fleet.hosts[i])
            return docker.follow_logs(hp.container.name, sink, follow=follow, stop=stop, tail=tail)

        try:
            results = each(show, ranks)
        except KeyboardInterrupt:
            stop.set()
            return 130
        return 1 if any(not o.ok or o.value != 0 for o in results) else 0
    finally:
        stop.set()
        for s in sinks:
            s.close()
        session.close()


def saved_logs(config: ClusterConfig, rank: int | None, tail: str, reporter: Reporter, attempt: int | None,
               log_dir: str) -> int:
    """One attempt's saved per-rank files (default: the latest run's last attempt), rank by rank."""
    run, n = saved_attempt(log_dir, config.job.name, attempt)
    files = [(r, host, path) for r, host, path in run.rank_files(n) if rank is None or r == rank]
    if not files:
        raise ConfigError(f"{run.root}/attempt-{n}: no log file" + (f" of rank {rank}" if rank is not None else ""))
    reporter.say(f"job {config.job.name}: saved logs of attempt {n} ({run.root}/attempt-{n}/)")
    for r, host, path in files:
        for line in tail_lines(path, tail):
            reporter.line(r, host, line.decode(errors="replace").rstrip("\r"))
    return 0


def attempts(config: ClusterConfig, log_dir: str = "dockerlaunch-logs") -> tuple[str | None, list[AttemptRecord]]:
    """The latest run's folder and its attempts, as `up` recorded them (none: no run saved under log_dir)."""
    run = latest_run(log_dir, config.job.name)
    return (str(run.root), run.attempts()) if run else (None, [])


def exec_in(config: ClusterConfig, rank: int, command: list[str], out: BinaryIO, err: BinaryIO) -> int:
    """`docker exec` in one rank's container; its output goes to `out`/`err` as it comes (the CLI's stdout)."""
    if not command:
        raise ConfigError("exec: give a command after --, e.g. dockerlaunch exec --rank 0 -- nvidia-smi")
    session = open_session(config)
    try:
        [i] = _rank_hosts(session, rank)
        name = session.plan.hosts[i].container.name

        def w(stream):
            def write(data: bytes):
                stream.write(data)
                stream.flush()
            return write

        return DockerHost.on(session.fleet.hosts[i]).remote.stream(["docker", "exec", name, *command], w(out),
                                                                    w(err))
    finally:
        session.close()
