"""Scale, doctor: how long does `doctor` take against N hosts, and which of its checks are not PASS there?

For each size N (a light sim cluster, or --config/--cluster of one that is up; `harness.sizes`), the real CLI
`doctor --output json`: its wall time, the launcher's peak RSS / threads / open fds, and the checks that are not
PASS, by check name. No floor: doctor has nothing to be compared with but itself at the other sizes (the growth
table of a run of several sizes).

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale_doctor.py --hosts 8,64,256 [--json FILE]
"""

from __future__ import annotations

import collections
import json
import sys

from harness import sizes
from harness.sizes import Ctx, StepFailed


def step_doctor(ctx: Ctx) -> dict:
    lines: list[str] = []
    launch = ctx.dl("doctor", "--output", "json", on_line=lambda t, line: lines.append(line))
    run = launch.wait(ctx.timeout)
    try:
        report = json.loads("\n".join(lines))
    except ValueError:
        raise StepFailed(f"doctor printed no JSON (rc {run['rc']}): {run['stderr_tail'][-600:]}") from None
    not_pass: dict[str, dict[str, int]] = {}
    reasons: dict[str, list[str]] = {}
    for c in report.get("checks", []):
        if c["verdict"] != "PASS":
            not_pass.setdefault(c["check"], collections.Counter())[c["verdict"]] += 1
            reasons.setdefault(f"{c['check']} {c['verdict']}", [])
            r = reasons[f"{c['check']} {c['verdict']}"]
            if c["reason"] not in r and len(r) < 3:
                r.append(c["reason"])
    hosts_seen = len({c["host"] for c in report.get("checks", [])})
    return {"launcher": run, "counts": report.get("counts"), "hosts_in_report": hosts_seen,
            "not_pass": {k: dict(v) for k, v in not_pass.items()}, "not_pass_reasons": reasons,
            "wall_s": run["wall_s"], "ok": run["rc"] == 0 and not run["timed_out"]}


if __name__ == "__main__":
    sys.exit(sizes.main(sizes.arguments(__doc__).parse_args(), [("doctor", step_doctor)], only_run=True))
