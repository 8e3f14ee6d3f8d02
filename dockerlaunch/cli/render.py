"""`dockerlaunch render`: the same checked job as compose files, Kubernetes objects or sbatch scripts."""

from __future__ import annotations

from pathlib import Path

import click

from dockerlaunch.cli.main import (
    CONTEXT,
    cli,
    config_options,
    diagnostics_option,
    load,
    offline_option,
    warn_secret_env,
)
from dockerlaunch.errors import ConfigError

TARGETS = ("compose", "k8s", "jobset", "slurm")


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


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@config_options
@click.option("--to", "target", type=click.Choice(TARGETS), required=True,
              help="compose: a file per node; k8s: Indexed Job + headless Service; jobset: a JobSet; "
                   "slurm: sbatch scripts (pyxis and plain Docker).")
@click.option("--out", metavar="DIR", help="Write the files here (a new or empty folder); default: print them.")
@click.option("--force", is_flag=True, help="With --out: write into a folder that is not empty.")
@click.option("--nodes", type=click.IntRange(1, 4096), help="k8s/jobset/slurm: the number of nodes, instead of "
              "--hosts (the scheduler picks them).")
@click.option("--infiniband", type=click.Choice(["on", "off"]), help="Set container.infiniband (auto is decided "
              "per host at launch, which only `up` and --probe can do).")
@click.option("--probe", is_flag=True, help="compose: ask each host for its values (NIC, GPUs, InfiniBand) over "
              "SSH, as `up` does, instead of leaving them to the host.")
@click.option("--host-network", is_flag=True, help="k8s/jobset: pods on the nodes' network (hostNetwork).")
@click.option("--rdma-resource", metavar="NAME", help="k8s/jobset: the extended resource that gives a pod RDMA "
              "devices (default rdma/rdma_shared_device_a).")
@click.option("--namespace", metavar="NS", help="k8s/jobset: metadata.namespace of the objects.")
@diagnostics_option
@offline_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def render(target: str, out: str | None, force: bool, nodes: int | None, infiniband: str | None, probe: bool,
           host_network: bool, rdma_resource: str | None, namespace: str | None, command: tuple[str, ...],
           **kw) -> None:
    """Render the job `up` would run for another launcher. Put the training command after `--`.

    The same plan as `up --dry-run` (flags, env, mounts, GPUs, InfiniBand, rank variables); values only a host
    knows become the target's own mechanism (NODE_RANK from the Job's completion index or SLURM_NODEID, ...).
    Whatever the target cannot express is refused in one line, never silently dropped.
    """
    from dockerlaunch.backends import RenderedFile  # noqa: F401 - the files' type
    from dockerlaunch.backends.docker import launch

    if nodes is not None:
        if kw.get("hosts"):
            raise ConfigError("render: give --nodes or --hosts, not both")
        if target == "compose":
            raise ConfigError("render --to compose: a file per host: give --hosts (--nodes is for schedulers)")
        kw["hosts"] = [f"node{i}" for i in range(nodes)]
    if probe and target != "compose":
        raise ConfigError(f"render --to {target}: --probe is for compose (the scheduler picks {target}'s nodes)")
    cfg = load(kw, command, infiniband=infiniband)
    warn_secret_env(cfg)
    launch.read_env_files(cfg)  # a missing secret file fails here as in `up` (its contents are never rendered)
    plan = launch.plan_job(cfg)
    if probe:
        plan = launch.probed_plan(cfg, plan)
    files = _render(plan, target, k8s_options(host_network, rdma_resource, namespace))
    if out:
        for path in write_files(files, Path(out), force):
            click.echo(str(path))
        return
    for f in files:
        click.echo(f"# ---- {f.name}")
        click.echo(f.text.rstrip("\n"))


def k8s_options(host_network: bool, rdma_resource: str | None, namespace: str | None):
    from dockerlaunch.backends.kubernetes import render as k8s

    if namespace is not None and not k8s.DNS_LABEL.match(namespace):
        raise ConfigError(f"--namespace {namespace!r}: a Kubernetes namespace is a DNS label (a-z, 0-9, '-')")
    if rdma_resource is not None and not k8s.RESOURCE_NAME.match(rdma_resource):
        raise ConfigError(f"--rdma-resource {rdma_resource!r}: an extended resource is DOMAIN/NAME, "
                          "e.g. rdma/rdma_shared_device_a")
    return k8s.Options(host_network=host_network, rdma_resource=rdma_resource or k8s.RDMA_RESOURCE,
                       namespace=namespace)


def _render(plan, target: str, k8s_opts):
    if target == "compose":
        from dockerlaunch.backends.compose import render as compose

        return compose.render(plan)
    if target in ("k8s", "jobset"):
        from dockerlaunch.backends.kubernetes import render as k8s

        return k8s.render(plan, target, k8s_opts)
    from dockerlaunch.backends.slurm import render as slurm

    return slurm.render(plan)
