"""The figures behind the suite's hang guards: the suite asserts only that these finish within about 3 x what is
measured here (a guard against a hang, never a speed claim), so this measures what they take, on a 2-node sim
cluster, in one run:

- `up` given SIGINT during pre-flight (a probe container runs): seconds until it exits
  (guard: tests/integration/test_faults.py test_sigint_during_preflight_starts_nothing, 15 s);
- `up` given SIGINT, SIGTERM, SIGHUP while the job runs on both hosts: seconds until it exits with every container
  gone (guard: tests/integration/test_launch.py test_signal_tears_down_every_host, 45 s);
- `doctor --config C --image DEMO` of the whole cluster (guard: tests/integration/test_probe_images.py
  test_a_bare_debian_image, 90 s).

  .venv/bin/python benchmarks/hang_guards.py [--runs 3]

Why it imports tests/ (the one benchmark beside doctor_time.py that does): it times the suite's own guards, so it
starts, waits for and stops `up` with the very helpers those tests use (tests/integration/helpers.py); a copy
could drift from what the guards guard.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.hosts.ssh import Remote  # noqa: E402
from dockerlaunch.hosts.targets import resolve_target  # noqa: E402
from dockerlaunch.job.load import load_config  # noqa: E402
from tests.integration.helpers import (  # noqa: E402
    containers_on,
    dl,
    probe_containers_on,
    start_up,
    stop_up,
    until,
    wait_for_ready,
)

GUARDS = {"SIGINT in pre-flight": 15.0, "teardown after SIGINT": 45.0, "teardown after SIGTERM": 45.0,
          "teardown after SIGHUP": 45.0, "doctor, 2 hosts": 90.0}
SLEEPER = 'echo "ready $NODE_RANK"; sleep 600'


def preflight_sigint(config: str, image: str, remotes: list[Remote]) -> float:
    job = f"b{secrets.token_hex(3)}"
    p, _, out = start_up("--config", config, "--image", image, "--name", job, "--", "sh", "-c", SLEEPER)
    try:
        if until(lambda: any(probe_containers_on(r) for r in remotes), 120) is None:
            sys.exit("hang_guards: pre-flight never started a probe container:\n" + "".join(out)[-2000:])
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
        return time.monotonic() - t0
    finally:
        stop_up(p)
        dl("down", "--config", config, "--name", job)


def teardown(config: str, sig: signal.Signals, remotes: list[Remote]) -> float:
    job = f"b{secrets.token_hex(3)}"
    p, lines, out = start_up("--skip-preflight", "--config", config, "--name", job, "--", "sh", "-c", SLEEPER)
    try:
        if wait_for_ready(lines, {"0", "1"}, 120) != {"0", "1"}:
            sys.exit("hang_guards: the job never became ready:\n" + "".join(out)[-2000:])
        t0 = time.monotonic()
        p.send_signal(sig)
        p.wait(timeout=300)
        took = time.monotonic() - t0
        left = [containers_on(r, job) for r in remotes]
        if any(left):
            sys.exit(f"hang_guards: containers left after {sig.name}: {left}")
        return took
    finally:
        stop_up(p)
        dl("down", "--config", config, "--name", job)


def doctor(config: str, image: str) -> float:
    t0 = time.monotonic()
    r = dl("doctor", "--config", config, "--image", image, "--output", "json", timeout=600)
    took = time.monotonic() - t0
    if r.returncode not in (0, 1):
        sys.exit(f"hang_guards: doctor failed: {r.stderr.strip()[-400:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    name = f"dlbench{secrets.token_hex(2)}"
    times: dict[str, list[float]] = {k: [] for k in GUARDS}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DOCKERLAUNCH_STATE_DIR"] = tmp
        config = str(Path(tmp) / "cluster.yaml")
        demo = sim.build_demo_image()
        sim.create(nodes=2, cluster=name, subnet=f"172.30.{200 + secrets.randbelow(40)}.0/24", config_out=config,
                   seed_images=(demo,))
        cfg = load_config(config)
        remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
        try:
            doctor(config, demo)  # warm: connections, page cache
            for _ in range(args.runs):  # interleaved, so that a slow minute of the machine spreads over all
                times["SIGINT in pre-flight"].append(preflight_sigint(config, demo, remotes))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    times[f"teardown after {sig.name}"].append(teardown(config, sig, remotes))
                times["doctor, 2 hosts"].append(doctor(config, demo))
                print("  ".join(f"{k}: {v[-1]:.1f} s" for k, v in times.items()), flush=True)
        finally:
            for r in remotes:
                r.close()
            sim.remove(name)
    print(f"\n{'what':26} {'median':>7} {'max':>6} {'guard':>6} {'guard/max':>9}")
    for what, got in times.items():
        print(f"{what:26} {statistics.median(got):6.1f}s {max(got):5.1f}s {GUARDS[what]:5.0f}s "
              f"{GUARDS[what] / max(got):8.1f}x")


if __name__ == "__main__":
    main()
