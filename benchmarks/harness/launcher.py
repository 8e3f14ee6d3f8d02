"""The launcher run as a user runs it (`.venv/bin/dockerlaunch ...` as a subprocess) and watched from outside: its
stdout lines with the time each arrived, and its peak RSS (VmHWM), threads and open fds, children included, sampled
every 50 ms."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from harness import REPO

DL = REPO / ".venv" / "bin" / "dockerlaunch"
LAUNCHER = [str(DL)] if DL.exists() else [sys.executable, "-m", "dockerlaunch"]
SAMPLE_EVERY = 0.05


class Sampler:
    """Peak RSS (VmHWM), threads and open fds of a process and its descendants, every SAMPLE_EVERY s."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak_rss_kb = 0
        self.children_rss_kb: dict[int, int] = {}
        self.peak_threads = 0
        self.peak_fds = 0
        self.peak_children = 0
        self.cpu_s = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _status(pid: int) -> dict[str, int]:
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "Threads"):
                    out[k] = int(v.split()[0])
        return out

    def _cpu(self) -> float:
        """utime + stime of the process and of its children it has waited for, in seconds."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def _descendants(self) -> list[int]:
        parents: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        parents[int(d)] = int(f.read().rpartition(")")[2].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            kids = [c for c, pp in parents.items() if pp == p]
            out += kids
            todo += kids
        return out

    def _run(self) -> None:
        kids: list[int] = []
        next_scan = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:  # a scan of /proc is costly: once a second
                kids = self._descendants()
                next_scan = now + 1.0
            threads = fds = 0
            for pid in [self.pid, *kids]:
                try:
                    st = self._status(pid)
                    n_fds = len(os.listdir(f"/proc/{pid}/fd"))
                except (OSError, ValueError):
                    continue
                if pid == self.pid:
                    self.peak_rss_kb = max(self.peak_rss_kb, st.get("VmHWM", 0))
                else:
                    self.children_rss_kb[pid] = max(self.children_rss_kb.get(pid, 0), st.get("VmHWM", 0))
                threads += st.get("Threads", 0)
                fds += n_fds
            self.peak_threads = max(self.peak_threads, threads)
            self.peak_fds = max(self.peak_fds, fds)
            self.peak_children = max(self.peak_children, len(kids))
            try:
                self.cpu_s = self._cpu()
            except (OSError, ValueError):
                pass
            self.samples += 1
            self._stop.wait(SAMPLE_EVERY)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return {"peak_rss_mb": round(self.peak_rss_kb / 1024, 1),
                "children_peak_rss_mb": round(sum(self.children_rss_kb.values()) / 1024, 1),
                "peak_children": self.peak_children,
                "peak_threads": self.peak_threads, "peak_fds": self.peak_fds, "cpu_s": round(self.cpu_s, 2),
                "samples": self.samples}


class Launch:
    """One CLI run in the background: stdout lines (with the time each arrived) go to `on_line`, a tail is kept."""

    def __init__(self, args: list[str], cwd: Path, on_line=None, keep_lines: int = 400):
        self.argv = [*LAUNCHER, *args]
        self.on_line = on_line
        self.out_tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.err_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.lines = 0
        self.t_start = time.time()
        self.p = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                  env={**os.environ, "COLUMNS": "400"})
        RUNNING.add(self)
        self.sampler = Sampler(self.p.pid)
        self.t_end: float | None = None
        self.timed_out = False
        self._out = threading.Thread(target=self._pump_out, daemon=True)
        self._err = threading.Thread(target=self._pump_err, daemon=True)
        self._out.start()
        self._err.start()

    def _pump_out(self) -> None:
        for raw in self.p.stdout:
            t = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines += 1
            self.out_tail.append(line)
            if self.on_line:
                try:
                    self.on_line(t, line)
                except Exception:  # noqa: BLE001 - a parser bug must not stall the pipe
                    traceback.print_exc()

    def _pump_err(self) -> None:
        for raw in self.p.stderr:
            self.err_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def wait(self, timeout: float) -> dict:
        try:
            self.p.wait(timeout=max(1.0, timeout - (time.time() - self.t_start)))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.p.send_signal(signal.SIGINT)  # up tears down on Ctrl-C
            try:
                self.p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t_end = time.time()
        stats = self.sampler.stop()
        self._out.join(30)
        self._err.join(10)
        RUNNING.discard(self)
        return {"argv": " ".join(self.argv[len(LAUNCHER):]), "rc": self.p.returncode, "timed_out": self.timed_out,
                "wall_s": round(self.t_end - self.t_start, 3), "t_start": self.t_start, "t_end": self.t_end,
                "stdout_lines": self.lines, **stats,
                # up's own account of where its time went ("started N container(s) in T (connect .., ...)")
                "phases": next((x.split(" in ", 1)[1].split(";")[0] for x in reversed(self.out_tail)
                                if "container(s) in " in x and "started " in x), None),
                "stderr_tail": "\n".join(self.err_tail)[-1500:]}

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()


RUNNING: set[Launch] = set()


class UpStream:
    """Watches up's stdout: `[rank host] text` lines per rank, dockerlaunch's own lines with their times."""

    RANK_LINE = re.compile(r"^\[(\d+) (\S+)\] (.*)$")

    def __init__(self, n: int, first_re: str = r"rank (\d+) up$"):
        self.n = n
        self.first = re.compile(first_re)
        self.ranks_up: set[int] = set()
        self.all_up = threading.Event()
        self.own: list[tuple[float, str]] = []
        self.rank_lines: list[tuple[float, int, str]] = []

    def __call__(self, t: float, line: str) -> None:
        m = self.RANK_LINE.match(line)
        if m:
            rank, text = int(m[1]), m[3]
            self.rank_lines.append((t, rank, text))
            if self.first.search(text):
                self.ranks_up.add(rank)
                if len(self.ranks_up) == self.n:
                    self.all_up.set()
        elif line.startswith("[dockerlaunch]"):
            self.own.append((t, line))

    def find(self, pattern: str) -> tuple[float, str] | None:
        rx = re.compile(pattern)
        return next(((t, s) for t, s in list(self.own) if rx.search(s)), None)


def wait_all_up(stream: UpStream, launch: Launch, timeout: float) -> bool:
    """Until every rank's first line reached up's stream; False if up exited first or the time ran out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if stream.all_up.wait(0.2):
            return True
        if launch.p.poll() is not None:
            return stream.all_up.wait(2)
    return False
