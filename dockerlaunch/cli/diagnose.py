"""Commands that look inside a running (or finished) job: transport, dump, commtest."""

from __future__ import annotations

import json
import sys

import click

from dockerlaunch.cli.console import RichReporter, print_table
from dockerlaunch.cli.main import cli, config_options, load, output_option


@cli.command()
@config_options
@output_option()
def transport(output: str, **kw) -> None:
    """How NCCL moves data on each host (from its own logs): network, HCAs, GDRDMA, intra/inter-host path.

    Warns when NCCL fell back to TCP sockets though InfiniBand ports are ACTIVE, and when ranks of one host
    talk through the network. Works for a running or a finished job (until its next `up`).
    """
    from dockerlaunch.diagnostics.collect import transport as read
    from dockerlaunch.diagnostics.transport import describe

    report = read(load(kw))
    if output == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        rows = []
        for rank, address, t, err in report.hosts:
            if err:
                rows.append([str(rank), address, "-", "-", "-", "-", "-", f"error: {err}"])
            elif t is None or not t.seen:
                rows.append([str(rank), address, "-", "-", "-", "-", "-", describe(t) if t else ""])
            else:
                rows.append([str(rank), address, ", ".join(t.network) or "-", ", ".join(t.hcas or t.sockets) or "-",
                             {True: "yes", False: "no", None: "-"}[t.gdrdma], ", ".join(t.intra) or "-",
                             ", ".join(t.inter) or "-", f"{t.processes} process log(s), NCCL {t.version or '?'}"])
        print_table(["rank", "host", "network", "HCAs / NICs", "GDRDMA", "intra-host", "inter-host", "notes"], rows)
        reporter = RichReporter()
        for f in report.findings:
            reporter.say(f"{f.level}: {f.host}: {f.message}", "bold red" if f.level == "FAIL" else "bold yellow")
        if not any(t and t.seen for _, _, t, _ in report.hosts):
            reporter.say("no NCCL transport lines: a gloo/CPU job, NCCL not initialized yet, or diagnostics.nccl_log "
                         "off when the job started")
    sys.exit(1 if any(f.level == "FAIL" for f in report.findings) else 0)


@cli.command()
@config_options
@click.option("--native", is_flag=True, help="Native (C/C++) frames too: slower, and pauses each rank longer.")
@click.option("--out", "out_dir", metavar="DIR", help="Folder for the files (default dockerlaunch-dumps/<job>-<time>).")
def dump(native: bool, out_dir: str | None, **kw) -> None:
    """Every rank's stack (py-spy), the flight recorder's dump, nvidia-smi and NCCL logs from every host.

    Prints which ranks share a stack and which one is elsewhere, e.g. the rank a hung collective waits for.
    """
    from dockerlaunch.diagnostics.dump import dump as run

    reporter = RichReporter()
    result = run(load(kw), out_dir=out_dir, native=native, reporter=reporter)
    for line in result.summary:
        reporter.say(line, "bold yellow" if line.startswith("odd one out") else "bold")
    notes: dict[str, list[str]] = {}  # the same note on every host is said once
    for hd in result.hosts:
        for note in hd.notes:
            notes.setdefault(note, []).append(f"host {hd.rank} ({hd.address})")
    for note, where in notes.items():
        who = "every host" if len(where) == len(result.hosts) > 1 else ", ".join(where)
        reporter.say(f"{who}: {note}", "dim")
    for e in result.errors:
        reporter.say(e, "bold red")
    if result.fr_analysis:
        reporter.say("flight recorder: " + (result.fr_analysis.strip().splitlines() or [""])[0])
    reporter.say(f"files: {result.folder}/ (summary.txt first)")
    sys.exit(0 if any(hd.stacks for hd in result.hosts) and not result.errors else 1)
