"""What doctor says: one Check per host and check name (a gpu.verdict.Verdict and its line), in a Report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dockerlaunch.verdict import Verdict

PASS, WARN, FAIL, SKIP, ERROR = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP, Verdict.ERROR
# the verdicts doctor's rows use (verify's NOTE is not one): the JSON's `counts` keys
DOCTOR_VERDICTS = (PASS, WARN, FAIL, SKIP, ERROR)


CHECK_ORDER = ["ssh", "probe", "docker", "image", "route", "master port", "reachability", "shm", "memlock", "nofile",
               "gpus", "driver", "archs", "gpu health", "gpu models", "infiniband", "ib in container", "image ibverbs",
               "mounts", "shared", "model cache", "hubs", "disk", "clock",
               # doctor --smoke: the image on the GPUs, after every check above passed
               "smoke", "smoke matmul", "smoke te linear", "smoke flash-attn", "smoke apex norm",
               "smoke all_reduce host", "smoke all_reduce world", "smoke transport", "straggler"]


@dataclass
class Check:
    host: str
    name: str
    status: Verdict
    reason: str
    rank: int = -1  # which host (two hosts may share an address behind one gateway, by port)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        """FAIL and ERROR rows: a check that could not run proves nothing."""
        return [c for c in self.checks if c.status in (FAIL, ERROR)]

    def add(self, host: str, name: str, status: Verdict, reason: str, rank: int = -1) -> None:
        self.checks.append(Check(host, name, status, reason, rank))

    def get(self, host: str, name: str) -> Check | None:
        return next((c for c in self.checks if c.host == host and c.name == name), None)

    def counts(self) -> dict[Verdict, int]:
        return {v: sum(1 for c in self.checks if c.status == v) for v in DOCTOR_VERDICTS}

    def summary(self) -> str:
        n = self.counts()
        return f"doctor: {n[PASS]} PASS, {n[FAIL]} FAIL, {n[WARN]} WARN, {n[SKIP]} SKIP" + \
            (f", {n[ERROR]} ERROR" if n[ERROR] else "")

    def to_dict(self) -> dict:
        return {"ok": not self.failed, "counts": {str(k): v for k, v in self.counts().items()},
                "checks": [{"host": c.host, "check": c.name, "verdict": str(c.status), "reason": c.reason}
                           for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
