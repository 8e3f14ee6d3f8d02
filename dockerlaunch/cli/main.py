"""The `dockerlaunch` command: the click group, shared options, and the one place errors become exit codes."""

from __future__ import annotations

import logging
import signal
import sys

import click

from dockerlaunch import __version__
from dockerlaunch.errors import DockerlaunchError, Terminated
from dockerlaunch.job.flags import Overrides
from dockerlaunch.job.load import load_config

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


# `dockerlaunch --help`: the commands by what a user came to do, each said in one line that ends where it ends
# (click cuts a docstring's first line at 45 characters, mid-sentence). A command missing here is listed under
# "Other" (tests/unit/cli/test_help.py fails on it).
SECTIONS = (
    ("Launch", (("up", "Start the job: one container per host, pre-flight first"),
                ("down", "Stop and remove the job's containers on every host"),
                ("ps", "List every dockerlaunch job on the hosts"),
                ("status", "The job's containers per host: state, exit code, since when"),
                ("logs", "The job's logs, prefixed by rank and host"),
                ("exec", "Run a command in one rank's container"),
                ("doctor", "Pre-flight checks of hosts and image together; exit 1 on a FAIL"))),
    ("Images", (("build", "Build a stack's pinned image, then verify it"),
                ("verify", "Prove an image without a GPU: symbols, cubins, imports, pins"),
                ("stacks", "The pinned stack matrix: list, show, check, lock"),
                ("fetch", "Download a stack's lock and sources for an offline build"),
                ("wheels", "Compiled packages (TE, apex, flash-attn) as cached wheels"),
                ("sources", "Source archives pinned by content"))),
    ("Distribution", (("push", "Copy a local image to every host over SSH (no registry to set up)"),
                      ("save", "Write images to one bundle file for air-gapped hosts"),
                      ("load", "Load a bundle here or onto the hosts, checked"),
                      ("cache", "Show or prune the layer cache push keeps"))),
    ("Diagnostics", (("dump", "Every rank's stacks and NCCL's flight recorder, from a hung job"),
                     ("transport", "How NCCL moves data on each host: IB or sockets"),
                     ("commtest", "all_reduce bandwidth across the hosts"))),
    ("Render", (("render", "The same job for compose, Kubernetes, JobSet or Slurm"),)),
    ("Cluster", (("config", "Show the cluster config as dockerlaunch reads it"),
                 ("schema", "The JSON Schema of the cluster config"),
                 ("sim", "A simulated cluster on this machine, to try everything"))),
)


class SectionedGroup(click.Group):
    """A group whose help lists its commands under SECTIONS' headings, compactly (one screen)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = {n: c for n in self.list_commands(ctx) if (c := self.get_command(ctx, n)) and not c.hidden}
        sections = [(title, [(n, line) for n, line in rows if n in commands]) for title, rows in SECTIONS]
        placed = {n for _, rows in sections for n, _ in rows}
        sections.append(("Other", [(n, c.get_short_help_str(80)) for n, c in commands.items() if n not in placed]))
        formatter.write_paragraph()
        for title, rows in sections:
            if rows:
                formatter.write_text(f"{title}:")
                with formatter.indentation():
                    formatter.write_dl(rows, col_spacing=2)
        formatter.write_text("Run `dockerlaunch COMMAND --help` for a command's options.")


class SectionedCommand(click.Command):
    """A command whose --help lists its options under headings, one line each where its help fits, aligned across
    the headings. click has no option groups; click-option-group (a dependency for ~30 lines of formatting) or
    rich-click (which restyles every help page and patches click) would do more than this needs. `sections`:
    (heading, parameter names; `help` for -h/--help) in order; an option in none is listed under "Other"
    (tests/unit/cli/test_help.py fails on it)."""

    def __init__(self, *args, sections: tuple[tuple[str, tuple[str, ...]], ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        records = {"help" if p is help_option else p.name: r for p in self.get_params(ctx)
                   if isinstance(p, click.Option) and (r := p.get_help_record(ctx))}
        placed = {n for _, names in self.sections for n in names}
        groups = [(title, [records[n] for n in names if n in records]) for title, names in self.sections]
        groups.append(("Other", [r for n, r in records.items() if n not in placed]))
        width = min(max(len(term) for term, _ in records.values()), OPTION_COLUMN)
        formatter.write_paragraph()
        for title, rows in groups:
            if rows:
                formatter.write_text(f"{title}:")
                with formatter.indentation():
                    formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=width,
                                       col_spacing=2)


OPTION_COLUMN = 24  # an option's name and value wider than this puts its help on the next line


@click.group(cls=SectionedGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="dockerlaunch")
def cli() -> None:
    """Build pinned LLM-training images and launch them across GPU hosts over SSH."""


def split_hosts(ctx, param, value):
    if value is None:
        return None
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        raise click.BadParameter("give at least one host, e.g. --hosts h1,h2")
    return hosts


def _apply(f, opts):
    for opt in reversed(opts):  # click lists options in the order written here
        f = opt(f)
    return f


def _target():
    return [click.option("--config", "config_path", metavar="PATH",
                         help="Config file [$DOCKERLAUNCH_CONFIG, ./dockerlaunch.yaml]."),
            click.option("--hosts", callback=split_hosts, metavar="H1,H2",
                         help="Hosts, rank 0 first: [user@]host[:port].")]


def _name():
    return [click.option("--name", metavar="NAME", help="Job name (containers are NAME-RANK).")]


def _shape():
    return [click.option("--image", metavar="IMAGE", help="Job image."),
            click.option("--nproc-per-node", type=click.IntRange(1, 1024), metavar="N", help="Processes per host."),
            click.option("--master-port", type=click.IntRange(1, 65535), metavar="PORT",
                         help="Rendezvous port on host 0."),
            click.option("--mount", "mounts", multiple=True, metavar="SRC:DST[:ro]", help="Extra mount (repeatable)."),
            click.option("--env", "env", multiple=True, metavar="KEY=VALUE",
                         help="Extra env (repeatable; no secrets).")]


def target_options(f):
    """Which hosts: --config and --hosts (every command that reaches the cluster)."""
    return _apply(f, _target())


def job_ref_options(f):
    """Which job on those hosts: the target and --name (down, status, logs, exec, dump, transport)."""
    return _apply(f, _target() + _name())


def config_options(f):
    """Everything that shapes the job's containers: the job reference and the flags that override the config file
    (up, doctor, render, commtest, config show). A command declares only the options it reads
    (tests/unit/cli/test_help.py holds the table)."""
    return _apply(f, _target() + _name() + _shape())


def output_option(help_text: str = "text for people, json for scripts"):
    return click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help=help_text)


def diagnostics_option(f):
    return click.option("--no-diagnostics", "no_diagnostics", is_flag=True,
                        help="No SYS_PTRACE, flight recorder, NCCL log files.")(f)


def offline_option(f):
    return click.option("--offline", is_flag=True, help="No model hub on the hosts (job.offline).")(f)


def warn_secret_env(config) -> None:
    """Once per command that shows or applies the env (up, render): a secret in plain env is everywhere."""
    from dockerlaunch.job.config import secret_looking_env

    names = secret_looking_env(config)
    if names:
        click.echo(f"warning: container.env {', '.join(names)} look{'s' if len(names) == 1 else ''} like secrets: a "
                   "plain value shows in `docker run`'s argv (ps on every host), --dry-run, renders and the run's "
                   "attempts.jsonl; put them in a file named by container.env_files (its lines go through "
                   "--env-file; renders refer to the file, or use the target's secrets)", err=True)


def load(kw: dict, command: tuple[str, ...] = (), infiniband: str | None = None, log_dir: str | None = None):
    """The config from the file and the command's flags (popped from `kw`); `log_dir`: the command's --log-dir,
    which the commands it prints repeat (job/invocation.py)."""
    ov = Overrides(  # a command declares only the options it uses (target_options, job_ref_options, ...)
        hosts=kw.pop("hosts", None), image=kw.pop("image", None), nproc_per_node=kw.pop("nproc_per_node", None),
        master_port=kw.pop("master_port", None), mounts=list(kw.pop("mounts", ())), env=list(kw.pop("env", ())),
        name=kw.pop("name", None), command=list(command) or None,
        diagnostics=False if kw.pop("no_diagnostics", False) else None,
        offline=True if kw.pop("offline", False) else None, push=True if kw.pop("push", False) else None,
        infiniband=infiniband,
        max_restarts=kw.pop("max_restarts", None), hang_timeout=kw.pop("hang_timeout", None),
        spares=kw.pop("spares", None),
    )
    return load_config(kw.pop("config_path", None), ov, log_dir=log_dir)


# The signals that stopped this run, in order. An exception raised by a signal handler can land inside
# threading's own lock handling (Condition.wait re-acquiring its lock) and come out as "RuntimeError: release
# unlocked lock" instead of itself; main() then still knows the run was stopped, and why.
_SIGNALLED: list[int] = []


def _shutting_down(signum: int) -> bool:
    """Notes the signal; True when an earlier one already stopped the run. Only the first signal raises: the
    cleanup it started (a teardown on every host, a push's loads) and main()'s one line run to their end, whatever
    follows. A signal often comes twice (coreutils' `timeout` signals the command and then its process group; a
    double Ctrl-C; a supervisor that signals again): raised again mid-cleanup, it ended in a traceback."""
    stopping = bool(_SIGNALLED)
    _SIGNALLED.append(signum)
    return stopping


def _terminate(signum, frame) -> None:
    if not _shutting_down(signum):
        raise Terminated(signum)


def _interrupt(signum, frame) -> None:
    if not _shutting_down(signum):
        raise KeyboardInterrupt


def _ignore_later_signals() -> None:
    """At the very end of a run a signal stopped: once Python's handlers are gone (interpreter shutdown puts the
    default disposition back), a late copy of the signal would kill the process, and the exit status would be the
    signal's death instead of 128+N. Nothing is started after this (an ignored signal is inherited)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(s) in (_terminate, _interrupt):
            signal.signal(s, signal.SIG_IGN)


class _HostTextFormatter(logging.Formatter):
    """Library code logs what hosts said (sim, build, fetch): shown as text, never as terminal controls."""

    def format(self, record: logging.LogRecord) -> str:
        from dockerlaunch.cli.console import host_text

        return host_text(super().format(record), newlines=True)


def main(argv: list[str] | None = None) -> None:
    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands

    # progress that library code logs (sim, build, fetch) is shown here, on stderr; paramiko's own logging is not
    log = logging.getLogger("dockerlaunch")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_HostTextFormatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    # paramiko's transport thread logs every failed handshake (a banner cut by MaxStartups, a reset) at ERROR with
    # a traceback, which Python prints on stderr when no handler is set: dockerlaunch says it once, in one line
    paramiko_log = logging.getLogger("paramiko")
    if not paramiko_log.handlers:
        paramiko_log.addHandler(logging.NullHandler())
        paramiko_log.propagate = False
    # SIGTERM and SIGHUP (a closed terminal or SSH session) stop a command the way Ctrl-C does: in the main
    # thread, at once, with every cleanup of the phase it is in; a later signal is only noted (_shutting_down)
    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # left alone where a runner ignores it
        signal.signal(signal.SIGINT, _interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup a closed terminal must not stop it
        signal.signal(signal.SIGHUP, _terminate)
    try:
        _run(argv)
    finally:
        if _SIGNALLED:  # stopped by a signal: the exit status is its own, whatever comes later
            _ignore_later_signals()


def _run(argv: list[str] | None) -> None:
    """The command, and the one place its errors and its stop by a signal become a line and an exit status."""
    try:
        cli.main(args=argv, prog_name="dockerlaunch", standalone_mode=False)
    except DockerlaunchError as e:
        from dockerlaunch.cli.console import host_text

        # a HostError quotes the host's own output: shown as text, never as terminal controls
        for line in str(e).splitlines() or [""]:  # several refusals at once: each its own `error:` line
            click.echo(f"error: {host_text(line)}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort as e:  # click turns Ctrl-C into Abort (after a line feed off the terminal's ^C)
        click.echo("interrupted" if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt) else "aborted",
                   err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Terminated as e:
        click.echo(f"terminated ({signal.Signals(e.signum).name})", err=True)
        sys.exit(e.exit_code)
    except Exception:
        if not _SIGNALLED:
            raise
        signum = _SIGNALLED[0]  # the signal's exception, turned into another on its way out (see _SIGNALLED)
        if signum == signal.SIGINT:
            click.echo("interrupted", err=True)
            sys.exit(130)
        click.echo(f"terminated ({signal.Signals(signum).name})", err=True)
        sys.exit(128 + signum)
    sys.exit(0)
