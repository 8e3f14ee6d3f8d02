"""Commands about jobs on hosts: config, up, doctor, down, status, logs, exec."""

from __future__ import annotations

import json
import sys

import click
import yaml

from dockerlaunch.cli.console import (
    RichReporter,
    console,
    dry_run_view,
    host_text,
    print_report,
    print_table,
    render_plan,
)
from dockerlaunch.cli.main import (
    CONTEXT,
    cli,
    config_options,
    diagnostics_option,
    load,
    offline_option,
    output_option,
    split_hosts,
    warn_secret_env,
)
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.hosts.targets import resolve_all
from dockerlaunch.job.config import config_schema
from dockerlaunch.job.plan import plan_job

SMOKE_HELP = ("Then run the image on the hosts' GPUs for real (about a minute): per GPU a bf16 matmul, TE's Linear, "
              "flash-attn and apex's fused norm where the image has them, each against a reference, and an "
              "all_reduce per host and across hosts; a GPU or host 20% slower than its peers is named. Without "
              "GPUs, the CPU path (a matmul, gloo all_reduce).")


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


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--dry-run", is_flag=True, help="Print the per-host plan; contact no host.")
@output_option("For --dry-run.")
@click.option("--detach", is_flag=True, help="Return once every container has started.")
@click.option("--skip-preflight", is_flag=True, help="Do not run the doctor checks first.")
@click.option("--keep", is_flag=True, help="Keep the containers after the job ends (inspect, then `down`).")
@click.option("--log-dir", default="dockerlaunch-logs", show_default=True, metavar="DIR",
              help="Per-rank log files go to DIR/<job>-<time>/attempt-N/.")
@click.option("--max-restarts", type=click.IntRange(0, 1000), metavar="N",
              help="Start every host again after a failure, up to N times (job.max_restarts).")
@click.option("--spares", callback=split_hosts, metavar="H1,H2",
              help="Hosts that replace a lost or unhealthy host before the next attempt (spares:).")
@click.option("--hang-timeout", metavar="DURATION",
              help="Dump and fail the attempt when no rank printed for this long, e.g. 30m (job.hang_timeout).")
@diagnostics_option
@offline_option
@click.option("--smoke", is_flag=True, help=SMOKE_HELP.replace("Then run", "First run") + " A FAIL starts nothing.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def up(dry_run: bool, output: str, detach: bool, skip_preflight: bool, keep: bool, log_dir: str, smoke: bool,
       command: tuple[str, ...], **kw) -> None:
    """Start the job: one container per host. Put the training command after `--`.

    Checks every host first (see `doctor`), then starts the containers concurrently, streams their
    logs, and stops every container on every host as soon as one rank fails or on Ctrl-C. Within a
    minute it prints NCCL's transport per host (see `transport`). With --max-restarts it starts every
    host again after a failure (a spare replaces a lost host); a job whose ranks all exit 0 is done.
    """
    from dockerlaunch.backends.docker import up as launch
    from dockerlaunch.backends.docker.secret_env import read_env_files
    from dockerlaunch.diagnostics.collect import watch_transport
    from dockerlaunch.diagnostics.dump import hang_dump
    from dockerlaunch.transfer.push import copy_between

    cfg = load(kw, command)
    warn_secret_env(cfg)
    read_env_files(cfg)  # a missing or unreadable secret file fails the dry run too
    targets = resolve_all(cfg)
    plan = plan_job(cfg, targets)  # the one plan: printed here, applied (placeholders filled) by up
    if dry_run:
        view = dry_run_view(plan, targets)
        if smoke:
            from dockerlaunch.diagnostics import smoke as smokelib

            view["smoke"] = smokelib.dry_run_text().splitlines()
        click.echo(json.dumps(view, indent=2) if output == "json" else render_plan(plan, targets))
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
    recovery = launch.Recovery(dump=hang_dump, copy_image=lambda src, dst, ref: copy_between(src.remote, dst.remote,
                                                                                          ref))
    sys.exit(launch.up(cfg, detach=detach, keep=keep, preflight=not skip_preflight, log_dir=log_dir or None,
                       reporter=RichReporter(), monitors=[watch_transport], plan=plan, recovery=recovery))


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
    report = doctorlib.doctor(cfg, plan_job(cfg, resolve_all(cfg)))
    if smoke:
        from dockerlaunch.diagnostics import smoke as smokelib
        from dockerlaunch.reporting import Reporter

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


@cli.command()
@config_options
def down(**kw) -> None:
    """Stop and remove the job's containers on every host."""
    from dockerlaunch.backends.docker import manage

    sys.exit(manage.down(load(kw), RichReporter()))


LOG_DIR_OPTION = click.option("--log-dir", default="dockerlaunch-logs", show_default=True, metavar="DIR",
                              help="Where `up` saved the job's runs (its --log-dir).")


@cli.command()
@config_options
@output_option()
@LOG_DIR_OPTION
def status(output: str, log_dir: str, **kw) -> None:
    """The job's containers per host (state, exit code, since when), and the attempts of its latest run."""
    from dockerlaunch.backends.docker import manage

    cfg = load(kw)
    found = manage.status(cfg)
    run, attempts = manage.attempts(cfg, log_dir)
    if output == "json":
        click.echo(json.dumps({"job": cfg.job.name, "containers": [{"host": host, **s.to_dict()} for host, s in found],
                               "run": run, "attempts": [a.__dict__ for a in attempts]}, indent=2))
        return
    if not found:
        RichReporter().say(f"job {cfg.job.name}: no containers on {len(cfg.hosts)} host(s)")
    else:
        rows = []
        for host, s in found:
            when = s.started_at if s.status == "running" else s.finished_at
            rows.append([str(s.rank), host, s.name, s.status, "" if s.status == "running" else str(s.exit_code),
                         when[:19].replace("T", " ")])
        print_table(["rank", "host", "container", "state", "exit code", "up since / finished"], rows)
    if attempts:
        click.echo(f"attempts of the latest run ({run}/):")
        for a in attempts:
            click.echo(host_text(f"  {a.started.replace('T', ' ')}  {a.line()}"))


@cli.command()
@config_options
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the containers exit.")
@click.option("--rank", type=int, help="Only this rank.")
@click.option("--tail", default="all", show_default=True, help="Lines from the end of each log.")
@click.option("--attempt", type=click.IntRange(0, 1000), metavar="N",
              help="The saved logs of attempt N of the latest run (0: the first start).")
@LOG_DIR_OPTION
def logs(follow: bool, rank: int | None, tail: str, attempt: int | None, log_dir: str, **kw) -> None:
    """Show the job's logs, prefixed by rank and host; once its containers are gone, the logs `up` saved."""
    from dockerlaunch.backends.docker import manage

    sys.exit(manage.logs(load(kw), rank=rank, follow=follow, tail=tail, reporter=RichReporter(), attempt=attempt,
                         log_dir=log_dir))


@cli.command("exec", context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--rank", type=int, required=True, help="Which rank's container.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_cmd(rank: int, command: tuple[str, ...], **kw) -> None:
    """Run a command in one rank's container, e.g. `exec --rank 1 -- py-spy dump --pid 1`."""
    from dockerlaunch.backends.docker import manage

    sys.exit(manage.exec_in(load(kw), rank, list(command), sys.stdout.buffer, sys.stderr.buffer))
