"""The job after `up`: `down`, `status`, `logs` (live, or a finished run's saved files), `exec`; and `ps`, every
dockerlaunch job on the hosts (found by the `dockerlaunch.job` label, as the others find one job's)."""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import BinaryIO

from dockerlaunch.backends.docker.dockerhost import ContainerState, DockerHost, parse_inspect
from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.backends.docker.runs import latest_run, saved_attempt, saved_jobs, tail_lines
from dockerlaunch.backends.docker.secret_env import remove_stale_env_files
from dockerlaunch.backends.docker.session import Session, existing_job_containers, open_session, own_containers
from dockerlaunch.errors import ConfigError, DockerError, DockerlaunchError
from dockerlaunch.hosts.fleet import Fleet, Host, each
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import LABEL_JOB
from dockerlaunch.job.recovery import AttemptRecord
from dockerlaunch.reporting import Reporter

# every container with the job label, as `docker inspect` JSON (exit 4: inspect failed for another reason than a
# container removed between `ps` and `inspect`)
ALL_JOBS_SCRIPT = (f"ids=$(docker ps -aq --filter label={shlex.quote(LABEL_JOB)}) || exit 1\n"
                   '[ -z "$ids" ] && exit 0\ndocker inspect $ids && exit 0\nexit 4')


def parse_all_jobs(text: str) -> list[ContainerState]:
    """`docker inspect` JSON -> the containers of dockerlaunch jobs (those with the job label) (pure)."""
    return [c for c in parse_inspect(text) if c.job is not None]


def _when(iso: str) -> datetime | None:
    """Docker's `2026-11-26T15:41:14.123456789Z` (nanoseconds, or an offset) as an aware datetime."""
    if len(iso) < 19 or iso.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(iso[:19]).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclass
class JobRow:
    """One job on the hosts: its containers, (host, container) in rank order."""

    name: str
    containers: list[tuple[str, ContainerState]] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return [h for h, _ in self.containers]

    @property
    def image(self) -> str:
        return ", ".join(dict.fromkeys(c.image for _, c in self.containers))

    @property
    def created(self) -> str:
        return min((c.created for _, c in self.containers), default="")

    def age(self, now: datetime) -> float | None:
        when = _when(self.created)
        return (now - when).total_seconds() if when else None

    @property
    def running(self) -> bool:
        return any(c.status in ("running", "restarting", "paused") for _, c in self.containers)

    def to_dict(self, now: datetime) -> dict:
        age = self.age(now)
        return {"name": self.name, "image": self.image, "created": self.created,
                "age_seconds": None if age is None else round(age),
                "hosts": [{"host": h, "rank": c.rank, "container": c.name, "state": c.status,
                           "exit_code": None if c.status == "running" else c.exit_code, "started_at": c.started_at,
                           "finished_at": c.finished_at} for h, c in self.containers]}


def group_jobs(hosts: list[str], found: list[list[ContainerState]]) -> list[JobRow]:
    """Per job, each container once (hosts that share an engine each see all of its containers: one goes to the
    host its label names, or, when no host of this config does, to the first that saw it), by job name."""
    rows: dict[str, JobRow] = {}
    for host, c in own_containers(hosts, found):
        rows.setdefault(c.job, JobRow(c.job)).containers.append((host, c))
    return [rows[k] for k in sorted(rows)]


def _list_host(h: Host) -> list[ContainerState]:
    r = h.connection().run(ALL_JOBS_SCRIPT, timeout=60)
    vanished = r.exit_status == 4 and r.stderr.strip() and all(
        "No such object" in line or "No such container" in line for line in r.stderr.strip().splitlines())
    if r.exit_status != 0 and not vanished:
        raise DockerError(h.name, r.last_line(), step="listing dockerlaunch containers", exit_status=r.exit_status)
    return parse_all_jobs(r.stdout)


@dataclass
class JobListing:
    """What `ps` found: the jobs on the hosts that answered, and why the others did not."""

    jobs: list[JobRow]
    failed: list[tuple[str, str]]  # (host, why)
    hosts: int
    saved: dict[str, str] = field(default_factory=dict)  # finished jobs' saved runs: {job: YYYYmmdd-HHMMSS}


def list_on(fleet: Fleet) -> tuple[list[JobRow], list[tuple[str, str]]]:
    """Every dockerlaunch job on the fleet's connected hosts; (host, why) of each that could not say."""
    failed = [(h.address, str(h.error.reason if hasattr(h.error, "reason") else h.error))
              for h in fleet.hosts if not h.connected]
    live = fleet.live
    outcomes = fleet.each(_list_host, live)
    failed += [(o.item.address, o.error.reason if hasattr(o.error, "reason") else str(o.error))
               for o in outcomes.failed]
    ok = [(o.item.name, o.value or []) for o in outcomes if o.ok]
    return group_jobs([h for h, _ in ok], [v for _, v in ok]), failed


def list_jobs(config: ClusterConfig, log_dir: str = "dockerlaunch-logs") -> JobListing:
    """`ps`: every job on the config's hosts (a host that does not answer is reported, not fatal)."""
    fleet = Fleet.connect(config, require_all=False)
    try:
        jobs, failed = list_on(fleet)
    finally:
        fleet.close()
    return JobListing(jobs, failed, len(config.hosts), saved_jobs(log_dir))


def jobs_line(jobs: list[JobRow] | None, saved: dict[str, str], log_dir: str, skip: str = "") -> str:
    """`jobs on the hosts: a (2 running), b (2 exited); saved logs under DIR/: c` -- for one-line messages
    (`jobs` None: the hosts were not asked)."""
    def counts(row: JobRow) -> str:
        by: dict[str, int] = {}
        for _, c in row.containers:
            by[c.state] = by.get(c.state, 0) + 1
        return ", ".join(f"{n} {s}" for s, n in by.items())

    on = [f"{j.name} ({counts(j)})" for j in jobs or [] if j.name != skip]
    kept = [n for n in saved if n != skip and n not in {j.name for j in jobs or []}]
    out = [f"jobs on the hosts: {', '.join(on)}" if on else "no dockerlaunch job on the hosts"] if jobs is not None \
        else []
    if kept or jobs is None:
        out.append(f"finished, logs kept under {log_dir}/: {', '.join(kept) or 'none'}")
    return "; ".join(out)


def missing_job(config: ClusterConfig, on_hosts: Session | list[JobRow] | None, log_dir: str,
                what: str = "", then: str = "") -> DockerlaunchError:
    """The error for a job with no containers on the hosts, in one line: a finished job whose logs are kept is
    known (said so), any other name is unknown; either way, the jobs there are instead. `on_hosts`: the jobs on the
    hosts, or a session to ask for them (None: the hosts were not asked)."""
    job = config.job.name
    jobs = list_on(on_hosts.fleet)[0] if isinstance(on_hosts, Session) else on_hosts
    saved = saved_jobs(log_dir)
    where = f"no containers on {len(config.hosts)} host(s)" if on_hosts is not None else "not asked of the hosts"
    if job in saved:
        head = f"job {job}: {where} (it ended; its logs are kept under {log_dir}/: `logs` shows them)"
    elif on_hosts is None:
        head = f"no saved logs of job {job} under {log_dir}/"
    else:
        head = f"no job named {job}: {where} and no saved logs under {log_dir}/"
    return DockerlaunchError(f"{what}{head}; {jobs_line(jobs, saved, log_dir, skip=job)}{then}")


def down(config: ClusterConfig, reporter: Reporter | None = None, ignore_missing: bool = False,
         log_dir: str = "dockerlaunch-logs") -> int:
    """Remove the job's containers everywhere. A job with none: an error naming the jobs there are, unless
    `ignore_missing` (as `kubectl delete --ignore-not-found`)."""
    reporter = reporter or Reporter()
    session = open_session(config)
    try:
        found = existing_job_containers(session, session.plan.job)
        if not found:
            remove_stale_env_files(session, session.plan.job)
            if ignore_missing:
                reporter.say(f"job {session.plan.job}: no containers on {session.plan.nnodes} host(s); nothing to "
                             "remove")
                return 0
            raise missing_job(config, session, log_dir, then=" (nothing removed; with --ignore-missing that exits 0)")
        by_host: dict[str, list[str]] = {}
        for host, s in found:
            by_host.setdefault(host, []).append(s.name)
        for o in session.fleet.each(lambda h: DockerHost.on(h).remove(by_host.get(h.name, []))).failed:
            raise DockerlaunchError(f"host {o.item.name}: removing containers failed: {o.error}")
        remove_stale_env_files(session, session.plan.job)
        reporter.say(f"removed {len(found)} container(s) of job {session.plan.job}")
        return 0
    finally:
        session.close()


def status(config: ClusterConfig) -> list[tuple[str, ContainerState]]:
    """(host, container state) of every container of the job, rank order."""
    return status_and_others(config)[0]


def status_and_others(config: ClusterConfig) -> tuple[list[tuple[str, ContainerState]], list[JobRow]]:
    """The job's containers (as `status`) and, when it has none, every job there is on the hosts instead."""
    session = open_session(config)
    try:
        found = existing_job_containers(session, session.plan.job)
        return found, [] if found else list_on(session.fleet)[0]
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
        names = {s.name for _, s in existing_job_containers(session, session.plan.job)}
        if not any(session.plan.hosts[i].container.name in names for i in ranks):
            if not names and latest_run(log_dir, session.plan.job) is None:
                raise missing_job(config, session, log_dir)
            session.close()
            return saved_logs(config, rank, tail, reporter, None, log_dir)

        def show(i: int) -> int:
            hp = session.plan.hosts[i]
            sink = LogSink(reporter, hp.rank, hp.address, None)
            sinks.append(sink)
            docker = DockerHost.on(session.fleet.hosts[i])
            return docker.follow_logs(hp.container.name, sink, follow=follow, stop=stop, tail=tail)

        results = each(show, ranks)  # Ctrl-C and SIGTERM go on to the CLI's one line (cli/main.py), as elsewhere
        return 1 if any(not o.ok or o.value != 0 for o in results) else 0
    finally:
        stop.set()
        for s in sinks:
            s.close()
        session.close()


def saved_logs(config: ClusterConfig, rank: int | None, tail: str, reporter: Reporter, attempt: int | None,
               log_dir: str) -> int:
    """One attempt's saved per-rank files (default: the latest run's last attempt), rank by rank. An attempt that
    left no rank file (a start or the pre-flight failed) is said with its cause, as attempts.jsonl recorded it."""
    job = config.job.name
    run = latest_run(log_dir, job)
    if run is None:
        raise missing_job(config, None, log_dir, "--attempt: " if attempt is not None else "")
    records = {r.attempt: r for r in run.attempts()}
    numbers = run.attempt_numbers()
    if (attempt is None and records) or (attempt in records and attempt not in numbers):
        n = attempt if attempt is not None else max([*numbers, *records])  # a refused attempt has no folder
    else:
        run, n = saved_attempt(log_dir, job, attempt)
    files = [(r, host, path) for r, host, path in run.rank_files(n) if rank is None or r == rank]
    if not files:
        rec = records.get(n)
        if rec is not None:
            said = rec.line().removeprefix(f"attempt {n}: ")
            reporter.say(f"job {job}: attempt {n} logged nothing ({run.root}/): {said}", "bold red")
            return 0
        raise ConfigError(f"{run.root}/attempt-{n}: no log file" + (f" of rank {rank}" if rank is not None else ""))
    reporter.say(f"job {job}: saved logs of attempt {n} ({run.root}/attempt-{n}/)")
    for r, host, path in files:
        for line in tail_lines(path, tail):
            reporter.line(r, host, line.decode(errors="replace").rstrip("\r"))
    return 0


def attempts(config: ClusterConfig, log_dir: str = "dockerlaunch-logs") -> tuple[str | None, list[AttemptRecord]]:
    """The latest run's folder and its attempts, as `up` recorded them (none: no run saved under log_dir)."""
    run = latest_run(log_dir, config.job.name)
    return (str(run.root), run.attempts()) if run else (None, [])


def not_running(config: ClusterConfig, rank: int, mine: ContainerState, address: str,
                found: list[tuple[str, ContainerState]]) -> DockerlaunchError:
    """`exec` into a rank whose container is not running: the job's state and what to run, in one line. (pure)"""
    when = (mine.finished_at or "")[:19].replace("T", " ")
    said = f"exited with code {mine.exit_code}" + (f" at {when}" if when and not when.startswith("0001") else "") \
        if mine.status in ("exited", "dead") else f"is {mine.status}"
    ranks = ", ".join(f"rank {s.rank} {s.state}" for _, s in found)
    running = [s for _, s in found if s.status == "running"]
    job = config.job.name
    after = (f"; exec into a running rank ({', '.join(str(s.rank) for s in running)}), or see what rank {rank} "
             "printed" if running else f"; nothing of job {job} runs (`down` removes its containers): see what "
             f"rank {rank} printed") + ", " + config.invocation.fix("logs", "--rank", str(rank))
    return DockerlaunchError(f"exec: rank {rank} of job {job} {said}: its container {mine.name} on {address} runs "
                             f"nothing to exec into (the job: {ranks}){after}")


def exec_in(config: ClusterConfig, rank: int, command: list[str], out: BinaryIO, err: BinaryIO,
            log_dir: str = "dockerlaunch-logs") -> int:
    """`docker exec` in one rank's container; its output goes to `out`/`err` as it comes (the CLI's stdout)."""
    if not command:
        raise ConfigError("exec: give a command after --, e.g. dockerlaunch exec --rank 0 -- nvidia-smi")
    session = open_session(config)
    try:
        [i] = _rank_hosts(session, rank)
        name = session.plan.hosts[i].container.name
        found = existing_job_containers(session, session.plan.job)
        if not found:
            raise missing_job(config, session, log_dir, "exec: ")
        if name not in {s.name for _, s in found}:
            raise DockerlaunchError(f"exec: rank {rank} of job {session.plan.job} has no container {name} on "
                                    f"{session.plan.hosts[i].address} (the job has: "
                                    f"{', '.join(f'{s.name}@{h} {s.status}' for h, s in found)})")
        [mine] = [s for _, s in found if s.name == name]
        if mine.status != "running":  # docker's own words: `Container 4f0c... is not running`
            raise not_running(config, rank, mine, session.plan.hosts[i].address, found)

        def w(stream):
            def write(data: bytes):
                stream.write(data)
                stream.flush()
            return write

        return DockerHost.on(session.fleet.hosts[i]).remote.stream(["docker", "exec", name, *command], w(out),
                                                                    w(err))
    finally:
        session.close()
