"""What a gang restart costs beyond doing it by hand, measured on a sim cluster (issue 22).

Both ways start from the same instant -- rank 1 prints `failing` and exits 3 -- and end at the first line of the
next attempt:
  automatic  one `up --max-restarts 1`: teardown, `job.restart_backoff`, a new attempt (connect, prepare, start)
  by hand    `up` exits after its teardown; after the same backoff a person's second `up` starts the job again
The difference is dockerlaunch's own overhead (target: at most 2 s). Every time is read from `up`'s output as it
arrives (one reader thread, monotonic clock), `--skip-preflight` on both so only the restart is timed.

Run (root, dockerd up; brings up a 2-node sim cluster of its own and removes it):
  .venv/bin/python benchmarks/recovery.py [--rounds 3] [--backoff 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dockerlaunch import sim  # noqa: E402

NAME = "dlbench-recovery"
# attempt 0: rank 1 fails at once; any later attempt (or a second run by hand, DL_BY_HAND=1) says it started
CMD = ('echo "started attempt $DL_RESTART_COUNT"; '
       'if [ "${DL_BY_HAND:-0}$DL_RESTART_COUNT" = 00 ] && [ "$NODE_RANK" = 1 ]; then echo failing; exit 3; fi; '
       'sleep 1')


def up(config: Path, *args: str) -> tuple[int, list[tuple[float, str]]]:
    """Runs `dockerlaunch up`, returns its exit code and each output line with the monotonic time it arrived."""
    p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "up", "--skip-preflight", "--config", str(config),
                          "--name", "bench-recovery", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, bufsize=1)
    assert p.stdout is not None
    lines = [(time.monotonic(), line.rstrip("\n")) for line in p.stdout]
    return p.wait(), lines


def first(lines: list[tuple[float, str]], text: str, after: float = 0.0) -> float:
    for t, line in lines:
        if t >= after and text in line:
            return t
    raise SystemExit(f"no line with {text!r} in up's output:\n" + "\n".join(x for _, x in lines[-40:]))


def automatic(config: Path, backoff: float) -> float:
    code, lines = up(config, "--max-restarts", "1", "--", "sh", "-c", CMD)
    if code != 0:
        raise SystemExit(f"automatic restart ended with {code}:\n" + "\n".join(x for _, x in lines[-40:]))
    failed = first(lines, "failing")
    return first(lines, "started attempt 1", after=failed) - failed


def by_hand(config: Path, backoff: float) -> tuple[float, float]:
    """(seconds from the failure to the next run's first line, of which the first `up` took to exit)."""
    code, lines = up(config, "--", "sh", "-c", CMD)
    exited = time.monotonic()
    if code != 3:
        raise SystemExit(f"the failing run ended with {code}:\n" + "\n".join(x for _, x in lines[-40:]))
    failed = first(lines, "failing")
    time.sleep(backoff)
    start = time.monotonic()
    code, lines = up(config, "--env", "DL_BY_HAND=1", "--", "sh", "-c", CMD)
    if code != 0:
        raise SystemExit(f"the second run ended with {code}:\n" + "\n".join(x for _, x in lines[-40:]))
    return (exited - failed) + backoff + (first(lines, "started attempt 0") - start), exited - failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backoff", type=float, default=2.0, help="job.restart_backoff, and the wait by hand")
    ap.add_argument("--subnet", default="172.30.251.0/24")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cluster.yaml"
        sim.create(nodes=2, cluster=NAME, subnet=a.subnet, config_out=str(config))
        try:
            data = yaml.safe_load(config.read_text())
            data.setdefault("job", {})["restart_backoff"] = a.backoff
            config.write_text(yaml.safe_dump(data))
            autos, hands, teardowns = [], [], []
            for r in range(a.rounds):
                autos.append(automatic(config, a.backoff))
                hand, teardown = by_hand(config, a.backoff)
                hands.append(hand)
                teardowns.append(teardown)
                print(f"round {r + 1}: automatic {autos[-1]:.2f} s, by hand {hand:.2f} s "
                      f"(teardown {teardown:.2f} s + backoff {a.backoff:g} s + start), "
                      f"overhead {autos[-1] - hand:+.2f} s", flush=True)
            ma, mh = statistics.median(autos), statistics.median(hands)
            print(f"median over {a.rounds}: failure -> next attempt's first line: automatic {ma:.2f} s, "
                  f"by hand {mh:.2f} s, ratio {ma / mh:.3f}, dockerlaunch's overhead {ma - mh:+.2f} s "
                  f"(target <= 2 s); teardown alone {statistics.median(teardowns):.2f} s")
        finally:
            sim.remove(cluster=NAME)


if __name__ == "__main__":
    main()
