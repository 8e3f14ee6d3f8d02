"""Scale, host loss: when one of N hosts freezes, how long until `up` names it (job.host_timeout 10 s)?

For each size N (`harness.sizes`): `up` with job.host_timeout 10, then `docker pause CLUSTER-nodeN` (freezes that
host's sshd): time until up prints that the host stopped answering; unpaused after, `down`. Target: host_timeout
+ 5 s (no floor: the time is the launcher's own watchdog).

Run (root, dockerd up):
  .venv/bin/python benchmarks/scale_hostloss.py --hosts 8,64,256 [--json FILE]
"""

from __future__ import annotations

import subprocess
import sys
import time

from harness import sizes, tail
from harness.direct import JOB_LABEL, job_containers, remove_by_label
from harness.launcher import UpStream, wait_all_up
from harness.sizes import HOST_TIMEOUT, Ctx, StepFailed, first_line_job, variant_config


def freeze(node: str, tries: int = 5) -> list[str]:
    """`docker pause` with its error kept: at a load average of 300 runc's cgroup freeze can time out
    ("unable to freeze") and a second try lands. Returns what each failed try said."""
    said = []
    for _ in range(tries):
        r = subprocess.run(["docker", "pause", node], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return said
        said.append(tail(r.stderr or r.stdout, 300).strip())
        time.sleep(2)
    raise StepFailed(f"docker pause {node} failed {tries} times: {said[-1]}")


def step_hostloss(ctx: Ctx) -> dict:
    c = ctx.cluster
    job = ctx.job("hl")
    last = c.n - 1
    node = c.node(last)
    cfg = variant_config(ctx, job={"host_timeout": HOST_TIMEOUT})
    out: dict = {"job": job, "paused": node, "host_timeout_s": HOST_TIMEOUT}
    stream = UpStream(c.n)
    t0 = time.time()
    launch = ctx.dl("up", "--name", job, "--skip-preflight", "--log-dir", str(ctx.scratch / "logs"), "--",
                    "sh", "-c", first_line_job(c), on_line=stream, config=cfg)
    try:
        if not wait_all_up(stream, launch, ctx.timeout):
            said = " | ".join(f"+{t - t0:.1f}s {line}" for t, line in stream.own[-4:])
            raise StepFailed(f"only {len(stream.ranks_up)} of {c.n} ranks' first lines reached up's stream "
                             f"(up {'exited ' + str(launch.p.returncode) if launch.p.poll() is not None else 'runs'}"
                             f"); up said: {said} {' | '.join(list(launch.err_tail)[-3:])}")
        out["all_first_lines_s"] = round(time.time() - t0, 3)
        time.sleep(3)  # a heartbeat or two after the start
        out["pause_tries"] = freeze(node)
        ctx.paused.add(node)
        t_pause = time.time()
        deadline = t_pause + HOST_TIMEOUT + 60
        said = None
        while time.time() < deadline and launch.p.poll() is None:
            said = stream.find(r"stopped answering|host lost")
            if said:
                break
            time.sleep(0.05)
        said = said or stream.find(r"stopped answering|host lost")
        if said:
            out["named_after_s"] = round(said[0] - t_pause, 3)
            out["line"] = said[1]
            out["names_rank"] = f"rank {last} " in said[1] and c.hosts[last] in said[1]
        run = launch.wait(max(60.0, ctx.timeout - (time.time() - t0)))
        out["up"] = run
        out["up_exit_after_pause_s"] = round(launch.t_end - t_pause, 3)
        out["up_lines"] = [f"+{t - t0:.1f}s {line}" for t, line in stream.own[-12:]]
    except BaseException:
        launch.kill()
        if node in ctx.paused:
            subprocess.run(["docker", "unpause", node], capture_output=True)
            ctx.paused.discard(node)
        remove_by_label(c, f"{JOB_LABEL}={job}")
        raise
    finally:
        launch.kill()
        if node in ctx.paused:
            subprocess.run(["docker", "unpause", node], capture_output=True)
            ctx.paused.discard(node)
    left_after_up = job_containers(c, job)
    out["left_after_up"] = sorted(x["name"] for x in left_after_up)
    drun = ctx.dl("down", "--name", job).wait(ctx.timeout)
    out["down"] = drun
    left = job_containers(c, job)
    out["left_after_down"] = len(left)
    if left:
        remove_by_label(c, f"{JOB_LABEL}={job}")
    out["ok"] = bool(said) and out.get("names_rank", False) and not left and out["up"]["rc"] != 0
    if not said:
        out["problem"] = f"up never said the host was lost (rc {out['up']['rc']}): {out['up']['stderr_tail'][-400:]}"
    return out


if __name__ == "__main__":
    sys.exit(sizes.main(sizes.arguments(__doc__).parse_args(), [("hostloss", step_hostloss)], only_run=True))
