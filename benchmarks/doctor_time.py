"""What doctor's GPU facts cost per host: `dockerlaunch doctor` on a 2-node sim cluster by the code of two commits,
in one run, with a stand-in nvidia-smi on both nodes (tests/gpu_standin.py: by default the replay of a real R590 H100's
outputs, --replay; the written case h100-healthy with --replay '') so that the probe's nvidia-smi questions
(--help-query-gpu, --query-gpu, -q, --query-compute-apps, dmesg) are asked for real over SSH.

The "before" commit is the one before doctor read GPU facts (default 35d569d, before issue 41's work); "after" is this
checkout. The job asks for no GPUs (the sim has none to give a container), so the difference is the probe's round
trip and its parsing; doctor reads a known image's labels and never scans it. A real nvidia-smi costs more than the
stand-in: NVML initialises per call (~0.1-1 s each without persistence mode), which this cannot measure.

  .venv/bin/python benchmarks/doctor_time.py [--before REV] [--runs 3] [--replay FOLDER]

Why it imports tests/: tests/gpu_standin.py is the project's one stand-in nvidia-smi (its recorded outputs live in
tests/data/nvidia-smi); a copy here would be a second one.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.engine import engine  # noqa: E402
from tests import gpu_standin  # noqa: E402


def doctor(src: Path, config: str, image: str, env: dict) -> float:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from dockerlaunch.cli.main import main; main(sys.argv[2:])", str(src), "doctor",
                        "--config", config, "--image", image, "--output", "json"], capture_output=True, text=True,
                       env=env, timeout=600)
    wall = time.monotonic() - t0
    if r.returncode not in (0, 1):
        sys.exit(f"doctor_time: doctor by {src} failed: {r.stderr.strip()[-400:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="35d569d")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replay", default="h100-sxm-590.48.01-exporter",
                    help="a folder of tests/data/nvidia-smi/real/ replayed as both nodes' nvidia-smi ('' : the written "
                         "case h100-healthy)")
    args = ap.parse_args()
    client = engine()
    name = f"dlbench{secrets.token_hex(2)}"
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        env = {**os.environ, "DOCKERLAUNCH_STATE_DIR": str(state)}
        os.environ["DOCKERLAUNCH_STATE_DIR"] = str(state)
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before],
                       check=True, capture_output=True)
        demo = sim.build_demo_image()
        config = state / "cluster.yaml"
        sim.create(nodes=2, cluster=name, subnet=f"172.30.{200 + secrets.randbelow(40)}.0/24",
                   config_out=str(config), seed_images=(demo,))
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as t:
                data = (gpu_standin.replay(args.replay) if args.replay else gpu_standin.script("h100-healthy")).encode()
                info = tarfile.TarInfo("nvidia-smi")
                info.size, info.mode = len(data), 0o755
                t.addfile(info, io.BytesIO(data))
            for node in client.containers.list(filters={"label": f"{sim.SIM_LABEL}={name}"}):
                node.put_archive("/usr/local/bin", buf.getvalue())
            doctor(REPO, str(config), demo, env)  # warm: connections, page cache
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.runs):
                for label, src in (("before", before), ("after", REPO)):
                    times[label].append(doctor(src, str(config), demo, env))
                    print(f"{label:6} {times[label][-1]:6.2f} s", flush=True)
        finally:
            sim.remove(name)
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)],
                           capture_output=True)
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"median of {args.runs}: before {b:.2f} s, after {a:.2f} s (2 hosts at once), after/before {a / b:.2f}")


if __name__ == "__main__":
    main()
