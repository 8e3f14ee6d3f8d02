"""What doctor says: one verdict.Finding per host and check (its Verdict and its line), in a Report. The smoke's
rows join the same Report; the JSON keeps its own keys (`check`, `verdict`, `reason`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dockerlaunch.verdict import Finding, Verdict

PASS, WARN, FAIL, SKIP, ERROR = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP, Verdict.ERROR
# the verdicts doctor's rows use (verify's NOTE is not one): the JSON's `counts` keys
DOCTOR_VERDICTS = (PASS, WARN, FAIL, SKIP, ERROR)


CHECK_ORDER = ["ssh", "probe", "docker", "image", "route", "master port", "gang port", "reachability", "shm", "memlock",
               "nofile", "gpus", "driver", "archs", "gpu health", "gpu models", "infiniband", "ib in container",
               "image ibverbs", "mounts", "selinux", "shared", "model cache", "hubs", "disk", "clock",
               # doctor --smoke: the image on the GPUs, after every check above passed
               "smoke", "smoke matmul", "smoke te linear", "smoke flash-attn", "smoke apex norm",
               "smoke all_reduce host", "smoke all_reduce world", "smoke transport", "straggler"]


@dataclass
class Report:
    checks: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> list[Finding]:
        """FAIL and ERROR rows: a check that could not run proves nothing."""
        return [c for c in self.checks if c.verdict in (FAIL, ERROR)]

    def add(self, host: str, check: str, verdict: Verdict, detail: str, rank: int = -1) -> None:
        self.checks.append(Finding(check, verdict, detail, host, rank))

    def get(self, host: str, check: str) -> Finding | None:
        return next((c for c in self.checks if c.host == host and c.check == check), None)

    def counts(self) -> dict[Verdict, int]:
        return {v: sum(1 for c in self.checks if c.verdict == v) for v in DOCTOR_VERDICTS}

    def summary(self) -> str:
        n = self.counts()
        return f"doctor: {n[PASS]} PASS, {n[FAIL]} FAIL, {n[WARN]} WARN, {n[SKIP]} SKIP" + \
            (f", {n[ERROR]} ERROR" if n[ERROR] else "")

    def to_dict(self) -> dict:
        return {"ok": not self.failed, "counts": {str(k): v for k, v in self.counts().items()},
                "checks": [{"host": c.host, "check": c.check, "verdict": str(c.verdict), "reason": c.detail}
                           for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
