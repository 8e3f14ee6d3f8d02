"""What a supervised job's hosts keep of it (gang.py's records, under <job folder>/runs/<run id>/ on every host),
read back by `up --detach`, `status`, `ps` and `logs`: how the job ended, its attempts, the gang's events.

Every host keeps the whole record (the coordinator sends each event to every rank), so any host that answers tells
how the job went, also while host 0 is down. The files are the host's words: each line is parsed as JSON and each
field checked for its type and size; anything else is dropped, never guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dockerlaunch import gang
from dockerlaunch.hosts.fleet import Host
from dockerlaunch.job.recovery import AttemptRecord

FILES = ("events.jsonl", "attempts.jsonl", "result.json")
READ = 'cat "$1/$2" 2>/dev/null; true'
LIST = 'cd "$1" 2>/dev/null && for f in unsupervised-rank*; do [ -e "$f" ] && echo "$f"; done; true'
LATEST = 'cd "$1" 2>/dev/null && ls -1t . 2>/dev/null | head -n 1; true'
TEXT_MAX = 2000


def _text(v: object, limit: int = TEXT_MAX) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _int(v: object, lo: int = 0, hi: int = 1 << 31) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


@dataclass(frozen=True)
class GangResult:
    """How a supervised job ended (result.json), checked field by field."""

    cause: str
    code: int
    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    attempt: int = 0
    ended: str = ""
    detail: str = ""

    @classmethod
    def parse(cls, text: str) -> GangResult | None:
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        cause, code = _text(d.get("cause"), 40), _int(d.get("code"), 0, 255)
        if cause is None or code is None:
            return None
        return cls(cause, code, _int(d.get("rank"), 0, 1 << 20), _text(d.get("host"), 300),
                   _int(d.get("exit_code"), 0, 255), _int(d.get("attempt"), 0, 100000) or 0,
                   _text(d.get("ended"), 40) or "", _text(d.get("detail")) or "")

    def line(self) -> str:
        return gang.describe({"cause": self.cause, "rank": self.rank, "host": self.host,
                              "exit_code": self.exit_code, "detail": self.detail}) + f"; exit code {self.code}"

    def to_dict(self) -> dict:
        return {"cause": self.cause, "code": self.code, "rank": self.rank, "host": self.host,
                "exit_code": self.exit_code, "attempt": self.attempt, "ended": self.ended, "detail": self.detail}


@dataclass(frozen=True)
class GangEvent:
    event: str
    text: str
    when: str = ""
    attempt: int | None = None
    rank: int | None = None

    @classmethod
    def parse(cls, line: str) -> GangEvent | None:
        try:
            d = json.loads(line)
        except ValueError:
            return None
        if not isinstance(d, dict) or _text(d.get("event"), 40) is None:
            return None
        return cls(d["event"][:40], _text(d.get("text")) or "", _text(d.get("when"), 40) or "",
                   _int(d.get("attempt"), 0, 100000), _int(d.get("rank"), 0, 1 << 20))


@dataclass
class RunRecords:
    """One host's record of one run."""

    folder: str
    events: list[GangEvent] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    result: GangResult | None = None
    unsupervised: list[str] = field(default_factory=list)  # ranks whose image had no Python for the supervisor

    @property
    def formed(self) -> bool:
        return any(e.event == "formed" for e in self.events)


def parse_run(folder: str, events: str, attempts: str, result: str, unsupervised: str) -> RunRecords:
    """The four answers of `read_run` -> RunRecords (pure; tested on the files gang.py writes, and on garbage)."""
    rec = RunRecords(folder)
    rec.events = [e for e in (GangEvent.parse(x) for x in events.splitlines() if x.strip()) if e is not None]
    for x in attempts.splitlines():
        try:
            a = AttemptRecord.from_json(x)
        except (ValueError, TypeError):
            continue
        if isinstance(a.attempt, int) and isinstance(a.cause, str) and isinstance(a.code, int):
            rec.attempts.append(a)
    rec.result = GangResult.parse(result) if result.strip() else None
    rec.unsupervised = [x for x in unsupervised.split() if x.startswith("unsupervised-rank")]
    return rec


def read_run(h: Host, folder: str) -> RunRecords:
    """One round trip: the run's records on host `h` (missing files read as empty)."""
    steps = [["sh", "-c", READ, "sh", folder, name] for name in FILES] + [["sh", "-c", LIST, "sh", folder]]
    out = [r.stdout if r is not None else "" for r in h.connection().run_steps(steps, timeout=30)]
    return parse_run(folder, *out)


def latest_run(h: Host, runs: str) -> str | None:
    """The newest run folder's name under <job folder>/runs on `h` (None: none)."""
    name = h.connection().run(["sh", "-c", LATEST, "sh", runs], timeout=30).stdout.strip()
    ok = name and all(c.isalnum() or c in "-_." for c in name) and not name.startswith(".")
    return name if ok else None
