"""What a supervised job's hosts keep of it (gang.py's records, under <job folder>/runs/<run id>/ on every host),
read back by `up --detach`, `status`, `ps` and `logs`: how the job ended, its attempts, the gang's events, and
each attempt's per-rank output (`logs`, once the containers are gone or for `--attempt N`).

Every host keeps the whole record (the coordinator sends each event to every rank), so any host that answers tells
how the job went, also while host 0 is down. The files are the host's words: each line is parsed as JSON and each
field checked for its type and size; anything else is dropped, never guessed at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from dockerlaunch import gang
from dockerlaunch.errors import HostError
from dockerlaunch.hosts.fleet import Host, each
from dockerlaunch.job.recovery import AttemptRecord

FILES = ("events.jsonl", "attempts.jsonl", "result.json")
READ = 'cat "$1/$2" 2>/dev/null; true'
LIST = 'cd "$1" 2>/dev/null && for f in unsupervised-rank*; do [ -e "$f" ] && echo "$f"; done; true'
# the newest run folder by name (a run id starts with its start time, YYYYmmdd-HHMMSS: names sort by time)
LATEST = ('cd "$1" 2>/dev/null && ls -1 . 2>/dev/null | grep -E "^[0-9]{8}-[0-9]{6}-[0-9a-f]+$" | LC_ALL=C sort '
          '| tail -n 1; true')
TEXT_MAX = 2000
# up's run ids: the `dockerlaunch.run` label, the run folder's name
RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{1,32}$")
RANK_LOG = re.compile(r"^rank([0-9]{1,7})-([A-Za-z0-9._\[\]%@+-]{1,300})\.log$")  # gang.py's Records.log_path
# one attempt's rank logs on a host, each framed as `NAME BYTES\n` and its bytes ($2: all, or the last N lines)
ATTEMPT_LOGS = (
    'cd "$1" 2>/dev/null || exit 0\nt=$(mktemp) || exit 1\ntrap \'rm -f "$t"\' EXIT\n'
    'for f in rank*.log; do\n  { [ -f "$f" ] && [ ! -L "$f" ]; } || continue\n'
    '  if [ "$2" = all ]; then cat -- "$f"; else tail -n "$2" -- "$f"; fi >"$t" 2>/dev/null\n'
    '  printf \'%s %d\\n\' "$f" "$(($(wc -c <"$t")))"\n  cat "$t"\ndone')


def _text(v: object, limit: int = TEXT_MAX) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _object(text: str) -> dict | None:
    """A JSON object as a host wrote it, or None for anything else."""
    try:
        d = json.loads(text)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


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
        d = _object(text)
        if d is None:
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

    @property
    def failed(self) -> bool:
        return self.code != 0

    def short(self) -> str:
        """For `ps`'s state column: `succeeded`, `failed: rank 1 exited 3`, `failed: host lost (rank 0), code 75`."""
        if not self.failed:
            return "succeeded"
        if self.cause == gang.RANK_FAILED and self.rank is not None and self.exit_code is not None:
            return f"failed: rank {self.rank} exited {self.exit_code}"
        return f"failed: {self.cause}" + (f" (rank {self.rank})" if self.rank is not None else "") + \
            f", code {self.code}"

    def part_of(self, rank: int | None) -> str:
        """What rank `rank` had to do with the end (`status`): every container exits with the job's code, so the
        cause is the result's rank, and the others were stopped by the gang (or finished, when all did)."""
        if not self.failed:
            return "finished"
        if rank is not None and rank == self.rank:
            if self.cause == gang.RANK_FAILED and self.exit_code is not None:
                return f"the cause: exited with {self.exit_code}"
            return f"the cause: {self.cause}"
        return "stopped by the gang" if self.rank is not None or self.cause != gang.START_FAILED else self.cause

    def to_dict(self) -> dict:
        return {"cause": self.cause, "code": self.code, "rank": self.rank, "host": self.host,
                "exit_code": self.exit_code, "attempt": self.attempt, "ended": self.ended, "detail": self.detail,
                "line": self.line()}


@dataclass(frozen=True)
class GangEvent:
    event: str
    text: str
    when: str = ""
    attempt: int | None = None
    rank: int | None = None

    @classmethod
    def parse(cls, line: str) -> GangEvent | None:
        d = _object(line)
        if d is None or _text(d.get("event"), 40) is None:
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


def _attempt_ok(a: AttemptRecord) -> bool:
    """Every field of the type `status` prints it as (a host's line is data: a string where a number goes is dropped,
    never printed as one)."""
    def opt(v: object, t: type) -> bool:
        return v is None or (isinstance(v, t) and not isinstance(v, bool))

    def strs(v: object) -> bool:
        return isinstance(v, list) and len(v) <= 100000 and all(isinstance(x, str) for x in v)

    return (_int(a.attempt, 0, 100000) is not None and _text(a.cause, 40) == a.cause and _int(a.code, 0, 255)
            is not None and isinstance(a.started, str) and isinstance(a.seconds, (int, float))
            and not isinstance(a.seconds, bool) and a.seconds >= 0 and strs(a.hosts) and opt(a.rank, int)
            and opt(a.host, str) and opt(a.exit_code, int) and strs(a.swaps) and isinstance(a.detail, str))


def parse_run(folder: str, events: str, attempts: str, result: str, unsupervised: str) -> RunRecords:
    """The four answers of `read_run` -> RunRecords (pure; tested on the files gang.py writes, and on garbage)."""
    rec = RunRecords(folder)
    # hosts that share one folder (`local` entries of one machine) each append every line: each is kept once
    rec.events = list(dict.fromkeys(e for e in (GangEvent.parse(x) for x in events.splitlines() if x.strip())
                                    if e is not None))
    seen = set()
    for x in attempts.splitlines():
        try:
            a = AttemptRecord.from_json(x)
        except (ValueError, TypeError, AttributeError):
            continue
        if _attempt_ok(a) and a.attempt not in seen:
            seen.add(a.attempt)
            rec.attempts.append(a)
    rec.result = GangResult.parse(result) if result.strip() else None
    rec.unsupervised = [x for x in unsupervised.split() if x.startswith("unsupervised-rank")]
    return rec


def read_run(h: Host, folder: str, strict: bool = False) -> RunRecords:
    """One round trip: the run's records on host `h` (missing files read as empty)."""
    return read_runs(h, [folder], strict)[0]


def read_runs(h: Host, folders: list[str], strict: bool = False) -> list[RunRecords]:
    """Several runs' records on host `h` (`ps`: every job's there) in one round trip. `strict`: a batch that did
    not run raises (else it reads as no records, as `up`'s poll wants)."""
    steps: list[list[str]] = []
    for folder in folders:
        steps += [["sh", "-c", READ, "sh", folder, name] for name in FILES] + [["sh", "-c", LIST, "sh", folder]]
    if not steps:
        return []
    rs = h.connection().run_steps(steps, timeout=30)
    if strict and rs[0] is not None and not rs[0].ok:  # each step exits 0: the batch itself did not run
        raise HostError(h.name, rs[0].last_line(), step="reading the gang's records", exit_status=rs[0].exit_status)
    out = [r.stdout if r is not None else "" for r in rs]
    k = len(FILES) + 1
    return [parse_run(folder, *out[i * k:(i + 1) * k]) for i, folder in enumerate(folders)]


def latest_run(h: Host, runs: str) -> str | None:
    """The newest run folder's name under <job folder>/runs on `h` (None: none)."""
    name = h.connection().run(["sh", "-c", LATEST, "sh", runs], timeout=30).stdout.strip()
    return name if RUN_ID.match(name) else None


def _why(e: BaseException | None) -> str:
    return str(getattr(e, "reason", None) or e)


@dataclass
class GangRun:
    """One supervised run as the hosts that answered keep it (each keeps the whole record: any one tells how the
    job went), and the hosts that did not answer."""

    run: str
    folder: str
    hosts: list[tuple[str, RunRecords]] = field(default_factory=list)  # (host, its records), rank order
    unanswered: list[tuple[str, str]] = field(default_factory=list)  # (host, why)

    @property
    def supervised(self) -> bool:
        """The run was the gang supervisor's (an attached run, or an image without Python, keeps no events)."""
        return any(r.events or r.attempts or r.result for _, r in self.hosts)

    @property
    def result(self) -> GangResult | None:
        """How the job ended: the first host in rank order that has the result (None: it has not ended)."""
        return next((r.result for _, r in self.hosts if r.result is not None), None)

    @property
    def result_host(self) -> str | None:
        return next((h for h, r in self.hosts if r.result is not None), None)

    @property
    def attempts(self) -> list[AttemptRecord]:
        """The run's attempts: the longest record (a host that was down for a while missed some), rank order."""
        return max((r.attempts for _, r in self.hosts), key=len, default=[])

    @property
    def events(self) -> list[GangEvent]:
        return max((r.events for _, r in self.hosts), key=len, default=[])

    @property
    def attempt(self) -> int | None:
        """The run's last attempt (the one that runs, or the one it ended with)."""
        seen = [a.attempt for a in self.attempts] + [e.attempt for e in self.events if e.attempt is not None]
        if self.result is not None:
            seen.append(self.result.attempt)
        return max(seen, default=None)

    def to_dict(self) -> dict:
        return {"run": self.run, "folder": self.folder, "hosts": [h for h, _ in self.hosts]}


def read_gang(hosts: list[Host], runs: str, run: str | None) -> GangRun | None:
    """A job's supervised run from every host in `hosts` (rank order) that answers: the run `run` (its containers'
    `dockerlaunch.run` label), or with None, the newest run folder under `runs` (<job folder>/runs) on any of them.
    None: no such run (a job started attached keeps no records there). Hosts that fail are in `unanswered`."""
    unanswered: list[tuple[str, str]] = []
    if run is None or not RUN_ID.match(run):
        newest = each(lambda h: latest_run(h, runs), hosts)
        unanswered = [(o.item.name, _why(o.error)) for o in newest.failed]
        hosts = [o.item for o in newest if o.ok]
        run = max((o.value for o in newest if o.ok and o.value), default=None)
        if run is None:
            return None
    folder = f"{runs}/{run}"
    got = each(lambda h: read_run(h, folder, strict=True), hosts)
    out = GangRun(run, folder, [(o.item.name, o.value) for o in got if o.ok and o.value is not None],
                  unanswered + [(o.item.name, _why(o.error)) for o in got.failed])
    return out if out.supervised else None


def parse_attempt_logs(data: bytes) -> list[tuple[int, str, bytes]]:
    """ATTEMPT_LOGS's answer -> (rank, host as in the file name, bytes) per file; stops at the first frame that is
    not one (pure; the host's words are data: an odd name is skipped, a short frame ends the list)."""
    out, i = [], 0
    while i < len(data):
        nl = data.find(b"\n", i)
        if nl < 0 or nl - i > 400:
            break
        name, _, size = data[i:nl].decode(errors="replace").rpartition(" ")
        if not size.isdigit() or nl + 1 + int(size) > len(data):
            break
        body, i = data[nl + 1:nl + 1 + int(size)], nl + 1 + int(size)
        m = RANK_LOG.match(name)
        if m:
            out.append((int(m[1]), m[2], body))
    return out


def attempt_logs(h: Host, folder: str, attempt: int, tail: str) -> list[tuple[int, str, bytes]]:
    """Host `h`'s rank logs of one attempt (`tail`: all, or the last N lines of each), one round trip."""
    out, err = bytearray(), bytearray()
    status = h.connection().stream(["sh", "-c", ATTEMPT_LOGS, "sh", f"{folder}/attempt-{int(attempt)}", tail],
                                   out.extend, err.extend, timeout=120)
    if status != 0:
        said = err.decode(errors="replace").strip().splitlines()
        raise HostError(h.name, said[-1] if said else f"exit status {status}",
                        step=f"reading {folder}/attempt-{attempt}", exit_status=status)
    return parse_attempt_logs(bytes(out))
