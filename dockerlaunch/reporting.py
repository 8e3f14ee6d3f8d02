"""How the apply layers tell a person what happens, without printing: the CLI supplies the printer.

Cluster, transfer and image code call a `Reporter` (status lines, prefixed log lines, progress bars);
`Reporter()` itself says nothing (library use, tests), and `cli.console.RichReporter` prints with rich.
Keeping rich out of the layers below the CLI is an import rule (tests/unit/test_imports.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Task:
    """One progress bar (a stream to a host)."""

    def advance(self, n: int) -> None:
        pass

    def done(self, status: str = "") -> None:
        pass


class Tasks:
    def add(self, label: str, total: int | None) -> Task:
        return Task()


class Reporter:
    """Says nothing; subclass to print."""

    def say(self, msg: str, style: str = "bold") -> None:
        """A status line from dockerlaunch itself (`style`: bold, bold red, bold yellow, bold green). It may quote
        what a host said: a printer shows that as text, never as terminal controls or markup (console.host_text)."""

    def line(self, rank: int, host: str, text: str) -> None:
        """One line of a rank's output: the job's own, printed as it is (its colours and bars are the user's)."""

    def checks(self, report) -> None:
        """A doctor report (backends/docker/doctor/report.Report)."""

    @contextlib.contextmanager
    def progress(self) -> Iterator[Tasks]:
        """A group of progress bars, alive for the `with` block."""
        yield Tasks()
