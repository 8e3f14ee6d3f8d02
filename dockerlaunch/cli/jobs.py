"""Commands about jobs on hosts: config, up, doctor, down, status, logs, exec."""

from __future__ import annotations

import json
import sys

import click
import yaml

from dockerlaunch.cli.console import (
    VERDICT_STYLE,
    RichReporter,
    console,
    dry_run_view,
    host_text,
    print_report,
    print_table,
    render_plan,
    styled,
)
from dockerlaunch.cli.main import (
    CONTEXT,
    SectionedCommand,
    cli,
    config_options,
    diagnostics_option,
    job_ref_options,
    load,
    offline_option,
    output_option,
    split_hosts,
    warn_secret_env,
)
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.job.config import config_schema
from dockerlaunch.job.invocation import DEFAULT_LOG_DIR
from dockerlaunch.job.plan import plan_job
from dockerlaunch.reporting import Reporter

SMOKE_HELP = ("Then run the image on the hosts' GPUs for real (about a minute): per GPU a bf16 matmul, TE's Linear, "
              "flash-attn and apex's fused norm where the image has them, each against a reference, and an "
              "all_reduce per host and across hosts; a GPU or host 20% slower than its peers is named. Without "
              "GPUs, the CPU path (a matmul, gloo all_reduce).")


def config_and_hosts_options(f):
    """Only the flags that say where the hosts are (`ps`: no job, image or name is read)."""
    f = click.option("--hosts", callback=split_hosts, metavar="H1,H2",
                     help="Hosts to look on: [user@]host[:port].")(f)
    return click.option("--config", "config_path", metavar="PATH",
                        help="Config file [$DOCKERLAUNCH_CONFIG, ./dockerlaunch.yaml].")(f)


def load_hosts(config_path: str | None, hosts: list[str] | None, log_dir: str | None = None):
    """The config with only --config and --hosts given (and the command's --log-dir, for its hints)."""
    return load({"config_path": config_path, "hosts": hosts, "image": None, "nproc_per_node": None,
                 "master_port": None, "mounts": (), "env": (), "name": None}, log_dir=log_dir)


class LineReporter(RichReporter):
    """RichReporter whose status lines are never wrapped."""

    def say(self, msg: str, style: str = "bold") -> None:
        """As RichReporter's, but never wrapped at the console's width (160 columns in a pipe): one status line
        stays one line, in a terminal (which folds it) and in a log (where grep finds it whole)."""
        self.flush()
        self.out.print(f"[dockerlaunch] {host_text(msg, newlines=True)}", style=style, markup=False, highlight=False,
                       soft_wrap=True)


class UpReporter(LineReporter):
    """`up`'s printer: the pre-flight as its rows that did not pass and one count line (`-v`: the whole table)."""

    def __init__(self, verbose: bool = False):
        super().__init__()
        self.verbose = verbose

    def preflight(self, report, hosts: int, seconds: float) -> None:
        from dockerlaunch.backends.docker.doctor.report import PASS, SKIP
        from dockerlaunch.reporting import preflight_line

        if self.verbose:
            self.checks(report)
            return
        self.flush()
        rows = [[c.host, c.check, styled(str(c.verdict), VERDICT_STYLE[c.verdict]), c.detail]
                for c in report.checks if c.verdict not in (PASS, SKIP)]
        if rows:
            print_table(["host", "check", "verdict", "reason"], rows, self.out, commands=True)
        self.say(preflight_line(report.counts(), hosts, seconds) + " (-v: every check)",
                 "bold red" if report.failed else "bold")


@cli.command()
def schema() -> None:
    """Print the JSON Schema of the cluster config."""
    click.echo(json.dumps(config_schema(), indent=2))


@cli.group("config", context_settings=CONTEXT)
def config_group() -> None:
    """Inspect the cluster config."""


@config_group.command("show")
@config_options
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def config_show(fmt: str, **kw) -> None:
    """Print the config after merging the file and the flags."""
    cfg = load(kw)
    data = cfg.model_dump(mode="json")
    click.echo(json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())


UP_SECTIONS = (
    ("Job", ("config_path", "hosts", "name", "image", "nproc_per_node", "master_port", "mounts", "env", "offline",
             "no_diagnostics")),
    ("Run", ("detach", "keep", "log_dir", "push", "skip_preflight", "smoke", "verbose")),
    ("After a failure", ("max_restarts", "spares", "hang_timeout")),
    ("Output", ("dry_run", "output", "help")),
)


@cli.command(cls=SectionedCommand, sections=UP_SECTIONS,
             context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--dry-run", is_flag=True, help="Print the per-host plan; contact no host.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text",
              help="With --dry-run: text (default) or json.")
@click.option("--detach", is_flag=True, help="Return once the gang formed; the hosts watch the job.")
@click.option("--skip-preflight", is_flag=True, help="Do not run the doctor checks first.")
@click.option("--push", is_flag=True, help="First push this machine's build to the hosts.")
@click.option("--keep", is_flag=True, help="Keep the containers after the job ends.")
@click.option("--log-dir", default=DEFAULT_LOG_DIR, metavar="DIR", help=f"Run logs go under DIR [./{DEFAULT_LOG_DIR}].")
@click.option("--max-restarts", type=click.IntRange(0, 1000), metavar="N", help="Restart every host, up to N times.")
@click.option("--spares", callback=split_hosts, metavar="H1,H2", help="Hosts that replace a lost or unhealthy one.")
@click.option("--hang-timeout", metavar="DURATION", help="Fail when no rank printed for this long (30m).")
@diagnostics_option
@offline_option
@click.option("--smoke", is_flag=True, help="First doctor's smoke test; a FAIL starts nothing.")
@click.option("-v", "--verbose", is_flag=True, help="The pre-flight's whole table, not only problems.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def up(dry_run: bool, output: str, detach: bool, skip_preflight: bool, keep: bool, log_dir: str, smoke: bool,
       verbose: bool, command: tuple[str, ...], **kw) -> None:
    """Start the job: one container per host; the training command goes after `--`.

    Checks every host first (`doctor`), starts the containers, streams their logs, and removes every container
    when a rank fails or on Ctrl-C (or, with --max-restarts, starts every host again).
    """
    from dockerlaunch.backends.docker import up as launch
    from dockerlaunch.backends.docker.secret_env import read_env_files
    from dockerlaunch.diagnostics.dump import hang_dump
    from dockerlaunch.diagnostics.nccl_logs import watch_transport
    from dockerlaunch.transfer.push import copy_between

    cfg = load(kw, command, log_dir=log_dir)
    warn_secret_env(cfg)
    read_env_files(cfg)  # a missing or unreadable secret file fails the dry run too
    from dockerlaunch.hosts.targets import resolve_all  # late: paramiko is a third of a CLI call's start

    targets = resolve_all(cfg)
    plan = plan_job(cfg, targets, supervised=detach)  # the one plan: printed here, applied (placeholders filled) by up
    pusher = _Pusher(cfg.image) if cfg.job.push else None  # this machine lacks the image: one line, nothing starts
    if dry_run:
        view = dry_run_view(plan, targets)
        view["push"] = pusher.to_dict() if pusher else None
        if smoke:
            from dockerlaunch.diagnostics import smoke as smokelib

            view["smoke"] = smokelib.dry_run_text().splitlines()
        click.echo(json.dumps(view, indent=2) if output == "json"
                   else render_plan(plan, targets, [pusher.plan_line(), ""] if pusher else []))
        if smoke and output != "json":
            click.echo(f"\nfirst, as job {cfg.job.name[:54]}-smoke in the same image and containers:")
            click.echo("\n".join(view["smoke"]))
        return
    if smoke:
        from dockerlaunch.backends.docker.doctor.report import Report
        from dockerlaunch.diagnostics import smoke as smokelib

        result = smokelib.run(cfg, RichReporter())
        report = Report()
        smokelib.add_to(report, result, [h.address for h in cfg.hosts])
        print_report(report, console())
        if result.failed:
            RichReporter().say("smoke FAILED: the job was not started", "bold red")
            sys.exit(1)
    hooks = launch.Hooks(dump=hang_dump, copy_image=lambda src, dst, ref, image_id: copy_between(
        src.remote, dst.remote, ref, expect_id=image_id), push=pusher.push if pusher else None)
    sys.exit(launch.up(cfg, detach=detach, keep=keep, preflight=not skip_preflight, log_dir=log_dir or None,
                       reporter=UpReporter(verbose), monitors=[watch_transport], plan=plan, hooks=hooks,
                       targets=targets))


class _Pusher:
    """`up --push`: this machine's build of the job's image, read once before any host is asked, pushed (as `push`
    pushes: thin, only what each host lacks) to every host of an attempt that lacks it or holds another build."""

    def __init__(self, ref: str | None):
        from dockerlaunch.engine import engine
        from dockerlaunch.transfer import push as pushlib

        if not ref:
            raise DockerlaunchError("--push (job.push) sends the job's image from this machine: give --image IMAGE")
        self.client = engine()
        try:
            self.image = pushlib.source_image(self.client, ref, lambda line: click.echo(line, err=True))
        except DockerlaunchError as e:
            raise DockerlaunchError(f"--push (job.push): {e}; build or pull it here first, or drop --push") from None
        self.created = str(self.client.images.get(self.image.id).attrs.get("Created") or "")

    def to_dict(self) -> dict:
        return {"image": self.image.ref, "image_id": self.image.id, "created": self.created,
                "to": "every host that lacks it or holds another build", "thin": True}

    def plan_line(self) -> str:
        return (f"First: push {self.image.ref} ({self.image.id[7:19]}, built {self.created[:19] or '?'}) from this "
                "machine to every host that lacks it or holds another build (thin: only the layers a host lacks).")

    def push(self, session, reporter) -> None:
        from dockerlaunch.transfer import push as pushlib
        from dockerlaunch.transfer.push_plan import PushState

        hosts = session.fleet.hosts
        job = pushlib.Push(self.client, [h.remote for h in hosts], self.image,
                           addresses=[h.target.hostname for h in hosts], reporter=reporter)
        results = job.apply()  # then the layer cache's fill, if any: the job does not wait for it
        pid = job.fill_pid
        if pid:
            reporter.say(f"filling the layer cache with {self.image.ref} in the background (pid {pid}): the next "
                         "push of its lineage reads only its new layers", "bold")
        failed = [r for r in results if r.status == PushState.FAILED]
        if failed:
            raise DockerlaunchError(f"--push: {self.image.ref} did not reach {failed[0].host}: {failed[0].detail}; "
                                    "nothing was started")
        done = [f"{r.host} {r.status}" + (f" ({r.bytes_sent / 1e6:.0f} MB)" if r.bytes_sent else "") for r in results]
        reporter.say(f"pushed {self.image.ref} ({self.image.id[7:19]}): {', '.join(done)}")


@cli.command()
@config_options
@offline_option
@click.option("--smoke", is_flag=True, help=SMOKE_HELP)
@output_option()
def doctor(output: str, smoke: bool, **kw) -> None:
    """Pre-flight checks on every host; exits 1 if any check FAILs."""
    from dockerlaunch.backends.docker import doctor as doctorlib
    from dockerlaunch.backends.docker.doctor.report import SKIP

    cfg = load(kw)
    if not cfg.image:
        raise DockerlaunchError("doctor needs the job image: pass --image IMAGE or set image:")
    from dockerlaunch.hosts.targets import resolve_all

    targets = resolve_all(cfg)  # once: the plan's and the connections'
    plan = plan_job(cfg, targets)
    with (RichReporter() if output == "text" else Reporter()).pending("doctor") as progress:
        report = doctorlib.doctor(cfg, plan, progress, targets)
    if smoke:
        from dockerlaunch.diagnostics import smoke as smokelib

        hosts = [h.address for h in cfg.hosts]
        if report.failed:
            report.add(hosts[0], "smoke", SKIP, "not run: fix the failed checks above first", rank=0)
        else:
            result = smokelib.run(cfg, Reporter() if output == "json" else RichReporter())
            smokelib.add_to(report, result, hosts)
    if output == "json":
        click.echo(report.to_json())
    else:
        print_report(report, console())
    sys.exit(1 if report.failed else 0)


LOG_DIR_OPTION = click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True, metavar="DIR",
                              help="Where `up` saved the job's runs (its --log-dir).")


@cli.command()
@job_ref_options
@click.option("--ignore-missing", is_flag=True,
              help="Exit 0 when the job has no containers (by default that is an error naming the jobs there are).")
@LOG_DIR_OPTION
def down(ignore_missing: bool, log_dir: str, **kw) -> None:
    """Stop and remove the job's containers on every host.

    A host that does not answer is named (exit 1) after the others' containers are removed, with the command to run
    once it answers."""
    from dockerlaunch.backends.docker import after_up

    sys.exit(after_up.down(load(kw, log_dir=log_dir), LineReporter(), ignore_missing=ignore_missing,
                           log_dir=log_dir))


# `ps --output json`, as its --help shows it (docs/CLI-JSON.md says what each key holds)
PS_JSON = """{"hosts": N,
 "jobs": [{"name", "image", "created", "age_seconds",
           "hosts": [{"host", "rank", "container", "state", "exit_code",
                      "started_at", "finished_at"}],
           "result": null | RESULT}],
 "unanswered": [{"host", "error"}],
 "saved": [{"name", "latest_run"}]}
RESULT (how a job under the gang supervisor ended, from its hosts' records;
"result" only on such jobs, null while one runs):
 {"cause", "code", "rank", "host", "exit_code", "attempt", "ended", "detail",
  "line"}"""
PS_EXIT = """Exit codes: 0; 1 when a listed job failed (one started with `up --detach`
that ended with a non-zero code: its state says which rank and how), or when
a host did not answer (it is named; the other hosts are listed)."""


@cli.command(epilog="\b\n" + PS_EXIT + "\n\n\b\n--output json prints (keys are only ever added: ignore unknown "
             "ones):\n" + PS_JSON)
@config_and_hosts_options
@output_option("text for people; json for scripts (its keys below)")
@LOG_DIR_OPTION
def ps(config_path: str | None, hosts: list[str] | None, output: str, log_dir: str) -> None:
    """List every dockerlaunch job on the config's hosts: name, hosts, state per host, age, image.

    Jobs are found by their containers' `dockerlaunch.job` label, whatever their name; finished jobs whose logs
    `up` kept under --log-dir are listed after them. A job started with `up --detach` that ended shows how, from
    its hosts' records (`succeeded`, `failed: rank 1 exited 3`): every container exits with the job's code, so
    the failed rank is the gang's word, not the container codes'. Exits 1 when a listed job failed or a host did
    not answer (the others are listed).
    """
    from datetime import datetime, timezone

    from dockerlaunch.backends.docker import after_up

    cfg = load_hosts(config_path, hosts, log_dir)
    found = after_up.list_jobs(cfg, log_dir)
    now = datetime.now(timezone.utc)
    code = 1 if found.failed or any(j.failed for j in found.jobs) else 0
    if output == "json":
        click.echo(json.dumps({"hosts": found.hosts, "jobs": [j.to_dict(now) for j in found.jobs],
                               "unanswered": [{"host": h, "error": why} for h, why in found.failed],
                               "saved": [{"name": n, "latest_run": t} for n, t in found.saved.items()]}, indent=2))
        sys.exit(code)
    say = LineReporter()
    if found.jobs:
        print_table(["job", "hosts", "state", "age", "image"],
                    [[j.name, _few(j.hosts), _states(j), after_up.age_text(j.age(now)), j.image] for j in found.jobs])
    else:
        say.say(f"no dockerlaunch job on {found.hosts - len(found.failed)} host(s)")
    for h, why in found.failed:
        say.say(f"host {h}: did not answer: {why}", "bold red")
    kept = [n for n in found.saved if n not in {j.name for j in found.jobs}]
    if kept:
        logs = cfg.invocation.command("logs", "--name", kept[0], name=False, hint="ps.logs")
        say.say(f"finished, logs kept under {log_dir}/: {', '.join(kept)} (`{logs}` shows "
                + ("it" if len(kept) == 1 else "the first") + ")")
    sys.exit(code)


def _few(items: list[str], n: int = 4) -> str:
    return ", ".join(items) if len(items) <= n else f"{', '.join(items[:n - 1])}, ... ({len(items)} in all)"


def _states(job) -> str:
    """How a supervised job ended (the gang's result: its containers' codes are all the job's), else per host, in
    the hosts column's order; one word when all agree; counts past a few hosts."""
    result = getattr(job, "result", None)
    if result is not None:
        return result.short() if not job.running else f"{_container_states(job)}; {result.short()}"
    return _container_states(job)


def _container_states(job) -> str:
    states = [c.state for _, c in job.containers]
    if len(set(states)) == 1:
        return states[0] if len(states) == 1 else f"{states[0]} (all {len(states)})"
    if len(states) <= 4:
        return ", ".join(states)
    by: dict[str, int] = {}
    for s in states:
        by[s] = by.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in by.items())


# `status --output json`, as its --help shows it (docs/CLI-JSON.md says what each key holds)
STATUS_JSON = """{"job", "containers": [{"host", "name", "rank", "status", "exit_code",
                         "started_at", "finished_at"}],
 "run", "attempts": [{"attempt", "cause", "code", "started", "seconds",
                      "hosts", "rank", "host", "exit_code", "swaps",
                      "detail"}],
 "other_jobs": [<a job as in ps's "jobs">],
 "result": null | {"cause", "code", "rank", "host", "exit_code", "attempt",
                   "ended", "detail", "line"},
 "records": null | {"run", "folder", "hosts"},
 "unanswered": [{"host", "error"}]}"""
STATUS_EXIT = """Exit codes: the job's own code when a job started with `up --detach`
ended failed (the failed rank's: 3 when rank 1 exited 3; 75 a host lost,
124 a hang, 143 stopped by a signal); else 1 when a host did not answer (it
is named, the other hosts answered: the result is in "result" when one of
them has it); else 0 (running, succeeded, or started attached). 1 with one
line on stderr: no such job."""


@cli.command(epilog="\b\n" + STATUS_EXIT + "\n\n\b\n--output json prints (keys are only ever added: ignore unknown "
             "ones):\n" + STATUS_JSON)
@job_ref_options
@output_option()
@LOG_DIR_OPTION
def status(output: str, log_dir: str, **kw) -> None:
    """The job's containers per host (state, exit code, since when), how it ended, and the attempts of its latest
    run.

    A job started with `up --detach` runs under the gang supervisor, which keeps the run's records on every host:
    how it ended and its attempts come from there (every container exits with the job's code: the cause is the
    rank the gang names, the others were stopped by it). A host that does not answer is named, and the others
    answer. A job with no containers and no run (on the hosts, or saved): with --name, an error naming the jobs
    there are (exit 1); without, the config's job is reported as having none, and the jobs that do run are listed
    (see `ps`).
    """
    from datetime import datetime, timezone

    from dockerlaunch.backends.docker import after_up

    named = kw.get("name") is not None
    cfg = load(kw, log_dir=log_dir)
    st = after_up.job_status(cfg, log_dir)
    run, attempts = (None, st.gang.attempts) if st.gang is not None else after_up.attempts(cfg, log_dir)
    down = "".join(f"; host {h} did not answer: {why}" for h, why in st.unanswered)
    if not st.found and run is None and st.gang is None and named:
        raise after_up.missing_job(cfg, st.others, log_dir, then=down)
    result = st.result
    if output == "json":
        now = datetime.now(timezone.utc)
        click.echo(json.dumps({"job": cfg.job.name, "containers": [{"host": host, **s.to_dict()} for host, s in
                                                                    st.found],
                               "run": run, "attempts": [a.__dict__ for a in attempts],
                               "other_jobs": [j.to_dict(now) for j in st.others],
                               "result": result.to_dict() if result else None,
                               "records": st.gang.to_dict() if st.gang else None,
                               "unanswered": [{"host": h, "error": why} for h, why in st.unanswered]}, indent=2))
        sys.exit(st.code)
    say = LineReporter()
    if not st.found:
        say.say(f"job {cfg.job.name}: no containers on {len(cfg.hosts) - len(st.unanswered)} host(s)"
                + (" that answered" if st.unanswered else ""))
        if st.others:
            say.say(after_up.jobs_line(st.others, {}, log_dir)
                    + f" (`{cfg.invocation.command('ps', name=False, hint='status.ps')}` for more)")
    else:
        rows = []
        for host, s in st.found:
            when = s.started_at if s.status == "running" else s.finished_at
            rows.append([str(s.rank), host, s.name, s.status, "" if s.status == "running" else str(s.exit_code),
                         when[:19].replace("T", " ")] + ([result.part_of(s.rank)] if result else []))
        ranks = {s.rank for _, s in st.found}
        down_hosts = dict(st.unanswered)
        for i, host in enumerate(st.hosts):
            if i not in ranks and host in down_hosts:
                rows.append([str(i), host, "", "unknown (its host did not answer)", "", ""] + ([""] if result else []))
        rows.sort(key=lambda r: int(r[0]) if r[0].isdigit() else 1 << 30)
        print_table(["rank", "host", "container", "state", "exit code", "up since / finished"]
                    + (["how it ended"] if result else []), rows)
    for h, why in st.unanswered:
        say.say(f"host {h}: did not answer: {why} (the other hosts answered)", "bold red")
    if result is not None:
        say.say(f"job {cfg.job.name} ended: {result.line()}", "bold red" if result.failed else "bold green")
    elif st.gang is not None and st.found:
        n = st.gang.attempt
        say.say(f"job {cfg.job.name} runs under the gang supervisor (run {st.gang.run})"
                + (f", attempt {n}" if n is not None else ""))
    if attempts:
        where = f"{run}/" if run else f"{st.gang.folder}/ on the hosts" if st.gang else "?"
        click.echo(f"attempts of the latest run ({where}):")
        for a in attempts:
            click.echo(host_text(f"  {a.started.replace('T', ' ')}  {a.line()}"))
    sys.exit(st.code)


@cli.command()
@job_ref_options
@click.option("--follow", "-f", is_flag=True,
              help="Keep streaming until the containers exit; then exit with the job's code (up --detach).")
@click.option("--rank", type=int, help="Only this rank.")
@click.option("--tail", default="all", show_default=True, help="Lines from the end of each log.")
@click.option("--attempt", type=click.IntRange(0, 1000), metavar="N",
              help="The kept logs of attempt N of the latest run (0: the first start).")
@LOG_DIR_OPTION
def logs(follow: bool, rank: int | None, tail: str, attempt: int | None, log_dir: str, **kw) -> None:
    """Show the job's logs, prefixed by rank and host; once its containers are gone, the logs kept of it.

    A job started with `up --detach` keeps each attempt's output on its hosts (each rank's on its own host), and
    its rank 0 shows the gang's events (a rank's exit, a restart, a hang dump) as `[dockerlaunch]` lines; once it
    ended, how is the last line. An attached job's logs are the ones `up` saved under --log-dir. A host that does
    not answer is named and the other ranks are shown.

    Exit codes: with --follow, the job's own code once a detached job ended (3 when rank 1 exited 3; 75 a host
    lost, 124 a hang); else 1 when a host of the ranks asked for did not answer or a stream failed; else 0.
    """
    from dockerlaunch.backends.docker import after_up

    sys.exit(after_up.logs(load(kw, log_dir=log_dir), rank=rank, follow=follow, tail=tail, reporter=LineReporter(),
                           attempt=attempt, log_dir=log_dir))


@cli.command("exec", context_settings={**CONTEXT, "allow_interspersed_args": False})
@job_ref_options
@click.option("--rank", type=int, required=True, help="Which rank's container.")
@LOG_DIR_OPTION
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_cmd(rank: int, log_dir: str, command: tuple[str, ...], **kw) -> None:
    """Run a command in one rank's container, e.g. `exec --rank 1 -- py-spy dump --pid 1`."""
    from dockerlaunch.backends.docker import after_up

    sys.exit(after_up.exec_in(load(kw, log_dir=log_dir), rank, list(command), sys.stdout.buffer, sys.stderr.buffer,
                              log_dir=log_dir))
