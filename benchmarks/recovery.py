"""What a gang restart costs beyond doing it by hand, measured on a sim cluster (issue 22).

Both ways start from the same instant -- rank 1 prints `failing` and exits 3 -- and end at the first line of the
next attempt:
  automatic  one `up --max-restarts 1`: teardown, `job.restart_backoff`, a new attempt (connect, prepare, start)
  by hand    `up` exits after its teardown; after the same backoff a person's second `up` starts the job again
The difference is dockerlaunch's own overhead (target: at most 2 s). Every time is read from `up`'s output as it
arrives (one reader thread, monotonic clock), `--skip-preflight` on both so only the restart is timed.

Then the same failure attached (the launcher decides) and detached (the gang supervisor on the hosts decides,
issue 59): failure -> the other rank stopped (its SIGTERM), and failure -> the next attempt running on every rank,
each instant by the command's own `date` (the nodes share this machine's clock), never by dockerlaunch's records.

Run (root, dockerd up; brings up a 2-node sim cluster of its own and removes it):
  .venv/bin/python benchmarks/recovery.py [--rounds 3] [--backoff 2]
"""

from __future__ import annotations

import argparse
import re
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


# the same failure attached and detached, every instant by the hosts' own clock (`date`; the sim's nodes share this
# machine's kernel clock): rank 1 fails once; rank 0 says when SIGTERM reached it; attempt 1 says when it started
TIMED = ('date +"started attempt $DL_RESTART_COUNT rank $NODE_RANK at %s.%N"; '
         'if [ "$DL_RESTART_COUNT" = 0 ]; then '
         '  if [ "$NODE_RANK" = 1 ]; then sleep 2; date +"failing at %s.%N"; exit 3; fi; '
         '  trap \'date +"stopped at %s.%N"; exit 143\' TERM; sleep 600 & wait; '
         'fi; sleep 1')
_AT = re.compile(r"(started attempt (\d+) rank (\d+)|failing|stopped) at (\d+\.\d+)")


def instants(text: str) -> tuple[float, float, float]:
    """(failure, rank 0 stopped, attempt 1 started on every rank) from the command's own lines."""
    failing, stopped, next_ = None, None, []
    for m in _AT.finditer(text):
        t = float(m[4])
        if m[1] == "failing":
            failing = t
        elif m[1] == "stopped":
            stopped = t
        elif m[2] == "1":
            next_.append(t)
    if failing is None or stopped is None or len(next_) < 2:
        raise SystemExit("the timed command's lines are missing:\n" + text[-3000:])
    return failing, stopped, max(next_)


def attached_vs_detached(config: Path, image: str) -> dict[str, tuple[float, float]]:
    """{mode: (failure -> rank 0 stopped, failure -> attempt 1 running on every rank)} for one failure each way."""
    from dockerlaunch.hosts.ssh import Remote
    from dockerlaunch.hosts.targets import resolve_target
    from dockerlaunch.job.load import load_config

    out = {}
    code, lines = up(config, "--image", image, "--max-restarts", "1", "--", "sh", "-c", TIMED)
    if code != 0:
        raise SystemExit(f"attached run ended with {code}:\n" + "\n".join(x for _, x in lines[-40:]))
    f, s, n = instants("\n".join(x for _, x in lines))
    out["attached"] = (s - f, n - f)
    code, lines = up(config, "--image", image, "--max-restarts", "1", "--detach", "--", "sh", "-c", TIMED)
    if code != 0:
        raise SystemExit(f"detached start ended with {code}:\n" + "\n".join(x for _, x in lines[-40:]))
    cfg = load_config(str(config))
    remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
    try:
        deadline = time.monotonic() + 120
        read = 'd=$(ls -1td /var/tmp/dockerlaunch/bench-recovery/runs/*/ | head -n 1); cat "$d"/result.json'
        while not remotes[0].run(["sh", "-c", read]).ok:
            if time.monotonic() > deadline:
                raise SystemExit("the detached run did not end within 120 s")
            time.sleep(0.5)
        logs = 'd=$(ls -1td /var/tmp/dockerlaunch/bench-recovery/runs/*/ | head -n 1); cat "$d"/attempt-*/rank*.log'
        f, s, n = instants("\n".join(r.run(["sh", "-c", logs]).stdout for r in remotes))
        out["detached"] = (s - f, n - f)
    finally:
        for r in remotes:
            r.close()
        subprocess.run([sys.executable, "-m", "dockerlaunch", "down", "--config", str(config), "--name",
                        "bench-recovery"], capture_output=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backoff", type=float, default=2.0, help="job.restart_backoff, and the wait by hand")
    ap.add_argument("--subnet", default="172.30.251.0/24")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cluster.yaml"
        demo = sim.build_demo_image()  # the detached runs' supervisor runs on the image's python3
        sim.create(nodes=2, cluster=NAME, subnet=a.subnet, config_out=str(config), seed_images=(demo,))
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
            modes: dict[str, list[tuple[float, float]]] = {"attached": [], "detached": []}
            for r in range(a.rounds):
                for mode, times in attached_vs_detached(config, demo).items():
                    modes[mode].append(times)
                    print(f"round {r + 1}: {mode}: failure -> rank 0 stopped {times[0]:.2f} s, -> attempt 1 on "
                          f"every rank {times[1]:.2f} s", flush=True)
            (at, an), (dt, dn) = ([statistics.median(x[i] for x in modes[m]) for i in (0, 1)]
                                  for m in ("attached", "detached"))
            print(f"median over {a.rounds}: failure -> rank 0 stopped: attached {at:.2f} s, detached {dt:.2f} s "
                  f"(ratio {dt / at:.3f}); failure -> next attempt: attached {an:.2f} s, detached {dn:.2f} s "
                  f"(ratio {dn / an:.3f})")
        finally:
            sim.remove(cluster=NAME)


if __name__ == "__main__":
    main()
