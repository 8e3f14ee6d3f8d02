"""Scale, up: how long do `up`, `status` and `down` take against N hosts, against N containers started and removed
with the docker CLI straight on the engines in the same run (the floor)?

For each size N (`harness.sizes`): the floor (N x `docker exec ENGINE docker run -d --network host ...`, one thread
per host, then `docker rm -f` the same way; before the launcher's steps and again after them, the faster of the
two), then `up --skip-preflight --detach` of a job whose ranks print a line and sleep: until every container runs
(the latest StartedAt on the engines), and up's own exit; `docker ps` on the engines must show N. `status --output
json`: wall; N containers, each once. `down`: wall; no container of the job left on any engine.
Target (set for 256 hosts): up <= 1.5 x floor.

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale_up.py --hosts 8,64,256 [--json FILE]
"""

from __future__ import annotations

import collections
import json
import sys

from harness import sizes
from harness.direct import JOB_LABEL, job_containers, remove_by_label
from harness.sizes import Ctx, first_line_job


def step_up_status_down(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("up")
    out: dict = {"job": job}
    run = ctx.dl("up", "--name", job, "--skip-preflight", "--detach", "--log-dir", str(ctx.scratch / "logs"),
                 "--", "sh", "-c", first_line_job(c)).wait(ctx.timeout)
    out["up"] = run
    found = job_containers(c, job)
    running = [x for x in found if x["status"] == "running"]
    names = collections.Counter(x["name"] for x in found)
    out["engines_running"] = len(running)
    out["engines_distinct_names"] = len(names)
    if running:
        out["up_all_running_s"] = round(max(x["started"] for x in running) - run["t_start"], 3)
    out["up_ok"] = run["rc"] == 0 and len(running) == c.n and len(names) == c.n
    if not out["up_ok"]:
        out["up_problem"] = (f"rc {run['rc']}, {len(running)} of {c.n} running on the engines "
                             f"({len(names)} distinct names): {run['stderr_tail'][-400:]}")

    lines: list[str] = []
    st = ctx.dl("status", "--name", job, "--output", "json", on_line=lambda t, line: lines.append(line))
    srun = st.wait(ctx.timeout)
    out["status"] = srun
    try:
        listed = json.loads("\n".join(lines)).get("containers", [])
    except ValueError:
        listed = None
    if listed is None:
        out["status_ok"] = False
        out["status_problem"] = f"no JSON (rc {srun['rc']}): {srun['stderr_tail'][-400:]}"
    else:
        per_name = collections.Counter(x["name"] for x in listed)
        ranks = collections.Counter(x.get("rank") for x in listed)
        dup = {k: v for k, v in per_name.items() if v > 1}
        out["status_listed"] = len(listed)
        out["status_distinct"] = len(per_name)
        out["status_ok"] = (srun["rc"] == 0 and len(listed) == c.n and not dup
                            and set(ranks) == set(range(c.n)))
        if not out["status_ok"]:
            some = sorted(dup.items())[:3]
            out["status_problem"] = (f"listed {len(listed)} for {c.n} hosts, {len(per_name)} distinct; "
                                     f"listed more than once: {len(dup)} e.g. {some}")

    drun = ctx.dl("down", "--name", job).wait(ctx.timeout)
    out["down"] = drun
    left = job_containers(c, job)
    out["down_left"] = len(left)
    out["down_ok"] = drun["rc"] == 0 and not left
    if not out["down_ok"]:
        out["down_problem"] = (f"rc {drun['rc']}, {len(left)} container(s) left on the engines: "
                               f"{[x['name'] for x in left][:5]} {drun['stderr_tail'][-400:]}")
        remove_by_label(c, f"{JOB_LABEL}={job}")
    out["ok"] = out["up_ok"] and out["status_ok"] and out["down_ok"]
    return out


if __name__ == "__main__":
    steps = [sizes.FLOOR_BEFORE, ("up_status_down", step_up_status_down), sizes.FLOOR_AFTER]
    sys.exit(sizes.main(sizes.arguments(__doc__).parse_args(), steps, only_run=True))
