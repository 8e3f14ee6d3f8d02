"""Terminal control from hosts (issue 50, finding 3): what a host says reaches the operator's terminal as visible
text, through the real renderers into a rich Console that believes it is a terminal (colours on, as a person sees
it), and through the real CLI's error lines. The job's own lines stay raw (its colours are the user's)."""

import io
import re
from pathlib import Path

from rich.console import Console

from dockerlaunch.backends.docker.doctor.report import PASS, WARN, Report
from dockerlaunch.cli.console import RichReporter, print_report, print_table

# erase the line and move up (forges the row above), an OSC 52 clipboard write ended by BEL, markup, and a C1 CSI
HOSTILE = "gpu0\x1b[2K\x1b[1A\x1b]52;c;Y3VybCBldmlsfHNo\x07[bold]PASS[/bold]\x9b2J"
# rich's own styling: SGR sequences only (ESC [ digits/semicolons m), which a host string must never add to
SGR = re.compile(r"\x1b\[[0-9;]*m")


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=400, highlight=False)


def shown(out: Console) -> str:
    """What reached the terminal, less rich's own colours."""
    return SGR.sub("", out.file.getvalue())


def assert_visible(text: str) -> None:
    bad = sorted({f"{ord(c):#x}" for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f})
    assert bad == [], text
    assert "^[[2K^[[1A^[]52;c;Y3VybCBldmlsfHNo\\x07[bold]PASS[/bold]\\x9b2J" in text, text


def test_a_hostile_host_string_shows_as_text_in_doctors_table():
    report = Report()
    report.add(HOSTILE, "gpu", WARN, f"process {HOSTILE} holds 3 GiB", rank=0)
    report.add("10.0.0.2", HOSTILE, PASS, "ok", rank=1)
    out = terminal()
    print_report(report, out)
    assert_visible(shown(out))


def test_a_hostile_container_in_status_rows_shows_as_text():
    """`status` and `transport` print their rows with print_table: a str cell is host text, never markup."""
    out = terminal()
    print_table(["rank", "host", "container", "state"], [["0", "10.0.0.1", HOSTILE, "running"]], out)
    assert_visible(shown(out))


def test_a_hostile_error_in_the_transport_summary_shows_as_text():
    from dockerlaunch.diagnostics.nccl_logs import TransportReport, report_to
    from dockerlaunch.verdict import Finding, Verdict

    out = terminal()
    report_to(RichReporter(out, quiet_progress=True),
              TransportReport([(0, "10.0.0.1", None, HOSTILE)],
                              [Finding("transport", Verdict.WARN, HOSTILE, "10.0.0.1")]))
    assert_visible(shown(out))


def hostile_dump(tmp_path: Path, lines: int = 3, fr_chars: int = 100):
    from dockerlaunch.diagnostics.dump import DumpResult, HostDump

    hd = HostDump(0, "10.0.0.1", tmp_path / "host0", notes=[f"py-spy sidecar failed: {HOSTILE}"])
    summary = [f"odd one out: rank 3 (10.0.0.1) in {HOSTILE}"] + [f"group {i}: {HOSTILE}" for i in range(lines)]
    fr = f"{HOSTILE} " + "x" * fr_chars + "\nmissing ranks: {1}\ncollective: " + HOSTILE
    return DumpResult(tmp_path, [hd], summary, fr, [f"host 10.0.0.2: {HOSTILE}"])


def test_a_hostile_stack_note_and_fr_trace_line_show_as_text_in_dumps_summary(tmp_path):
    from dockerlaunch.cli.diagnose import print_dump

    out = terminal()
    print_dump(hostile_dump(tmp_path), RichReporter(out, quiet_progress=True))
    text = shown(out)
    assert_visible(text)
    assert "flight recorder: missing ranks: {1}" in text and "odd one out: rank 3" in text, text


def test_dumps_printed_summary_is_capped(tmp_path):
    """A host (or fr_trace's sandbox) that prints without end fills summary.txt, not the terminal."""
    from dockerlaunch.cli.diagnose import PRINTED_CHARS, PRINTED_LINES, print_dump

    out = terminal()
    print_dump(hostile_dump(tmp_path, lines=5000, fr_chars=10_000_000), RichReporter(out, quiet_progress=True))
    lines = shown(out).splitlines()
    assert len(lines) <= 3 * PRINTED_LINES + 8, len(lines)
    assert max(len(x) for x in lines) <= PRINTED_CHARS + 200, max(len(x) for x in lines)
    assert any("more line(s) in summary.txt" in x for x in lines), lines[-5:]


def test_the_jobs_own_lines_stay_raw():
    """`[rank host] ...`: the job's colours and progress bars are the user's."""
    out = terminal()
    RichReporter(out).line(0, "10.0.0.1", "\x1b[32mloss 1.0\x1b[0m")
    assert "\x1b[32mloss 1.0\x1b[0m" in out.file.getvalue()


def test_an_error_line_quoting_a_host_shows_as_text(cli, tmp_path):
    """The CLI's one error handler: a DockerlaunchError (a HostError quotes the host's output) is printed as text.
    Through the real CLI; click strips CSI sequences on a pipe but not OSC 52, which a terminal obeys."""
    missing = tmp_path / f"c{HOSTILE}.yaml"
    r = cli("status", "--config", str(missing))
    assert r.returncode != 0 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "\x9b" not in r.stderr, repr(r.stderr)
    assert "^[]52;c;Y3VybCBldmlsfHNo\\x07[bold]PASS[/bold]" in r.stderr, r.stderr


def test_host_text_keeps_line_breaks_only_when_asked_and_cuts_at_a_limit():
    from dockerlaunch.cli.console import host_text

    assert host_text("a\nb\u202ec") == "a\\nb\\u202ec"
    assert host_text("a\nb\x1b", newlines=True) == "a\nb^["
    assert host_text("x" * 10, limit=4) == "xxxx... (6 more characters)"


def test_a_hostile_status_on_a_progress_bar_shows_as_text():
    """push's bars: a label is a host's name, a status what it said."""
    out = terminal()
    with RichReporter(out).progress() as bars:
        bars.add(HOSTILE, 10).done(HOSTILE)
    text = out.file.getvalue()  # a live display: rich itself erases and redraws lines, so only the host's own
    assert "\x1b]" not in text and "\x07" not in text and "\x9b" not in text, repr(text)  # controls are looked for
    assert "^[[2K^[[1A^[]52;c;Y3VybCBldmlsfHNo\\x07[bold]PASS[/bold]\\x9b2J" in SGR.sub("", text), repr(text)


def test_what_library_code_logs_from_a_host_shows_as_text():
    """main() prints the library's log lines (sim, build, fetch: they quote hosts) through this formatter."""
    import logging

    from dockerlaunch.cli.main import _HostTextFormatter

    record = logging.LogRecord("dockerlaunch", logging.INFO, __file__, 1, "host said %s", (HOSTILE,), None)
    assert_visible(_HostTextFormatter("%(message)s").format(record))
