"""The job after `up`: `down`, `status`, `logs` (live, or a finished run's saved files), `exec`; and `ps`, every
dockerlaunch job on the hosts (found by the `dockerlaunch.job` label, as the others find one job's).

A job started with `up --detach` runs under the gang supervisor, which keeps the run's records on every host
(gang_records): `status`, `ps` and `logs` read how it ended from there (every container exits with the job's code,
so container codes alone would blame every rank), and answer from the hosts that answer when one is down."""

from __future__ import annotations

import re
import shlex
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import BinaryIO

from dockerlaunch.backends.docker.dockerhost import ContainerState, DockerHost, parse_inspect
from dockerlaunch.backends.docker.gang_records import (
    RUN_ID,
    GangResult,
    GangRun,
    attempt_logs,
    read_gang,
    read_runs,
)
from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.backends.docker.runs import RunFolder, latest_run, saved_attempt, saved_jobs, tail_lines
from dockerlaunch.backends.docker.secret_env import remove_stale_env_files
from dockerlaunch.backends.docker.session import Session, existing_job_containers, open_session, own_containers
from dockerlaunch.errors import ConfigError, DockerError, DockerlaunchError
from dockerlaunch.hosts.fleet import Fleet, Host, each
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import GANG_RUNS, LABEL_JOB, diag_root, plan_job, with_login
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
    gang: GangRun | None = None  # a supervised job's records (None: started attached, or not read)

    @property
    def result(self) -> GangResult | None:
        return self.gang.result if self.gang is not None else None

    @property
    def failed(self) -> bool:
        """The gang says the job ended failed (container codes are not asked: each is the job's code)."""
        return self.result is not None and self.result.failed

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
        """`result` only for a job under the gang supervisor (null while it runs); a job started attached keeps
        the keys it always had."""
        age = self.age(now)
        out = {"name": self.name, "image": self.image, "created": self.created,
               "age_seconds": None if age is None else round(age),
               "hosts": [{"host": h, "rank": c.rank, "container": c.name, "state": c.status,
                          "exit_code": None if c.status == "running" else c.exit_code, "started_at": c.started_at,
                          "finished_at": c.finished_at} for h, c in self.containers]}
        if self.gang is not None:
            out["result"] = self.result.to_dict() if self.result else None
        return out


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
    """`ps`: every job on the config's hosts (a host that does not answer is reported, not fatal), each supervised
    one with how it ended (its hosts' records)."""
    fleet = Fleet.connect(config, require_all=False)
    try:
        jobs, failed = list_on(fleet)
        read_results(fleet, jobs)
    finally:
        fleet.close()
    return JobListing(jobs, failed, len(config.hosts), saved_jobs(log_dir))


_JOB_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")  # job/config.py's: a label that is not one names no folder


def run_label(containers: list[tuple[str, ContainerState]]) -> str | None:
    """The run the containers belong to (their `dockerlaunch.run` label; the newest, should they differ)."""
    return max((c.run for _, c in containers if c.run and RUN_ID.match(c.run)), default=None)


def read_results(fleet: Fleet, jobs: list[JobRow]) -> None:
    """Each supervised job's records (`JobRow.gang`) from the hosts it has containers on: one round trip per host
    for all of its jobs. The job's folder is found as `up` makes it (diagnostics.dir of this config; another
    config's diagnostics.dir is not known here: such a job shows its containers only)."""
    if not fleet.hosts:
        return
    root = diag_root(with_login(fleet.config, fleet.targets[0].user))
    wanted: dict[str, list[tuple[JobRow, str, str]]] = {}
    for j in jobs:
        run = run_label(j.containers)
        if run is None or not _JOB_NAME.match(j.name):
            continue
        for h in dict.fromkeys(j.hosts):
            wanted.setdefault(h, []).append((j, run, f"{root}/{j.name}/{GANG_RUNS}/{run}"))
    got = fleet.each(lambda h: read_runs(h, [f for _, _, f in wanted[h.name]]),
                     [h for h in fleet.live if h.name in wanted])
    seen: dict[str, GangRun] = {}
    for o in got:
        if not o.ok:
            continue  # its containers are listed; how the job ended is told by its other hosts, or not at all
        for (j, run, folder), rec in zip(wanted[o.item.name], o.value or []):
            seen.setdefault(j.name, GangRun(run, folder)).hosts.append((o.item.name, rec))
    for j in jobs:
        g = seen.get(j.name)
        if g is not None and g.supervised:
            order = j.hosts
            g.hosts.sort(key=lambda hr: order.index(hr[0]))
            j.gang = g


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
    """Remove the job's containers on every host that answers. A job with none: an error naming the jobs there are,
    unless `ignore_missing` (as `kubectl delete --ignore-not-found`). A host that does not answer (it died, its
    network is down) keeps the others' containers from nothing: they go, and the host is named in one error with
    the command to run once it answers (its containers, if any, are still there)."""
    reporter = reporter or Reporter()
    session = open_answering(config)
    try:
        job = session.plan.job
        seen = job_on_hosts(session)
        found, unanswered = seen.found, seen.unanswered
        if not found and not unanswered:
            remove_stale_env_files(session, job)
            if ignore_missing:
                reporter.say(f"job {job}: no containers on {session.plan.nnodes} host(s); nothing to remove")
                return 0
            raise missing_job(config, session, log_dir, then=" (nothing removed; with --ignore-missing that exits 0)")
        by_host: dict[str, list[str]] = {}
        for host, s in found:
            by_host.setdefault(host, []).append(s.name)
        failed = session.fleet.each(lambda h: DockerHost.on(h).remove(by_host.get(h.name, [])), seen.answered).failed
        remove_stale_env_files(session, job)
        gone = [(host, s) for host, s in found if host not in {o.item.name for o in failed}]
        if gone:
            on = (f" on {len({host for host, _ in gone})} of {session.plan.nnodes} host(s)" if unanswered or failed
                  else "")
            reporter.say(f"removed {len(gone)} container(s) of job {job}{on}")
        problems = [f"host {o.item.name}: removing containers failed: {o.error}" for o in failed]
        problems += [f"host {host}: did not answer ({why}): its containers of job {job}, if any, are still there"
                     for host, why in unanswered]
        if problems:
            again = config.invocation.fix("down", "--ignore-missing", hint="down.again")
            raise DockerlaunchError(f"{'; '.join(problems)}; {'once it answers, ' if unanswered else ''}{again}")
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


def _why(e: BaseException | None) -> str:
    return str(getattr(e, "reason", None) or e)


def open_answering(config: ClusterConfig) -> Session:
    """A session over the hosts that answer (`status`, `logs`: each host keeps the whole record of a supervised
    run, so the rest tell how it went); the others keep their error (`host.error`). None answering: their errors,
    as a session that needs every host says them."""
    fleet = Fleet.connect(config, require_all=False)
    try:
        if not fleet.live:
            errors = [h.error for h in fleet.hosts if h.error]
            if len(errors) == 1:
                raise errors[0]
            raise DockerlaunchError("; ".join(str(e) for e in errors))
        return Session(fleet, plan_job(config, fleet.targets, require_image=False))
    except BaseException:
        fleet.close()
        raise


@dataclass
class OnHosts:
    """What the hosts that answered said of one job: its containers (host, state), rank order."""

    found: list[tuple[str, ContainerState]]
    answered: list[Host]
    unanswered: list[tuple[str, str]]  # (host, why), rank order


def job_on_hosts(session: Session) -> OnHosts:
    job = session.plan.job
    outcomes = session.fleet.each(lambda h: DockerHost.on(h).job_containers(job))
    ok = [o for o in outcomes if o.ok]
    why = {h.name: _why(h.error) for h in session.fleet.hosts if not h.connected}
    why.update({o.item.name: _why(o.error) for o in outcomes.failed})
    return OnHosts(own_containers([o.item.name for o in ok], [o.value or [] for o in ok]), [o.item for o in ok],
                   [(h.name, why[h.name]) for h in session.fleet.hosts if h.name in why])


def _stamp(run: RunFolder, job: str) -> str:
    """A saved run's start, `YYYYmmdd-HHMMSS` (DIR/<job>-<time>): comparable with a run id's first 15 characters."""
    return run.root.name[len(job) + 1:][:15]


def gang_of(session: Session, on: OnHosts, log_dir: str) -> GangRun | None:
    """The job's supervised run, read from the hosts that answered: the one its containers belong to, or, with no
    containers, the newest run folder on the hosts unless a run `up` saved under `log_dir` is newer (an attached
    run since). None: the job's latest run was not supervised (attached: `up` saved it locally)."""
    if not on.answered:
        return None
    job = session.plan.job
    gang = read_gang(on.answered, f"{session.plan.job_dir}/{GANG_RUNS}", run_label(on.found))
    if gang is None:
        return None
    if not on.found:
        saved = latest_run(log_dir, job)
        if saved is not None and _stamp(saved, job) > gang.run[:15]:
            return None
    gang.unanswered = on.unanswered + [u for u in gang.unanswered if u[0] not in dict(on.unanswered)]
    return gang


@dataclass
class JobStatus:
    """`status`: the job's containers on the hosts that answered, its supervised run's records (or the run `up`
    saved), and the hosts that did not answer."""

    job: str
    hosts: list[str]  # the config's, rank order
    found: list[tuple[str, ContainerState]]
    unanswered: list[tuple[str, str]]
    gang: GangRun | None = None
    others: list[JobRow] = field(default_factory=list)  # every job there is, when this one has no container

    @property
    def result(self) -> GangResult | None:
        return self.gang.result if self.gang is not None else None

    @property
    def code(self) -> int:
        """The job's code when it ended failed (the gang's result); else 1 when a host did not answer; else 0."""
        if self.result is not None and self.result.failed:
            return self.result.code
        return 1 if self.unanswered else 0


def job_status(config: ClusterConfig, log_dir: str = "dockerlaunch-logs") -> JobStatus:
    session = open_answering(config)
    try:
        on = job_on_hosts(session)
        gang = gang_of(session, on, log_dir)
        others = [] if on.found else list_on(session.fleet)[0]
        return JobStatus(session.plan.job, [h.address for h in session.plan.hosts], on.found,
                         gang.unanswered if gang is not None else on.unanswered, gang, others)
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
    per-rank files the gang kept on the hosts (a detached run) or `up` saved under `log_dir` (an attached one),
    whichever run is the newer.

    A supervised job that ended: its result line last; with `follow`, the exit code is then the job's. Else 1 when
    a stream failed or a host of the asked ranks did not answer (the others are shown), 0 otherwise."""
    reporter = reporter or Reporter()
    try:
        session = open_answering(config)
    except DockerlaunchError:
        if attempt is not None and latest_run(log_dir, config.job.name) is not None:
            return saved_logs(config, rank, tail, reporter, attempt, log_dir)  # as before: no host is needed
        raise
    sinks = []
    stop = threading.Event()
    try:
        ranks = _rank_hosts(session, rank)
        on = job_on_hosts(session)
        down = dict(on.unanswered)
        names = {s.name for _, s in on.found}
        live = [i for i in ranks if session.plan.hosts[i].container.name in names]
        if attempt is None and live:
            missed = _say_down(session, ranks, down, reporter, "its logs are not shown")

            def show(i: int) -> int:
                hp = session.plan.hosts[i]
                sink = LogSink(reporter, hp.rank, hp.address, None)
                sinks.append(sink)
                docker = DockerHost.on(session.fleet.hosts[i])
                return docker.follow_logs(hp.container.name, sink, follow=follow, stop=stop, tail=tail)

            results = each(show, live)  # Ctrl-C and SIGTERM go on to the CLI's one line (cli/main.py), as elsewhere
            for s in sinks:
                s.close()
            code = 1 if missed or any(not o.ok or o.value != 0 for o in results) else 0
            gang = gang_of(session, on, log_dir)  # after the streams: how the job ended, if it did
            return _ended(session.plan.job, gang, follow, code, reporter)
        gang = gang_of(session, on, log_dir)
        if gang is not None:
            return gang_logs(session, gang, ranks, tail, reporter, attempt, follow)
        if latest_run(log_dir, session.plan.job) is None:
            said = "; ".join(f"host {h} did not answer: {why}" for h, why in on.unanswered)
            if attempt is None and not names:
                raise missing_job(config, session, log_dir, then=f"; {said}" if said else "")
            if said and any(session.plan.hosts[i].address in down for i in ranks):
                raise DockerlaunchError(f"job {session.plan.job}: {said}")
        session.close()
        return saved_logs(config, rank, tail, reporter, attempt, log_dir)
    finally:
        stop.set()
        for s in sinks:
            s.close()
        session.close()


def _say_down(session: Session, ranks: list[int], down: dict[str, str], reporter: Reporter, what: str) -> bool:
    """One line per asked rank whose host did not answer; True when there was one."""
    missed = [i for i in ranks if session.plan.hosts[i].address in down]
    for i in missed:
        addr = session.plan.hosts[i].address
        reporter.say(f"host {addr} (rank {i}) did not answer: {down[addr]}; {what} (the other ranks' are)",
                     "bold red")
    return bool(missed)


def _ended(job: str, gang: GangRun | None, follow: bool, code: int, reporter: Reporter) -> int:
    """The gang's result line, once the job ended; with `follow` the exit code is then the job's."""
    result = gang.result if gang is not None else None
    if result is None:
        return code
    reporter.say(f"job {job} ended: {result.line()}", "bold red" if result.failed else "bold green")
    return result.code if follow else code


def gang_logs(session: Session, gang: GangRun, ranks: list[int], tail: str, reporter: Reporter,
              attempt: int | None, follow: bool = False) -> int:
    """One attempt's per-rank logs as the gang kept them on the hosts (<run folder>/attempt-N/rank<R>-<host>.log:
    each host keeps its own ranks'), default the run's last attempt, rank by rank; then how the job ended."""
    job = session.plan.job
    if tail != "all" and not tail.isdigit():
        raise ConfigError(f"--tail {tail!r}: give a number of lines or 'all'")
    known = sorted({a.attempt for a in gang.attempts} | ({gang.attempt} if gang.attempt is not None else set()))
    n = attempt if attempt is not None else (gang.attempt or 0)
    if attempt is not None and attempt not in known:
        have = ", ".join(map(str, known)) or "none yet"
        raise ConfigError(f"--attempt {attempt}: run {gang.run} of job {job} (kept on the hosts in {gang.folder}/) "
                          f"has attempt(s) {have}")
    answered = {h for h, _ in gang.hosts}
    got = session.fleet.each(lambda h: attempt_logs(h, gang.folder, n, tail),
                             [h for h in session.fleet.live if h.name in answered])
    down = dict(gang.unanswered)
    down.update({o.item.name: _why(o.error) for o in got.failed})
    files: dict[tuple[int, str], bytes] = {}
    for o in got:
        for r, host, data in o.value or []:
            if r in ranks:
                files.setdefault((r, host), data)  # hosts that share a folder (one engine) hold the same files
    absent = [i for i in ranks if not any(r == i for r, _ in files)]
    if files or any(session.plan.hosts[i].address in down for i in absent):
        reporter.say(f"job {job}: logs of attempt {n} of run {gang.run}, kept on the hosts "
                     f"({gang.folder}/attempt-{n}/)")
    missed = _say_down(session, absent, down, reporter, f"its log of attempt {n} is kept there")
    for (r, host), data in sorted(files.items()):
        for line in data.splitlines():
            reporter.line(r, host, line.decode(errors="replace").rstrip("\r"))
    if not files and not missed:
        rec = next((a for a in gang.attempts if a.attempt == n), None)
        said = f": {rec.line().removeprefix(f'attempt {n}: ')}" if rec is not None else ""
        which = f"rank {ranks[0]} logged nothing" if len(ranks) == 1 else "no rank logged anything"
        reporter.say(f"job {job}: attempt {n} of run {gang.run}: {which} ({gang.folder}/attempt-{n}/ on the "
                     f"hosts){said}", "bold red" if rec is not None and rec.code else "bold")
    last = attempt is None or (gang.result is not None and attempt == gang.result.attempt)
    return _ended(job, gang if last else None, follow, 1 if missed else 0, reporter)


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
             f"rank {rank} printed") + ", " + config.invocation.fix("logs", "--rank", str(rank), hint="exec.logs")
    return DockerlaunchError(f"exec: rank {rank} of job {job} {said}: its container {mine.name} on {address} runs "
                             f"nothing to exec into (the job: {ranks}){after}")


def exec_in(config: ClusterConfig, rank: int, command: list[str], out: BinaryIO, err: BinaryIO,
            log_dir: str = "dockerlaunch-logs") -> int:
    """`docker exec` in one rank's container; its output goes to `out`/`err` as it comes (the CLI's stdout)."""
    if not command:
        example = config.invocation.command("exec", "--rank", str(rank), "--", "nvidia-smi", hint="exec.example")
        raise ConfigError(f"exec: give a command after --, e.g. {example}")
    session = open_answering(config)  # the rank's host must answer; another that does not changes nothing here
    try:
        [i] = _rank_hosts(session, rank)
        name = session.plan.hosts[i].container.name
        session.fleet.hosts[i].connection()  # its error, where it did not answer
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
