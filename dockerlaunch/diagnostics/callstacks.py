"""py-spy dumps of every rank -> groups of identical stacks, and the ranks that are not where the rest are.

A hung job is nearly always N-1 ranks waiting in a collective and one rank somewhere else; naming that rank
and its line is the whole diagnosis. Pure: py-spy's text in, groups and one summary line per group out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_THREAD = re.compile(r'^Thread (\S+) \((\w+)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^\s+(.+?) \((.+?)(?::(\d+))?\)\s*$")
# frames in these files are the machinery a rank waits in; the line worth naming is the caller's
_LIBRARY = re.compile(
    r"(^|/)(site-packages|dist-packages|lib/python\d)|^(torch|threading\.py|queue\.py|selectors\.py|socket\.py|"
    r"multiprocessing|concurrent|asyncio|<frozen|lib[\w+.-]*\.so|\[)"
)


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int | None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    @property
    def library(self) -> bool:
        return bool(_LIBRARY.search(self.file)) or self.func.startswith("0x")


@dataclass
class Thread:
    ident: str
    state: str  # active / idle / gil ...
    name: str
    frames: list[Frame] = field(default_factory=list)  # innermost first, as py-spy prints


@dataclass
class RankStack:
    """One rank's dump."""

    rank: int
    host: str
    threads: list[Thread] = field(default_factory=list)
    error: str | None = None  # py-spy failed: its message

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.name == "MainThread"), self.threads[0] if self.threads else None)

    def key(self) -> tuple:
        t = self.main
        if t is None:
            return ("error", self.error or "no Python threads")
        return tuple((f.func, f.file, f.line) for f in t.frames if not f.func.startswith("0x"))

    def describe(self) -> str:
        t = self.main
        if t is None:
            return f"no stack ({self.error or 'no Python threads'})"
        frames = [f for f in t.frames if not f.func.startswith("0x")]
        if not frames:
            return f"{t.state}, no Python frames"
        python = [f for f in frames if f.line is not None] or frames  # --native adds C frames: name Python's
        inner = python[0]
        user = next((f for f in python if not f.library), python[-1])
        where = f"{inner.func} at {user.where}" if inner == user else f"{inner.func} at {user.where} (in {user.func})"
        return where + (", idle" if t.state == "idle" else "")


def parse_pyspy(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for raw in text.splitlines():
        m = _THREAD.match(raw)
        if m:
            threads.append(Thread(m[1], m[2], m[3] or ""))
            continue
        f = _FRAME.match(raw)
        if f and threads:
            threads[-1].frames.append(Frame(f[1], f[2], int(f[3]) if f[3] else None))
    return threads


def ranges(ranks: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    rs, out, i = sorted(set(ranks)), [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


@dataclass
class Group:
    stacks: list[RankStack]

    @property
    def ranks(self) -> list[int]:
        return sorted(s.rank for s in self.stacks)


def group(stacks: list[RankStack]) -> list[Group]:
    """Identical main-thread stacks together, the largest group first."""
    by_key: dict[tuple, list[RankStack]] = {}
    for s in sorted(stacks, key=lambda s: s.rank):
        by_key.setdefault(s.key(), []).append(s)
    return sorted((Group(v) for v in by_key.values()), key=lambda g: (-len(g.stacks), g.ranks[0]))


def summary(stacks: list[RankStack]) -> list[str]:
    """'7 ranks (0-4,6-7) in all_reduce at train.py:812 (step)', then each odd one out with its host."""
    groups = group(stacks)
    if not groups:
        return ["no rank processes found"]
    lines = []
    majority = groups[0] if len(groups) == 1 or len(groups[0].stacks) > len(groups[1].stacks) else None
    for g in groups:
        if g is majority:
            n = len(g.stacks)
            who = f"{n} ranks ({ranges(g.ranks)})" if n > 1 else f"rank {g.ranks[0]} ({g.stacks[0].host})"
            lines.append(f"{who} in {g.stacks[0].describe()}")
        else:
            for s in g.stacks:
                label = "odd one out: " if majority is not None else ""
                lines.append(f"{label}rank {s.rank} ({s.host}) in {s.describe()}")
    return lines
