"""Apply: connect, check, probe, plan for real, start one container per host, stream, wait, tear down.

Invariants: nothing starts until every host is connected, checked and planned without
placeholders; once anything has started, every exit path (a failed start, a failed rank, Ctrl-C,
SIGTERM, SIGHUP, a lost host) removes every job container on every reachable host, unless
--detach/--keep; a host's own watchdog removes them when the launcher is gone (see watchdog.py).
Secret env files live on a host only while its `docker run` runs: one command writes, starts and removes.
"""

from __future__ import annotations

import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from dockerlaunch import gang
from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.dockerhost import ContainerState, DockerHost, listing_script, parse_listing
from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.backends.docker.pyspy import local_pyspy, stage_pyspy
from dockerlaunch.backends.docker.runs import RunFolder, safe_host
from dockerlaunch.backends.docker.secret_env import (
    env_file_paths,
    read_env_files,
    remove_env_files,
    stale_env_files_argv,
)
from dockerlaunch.backends.docker.session import (
    Phases,
    Session,
    check_command,
    gather_facts,
    master_addr_of,
    own_containers,
)
from dockerlaunch.backends.docker.watchdog import Watchdogs
from dockerlaunch.errors import DockerlaunchError, HostError, Terminated
from dockerlaunch.hosts.fleet import Fleet, Host
from dockerlaunch.hosts.ssh import Result
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import (
    DIAG_SUBDIRS,
    GANG_BIN,
    GANG_RUNS,
    JobPlan,
    diag_root,
    gang_dir,
    plan_job,
    resolve,
)
from dockerlaunch.job.recovery import AttemptRecord, Cause, Ending, NoSpareLeft, should_restart, swap_hosts
from dockerlaunch.reporting import Reporter

MONITOR_JOIN = 15.0  # after the job ends, monitors get this long to say their last word


EXIT_HOST_LOST = gang.EXIT_HOST_LOST  # `up`'s exit code when a host stopped answering (EX_TEMPFAIL)


EXIT_HANG = gang.EXIT_HANG  # `up`'s exit code when the job hung (job.hang_timeout), as timeout(1)'s


HANG_DUMP_DEADLINE = 180.0  # the hang dump's own limit: a hung host must not hang `up`


LISTING, STALE_ENV, DIAG, PROBE = "listing", "stale secret files", "diagnostics folder", "probe"  # prepare's steps
PREPARE_TIMEOUT = 120.0  # seconds for a host's steps before its start (listing, diagnostics folder, probe) together


START_SETTLE = 30.0  # on Ctrl-C during the start, wait this long for `docker run`s under way, then remove


Monitor = Callable[[Session, JobPlan, Reporter, threading.Event], None]


@dataclass
class Hooks:
    """What `up` needs from the layers above it (the CLI wires them in): a dump of every rank when the job hangs
    (into the folder given; returns a one-line summary), the image copied from a host that has it onto a
    spare that lacks it or holds another build, and (`up --push`, job.push) this machine's build pushed to every
    host that lacks it or holds another (each raises DockerlaunchError when it cannot)."""

    dump: Callable[[Session, Path], str] | None = None
    copy_image: Callable[[Host, Host, str, str], str] | None = None  # (source, spare, ref, the run's Image ID)
    push: Callable[[Session, Reporter], None] | None = None


@dataclass(frozen=True)
class Replace:
    """An attempt's outcome before anything started: these ranks' hosts cannot take part ({rank: why}), and spares
    may replace them (`up` swaps them in and tries again)."""

    bad: dict[int, str]


def up(
    config: ClusterConfig,
    *,
    detach: bool = False,
    keep: bool = False,
    preflight: bool = True,
    log_dir: str | None = "dockerlaunch-logs",
    reporter: Reporter | None = None,
    monitors: Sequence[Monitor] = (),
    plan: JobPlan | None = None,
    hooks: Hooks | None = None,
    targets: Sequence[SSHTarget] | None = None,
) -> int:
    """Start the job, and start it again after a failure while job.max_restarts allows; return the exit code
    `dockerlaunch up` exits with (the last attempt's). `plan`: the one the caller showed or checked
    (`plan_job(config, targets)`), made here when not given (and again when a spare replaced a host). `targets`: the
    hosts' SSH targets `plan` was made from (hosts/targets.resolve_all), resolved here when not given: once per
    host list, for every attempt (again only when a spare replaced a host).

    `monitors` run in threads beside a started job (not --detach), until `stop` is set (e.g. the transport
    watcher of `diagnostics`, which lives above this layer)."""
    reporter = reporter or Reporter()
    hooks = hooks or Hooks()
    job = config.job
    secrets_blob = read_env_files(config) if config.container.env_files else b""
    run = RunFolder.create(log_dir, job.name) if log_dir and not detach else None
    attempt, swaps, fresh = 0, [], set()
    resolved: list[SSHTarget] = list(targets or ())  # filled by the attempt that resolves them
    while True:
        t0, started = time.monotonic(), datetime.now().isoformat(timespec="seconds")
        try:
            ending = _attempt(config, plan, attempt, reporter, detach=detach, keep=keep, preflight=preflight,
                              run=run, secrets_blob=secrets_blob, monitors=monitors, hooks=hooks,
                              fresh=fresh, targets=resolved)
        except DockerlaunchError as e:
            if attempt == 0:
                raise  # nothing ran yet: the one-line error, as without restarts
            ending = Ending(1, Cause.START_FAILED, detail=str(e))
        if isinstance(ending, Replace):
            try:
                config, new = swap_hosts(config, ending.bad)
            except NoSpareLeft as e:
                raise DockerlaunchError(f"cannot start attempt {attempt}: {e}") from None
            for sw in new:
                reporter.say(f"replacing {sw}", "bold yellow")
            swaps += [str(sw) for sw in new]
            fresh |= {sw.rank for sw in new}
            plan, resolved = None, []  # made again from the new host list (host 0 replaced: a new MASTER_ADDR)
            continue
        record = AttemptRecord.of(attempt, ending, started, time.monotonic() - t0,
                                  [h.address for h in config.hosts], swaps)
        if run is not None:
            run.record(record)
        if job.max_restarts or attempt:
            reporter.say(record.line(), "bold green" if ending.cause == Cause.SUCCEEDED else "bold yellow")
        if not should_restart(ending, attempt, job.max_restarts):
            if ending.cause in (Cause.RANK_FAILED, Cause.HOST_LOST, Cause.HANG) and job.max_restarts:
                reporter.say(f"no restart left (job.max_restarts {job.max_restarts}): the job failed", "bold red")
            return ending.code
        swaps = []
        if ending.lost and config.spares:
            try:
                config, new = swap_hosts(config, dict.fromkeys(ending.lost, "host lost"))
            except NoSpareLeft as e:
                reporter.say(f"cannot restart: {e}", "bold red")
                return ending.code
            for sw in new:
                reporter.say(f"replacing {sw}", "bold yellow")
            swaps = [str(sw) for sw in new]
            fresh |= {sw.rank for sw in new}
            plan, resolved = None, []
        attempt += 1
        reporter.say(f"restarting every host in {job.restart_backoff:g}s: attempt {attempt} of at most "
                     f"{job.max_restarts} restart(s) (DL_RESTART_COUNT={attempt})", "bold yellow")
        time.sleep(job.restart_backoff)  # Ctrl-C / SIGTERM here: nothing runs, and no attempt starts


def _attempt(config: ClusterConfig, plan: JobPlan | None, attempt: int, reporter: Reporter, *, detach: bool,
             keep: bool, preflight: bool, run: RunFolder | None, secrets_blob: bytes, monitors: Sequence[Monitor],
             hooks: Hooks, fresh: set[int], targets: list[SSHTarget]) -> Ending | Replace:
    """One start of every host: connect, prepare, check, plan for real, start, watch, tear down; or, before
    anything started, the hosts a spare should replace. `targets`: the hosts' SSH targets, resolved by the first
    attempt that connects when empty (and kept for the next)."""
    phases = Phases()
    fleet = Fleet.connect(config, require_all=not config.spares, targets=targets or None)
    targets[:] = fleet.targets
    unreachable = {h.rank: h.error.reason if h.error else "unreachable" for h in fleet.hosts if not h.connected}
    if unreachable:
        fleet.close()
        return Replace(unreachable)
    try:
        # the image is required here: it starts containers
        session = Session(fleet, plan or plan_job(config, fleet.targets, supervised=detach))
    except BaseException:
        fleet.close()
        raise
    phases.done("connect")
    try:
        if hooks.push is not None and (attempt == 0 or fresh):  # spares that joined get it from here too
            hooks.push(session, reporter)
            fresh.clear()
            phases.done("push")
        elif fresh and hooks.copy_image is not None:
            _image_onto_spares(session, sorted(fresh), hooks, reporter)
            fresh.clear()
            phases.done("image")
        # probe.sh runs once per host per attempt: in the pre-flight's own round trip (doctor's observe, whose
        # answers `up` then plans from), else in prepare's
        probes = None if preflight else prepare(session, reporter)
        if preflight:
            prepare(session, reporter, diag=False, probe=False)  # the listing: a running job refuses before any check
        else:
            check_command(session.plan, probes)  # no command given: the image's CMD, read by the probe
        phases.done("prepare")
        for note in session.plan.advice:
            reporter.say(f"note: {note}", "yellow")
        if preflight:
            from dockerlaunch.backends.docker import doctor

            t_check = time.monotonic()
            with reporter.pending("pre-flight") as progress:
                report, observed = doctor.check_observed(session.fleet, session.plan, progress)
            probes = observed.probes()
            check_command(session.plan, probes)  # before the table: a job that cannot start has nothing to check
            phases.done("preflight")
            reporter.preflight(report, len(session.fleet.hosts), time.monotonic() - t_check)
            if report.failed:
                bad: dict[int, str] = {}
                for c in report.failed:
                    bad.setdefault(c.rank, f"doctor: {c.check}: {c.detail}"[:200])
                # a failure on every host is the job's, not a host's: no spare would pass; nor would one fix an
                # image row (a push does, and a spare copies its image from another host)
                image_rows = any(c.check == "image" for c in report.failed)
                if config.spares and not image_rows and -1 not in bad and len(bad) <= len(config.spares) and len(
                        bad) < len(config.hosts):
                    return Replace(bad)
                # the fix is each failed row's own (never --skip-preflight: it would start what cannot run)
                reporter.say(f"preflight FAILED ({len(report.failed)} check(s)); nothing was started: fix what "
                             "failed above, then run `up` again", "bold red")
                reporter.command("check without starting:", config.invocation.command("doctor", hint="up.doctor"))
                left_out = config.invocation.left_out_note("doctor")
                if left_out:
                    reporter.say(f"that doctor {left_out}", "yellow")
                return Ending(1, Cause.PREFLIGHT_FAILED)
            prepare(session, reporter, listing=False, probe=False)  # the diagnostics folder
            phases.done("prepare")
        if session.plan.supervised:
            _stage_gang(session)
            phases.done("supervisor")
        env_paths = env_file_paths(session, session.plan.job) if secrets_blob else {}
        try:
            # a launch's id: its containers' label, its records' folder on the hosts (newest last when sorted)
            run_id = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
            applied = resolve(session.plan, gather_facts(session, env_paths, probes), run_id, attempt)
            if applied.unresolved():
                raise DockerlaunchError("internal: plan still has unresolved values: "
                                        + "; ".join(applied.unresolved()))
            return _start_and_watch(session, applied, reporter, detach=detach, keep=keep,
                                    run_dir=run.attempt_dir(attempt) if run else None, env_paths=env_paths,
                                    secrets_blob=secrets_blob, run_id=run_id, monitors=monitors, phases=phases,
                                    on_hang=hooks.dump)
        finally:
            if env_paths:  # normally gone already (removed as each `docker run` returned): the safety net
                remove_env_files(session, env_paths)
    finally:
        session.close()


BUILD_FORMAT = "{{.Id}} {{.Created}} {{json .RootFS.Layers}}"  # observe.sh's `image` and `image_content` in one


def _image_onto_spares(session: Session, ranks: list[int], hooks: Hooks, reporter: Reporter) -> None:
    """A spare that took a rank gets the job's image from a host that has it (no registry needed), unless it holds
    the very build that host holds (a spare with the tag at all may hold last week's); where every host is a
    spare, one holding the image is kept, and the pre-flight compares it with this machine's build."""
    from dockerlaunch.backends.docker.doctor.observations import ImageBuild

    image = session.plan.image
    argv = ["docker", "image", "inspect", "--format", BUILD_FORMAT, image]

    def build(h: Host) -> ImageBuild | None:
        r = h.remote.run(argv, timeout=60)
        image_id, _, content = r.stdout.strip().partition(" ")
        return ImageBuild.from_content(image_id, content) if r.ok and image_id.startswith("sha256:") else None

    builds = session.fleet.each(build).raise_first()
    sources = [(h, b) for h, b in zip(session.fleet.hosts, builds) if b is not None and h.rank not in ranks]
    for r in ranks:
        mine = builds[r]
        # no host to compare with (every host is a spare): doctor's image row compares it with this machine's
        if mine is not None and (not sources or mine.same_as(sources[0][1])):
            continue
        if not sources:
            raise DockerlaunchError(f"spare {session.fleet.hosts[r].address} lacks {image} and no other host of "
                                    "the job has it; " + session.config.invocation.fix(
                                        "push", image, "--hosts", session.fleet.hosts[r].address, hosts=False,
                                        name=False, hint="up.push-spare"))
        dst = session.fleet.hosts[r]
        # the run's build: the one every job host holds (the pre-flight compared it with this machine's); a
        # source's stream is then checked against it, so no one host's word decides what the spare runs
        if not all(b.same_as(sources[0][1]) for _, b in sources):
            raise DockerlaunchError(f"the job's hosts hold different builds of {image} ("
                                    + ", ".join(f"{h.address}: {b.describe()}" for h, b in sources)
                                    + "): nothing to copy onto spare " + dst.address + "; "
                                    + session.config.invocation.fix("push", image, name=False, hint="up.push-builds"))
        held = f" (it holds {mine.describe()}, not {sources[0][1].describe()})" if mine else ""
        reporter.say(f"copying {image} from {sources[0][0].address} to spare {dst.address}{held}")
        reporter.say(hooks.copy_image(sources[0][0], dst, image, sources[0][1].id))  # type: ignore[misc]


KEEP_RUNS = 20  # each host keeps the records of the job's newest runs (runs/<run id>/); older ones are removed

# gang.py and its entry shim into the job's bin/ (mounted read-only at /.dockerlaunch), each written whole; the
# job's runs/ pruned to its KEEP_RUNS newest (names as `up` makes them: nothing else is removed)
STAGE_GANG = ('umask 022; b=$1; { [ -d "$b" ] && [ ! -L "$b" ]; } || { echo "$b is not a folder" >&2; exit 1; }\n'
              # mktemp: hosts that share this folder (their engine's) may run with the same pid
              'e=$(mktemp "$b/.gang-entry.XXXXXX") && g=$(mktemp "$b/.gang.XXXXXX") || exit 1\n'
              'printf "%s" "$2" >"$e" && cat >"$g" && chmod 644 "$e" "$g" && '
              'mv -f "$e" "$b/gang-entry.sh" && mv -f "$g" "$b/gang.py" || { rm -f "$e" "$g"; exit 1; }\n'
              'cd "$3" 2>/dev/null || exit 0\n'
              'ls -1t | tail -n "+$4" | while IFS= read -r d; do\n'
              '  case $d in [0-9]*-[0-9]*-[0-9a-f]*) case $d in *[!0-9a-f-]*) ;; *) rm -rf -- "$d" ;; esac ;; esac\n'
              'done\n')


def _stage_gang(session: Session) -> None:
    """The supervisor's files on every host, before any start: the image brings its python3, the host nothing."""
    from dockerlaunch import gang

    code = Path(gang.__file__).read_bytes()
    entry = script("gang-entry.sh")
    where, runs = f"{session.plan.job_dir}/{GANG_BIN}", f"{session.plan.job_dir}/{GANG_RUNS}"
    # a hang's stacks: py-spy from the image, else dockerlaunch's own beside gang.py (the supervisor looks there)
    pyspy = local_pyspy() if session.config.job.hang_timeout else None
    root = diag_root(session.plan.config)

    def stage(h: Host) -> None:
        h.remote.check(["sh", "-c", STAGE_GANG, "sh", where, entry, runs, str(KEEP_RUNS + 1)],
                       "copying the gang supervisor", timeout=60, stdin=code)
        if pyspy is not None:
            stage_pyspy(h.remote, session.plan.job_dir, root, pyspy)

    session.fleet.each(stage).raise_first()


GANG_POLL = 0.5


def _await_gang(session: Session, plan: JobPlan, reporter: Reporter, run_id: str) -> str | None:
    """`up --detach` returns once the gang formed (host 0's events say so); None then, else why not in one line.
    An image without Python >= 3.8 runs unsupervised: one WARN line, and the job runs as it did before."""
    from dockerlaunch.backends.docker.gang_records import read_run

    folder = gang_dir(plan, run_id)
    h0 = session.fleet.hosts[0]
    name0 = plan.hosts[0].container.name
    deadline = time.monotonic() + session.config.job.start_timeout + 15
    while True:
        # rank 0's container gone before its records say anything (its engine cannot see the job's folder, the
        # image's shell is missing, ...): said at once, not after the start timeout
        state = DockerHost.on(h0).docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name0, timeout=30)
        seen = read_run(h0, folder)
        if seen.unsupervised:
            reporter.say(f"WARN: the image {plan.image} has no Python >= 3.8, which the gang supervisor runs on: "
                         "nothing stops the other ranks when one fails, restarts or watches for hangs once this "
                         "returns (run `up` attached for that)", "bold yellow")
            return None
        if seen.result is None and not seen.formed and state.ok and state.stdout.split()[:1] == ["exited"]:
            said = DockerHost.on(h0).docker("logs", "--tail", "3", name0, timeout=30)
            last = " / ".join(x.strip() for x in (said.stdout + said.stderr).strip().splitlines()[-3:])
            return (f"rank 0's container ({h0.address}) exited with {state.stdout.split()[-1]} before the gang "
                    f"formed" + (f": {last[:300]}" if last else "") + f" (its records would be in {folder}/)")
        if seen.result is not None:
            return f"the gang ended before it ran: {seen.result.line()}"
        if seen.formed:
            return None
        if time.monotonic() > deadline:
            return (f"the gang did not form within {session.config.job.start_timeout:g}s (job.start_timeout): "
                    f"is job.gang_port {session.config.job.gang_port} on {plan.master_addr} open to the hosts?")
        time.sleep(GANG_POLL)


def prepare(session: Session, reporter: Reporter, *, listing: bool = True, diag: bool = True, probe: bool = True
            ) -> list[probelib.Probe | Exception] | None:
    """Each host's steps before its start, in one round trip (`Remote.run_steps`; at 256 hosts every extra round
    trip is a wait on the slowest): the job's containers of an earlier run, secret files it left, the emptied
    diagnostics folder, the probe. A host where the job has any container stops its batch at the listing, so
    nothing is touched beside a running job; running ones make `up` refuse, stopped ones are removed and that
    host's remaining steps run again. Returns each host's probe when asked."""
    config, job = session.plan.config, session.plan.job  # the plan's: diagnostics.dir settled for the login
    master = master_addr_of(session) if probe else ""
    diag_argv = None
    gang_dirs = (f"+{GANG_BIN}", f"+{GANG_RUNS}") if session.plan.supervised else ()
    if diag and (session.plan.diag_dir is not None or gang_dirs):
        subdirs = (DIAG_SUBDIRS if session.plan.diag_dir is not None else ()) + gang_dirs
        user = config.container.user
        uid = user.split(":")[0] if user else ""
        # a container user other than root: its own folders where it is a uid (chown), else sticky like /tmp
        mode, owner = ("0755", "-") if not user else ("1777", uid if uid.isdigit() else "-")
        diag_argv = ["sh", "-c", script("diagdir.sh"), "sh", diag_root(config), job, mode, owner, *subdirs]
    locals_ = [h.rank for h in session.fleet.hosts if h.target.local]

    def elsewhere(user: str) -> str:  # beside the refused folder, never inside it
        root = diag_root(config)
        return f"{root}-{user}" if not root.endswith(f"-{user}") else f"{root}-{job}"
    diag_ranks = {h.rank for h in session.fleet.hosts if not h.target.local} | set(locals_[:1])  # one folder

    def steps(h) -> dict[str, list[str]]:
        """This host's steps by name, in the order they run (the first that fails ends the batch)."""
        out: dict[str, list[str]] = {}
        if listing:  # the listing stops the batch when the job has containers there (LEFTOVERS)
            out[LISTING], out[STALE_ENV] = listing_script(job), stale_env_files_argv(job)
        if diag_argv and h.rank in diag_ranks:
            out[DIAG] = diag_argv
        if probe:
            # the image's labels (its torch) from host 0 only: every host runs the same image, and each question
            # is a docker CLI run on an engine that the sim's hosts share
            gets_gpus = session.plan.hosts[h.rank].container.gpus is not None
            out[PROBE] = probelib.probe_argv(master, session.plan.image if h.rank == 0 else None, gpu=gets_gpus)
        return out

    def run(h, skip: tuple[str, ...] = ()) -> dict[str, Result | None]:
        named = {k: v for k, v in steps(h).items() if k not in skip}
        return dict(zip(named, h.remote.run_steps(list(named.values()), timeout=PREPARE_TIMEOUT)))

    hosts = session.fleet.hosts
    done = session.fleet.each(run).raise_first()
    if listing:
        found = [parse_listing(h.name, job, rs[LISTING]) for h, rs in zip(hosts, done)]  # type: ignore[arg-type]
        if any(found):
            _clear_leftovers(session, own_containers([h.name for h in hosts], found), reporter)
        again = [h for h, rs in zip(hosts, done) if rs[LISTING].exit_status != 0]  # type: ignore[union-attr]
        for h, rs in zip(again, session.fleet.each(lambda h: run(h, skip=(LISTING,)), again).raise_first()):
            done[h.rank] = {**done[h.rank], **rs}  # the rest of its batch, run again once its leftovers went
    if diag_argv:
        for h, rs in zip(hosts, done):
            if h.rank in diag_ranks:
                r = rs[DIAG]
                if r is not None and not r.ok:
                    fix = f"set diagnostics.dir to a folder of the SSH user's own, e.g. {elsewhere(h.target.user)}"
                    raise DockerlaunchError(str(HostError(h.name, f"{r.last_line()}; {fix}",
                                                          step="preparing the diagnostics folder")))
    if not probe:
        return None
    probes: list[probelib.Probe | Exception] = []
    for h, rs in zip(hosts, done):
        r = rs[PROBE]
        if r is None or not r.ok:
            probes.append(HostError(h.name, r.last_line() if r is not None else "not run", step=probelib.PROBE_STEP,
                                    exit_status=r.exit_status if r is not None else None))
            continue
        try:
            probes.append(probelib.parse_probe(r.stdout, h.name))
        except HostError as e:
            probes.append(e)
    return probes


def _clear_leftovers(session: Session, existing: list[tuple[str, ContainerState]], reporter: Reporter) -> None:
    """Containers of an earlier run that are not running are removed; running ones make `up` refuse."""
    job = session.plan.job
    running = [(host, s) for host, s in existing if s.status in ("running", "restarting", "paused")]
    if running:
        what = ", ".join(f"{s.name}@{host} {s.status}" for host, s in running)
        down = session.config.invocation.fix("down", "--name", job, name=False, hint="up.down-running")
        raise DockerlaunchError(f"job {job} already has containers ({what}); {down}")
    by_host: dict[str, list[str]] = {}
    for host, s in existing:
        by_host.setdefault(host, []).append(s.name)
    session.fleet.each(lambda h: DockerHost.on(h).remove(by_host.get(h.name, []), grace=0)).raise_first()
    reporter.say(f"removed {len(existing)} leftover container(s) of an earlier run of {job}")


def _remove_everywhere(session: Session, plan: JobPlan, grace: int = 3, skip: tuple[int, ...] = ()):
    names = {hp.rank: hp.container.name for hp in plan.hosts}
    hosts = [h for h in session.fleet.hosts if h.rank not in skip]
    return session.fleet.each(lambda h: DockerHost.on(h).remove([names[h.rank]], grace=grace), hosts)


def _teardown(session: Session, plan: JobPlan, reporter: Reporter, why: str, skip: tuple[int, ...] = ()) -> None:
    n = plan.nnodes - len(skip)
    reporter.say(f"{why}: stopping and removing job containers on {n} host(s)", "bold yellow")
    for o in _remove_everywhere(session, plan, skip=skip).failed:
        reporter.say(f"host {o.item.address}: could not remove {plan.hosts[o.item.rank].container.name}: {o.error}",
                     "bold red")


def _start_and_watch(session: Session, plan: JobPlan, reporter: Reporter, *, detach: bool, keep: bool,
                     run_dir: Path | None, env_paths: dict[int, tuple[str, ...]], secrets_blob: bytes, run_id: str,
                     monitors: Sequence[Monitor] = (), phases: Phases | None = None,
                     on_hang: Callable[[Session, Path], str] | None = None) -> Ending:
    """Start, watch, finish -- and on every way out of them (a failed start, Ctrl-C, SIGTERM, an error), tear
    down whatever started. Two places only say whether containers may be running: set before the first `docker
    run`; cleared once `_run_started` returned, which leaves none behind (it tore them down, or --keep kept them, or
    the hosts' gang supervisors own a detached job). Any other way out tears down here."""
    config = session.config
    run = _Run(stop=threading.Event())
    watchdogs = None if detach else Watchdogs(session.fleet.hosts, run_id, config.job.orphan_grace)
    why = "error"  # an unexpected one: never leave containers behind
    try:
        if watchdogs is not None:
            watchdogs.start()  # before any container: a launcher that dies mid-start leaves nothing running
        reporter.say(f"starting {plan.job}: {plan.nnodes} host(s), image {plan.image}, "
                     f"MASTER_ADDR={plan.master_addr}:{plan.master_port}")
        run.started = True  # from here on, any exit path tears down (a partial start too)
        ending = _run_started(session, plan, reporter, run, watchdogs, detach=detach, keep=keep, run_dir=run_dir,
                              env_paths=env_paths, secrets_blob=secrets_blob, run_id=run_id, monitors=monitors,
                              phases=phases or Phases(), on_hang=on_hang)
        run.started = False
        return ending
    except (KeyboardInterrupt, Terminated) as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
        return Ending(130 if isinstance(e, KeyboardInterrupt) else e.exit_code, Cause.INTERRUPTED)
    finally:
        run.stop.set()
        if run.started:
            _teardown(session, plan, reporter, why, skip=run.lost)
        if watchdogs is not None:
            watchdogs.stand_down()  # the launcher removed the containers (or keeps them: --keep)
        for s in run.sinks:
            s.close()


def _run_started(session: Session, plan: JobPlan, reporter: Reporter, run: _Run, watchdogs: Watchdogs | None, *,
                 detach: bool, keep: bool, run_dir: Path | None, env_paths: dict[int, tuple[str, ...]],
                 secrets_blob: bytes, run_id: str, monitors: Sequence[Monitor], phases: Phases,
                 on_hang: Callable[[Session, Path], str] | None) -> Ending:
    """The start and what follows it, each way ending with no container the launcher still owes a teardown: a
    failed start or a gang that did not form tears down; a detached job is its supervisors'; an attached one is
    finished (torn down, or kept)."""
    phases.done("watchdogs" if watchdogs is not None else "plan")
    gang_secret = secrets.token_hex(32) if plan.supervised else None
    failed = _start(session, plan, reporter, env_paths, secrets_blob, phases, gang_secret)
    if failed is not None:
        return failed
    if detach:
        formed = _await_gang(session, plan, reporter, run_id) if plan.supervised else None
        phases.done("gang")
        if formed is not None:
            reporter.say(formed, "bold red")
            _teardown(session, plan, reporter, "the gang did not form")
            return Ending(1, Cause.START_FAILED, detail=formed)
        job = session.config.job
        reporter.say(f"started {plan.nnodes} container(s) in {phases}; the hosts watch the job (fail-fast"
                     + (f", up to {job.max_restarts} restart(s)" if job.max_restarts else "")
                     + (", hangs" if job.hang_timeout else "")
                     + f", lost hosts) with no launcher: records in {gang_dir(plan, run_id)}/ on every host")
        reporter.command("follow with:", session.config.invocation.command(
            "logs", "--follow", "--name", plan.job, name=False, hint="up.follow"))
        return Ending(0, Cause.DETACHED)
    reporter.say(f"started {plan.nnodes} container(s) in {phases}" + (f"; logs: {run_dir}/" if run_dir else ""))
    ending, watchers = _watch(session, plan, reporter, run, watchdogs, monitors, run_dir, on_hang)
    run.stop.set()
    _finish(session, plan, reporter, ending, watchers, watchdogs, keep)
    return ending


@dataclass
class _Run:
    """What the start/watch/finish steps share with the teardown around them."""

    stop: threading.Event
    started: bool = False
    lost: tuple[int, ...] = ()  # ranks whose host stopped answering: not waited for in the teardown
    sinks: list[LogSink] = field(default_factory=list)


def _start(session: Session, plan: JobPlan, reporter: Reporter, env_paths: dict[int, tuple[str, ...]],
           secrets_blob: bytes, phases: Phases, gang_secret: str | None = None) -> Ending | None:
    """One container per host, concurrently (each with its secrets file for the length of its `docker run`, and a
    supervised job's gang secret); a host that fails to start: everything is torn down and the Ending says which
    (None: all started)."""

    def start(h) -> str:
        path = env_paths.get(h.rank)
        result = DockerHost.on(h).run_container(plan.hosts[h.rank].container,
                                                env_file=(path[0], secrets_blob) if path else None,
                                                gang_secret=gang_secret)
        env_paths.pop(h.rank, None)  # written and removed by that one command
        return result

    results = session.fleet.each(start, settle=START_SETTLE)
    phases.done("start")
    if not results.failed:
        return None
    for o in results.failed:
        reporter.say(str(o.error), "bold red")
    _teardown(session, plan, reporter, "start failed")
    o = results.failed[0]
    return Ending(1, Cause.START_FAILED, o.item.rank, o.item.address, detail=str(o.error)[:300])


def _watch(session: Session, plan: JobPlan, reporter: Reporter, run: _Run, watchdogs: Watchdogs | None,
           monitors: Sequence[Monitor], run_dir: Path | None,
           on_hang: Callable[[Session, Path], str] | None) -> tuple[Ending, list[threading.Thread]]:
    """Follow every rank's logs and wait for its exit, until all ranks exit 0 or the first of: a rank fails, a host
    is lost (watchdogs), the job hangs (job.hang_timeout). Monitors (NCCL transport, ...) run beside it."""
    config, hosts = session.config, session.fleet.hosts
    exits: queue.Queue[tuple[int, int | Exception]] = queue.Queue()

    def follow(i: int) -> None:
        hp = plan.hosts[i]
        try:
            DockerHost.on(hosts[i]).follow_logs(hp.container.name, run.sinks[i], stop=run.stop)
            if run.stop.is_set():
                return
            exits.put((i, DockerHost.on(hosts[i]).wait(hp.container.name, timeout=120)))
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            exits.put((i, e))

    hang_after = config.job.hang_timeout
    progress = re.compile(config.job.progress_regex) if config.job.progress_regex else None
    for hp in plan.hosts:
        path = run_dir / f"rank{hp.rank}-{safe_host(hp.address)}.log" if run_dir else None
        run.sinks.append(LogSink(reporter, hp.rank, hp.address, path, progress=progress))
    for i in range(len(plan.hosts)):
        threading.Thread(target=follow, args=(i,), daemon=True).start()
    watchers = [threading.Thread(target=m, args=(session, plan, reporter, run.stop), daemon=True) for m in monitors]
    for t in watchers:
        t.start()

    done: dict[int, int] = {}
    while len(done) < len(plan.hosts):
        gone = watchdogs.lost(config.job.host_timeout) if watchdogs else []
        if gone:
            run.lost = tuple(h.rank for h in gone)
            names = ", ".join(f"rank {h.rank} ({h.address})" for h in gone)
            reporter.say(f"{names} stopped answering for {config.job.host_timeout:g}s: host lost "
                         f"(its own watchdog removes its container when it comes back)", "bold red")
            return Ending(EXIT_HOST_LOST, Cause.HOST_LOST, gone[0].rank, gone[0].address, lost=run.lost), watchers
        if gang.hung({s.rank: s.progress_at for s in run.sinks}, time.monotonic(), hang_after):  # the gang's rule
            return _hung(session, plan, reporter, run.sinks, hang_after, run_dir, on_hang), watchers
        try:
            i, result = exits.get(timeout=0.2)
        except queue.Empty:
            for sink in run.sinks:
                sink.tick()
            continue
        hp = plan.hosts[i]
        if isinstance(result, Exception):
            reporter.say(f"rank {hp.rank} ({hp.address}): lost track of the container: {result}", "bold red")
            return Ending(1, Cause.RANK_FAILED, hp.rank, hp.address, detail=f"lost track: {result}"[:300]), watchers
        done[i] = result
        if result != 0:
            reporter.say(f"rank {hp.rank} ({hp.address}) exited with {result}", "bold red")
            return Ending(result, Cause.RANK_FAILED, hp.rank, hp.address, exit_code=result), watchers
        reporter.say(f"rank {hp.rank} ({hp.address}) finished")
    return Ending(0, Cause.SUCCEEDED), watchers


def _finish(session: Session, plan: JobPlan, reporter: Reporter, ending: Ending, watchers: list[threading.Thread],
            watchdogs: Watchdogs | None, keep: bool) -> None:
    """After the watch: monitors get their last word on success; a failure tears down every host but the lost
    ones (their watchdogs do it there); a success removes the containers unless --keep."""
    if ending.code == 0:
        for t in watchers:
            t.join(MONITOR_JOIN)
    if ending.code != 0:
        for r in ending.lost:
            if watchdogs:
                watchdogs.abandon(session.fleet.hosts[r])
        why = {Cause.HOST_LOST: "host lost", Cause.HANG: "hang"}.get(ending.cause, f"rank failed (exit {ending.code})")
        _teardown(session, plan, reporter, why, skip=ending.lost)
    elif not keep:
        _remove_everywhere(session, plan, grace=1)
        reporter.say(f"job {plan.job} succeeded on all {plan.nnodes} host(s)", "bold green")


def _hung(session: Session, plan: JobPlan, reporter: Reporter, sinks: list[LogSink], after: float,
          run_dir: Path | None, on_hang: Callable[[Session, Path], str] | None) -> Ending:
    """No rank made progress for job.hang_timeout: name the quietest rank, dump every rank (bounded by its own
    deadline, so a hung host cannot hang `up`), then the attempt has failed."""
    now = time.monotonic()
    quiet = min(sinks, key=lambda s: s.progress_at)
    what = "matched job.progress_regex" if sinks[0].progress is not None else "printed a line"
    reporter.say(f"no rank {what} for {after:g}s: the job hangs (quietest: rank {quiet.rank} ({quiet.host}), "
                 f"silent for {now - quiet.progress_at:.0f}s)", "bold red")
    detail = f"quietest rank {quiet.rank}"
    if on_hang is not None:
        folder = (run_dir or Path("dockerlaunch-dumps") / f"{plan.job}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
        folder = folder / "hang-dump"
        said: list[str] = []

        def dump() -> None:
            try:
                said.append(on_hang(session, folder))
            except Exception as e:  # noqa: BLE001 - the dump is evidence, never a reason to stay
                said.append(f"the dump failed: {e}")

        reporter.say(f"dumping every rank into {folder}/ (at most {HANG_DUMP_DEADLINE:g}s)")
        t = threading.Thread(target=dump, daemon=True, name="dl-hang-dump")
        t.start()
        t.join(HANG_DUMP_DEADLINE)
        result = said[0] if said else f"the dump did not finish in {HANG_DUMP_DEADLINE:g}s (a host hangs?)"
        reporter.say(f"dump: {result}")
        detail += f"; dump in {folder}: {result}"
    return Ending(EXIT_HANG, Cause.HANG, quiet.rank, quiet.host, detail=detail[:500])
