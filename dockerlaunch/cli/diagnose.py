"""Commands that look inside a running (or finished) job: transport, dump, commtest."""

from __future__ import annotations

import json
import sys

import click

from dockerlaunch.cli.console import RichReporter, host_text, print_table
from dockerlaunch.cli.main import cli, config_options, job_ref_options, load, output_option


@cli.command()
@job_ref_options
@output_option()
def transport(output: str, **kw) -> None:
    """How NCCL moves data on each host (from its own logs): network, HCAs, GDRDMA, intra/inter-host path.

    Warns when NCCL fell back to TCP sockets though InfiniBand ports are ACTIVE, and when ranks of one host
    talk through the network. Works for a running or a finished job (until its next `up`).
    """
    from dockerlaunch.diagnostics.nccl_logs import transport as read
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
            reporter.say(f"{f.verdict}: {f.host}: {f.detail}", "bold red" if f.verdict == "FAIL" else "bold yellow")
        if not any(t and t.seen for _, _, t, _ in report.hosts):
            reporter.say("no NCCL transport lines: a gloo/CPU job, NCCL not initialized yet, or diagnostics.nccl_log "
                         "off when the job started")
    sys.exit(1 if any(f.verdict == "FAIL" for f in report.findings) else 0)


@cli.command()
@job_ref_options
@click.option("--native", is_flag=True, help="Native (C/C++) frames too: slower, and pauses each rank longer.")
@click.option("--out", "out_dir", metavar="DIR", help="Folder for the files (default dockerlaunch-dumps/<job>-<time>).")
def dump(native: bool, out_dir: str | None, **kw) -> None:
    """Every rank's stack (py-spy), the flight recorder's dump, nvidia-smi and NCCL logs from every host.

    Prints which ranks share a stack and which one is elsewhere, e.g. the rank a hung collective waits for.
    """
    from dockerlaunch.diagnostics.dump import dump as run

    reporter = RichReporter()
    result = run(load(kw), out_dir=out_dir, native=native, reporter=reporter)
    print_dump(result, reporter)
    sys.exit(0 if any(hd.stacks for hd in result.hosts) and not result.errors else 1)


# What `dump` prints of what the hosts and fr_trace's sandbox said (all of it is in summary.txt): at most
# PRINTED_LINES lines of each kind (stack groups, notes, errors; 3 of fr_trace), each cut at PRINTED_CHARS
PRINTED_LINES = 20
PRINTED_CHARS = 300


def print_dump(result, reporter) -> None:
    """dump's summary on the terminal: host text escaped (console.host_text) and capped; summary.txt has it all."""
    def say(lines: list[str], style, more: str) -> None:
        for line in lines[:PRINTED_LINES]:
            reporter.say(host_text(line, limit=PRINTED_CHARS), style(line))
        if len(lines) > PRINTED_LINES:
            reporter.say(f"... {len(lines) - PRINTED_LINES} more {more} in summary.txt", "dim")

    say(result.summary, lambda line: "bold yellow" if line.startswith("odd one out") else "bold", "line(s)")
    notes: dict[str, list[str]] = {}  # the same note on every host is said once
    for hd in result.hosts:
        for note in hd.notes:
            notes.setdefault(note, []).append(f"host {hd.rank} ({hd.address})")
    said = []
    for note, where in notes.items():
        who = "every host" if len(where) == len(result.hosts) > 1 else ", ".join(where)
        said.append(f"{who}: {note}")
    say(said, lambda _: "dim", "note(s)")
    say(result.errors, lambda _: "bold red", "error(s)")
    if result.fr_analysis:  # fr_trace's verdict and whom the collective waits for
        lines = result.fr_analysis.strip().splitlines()
        for line in lines[:1] + [x for x in lines[1:] if x.startswith(("missing ranks", "collective:"))][:2]:
            reporter.say(f"flight recorder: {host_text(line, limit=PRINTED_CHARS)}", "bold yellow")
    reporter.say(f"files: {host_text(result.folder)}/ (summary.txt first)")


def _print_result(r, reporter) -> None:
    from dockerlaunch.diagnostics.commtest import human
    from dockerlaunch.diagnostics.transport import describe

    h = r.header
    if h:
        nccl = f", NCCL {h['nccl']}" if h.get("nccl") else ""
        reporter.say(f"commtest: {h.get('backend')} all_reduce (float32, sum), {len(r.hosts)} host(s), "
                     f"{h.get('world')} rank(s), torch {h.get('torch')}{nccl}")
    rows = [[human(x["bytes"]), str(x["count"]), x["type"], f"{x['time_us']:.1f}", f"{x['algbw']:.3f}",
             f"{x['busbw']:.3f}", str(x["wrong"])] for x in r.rows]
    if rows:
        print_table(["size", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"], rows)
    elif r.output_tail:
        reporter.say("the test job's last lines:", "bold red")
        for line in r.output_tail:
            click.echo(host_text(line))
    if r.transport:
        for rank, address, t, _ in r.transport.hosts:
            if t is not None and t.seen:
                reporter.say(f"transport host {rank} ({address}): {describe(t)}")
        for f in r.transport.findings:
            reporter.say(f"{f.verdict}: {f.host}: {f.detail}", "bold red" if f.verdict == "FAIL" else "bold yellow")
    style = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red"}.get(r.verdict.status, "bold")
    reporter.say(f"{r.verdict.status}: {r.verdict.reason}", style)


@cli.command()
@config_options
@click.option("--sizes", metavar="MIN:MAX", help="Message sizes, doubling from MIN to MAX "
              "(default 1M:1G with GPUs, 1M:64M for gpus: none).")
@click.option("--iters", type=click.IntRange(0, 10000), default=0, show_default=True,
              help="Timed iterations per size (0: 20 with GPUs, fewer for large sizes on CPU).")
@click.option("--pairwise", is_flag=True, help="Every pair of hosts alone, at the largest size: finds a slow host.")
@output_option()
def commtest(sizes: str | None, iters: int, pairwise: bool, output: str, **kw) -> None:
    """all_reduce bandwidth across the hosts, in the job's image (NCCL on GPUs, gloo on CPU), like nccl-tests.

    busbw = algbw x 2(n-1)/n, judged against the InfiniBand port rates or NIC speed of the hosts: PASS at
    60% or more, WARN from 25%, FAIL below (or on wrong results, or NCCL on sockets beside ACTIVE IB ports).
    """
    from dockerlaunch.diagnostics import commtest as ct

    cfg = load(kw)
    lo, hi = ct.parse_sizes(sizes or ("1M:64M" if cfg.container.gpus == "none" else "1M:1G"))
    reporter = RichReporter()
    if pairwise:
        pairs = ct.pairwise(cfg, hi, iters, reporter=reporter)
        bad = ct.suspects(pairs, len(cfg.hosts))
        if output == "json":
            click.echo(json.dumps({"size": hi, "pairs": [{"pair": list(p.pair), **p.result.to_dict()} for p in pairs],
                                   "suspects": [cfg.hosts[i].address for i in bad]}, indent=2))
        else:
            rows = [[f"{p.pair[0]}-{p.pair[1]}", " + ".join(p.result.hosts),
                     f"{p.busbw:.3f}" if p.busbw is not None else "-", p.result.verdict.status,
                     p.result.verdict.reason] for p in pairs]
            print_table(["pair", "hosts", f"busbw(GB/s) at {ct.human(hi)}", "verdict", "why"], rows)
            if bad:
                reporter.say("slow: " + ", ".join(f"host {i} ({cfg.hosts[i].address})" for i in bad)
                             + " is in every slow pair: check its NIC/HCA, cable and switch port", "bold red")
            else:
                reporter.say("no single host is in every slow pair" if any(
                    p.result.verdict.status != "PASS" for p in pairs) else "every pair is alike")
        sys.exit(1 if bad or any(p.result.verdict.status == "FAIL" for p in pairs) else 0)
    r = ct.run(cfg, lo, hi, iters, reporter=reporter)
    if output == "json":
        click.echo(json.dumps(r.to_dict(), indent=2))
    else:
        _print_result(r, reporter)
    sys.exit(1 if r.verdict.status == "FAIL" else 0)
