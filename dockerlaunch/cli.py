"""Command line: parse flags, call the planning/apply layers, print results. No logic of its own."""

from __future__ import annotations

import json
import shlex
import sys

import click
import yaml

from dockerlaunch import __version__
from dockerlaunch.config import Overrides, config_schema, load_config
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.plan import ClusterPlan, make_plan
from dockerlaunch.ssh import load_ssh_config

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="dockerlaunch")
def cli() -> None:
    """Build pinned LLM-training images and launch them across GPU hosts over SSH."""


# ---------------------------------------------------------------- shared options


def _split_hosts(ctx, param, value):
    if value is None:
        return None
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        raise click.BadParameter("give at least one host, e.g. --hosts h1,h2")
    return hosts


def config_options(f):
    """Flags that override the config file; shared by every command that reads it."""
    opts = [
        click.option("--config", "config_path", metavar="PATH", help="Cluster config (default ./dockerlaunch.yaml)."),
        click.option("--hosts", callback=_split_hosts, metavar="H1,H2", help="Hosts, rank 0 first: [user@]host[:port]."),
        click.option("--image", metavar="IMAGE", help="Job image."),
        click.option("--nproc-per-node", type=click.IntRange(1, 1024), help="Processes per host."),
        click.option("--master-port", type=click.IntRange(1, 65535), help="Rendezvous port on host 0."),
        click.option("--mount", "mounts", multiple=True, metavar="SRC:DST[:ro]", help="Extra mount (repeatable)."),
        click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="Extra env (repeatable; no secrets)."),
        click.option("--name", metavar="NAME", help="Job name (containers are NAME-RANK)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _load(kw: dict, command: tuple[str, ...] = ()):
    ov = Overrides(
        hosts=kw.pop("hosts"), image=kw.pop("image"), nproc_per_node=kw.pop("nproc_per_node"),
        master_port=kw.pop("master_port"), mounts=list(kw.pop("mounts")), env=list(kw.pop("env")),
        name=kw.pop("name"), command=list(command) or None,
    )
    return load_config(kw.pop("config_path"), ov)


# ---------------------------------------------------------------- commands


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
    cfg = _load(kw)
    data = cfg.model_dump(mode="json")
    click.echo(json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--dry-run", is_flag=True, help="Print the per-host plan; contact no host.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True, help="For --dry-run.")
@click.option("--detach", is_flag=True, help="Return once every container has started.")
@click.option("--skip-preflight", is_flag=True, help="Do not run the doctor checks first.")
@click.option("--keep", is_flag=True, help="Keep the containers after the job ends (inspect, then `down`).")
@click.option("--log-dir", default="dockerlaunch-logs", show_default=True, metavar="DIR",
              help="Per-host log files go to DIR/<job>-<time>/.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def up(dry_run: bool, output: str, detach: bool, skip_preflight: bool, keep: bool, log_dir: str,
       command: tuple[str, ...], **kw) -> None:
    """Start the job: one container per host. Put the training command after `--`.

    Checks every host first (see `doctor`), then starts the containers concurrently, streams their
    logs, and stops every container on every host as soon as one rank fails or on Ctrl-C.
    """
    cfg = _load(kw, command)
    plan = make_plan(cfg, ssh_config=load_ssh_config(cfg.ssh.config_file))
    if dry_run:
        click.echo(json.dumps(plan.to_dict(), indent=2) if output == "json" else render_plan(plan))
        return
    from dockerlaunch import launch

    sys.exit(launch.up(cfg, detach=detach, keep=keep, preflight=not skip_preflight, log_dir=log_dir or None))


@cli.command()
@config_options
def doctor(**kw) -> None:
    """Pre-flight checks on every host; exits 1 if any check FAILs."""
    from dockerlaunch import doctor as doctorlib
    from dockerlaunch.launch import _console

    cfg = _load(kw)
    if not cfg.image:
        raise DockerlaunchError("doctor needs the job image: pass --image IMAGE or set image:")
    report = doctorlib.doctor(cfg)
    doctorlib.print_report(report, _console())
    sys.exit(1 if report.failed else 0)


@cli.command()
@config_options
def down(**kw) -> None:
    """Stop and remove the job's containers on every host."""
    from dockerlaunch import launch

    sys.exit(launch.down(_load(kw)))


@cli.command()
@config_options
def status(**kw) -> None:
    """The job's containers per host: state, exit code, since when."""
    from dockerlaunch import launch

    sys.exit(launch.status(_load(kw)))


@cli.command()
@config_options
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the containers exit.")
@click.option("--rank", type=int, help="Only this rank.")
@click.option("--tail", default="all", show_default=True, help="Lines from the end of each log.")
def logs(follow: bool, rank: int | None, tail: str, **kw) -> None:
    """Show the job's logs, prefixed by rank and host."""
    from dockerlaunch import launch

    sys.exit(launch.logs(_load(kw), rank=rank, follow=follow, tail=tail))


@cli.command("exec", context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--rank", type=int, required=True, help="Which rank's container.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_cmd(rank: int, command: tuple[str, ...], **kw) -> None:
    """Run a command in one rank's container, e.g. `exec --rank 1 -- py-spy dump --pid 1`."""
    from dockerlaunch import launch

    sys.exit(launch.exec_in(_load(kw), rank, list(command)))


def format_argv(argv: list[str], n_command: int) -> str:
    """`docker run|build` argv as a copy-pasteable shell command, one flag (and its value) per line.

    The last `n_command + 1` tokens (image and command, or the build context) share the final line.
    """
    tail = len(argv) - n_command - 1
    lines: list[list[str]] = [argv[:2]]
    for tok in argv[2:tail]:
        if len(lines) > 1 and len(lines[-1]) == 1 and lines[-1][0].startswith("-") and not tok.startswith("-") \
                and "=" not in lines[-1][0]:
            lines[-1].append(tok)  # the flag's value
        else:
            lines.append([tok])
    lines.append(argv[tail:])
    return " \\\n    ".join(shlex.join(parts) for parts in lines)


def render_plan(plan: ClusterPlan) -> str:
    out = [
        f"Plan for job {plan.job!r}: {plan.nnodes} host(s), image {plan.image}, "
        f"MASTER_ADDR={plan.master_addr} MASTER_PORT={plan.master_port}",
    ]
    for h in plan.hosts:
        out.append("")
        out.append(f"# rank {h.rank}: {h.address}  (ssh {h.ssh.describe()}; {h.nproc_per_node} process(es))")
        out.append(format_argv(h.container.argv(), len(h.container.command)))
    pending = plan.unresolved()
    out.append("")
    if pending:
        out.append(f"{len(pending)} value(s) are resolved on the hosts at launch (shown as <resolved at launch: ...>).")
    out.append("Dry run: no host was contacted.")
    return "\n".join(out)


# ---------------------------------------------------------------- stacks and images


@cli.group(context_settings=CONTEXT)
def stacks() -> None:
    """The pinned stack matrix (Dockerfiles/stacks.yaml)."""


@stacks.command("list")
def stacks_list() -> None:
    """One line per stack: name, image tag, key pins."""
    from dockerlaunch.stacks import load_matrix

    for s in load_matrix().stacks.values():
        te = f" te {s.transformer_engine}" if s.transformer_engine else ""
        click.echo(f"{s.name:<26} torch {s.torch}{te} mcore {s.megatron_core} swift {s.ms_swift}  {s.tag}")


@stacks.command("show")
@click.argument("name")
def stacks_show(name: str) -> None:
    """Every pin of one stack, and its image tag."""
    from dockerlaunch.stacks import load_matrix

    s = load_matrix().get(name)
    click.echo(yaml.safe_dump({"name": s.name, "tag": s.tag, **s.model_dump(mode="json", exclude_none=True,
                                                                          exclude={"name"})}, sort_keys=False).rstrip())


@stacks.command("check")
def stacks_check() -> None:
    """Evaluate every compatibility rule on every stack; exit 1 on any error-level violation."""
    from dockerlaunch.constraints import RULES, check_stack
    from dockerlaunch.stacks import load_matrix

    matrix = load_matrix()
    errors = 0
    for s in matrix.stacks.values():
        for v in check_stack(s):
            errors += v.rule.severity == "error"
            click.echo(f"{v.rule.severity.upper():5} {v.line()}")
    click.echo(f"stacks check: {len(matrix.stacks)} stacks x {len(RULES)} rules, {errors} error(s)")
    sys.exit(1 if errors else 0)


def _build_options(kw: dict):
    from dockerlaunch.build import BuildOptions

    return BuildOptions(tag=kw["tag"], base_image=kw["base_image"], ca_cert=kw["ca_cert"],
                        pip_index_url=kw["pip_index_url"], wheelhouse=kw["wheelhouse"], offline=kw["offline"],
                        no_cache=kw["no_cache"], max_jobs=kw["max_jobs"], force=kw["force"])


@cli.command()
@click.option("--stack", "stack_name", required=True, help="A stack from `dockerlaunch stacks list`.")
@click.option("--tag", help="Image tag (default: one that encodes the stack).")
@click.option("--base-image", metavar="REF", help="Override the stack's base image (e.g. a local mirror).")
@click.option("--ca-cert", metavar="PATH", help="CA bundle for pip behind an intercepting proxy (a build secret).")
@click.option("--pip-index-url", metavar="URL", help="Package index (a build secret: may hold credentials).")
@click.option("--wheelhouse", metavar="DIR", help="Wheels from `dockerlaunch fetch`.")
@click.option("--offline", is_flag=True, help="No network for Python packages: install from --wheelhouse only.")
@click.option("--no-cache", is_flag=True)
@click.option("--max-jobs", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Parallel compile jobs (flash-attn needs ~9 GB RAM each).")
@click.option("--force", is_flag=True, help="Build even if the stack violates a compatibility rule.")
@click.option("--dry-run", is_flag=True, help="Print the docker build command; build nothing.")
def build(stack_name: str, dry_run: bool, **kw) -> None:
    """Build a stack's image, then verify it (imports, versions vs pins)."""
    from dockerlaunch import build as buildlib
    from dockerlaunch.stacks import load_matrix

    stack = load_matrix().get(stack_name)
    opts = _build_options(kw)
    if dry_run:
        click.echo(format_argv(buildlib.render_build(stack, opts), 0))
        return
    code, _ = buildlib.build(stack, opts)
    sys.exit(code)


@cli.command()
@click.option("--stack", "stack_name", required=True)
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR", help="Wheelhouse folder (one subfolder per layer).")
def fetch(stack_name: str, out_dir: str) -> None:
    """Download every wheel and source archive a stack needs, for `build --wheelhouse DIR --offline`."""
    from pathlib import Path

    from dockerlaunch import build as buildlib
    from dockerlaunch.stacks import load_matrix

    counts = buildlib.fetch(load_matrix().get(stack_name), Path(out_dir))
    for layer, n in counts.items():
        click.echo(f"{layer:<12} {n} file(s)")


@cli.command()
@click.argument("image")
@click.option("--gpus", is_flag=True, help="Run the checks with --gpus all (CUDA images on a GPU host).")
def verify(image: str, gpus: bool) -> None:
    """Import every component the image's stack declares and compare versions with its pinned labels."""
    from dockerlaunch import build as buildlib

    report = buildlib.verify(image, gpus=gpus)
    click.echo(report.render())
    sys.exit(0 if report.ok else 1)


# ---------------------------------------------------------------- image distribution


def _connect_each(cfg):
    """(addresses, remotes): remotes[i] is host i's Remote or the error that kept it from connecting."""
    from dockerlaunch.ssh import connect_each, resolve_target

    ssh_config = load_ssh_config(cfg.ssh.config_file)
    targets = [resolve_target(h, cfg.ssh, ssh_config) for h in cfg.hosts]
    return [h.address for h in cfg.hosts], connect_each(targets)


def _took(seconds: float, stream_seconds: float) -> str:
    """Total time, and how much of it the stream took (the rest is docker load applying layers)."""
    if not seconds:
        return ""
    return f"{seconds:.1f}s (stream {stream_seconds:.1f}s)" if stream_seconds else f"{seconds:.1f}s"


def _summary(results) -> int:
    from rich.table import Table

    from dockerlaunch.launch import _console

    table = Table("host", "result", "sent", "time", "detail", box=None)
    for r in results:
        style = {"failed": "bold red", "skipped": "dim"}.get(r.status, "green")
        table.add_row(r.host, f"[{style}]{r.status}[/]", f"{r.bytes_sent / 1e6:.0f} MB" if r.bytes_sent else "",
                      _took(r.seconds, r.stream_seconds), r.detail)
    _console().print(table)
    return 1 if any(r.status == "failed" for r in results) else 0


@cli.command()
@click.argument("ref", metavar="IMAGE")
@config_options
@click.option("--compress", type=click.Choice(["auto", "zstd", "none"]), default="auto", show_default=True,
              help="auto: zstd where the host has it.")
@click.option("--thin/--full", default=True, show_default=True,
              help="Send only the layers a host lacks (docker load skips layers it has).")
@click.option("--strategy", type=click.Choice(["auto", "star", "chain"]), default="auto", show_default=True,
              help="star: the launcher streams to each host; chain: each host relays to the next over TCP "
                   "(every link carries one copy); auto: chain for 3+ hosts.")
def push(ref: str, compress: str, thin: bool, strategy: str, **kw) -> None:
    """Copy a local image to every host over SSH (no registry); skips hosts that already have it."""
    from dockerlaunch import distribute
    from dockerlaunch.distribute import HostResult
    from dockerlaunch.sim import engine

    kw["image"] = ref
    cfg = _load(kw)
    client = engine()
    distribute.local_image(client, ref)  # a clear error before any connection
    addresses, remotes = _connect_each(cfg)
    live = [r for r in remotes if not isinstance(r, BaseException)]
    results = [HostResult(address, "failed", str(r)) for address, r in zip(addresses, remotes)
               if isinstance(r, BaseException)]
    try:
        results += distribute.push(client, live, ref, compress, thin=thin, strategy=strategy)
    finally:
        for r in live:
            r.close()
    sys.exit(_summary(results))


@cli.command()
@click.argument("images", nargs=-1, required=True)
@click.option("-o", "--output", "out", required=True, metavar="FILE", help="Bundle file (zstd tar).")
def save(images: tuple[str, ...], out: str) -> None:
    """Write local images to one bundle file (zstd tar + manifest with Image IDs and sha256)."""
    from pathlib import Path

    from dockerlaunch import distribute
    from dockerlaunch.sim import engine

    bundle = distribute.save_bundle(engine(), list(images), Path(out))
    for e in bundle.images:
        click.echo(f"{e.ref}  {e.id[7:19]}  {e.bytes / 1e6:.0f} MB  sha256 {e.sha256[:12]}")
    click.echo(f"wrote {out} ({Path(out).stat().st_size / 1e6:.0f} MB)")


@cli.command()
@click.argument("bundle")
@click.option("--config", "config_path", metavar="PATH", help="Cluster config, for --hosts' SSH settings.")
@click.option("--hosts", callback=_split_hosts, metavar="H1,H2", help="Load onto these hosts (default: locally).")
def load(bundle: str, config_path: str | None, hosts: list[str] | None) -> None:
    """Load a bundle locally or onto hosts, checking sha256 and Image IDs before tagging."""
    from pathlib import Path

    from dockerlaunch import distribute
    from dockerlaunch.config import Overrides, load_config
    from dockerlaunch.distribute import HostResult

    path = Path(bundle)
    if not path.is_file():
        raise DockerlaunchError(f"bundle {bundle} does not exist")
    if not hosts and not config_path:
        for e in distribute.load_bundle(path, distribute.local_loader(), distribute.local_runner):
            click.echo(f"loaded {e.ref} ({e.id[7:19]})")
        return
    cfg = load_config(config_path, Overrides(hosts=hosts))
    addresses, remotes = _connect_each(cfg)
    results = []
    for address, r in zip(addresses, remotes):
        if isinstance(r, BaseException):
            results.append(HostResult(address, "failed", str(r)))
            continue
        try:
            entries = distribute.load_bundle(path, distribute.remote_loader(r), distribute.remote_runner(r),
                                             where=f"host {address}")
            results.append(HostResult(address, "loaded", ", ".join(e.ref for e in entries)))
        except DockerlaunchError as e:
            results.append(HostResult(address, "failed", str(e)))
        finally:
            r.close()
    sys.exit(_summary(results))


# ---------------------------------------------------------------- simulated cluster



@cli.group(context_settings=CONTEXT)
def sim() -> None:
    """A simulated cluster on this machine: containers with sshd + dockerd, to rehearse launches."""


@sim.command("up")
@click.option("--nodes", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--name", "cluster", default="dlsim", show_default=True, help="Cluster name (prefix of every object).")
@click.option("--subnet", default="172.30.0.0/24", show_default=True, help="Private bridge subnet; node1 is .11.")
@click.option("--config-out", metavar="FILE", help="Write the cluster config here (default: in the state dir).")
@click.option("--base-image", metavar="REF", help="Debian bookworm image to build nodes from.")
@click.option("--egress-rate", metavar="RATE", help="Shape each node's egress, tc units (e.g. 200mbit).")
@click.option("--seed-image", "seed_images", multiple=True, metavar="IMAGE", help="Preload a local image into every node.")
def sim_up(**kw) -> None:
    """Start N nodes; write a cluster config that `--config FILE` uses directly."""
    from dockerlaunch import sim as simlib

    path = simlib.up(
        nodes=kw["nodes"], cluster=kw["cluster"], subnet=kw["subnet"], config_out=kw["config_out"],
        base_image=kw["base_image"], egress_rate=kw["egress_rate"], seed_images=kw["seed_images"],
    )
    click.echo(str(path))


@sim.command("demo-image")
@click.option("--base-image", metavar="REF", help="Debian bookworm image to build from.")
@click.option("--wheelhouse", metavar="DIR", help="Use these wheels instead of downloading torch and its deps.")
def sim_demo_image(base_image: str | None, wheelhouse: str | None) -> None:
    """Build the demo job image (torch CPU + a gloo all_reduce) offline from a wheelhouse; print its tag."""
    from pathlib import Path

    from dockerlaunch import sim as simlib

    click.echo(simlib.build_demo_image(base_image, Path(wheelhouse) if wheelhouse else None))


@sim.command("down")
@click.option("--name", "cluster", default="dlsim", show_default=True)
def sim_down(cluster: str) -> None:
    """Remove the nodes, their network and volumes."""
    from dockerlaunch import sim as simlib

    simlib.down(cluster)


@sim.command("status")
@click.option("--name", "cluster", default=None, help="Only this cluster (default: all).")
def sim_status(cluster: str | None) -> None:
    """List sim nodes."""
    from rich.console import Console
    from rich.table import Table

    from dockerlaunch import sim as simlib

    rows = simlib.status(cluster)
    if not rows:
        click.echo("no sim nodes")
        return
    table = Table("cluster", "node", "ip", "state", "image", box=None)
    for r in rows:
        table.add_row(r["cluster"], r["node"], r["ip"], r["state"], r["image"])
    Console().print(table)


@sim.command("shape")
@click.option("--name", "cluster", default="dlsim", show_default=True)
@click.option("--rate", metavar="RATE", help="Egress rate in tc units (e.g. 200mbit).")
@click.option("--off", is_flag=True, help="Remove shaping.")
@click.option("--node", "nodes", multiple=True, type=int, help="Only these node numbers (1-based).")
def sim_shape(cluster: str, rate: str | None, off: bool, nodes: tuple[int, ...]) -> None:
    """Shape each node's egress bandwidth (token bucket on eth0), for benchmarks."""
    from dockerlaunch import sim as simlib

    if bool(rate) == off:
        raise click.UsageError("give exactly one of --rate RATE or --off")
    simlib.shape(cluster, None if off else rate, list(nodes) or None)


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="dockerlaunch", standalone_mode=False)
    except DockerlaunchError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(0)
