"""How the apply layers tell a person what happens, without printing: the CLI supplies the printer.

Cluster, transfer and image code call a `Reporter` (status lines, prefixed log lines, progress bars);
`Reporter()` itself says nothing (library use, tests), and `cli.console.RichReporter` prints with rich.
Keeping rich out of the layers below the CLI is an import rule (tests/unit/test_imports.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class Task:
    """One progress bar: one phase's bytes (a stream to a host, the layer cache's fill, a read of the save), so that
    its rate is that phase's own."""

    def advance(self, n: int) -> None:
        pass

    def phase(self, text: str) -> None:
        """What runs now that no longer moves the bar (the host's docker load after the stream's last byte)."""

    def done(self, status: str = "", ok: bool = True) -> None:
        """The phase ended (`ok`: all its bytes went): its bar keeps the rate it had while it ran."""


class Tasks:
    def add(self, label: str, total: int | None) -> Task:
        return Task()


class Reporter:
    """Says nothing; subclass to print."""

    def say(self, msg: str, style: str = "bold") -> None:
        """A status line from dockerlaunch itself (`style`: bold, bold red, bold yellow, bold green). It may quote
        what a host said: a printer shows that as text, never as terminal controls or markup (console.host_text)."""

    def command(self, label: str, command: str) -> None:
        """A command the user may paste, after one label on a line of its own (`follow with:`, `fix:`): a printer
        shows it whole, never wrapped, with nothing else before the label (job/invocation.py: one label per line)."""

    def line(self, rank: int, host: str, text: str) -> None:
        """One line of a rank's output: the job's own, printed as it is (its colours and bars are the user's)."""

    def checks(self, report) -> None:
        """A doctor report (backends/docker/doctor/report.Report)."""

    def preflight(self, report, hosts: int, seconds: float) -> None:
        """`up`'s pre-flight report, checked on `hosts` hosts in `seconds`: the whole table here; a printer may
        show less (the CLI's `up` shows the rows that did not pass and `preflight_line`; `up -v` the table)."""
        self.checks(report)

    @contextlib.contextmanager
    def pending(self, what: str) -> Iterator[Callable[[str, int, int], None]]:
        """A step over many hosts that prints nothing until it ends (`up`'s pre-flight): the block is given a
        function to call with (the part under way, hosts that answered, hosts asked); a printer may show it (the
        CLI: one line that updates, on a terminal, once the step has taken a while)."""
        yield lambda part, done, asked: None

    @contextlib.contextmanager
    def progress(self) -> Iterator[Tasks]:
        """A group of progress bars, alive for the `with` block."""
        yield Tasks()


def preflight_line(counts: dict, hosts: int, seconds: float) -> str:
    """`doctor: 23 PASS, 4 SKIP on 2 hosts in 1.8 s`: a report's counts (verdict -> n, in the order given; a
    verdict none had is left out, PASS never)."""
    said = ", ".join(f"{n} {v}" for v, n in counts.items() if n or str(v) == "PASS")
    return f"doctor: {said} on {hosts} host{'s' if hosts != 1 else ''} in {seconds:.1f} s"
