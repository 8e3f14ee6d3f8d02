"""Scale, fail-fast: when one of N ranks exits 1, how long until no container of the job is left, against N
containers removed with the docker CLI straight on the engines in the same run (the floor)?

For each size N (`harness.sizes`): `up` of a job whose rank N-1 exits 1 once every rank's first line has reached
up's stream: from that rank's exit (docker events `die` on its engine) to the last job container's `destroy` on any
engine, and to up's exit (non-zero expected). The floor: N x `docker rm -f` on the engines, the faster of one run
before and one after. Targets (set for 256 hosts): teardown <= 1.5 x floor and <= 10 s after the rank's exit.

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale_failfast.py --hosts 8,64,256 [--json FILE]
"""

from __future__ import annotations

import re
import sys
import time

from harness import sizes, tail
from harness.direct import JOB_LABEL, EngineEvents, job_containers, on_engine, remove_by_label
from harness.launcher import UpStream, wait_all_up
from harness.sizes import Ctx


def step_failfast(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("ff")
    last = c.n - 1
    max_wait = int(ctx.timeout * 10)  # tenths of a second: the rank fails by itself if never told to
    cmd = (f'echo "rank $NODE_RANK up"; if [ "$NODE_RANK" = "{last}" ]; then n=0; '
           f'while [ ! -e /tmp/fail ] && [ $n -lt {max_wait} ]; do sleep 0.1; n=$((n+1)); done; '
           'echo "rank $NODE_RANK exits 1 at $(date +%s.%N)"; exit 1; fi; exec sleep 600')
    out: dict = {"job": job}
    t0 = time.time()
    events = EngineEvents(c, job, since=t0 - 1, until=t0 + ctx.timeout + 120)
    stream = UpStream(c.n)
    launch = ctx.dl("up", "--name", job, "--skip-preflight", "--log-dir", str(ctx.scratch / "logs"), "--",
                    "sh", "-c", cmd, on_line=stream)
    try:
        if not wait_all_up(stream, launch, ctx.timeout):
            out["problem"] = f"only {len(stream.ranks_up)} of {c.n} ranks' first lines reached up's stream"
        out["all_first_lines_s"] = round(time.time() - t0, 3)
        name = f"{job}-{last}"
        trig = on_engine(c.engine_of(last), ["docker", "exec", name, "touch", "/tmp/fail"])
        out["triggered"] = trig.returncode == 0
        if trig.returncode != 0:
            out["trigger_error"] = tail(trig.stderr, 300)
        run = launch.wait(ctx.timeout)
        out["up"] = run
        time.sleep(2)  # the engines' last events reach the watchers
        left = job_containers(c, job)
        out["left"] = len(left)
        die = events.times("die", name)
        destroys = events.times("destroy")
        printed = next((float(m[1]) for _, r, s in stream.rank_lines if r == last
                        for m in [re.search(r"exits 1 at ([0-9.]+)", s)] if m), None)
        t_exit = min(die) if die else printed
        out["rank_exit_from"] = "docker events die" if die else ("the rank's printed time" if printed else None)
        out["destroyed"] = len(set(n for a, n, t in events.events if a == "destroy"))
        if t_exit is not None:
            if not left and len(set(n for a, n, t in events.events if a == "destroy")) >= c.n:
                out["teardown_s"] = round(max(destroys) - t_exit, 3)
            elif not left:  # some destroy events missed: up's exit is an upper bound
                out["teardown_s"] = round(launch.t_end - t_exit, 3)
                out["teardown_note"] = "upper bound (up's exit): not every destroy event was seen"
            out["up_exit_after_rank_s"] = round(launch.t_end - t_exit, 3)
        failed_line = stream.find(r"exited with|rank failed")
        out["up_said"] = failed_line[1] if failed_line else None
        out["up_lines"] = [f"+{t - t0:.1f}s {line}" for t, line in stream.own[-12:]]
        out["ok"] = (run["rc"] not in (0, None) and not run["timed_out"] and not left and "teardown_s" in out)
        if left:
            names = [x["name"] for x in left][:5]
            out["problem"] = f"{len(left)} container(s) of the job left after up exited: {names}"
        elif run["rc"] == 0:
            out["problem"] = "up exited 0 although a rank exited 1"
    finally:
        launch.kill()
        events.close()
        if job_containers(c, job):
            remove_by_label(c, f"{JOB_LABEL}={job}")
    return out


if __name__ == "__main__":
    steps = [sizes.FLOOR_BEFORE, ("failfast", step_failfast), sizes.FLOOR_AFTER]
    sys.exit(sizes.main(sizes.arguments(__doc__).parse_args(), steps, only_run=True))
