"""`dockerlaunch render`: the same checked job as compose files, Kubernetes objects or sbatch scripts."""

from __future__ import annotations

from pathlib import Path

import click

from dockerlaunch.backends import renderers
from dockerlaunch.backends.refusals import with_header
from dockerlaunch.cli.main import (
    CONTEXT,
    SectionedCommand,
    cli,
    config_options,
    diagnostics_option,
    load,
    offline_option,
    warn_secret_env,
)
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.load import NoHostsError


def _per_host() -> list[str]:
    return [t.name for t in renderers.TARGETS if t.per_host]


def _scheduled() -> list[str]:
    return [t.name for t in renderers.TARGETS if not t.per_host]



def write_files(files, out: Path, force: bool) -> list[Path]:
    """Into `out`, which must be new or empty (or `force`): a render never mixes with other files silently."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {out}: the folder is not empty; pick a new one or pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for f in files:
        path = out / f.name
        path.write_text(f.text)
        path.chmod(0o755 if f.executable else 0o644)
        written.append(path)
    return written


def _dropped(to, cfg, options, dropping):
    """The config without the fields --drop names, and their WARN lines: a field is dropped only where this
    render refuses it (asked of the unprobed plan: what a probe settles is never a dropped field)."""
    from dockerlaunch.backends import Unsupported
    from dockerlaunch.backends.refusals import drop_fields, refused
    from dockerlaunch.hosts.targets import resolve_all
    from dockerlaunch.job.plan import plan_job

    try:
        to.render(plan_job(cfg, resolve_all(cfg)), options)
        found: list[Unsupported] = []
    except Unsupported as e:
        found = refused(e)
    return drop_fields(cfg, dropping, found, to.name)


def _target_flags(f):
    """Every target's own flags (backends/renderers.py), in the order of renderers.TARGETS."""
    for flag in reversed(renderers.all_flags()):
        f = click.option(f"--{flag.name}", flag.key, is_flag=flag.is_flag, metavar=flag.metavar, help=flag.help)(f)
    return f


def _sections() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`render --help`'s headings; every target's own flags go under Target (a new target's too)."""
    return (
        ("Job", ("config_path", "hosts", "name", "image", "nproc_per_node", "master_port", "mounts", "env", "offline",
                 "no_diagnostics", "infiniband")),
        ("Target", ("target", "nodes", "probe", "drops", *(f.key for f in renderers.all_flags()))),
        ("Output", ("out", "force", "help")),
    )


@cli.command(cls=SectionedCommand, sections=_sections(), context_settings={**CONTEXT, "allow_interspersed_args": False},
             epilog="Targets: " + "; ".join(f"{t.name}: {t.summary}" for t in renderers.TARGETS) + ".")
@config_options
@click.option("--to", "target", type=click.Choice(renderers.names()), required=True, metavar="TARGET",
              help=f"{', '.join(renderers.names())} (below).")
@click.option("--out", metavar="DIR", help="Write the files into a new or empty DIR.")
@click.option("--force", is_flag=True, help="With --out: a DIR that is not empty.")
@click.option("--nodes", type=click.IntRange(1, 4096), metavar="N",
              help=f"Nodes for {'/'.join(_scheduled())} (not --hosts).")
@click.option("--infiniband", type=click.Choice(["on", "off"]), help="Set container.infiniband (not auto).")
@click.option("--probe", is_flag=True, help=f"{'/'.join(_per_host())}: ask the hosts their values, as `up` does.")
@click.option("--drop", "drops", multiple=True, metavar="FIELD",
              help="Leave out a field the target refuses (repeatable).")
@_target_flags
@diagnostics_option
@offline_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def render(target: str, out: str | None, force: bool, nodes: int | None, infiniband: str | None, probe: bool,
           drops: tuple[str, ...], command: tuple[str, ...], **kw) -> None:
    """Render the job `up` would run for another launcher; the training command goes after `--`.

    The same plan as `up --dry-run`; what only a host knows becomes the target's own mechanism. What a target
    cannot express is refused in one line (--drop FIELD leaves it out, said in each file's header).
    """
    from dockerlaunch.backends.docker.secret_env import read_env_files
    from dockerlaunch.backends.docker.session import probed_plan
    from dockerlaunch.backends.refusals import drop_named
    from dockerlaunch.hosts.targets import resolve_all
    from dockerlaunch.job.plan import plan_job

    to = renderers.get(target)
    values = {f.key: kw.pop(f.key) for f in renderers.all_flags()}
    if nodes is not None:
        if kw.get("hosts"):
            raise ConfigError("render: give --nodes or --hosts, not both")
        if to.per_host:
            raise ConfigError(f"render --to {target}: a file per host: give --hosts (--nodes is for schedulers)")
        kw["hosts"] = [f"node{i}" for i in range(nodes)]
    if probe and not to.per_host:
        raise ConfigError(f"render --to {target}: --probe is for {', '.join(_per_host())} (the scheduler picks "
                          f"{target}'s nodes)")
    dropping = list({d.field: d for d in map(drop_named, drops)}.values())  # a bad name fails before anything
    foreign = renderers.foreign_flags(to, values)
    if foreign:
        raise ConfigError(f"render --to {target}: {foreign[0]}")
    try:
        cfg = load(kw, command, infiniband=infiniband)
    except NoHostsError as e:
        if to.per_host:
            raise
        where = f" ({e.source} lists no hosts)" if e.source else ""
        raise ConfigError(f"render --to {target} needs the number of nodes{where}: pass --nodes N") from None
    warn_secret_env(cfg)
    read_env_files(cfg)  # a missing secret file fails here as in `up` (its contents are never rendered)
    options = to.options(values)
    warns: list[str] = []
    if dropping:
        cfg, warns = _dropped(to, cfg, options, dropping)
    targets = resolve_all(cfg)  # once: the plan's and, with --probe, the connections'
    plan = plan_job(cfg, targets)
    if probe:
        plan = probed_plan(cfg, plan, targets)
    files = with_header(to.render(plan, options), warns)
    if out:
        for line in warns:
            click.echo(line.lstrip("# "), err=True)
        for path in write_files(files, Path(out), force):
            click.echo(str(path))
        return
    for f in files:
        click.echo(f"# ---- {f.name}")
        click.echo(f.text.rstrip("\n"))
