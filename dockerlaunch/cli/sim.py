"""`dockerlaunch sim`: a simulated cluster on this machine, to rehearse launches for real."""

from __future__ import annotations

import click

from dockerlaunch.cli.console import print_table
from dockerlaunch.cli.main import CONTEXT, cli


@cli.group(context_settings=CONTEXT)
def sim() -> None:
    """A simulated cluster on this machine: containers with sshd + dockerd, to rehearse launches."""


@sim.command("up")
@click.option("--nodes", type=click.IntRange(1, 512), default=None,
              help="Number of nodes, at most 64, or 512 with --light [default: one per --engines entry, else 2].")
@click.option("--name", "cluster", default="dlsim", show_default=True, help="Cluster name (prefix of every object).")
@click.option("--subnet", default=None,
              help="Private bridge subnet; node1 is .11 [default: 172.30.0.0/24, with --light 172.28.0.0/22].")
@click.option("--light", is_flag=True,
              help="Light hosts: each runs only sshd (own IP, host key, OpenSSH's default limits) and its docker "
                   "CLI drives one of a few shared engine containers; for hundreds of hosts on one machine.")
@click.option("--light-engines", type=click.IntRange(1, 64), default=None, metavar="E",
              help="Engine containers of a --light cluster; host i uses engine ((i-1) % E) + 1 "
                   "[default: one per 32 hosts, at most 8].")
@click.option("--config-out", metavar="FILE", help="Write the cluster config here (default: in the state dir).")
@click.option("--base-image", metavar="REF", help="Debian bookworm image to build the 20.10 nodes from.")
@click.option("--engines", "engines", metavar="LIST",
              help="Docker engine of each node, one per node: 20.10 (Debian 12), 26 (Debian 13), 28 (Debian "
                   "sid), 28-containerd (28 with the containerd image store) [default: 20.10].")
@click.option("--engine", "engine", metavar="KIND", help="One engine kind for every node (see --engines).")
@click.option("--egress-rate", metavar="RATE", help="Shape each node's egress, tc units (e.g. 200mbit).")
@click.option("--seed-image", "seed_images", multiple=True, metavar="IMAGE",
              help="Preload a local image into every node.")
@click.option("--slurm", is_flag=True,
              help="Also run Slurm (Debian's slurm-wlm + munge): slurmctld on node1, slurmd on every node.")
def sim_up(**kw) -> None:
    """Start N nodes; write a cluster config that `--config FILE` uses directly."""
    from dockerlaunch import sim as simlib

    if kw["engines"] and kw["engine"]:
        raise click.UsageError("give --engines (one per node) or --engine (all nodes), not both")
    if not kw["light"] and (kw["nodes"] or 0) > simlib.MAX_NODES:
        raise click.UsageError(f"--nodes {kw['nodes']}: at most {simlib.MAX_NODES} regular nodes (each runs a "
                               f"dockerd); --light gives up to {simlib.MAX_LIGHT_NODES} hosts")
    if kw["light_engines"] is not None and not kw["light"]:
        raise click.UsageError("--light-engines is for light clusters: add --light")
    path = simlib.create(
        nodes=kw["nodes"], cluster=kw["cluster"], subnet=kw["subnet"], config_out=kw["config_out"],
        base_image=kw["base_image"], egress_rate=kw["egress_rate"], seed_images=kw["seed_images"],
        slurm=kw["slurm"], engines=kw["engines"] or kw["engine"], light=kw["light"],
        light_engines=kw["light_engines"],
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

    simlib.remove(cluster)


@sim.command("status")
@click.option("--name", "cluster", default=None, help="Only this cluster (default: all).")
def sim_status(cluster: str | None) -> None:
    """List sim nodes (and a light cluster's engines; a light host's engine column names the one serving it)."""
    from dockerlaunch import sim as simlib

    rows = simlib.inventory(cluster)
    if not rows:
        click.echo("no sim nodes")
        return
    headers = ["cluster", "node", "ip", "state", "engine", "store", "image"]
    if any(r["slurm"] != "-" for r in rows):  # the column only where a cluster runs Slurm
        headers.append("slurm")
    print_table(headers, [[r[h] for h in headers] for r in rows])


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
