"""A rank's output split into lines for the reporter and its per-rank file."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

from dockerlaunch.reporting import Reporter


class LogSink:
    """Splits a rank's output into lines for the reporter (`[rank host] line`) and its per-rank file. A terminal's
    `\r\n` (container.tty) ends a line like `\n`; a line left unfinished for PARTIAL_AFTER seconds (a prompt, a
    progress bar without its newline) is shown as it is, so nothing waits for a newline that may not come."""

    PARTIAL_AFTER = 1.0

    def __init__(self, reporter: Reporter, rank: int, host: str, path: Path | None,
                 progress: re.Pattern | None = None):
        self.reporter, self.rank, self.host = reporter, rank, host
        self.progress = progress  # lines that count as progress (job.progress_regex); None: every line
        self.progress_at = time.monotonic()  # when this rank last made progress (hang detection)
        self.buf = b""
        self.since = 0.0  # when the unfinished line in buf began
        self.lock = threading.Lock()
        self.file = None
        if path:  # 0600: a rank may print its environment (and the run folder is 0700 anyway)
            self.file = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "ab")

    def __call__(self, data: bytes) -> None:
        with self.lock:
            if not self.buf:
                self.since = time.monotonic()
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            if self.buf and lines:
                self.since = time.monotonic()
            for line in lines:
                self._emit(line.removesuffix(b"\r"), b"\n")

    def tick(self) -> None:
        """Show an unfinished line that has waited PARTIAL_AFTER seconds, and put the file's lines on disk
        (called about every 0.2 s)."""
        with self.lock:
            if self.buf and time.monotonic() - self.since >= self.PARTIAL_AFTER:
                self._emit(self.buf, b"")
                self.buf = b""
            if self.file:
                self.file.flush()

    def _emit(self, line: bytes, end: bytes) -> None:
        if self.file:
            self.file.write(line + end)
        text = line.decode(errors="replace").rstrip("\r")
        if self.progress is None or self.progress.search(text):
            self.progress_at = time.monotonic()
        self.reporter.line(self.rank, self.host, text)

    def close(self) -> None:
        with self.lock:
            if self.buf:
                self._emit(self.buf, b"")
                self.buf = b""
            if self.file:
                self.file.close()
                self.file = None
