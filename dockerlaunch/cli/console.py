"""Everything that prints: the rich reporter for the apply layers, tables, and the plan as text.

The only module family allowed to import rich (an import rule checked by tests/unit/test_imports.py).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.color import ColorSystem
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.style import Style
from rich.table import Table
from rich.text import Text

from dockerlaunch.backends.docker.doctor.report import Report, Verdict
from dockerlaunch.docker_run import argv as docker_argv
from dockerlaunch.job.invocation import FIX
from dockerlaunch.reporting import Reporter, Task, Tasks

if TYPE_CHECKING:  # types only: every command imports this module, and hosts/ pulls in paramiko
    from dockerlaunch.hosts.targets import SSHTarget
    from dockerlaunch.job.plan import JobPlan

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]
VERDICT_STYLE = {Verdict.PASS: "green", Verdict.WARN: "yellow", Verdict.FAIL: "bold red", Verdict.SKIP: "dim",
                 Verdict.ERROR: "bold magenta"}


# C0 controls, DEL and C1 controls (0x80-0x9f: 0x9b is a one-byte CSI on some terminals), and the bidi overrides
# that reorder what a line shows: anything that could move the cursor, erase, recolour, retitle, write the
# clipboard (OSC 52) or disguise text
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SHOWN = {"\x1b": "^[", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _shown(m: re.Match) -> str:
    c = m.group()
    return _SHOWN.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def host_text(s: object, newlines: bool = False, limit: int | None = None) -> str:
    """A string from a host (or a file from one), safe to print: control characters shown as visible text (ESC as
    `^[`, others as `\\xNN`), so a host cannot move the cursor, erase lines, forge a PASS row or write the
    clipboard. `newlines`: keep line breaks (a message of several lines). `limit`: at most this many characters.

    Every sink here (say, print_table, print_report, the error lines) passes what it prints through this and never
    reads rich markup in it, so `[bold]` from a host stays literal text. JSON output keeps the raw value.
    """
    text = str(s)
    cut = ""
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], f"... ({len(text) - limit} more characters)"
    if newlines:
        return "\n".join(_UNSAFE.sub(_shown, line) for line in text.split("\n")) + cut
    return _UNSAFE.sub(_shown, text) + cut


def _cell(value: object) -> object:
    """A table cell: a str is host text, shown literally; a rich Text (a style chosen here) keeps its style."""
    if isinstance(value, Text):
        return Text(host_text(value.plain, newlines=True), style=value.style)
    return Text(host_text(value, newlines=True))


def styled(text: str, style: str) -> Text:
    """A table cell in a style chosen here (print_table shows a str cell literally, markup and all)."""
    return Text(text, style=style)


def console(stderr: bool = False) -> Console:
    # no terminal (CI, a pipe): wide lines rather than tables wrapped at 80 columns
    stream = sys.stderr if stderr else sys.stdout
    return Console(highlight=False, width=None if stream.isatty() else 160, stderr=stderr)


class _Bar(Task):
    def __init__(self, progress: Progress, label: str, total: int | None):
        self.progress, self.label = progress, host_text(label)  # a host's name or what it said
        self.id = progress.add_task(self.label, total=total)
        self.start = self.last = progress.get_time()  # its rate counts from here: a phase that waits before its first
        #                                                byte (docker save writing the image out first) is that slow

    def advance(self, n: int) -> None:
        self.progress.advance(self.id, n)  # while it runs, rich's rate of the last samples: the rate now
        if n:
            self.last = self.progress.get_time()

    def _task(self):
        return next(t for t in self.progress.tasks if t.id == self.id)

    def phase(self, text: str) -> None:
        self.progress.update(self.id, description=f"{self.label} {host_text(text)}")

    def done(self, status: str = "", ok: bool = True) -> None:
        """Ends the bar at what it counted, at its rate from its start to its last byte: not after it (a phase that
        waits after its last byte, a host's docker load, would read as a slower stream), and when `ok` a total that
        was an estimate (the plan's bytes before tar headers) becomes what was counted."""
        task = self._task()
        took = self.last - self.start
        speed = task.completed / took if took > 0 and task.completed else (task.finished_speed or task.speed)
        self.progress.update(self.id, description=f"{self.label} {host_text(status)}" if status else self.label)
        self.progress.stop_task(self.id)
        if ok:  # set as is: update(total=) would drop the samples the rate comes from
            task.total = max(task.completed, 1)
        task.finished_time = task.finished_time or task.elapsed
        task.finished_speed = speed


class _Bars(Tasks):
    def __init__(self, progress: Progress):
        self.p = progress

    def add(self, label: str, total: int | None) -> Task:
        return _Bar(self.p, label, total)


# what rich's Text drops from a line (bell, backspace, vertical tab, form feed, carriage return)
_CONTROL = {c: None for c in (7, 8, 11, 12, 13)}
_COLOR_SYSTEMS = {"standard": ColorSystem.STANDARD, "256": ColorSystem.EIGHT_BIT, "truecolor": ColorSystem.TRUECOLOR,
                  "windows": ColorSystem.WINDOWS}
FLUSH_EVERY = 0.1  # seconds: rank lines reach the terminal or pipe at least this often
PENDING_AFTER_S = 2.0  # a step over the hosts that prints nothing shows its progress line after this long
PENDING_REDRAW_S = 0.25


class RichReporter(Reporter):
    """Rank lines take a fast path (256 hosts x 8 ranks print millions of lines; rich's print costs ~140 us a
    line): a prefix styled once per rank, then plain writes to the console's file under a lock, flushed at least
    every FLUSH_EVERY seconds by a small thread, and before anything else is printed."""

    def __init__(self, out: Console | None = None, quiet_progress: bool = False):
        self.out = out or console()
        self.quiet_progress = quiet_progress
        self._prefixes: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()
        self._dirty = False
        self._flusher: threading.Thread | None = None

    def say(self, msg: str, style: str = "bold") -> None:
        self.flush()
        self.out.print(f"[dockerlaunch] {host_text(msg, newlines=True)}", style=style, markup=False,
                       highlight=False)

    def command(self, label: str, command: str) -> None:
        """`label command` on a line of its own, never wrapped and without the `[dockerlaunch]` prefix: selected
        after its one label, the command is whole."""
        self.flush()
        self.out.print(host_text(f"{label} {command}"), style="bold", markup=False, highlight=False, soft_wrap=True)

    def line(self, rank: int, host: str, text: str) -> None:
        prefix = self._prefixes.get((rank, host))
        if prefix is None:
            system = _COLOR_SYSTEMS.get(self.out.color_system or "")
            plain = f"[{rank} {host}] "
            prefix = Style.parse(COLORS[rank % len(COLORS)]).render(plain, color_system=system) if system else plain
            self._prefixes[(rank, host)] = prefix
        text = prefix + text.translate(_CONTROL) + "\n"
        with self._lock:
            self.out.file.write(text)
            self._dirty = True
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_often, daemon=True, name="dl-flush")
                self._flusher.start()

    def _flush_often(self) -> None:
        while True:
            time.sleep(FLUSH_EVERY)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if self._dirty:
                self._dirty = False
                try:
                    self.out.file.flush()
                except (OSError, ValueError):
                    pass  # a closed or broken stdout: nothing more can be shown

    def checks(self, report: Report) -> None:
        self.flush()
        print_report(report, self.out)

    @contextlib.contextmanager
    def pending(self, what: str) -> Iterator[Callable[[str, int, int], None]]:
        """On a terminal, once the step has taken PENDING_AFTER_S: one line, redrawn in place, of how many hosts
        answered (`[dockerlaunch] pre-flight: 41 of 64 hosts answered (probe containers), 9 s`), erased when the
        step ends. Elsewhere (a pipe, a log) nothing: the step's result line follows anyway."""
        if not self.out.is_terminal:
            yield lambda part, done, asked: None
            return
        state = ["", 0, 0]
        t0 = time.monotonic()
        stop = threading.Event()
        drawn = [False]

        def tell(part: str, done: int, asked: int) -> None:
            state[:] = [part, done, asked]

        def draw() -> None:
            while not stop.wait(PENDING_REDRAW_S):
                took = time.monotonic() - t0
                if took < PENDING_AFTER_S:
                    continue
                part, done, asked = state
                line = f"[dockerlaunch] {what}: {done} of {asked} host(s) answered ({part}), {took:.0f} s"
                with self._lock:
                    self.out.file.write("\r\x1b[K" + host_text(line)[:max(self.out.width - 1, 20)])
                    self.out.file.flush()
                    drawn[0] = True

        drawer = threading.Thread(target=draw, daemon=True, name="dl-pending")
        drawer.start()
        try:
            yield tell
        finally:
            stop.set()
            drawer.join(timeout=1)
            if drawn[0]:
                with self._lock:
                    self.out.file.write("\r\x1b[K")
                    self.out.file.flush()

    @contextlib.contextmanager
    def progress(self) -> Iterator[Tasks]:
        if self.quiet_progress:
            yield Tasks()
            return
        p = Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                     TransferSpeedColumn(), TimeRemainingColumn(), console=self.out, transient=False)
        with p:
            yield _Bars(p)


_FIX_COMMAND = f"{FIX} dockerlaunch "


def _command_end(text: str, i: int) -> int:
    """Where a shell command that starts at `i` ends: at the first `;` or `)` outside quotes, else the text's end
    (shlex.join quotes every `;`, `)` and space of a word, so neither ends a printed command early)."""
    quote = ""
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in ";)":
            break
        i += 1
    return i


def pull_commands(text: str, found: dict[str, int]) -> str:
    """`text` with each command in it replaced by `[N]`, N its number in `found` (one number per distinct command,
    across a table): a `fix: dockerlaunch ...` and a backticked span of several words. A table wraps a command at
    its cell's width (`ssh-keyscan -H` / `172.30.10.12 >> ...`), so the table holds the number and the command is
    printed whole under it (`commands_below`). (pure)"""
    out: list[str] = []
    i = 0
    while i < len(text):
        start = end = -1
        if text.startswith(_FIX_COMMAND, i):
            start = i + len(FIX) + 1
            end = _command_end(text, start)
            out.append(text[i:start])
        elif text[i] == "`":
            close = text.find("`", i + 1)
            if close > 0 and " " in text[i + 1:close].strip():
                start, end = i + 1, close
        if start < 0:
            out.append(text[i])
            i += 1
            continue
        command = text[start:end].rstrip()
        n = found.setdefault(command, len(found) + 1)
        out.append(f"[{n}]" + text[start + len(command):end])
        i = end + (1 if text[i] == "`" else 0)
    return "".join(out)


def commands_below(found: dict[str, int], out: Console) -> None:
    """Under a table: each command `pull_commands` took out of its cells, whole, after its one label `[N]`."""
    for command, n in found.items():
        out.print(host_text(f"[{n}] {command}"), markup=False, highlight=False, soft_wrap=True)


def print_report(report: Report, out: Console) -> None:
    table = Table("host", "check", "verdict", "reason", box=None, pad_edge=False)
    found: dict[str, int] = {}
    for c in report.checks:
        table.add_row(_cell(c.host), _cell(c.check), Text(str(c.verdict), style=VERDICT_STYLE[c.verdict]),
                      _cell(pull_commands(c.detail, found)))
    out.print(table)
    commands_below(found, out)
    out.print(host_text(report.summary(), newlines=True), highlight=False, markup=False)


def print_table(columns: list[str], rows: list[list[str | Text]], out: Console | None = None,
                commands: bool = False) -> None:
    """Cells are host text (a str is shown literally, never read as markup); style one with a rich Text.
    `commands`: the commands in str cells are printed whole under the table (`pull_commands`)."""
    table = Table(*columns, box=None)
    found: dict[str, int] = {}
    for row in rows:
        table.add_row(*(_cell(pull_commands(v, found) if commands and isinstance(v, str) else v) for v in row))
    out = out or console()
    out.print(table)
    commands_below(found, out)


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


def dry_run_view(plan: JobPlan, targets: list[SSHTarget]) -> dict:
    """`up --dry-run --output json`: the neutral plan plus, per host, where it is reached and its docker argv."""
    view = plan.to_dict()
    for h, t, hp in zip(view["hosts"], targets, plan.hosts):
        h["ssh"] = t.describe()
        h["argv"] = docker_argv(hp.container)
    return view


def render_plan(plan: JobPlan, targets: list[SSHTarget], first: list[str] = ()) -> str:
    """The dry run's text; `first`: what `up` does before the plan's containers start (a push)."""
    out = [
        f"Plan for job {plan.job!r}: {plan.nnodes} host(s), image {plan.image}, "
        f"MASTER_ADDR={plan.master_addr} MASTER_PORT={plan.master_port}",
    ]
    for h, t in zip(plan.hosts, targets):
        out.append("")
        out.append(f"# rank {h.rank}: {h.address}  (ssh {t.describe()}; {h.nproc_per_node} process(es))")
        line = format_argv(docker_argv(h.container), len(h.container.command))
        # no command given: the image's own CMD runs (a shell comment, so the line still pastes as it is)
        out.append(line if h.container.command else f"{line}  # <the image's CMD>")
    pending = plan.unresolved()
    out.append("")
    out += first
    r = plan.restart_policy()
    if r["max_restarts"] or r["hang_timeout"] or r["spares"]:
        out.append(f"After a failure: up to {r['max_restarts']} gang restart(s), {r['restart_backoff']:g}s apart; "
                   + (f"hang after {r['hang_timeout']:g}s without "
                      + (f"a line matching {r['progress_regex']!r}" if r["progress_regex"] else "a line")
                      if r["hang_timeout"] else "no hang detection")
                   + (f"; spares {', '.join(r['spares'])}" if r["spares"] else "; no spares"))
    out += [f"note: {a}" for a in plan.advice]
    if pending:
        out.append(f"{len(pending)} value(s) are resolved on the hosts at launch (shown as <resolved at launch: ...>).")
    out.append("Dry run: no host was contacted.")
    return "\n".join(out)
