"""Gang restarts as pure rules: how an attempt ended, whether another one starts, which spare takes which rank.

The docker backend runs the attempts (backends/docker/up.py `up`); what it decides between two attempts is
decided here, so it can be tested without a host. Restarts happen only on failure: a job whose ranks all exit 0
is done (a Kubernetes StatefulSet that restarted finished jobs is the failure this avoids), and a person's Ctrl-C
or SIGTERM ends the job without a new attempt.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from dockerlaunch import gang
from dockerlaunch.enums import StrEnum
from dockerlaunch.job.config import ClusterConfig, HostConfig


class Cause(StrEnum):
    """How an attempt ended; the values the gang supervisor (gang.py) writes on the hosts are its own constants."""

    SUCCEEDED = gang.SUCCEEDED
    RANK_FAILED = gang.RANK_FAILED
    HOST_LOST = gang.HOST_LOST
    HANG = gang.HANG
    START_FAILED = gang.START_FAILED
    PREFLIGHT_FAILED = "preflight failed"
    INTERRUPTED = gang.INTERRUPTED
    DETACHED = "detached"


# what another attempt may fix: a crash, a lost or replaced host, a hang, a start that failed on one host -- the
# gang supervisor's rule, so an attached and a detached run restart alike
RESTARTABLE = frozenset(Cause(c) for c in gang.RESTARTABLE)


@dataclass
class Ending:
    """How one attempt ended: `up`'s exit code for it, why, and which rank/host (where one was first)."""

    code: int
    cause: Cause
    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None  # the rank's own exit code
    lost: tuple[int, ...] = ()  # ranks whose hosts stopped answering
    detail: str = ""  # e.g. where the hang dump went


def should_restart(ending: Ending, attempt: int, max_restarts: int) -> bool:
    """Another attempt, or not: only for a failure another start can fix, and only while restarts are left."""
    return gang.should_restart(str(ending.cause), attempt, max_restarts)


@dataclass
class AttemptRecord:
    """One line of a run's attempts.jsonl, and the summary `up` prints and `status` shows."""

    attempt: int  # 0: the first start (DL_RESTART_COUNT)
    cause: str
    code: int
    started: str  # ISO time, the launcher's clock
    seconds: float
    hosts: list[str] = field(default_factory=list)  # rank order
    rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    swaps: list[str] = field(default_factory=list)  # "rank 1: 10.0.0.2 -> spare 10.0.0.9 (host lost)"
    detail: str = ""

    @classmethod
    def of(cls, attempt: int, ending: Ending, started: str, seconds: float, hosts: list[str],
           swaps: list[str]) -> AttemptRecord:
        return cls(attempt, str(ending.cause), ending.code, started, round(seconds, 1), list(hosts), ending.rank,
                   ending.host, ending.exit_code, list(swaps), ending.detail)

    def line(self) -> str:
        what = self.cause
        if self.rank is not None:
            what += f": rank {self.rank} ({self.host})"
            if self.exit_code is not None:
                what += f" exited with {self.exit_code}"
        out = f"attempt {self.attempt}: {what}, after {_duration(self.seconds)}; up's exit code {self.code}"
        if self.swaps:
            out += "; " + "; ".join(self.swaps)
        if self.detail:
            out += f"; {self.detail}"
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AttemptRecord:
        data = json.loads(text)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{seconds:.1f}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Swap:
    rank: int
    old: str
    new: str
    why: str

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.old} -> spare {self.new} ({self.why})"


class NoSpareLeft(Exception):
    """More hosts must be replaced than spares remain."""


def swap_hosts(config: ClusterConfig, bad: dict[int, str]) -> tuple[ClusterConfig, list[Swap]]:
    """The config with each rank in `bad` ({rank: why}) on the next spare, in rank order; used spares leave the
    spare list (a replaced host does not come back as a spare: it failed once). Rank 0's replacement is host 0
    of the new config, so the plan made from it has the new MASTER_ADDR."""
    spares = list(config.spares)
    if len(bad) > len(spares):
        names = ", ".join(f"rank {r} ({config.hosts[r].address}: {why})" for r, why in sorted(bad.items()))
        left = f"{len(spares)} spare(s) left" if spares else "no spare left"
        raise NoSpareLeft(f"{names} must be replaced and {left}")
    hosts: list[HostConfig] = list(config.hosts)
    swaps = []
    for rank, why in sorted(bad.items()):
        spare = spares.pop(0)
        swaps.append(Swap(rank, hosts[rank].address, spare.address, why))
        hosts[rank] = spare
    return config.model_copy(update={"hosts": hosts, "spares": spares}), swaps
