"""What `job.offline` and `--check_model false` save on hosts without a model hub, measured on a sim cluster.

The same 2-host `swift sft` (LoRA, 4 steps, the tiny Qwen2 of tests/integration/test_swift.py on /shared) runs
through `dockerlaunch up` three times, `--skip-preflight` so only the job is timed:
  online     job.offline false, the command as users write it: every rank's trainer asks ModelScope
             (ms-swift's check_model) and waits on its retries
  offline    job.offline true (HF_HUB_OFFLINE & co.), the command still without --check_model
  offline + --check_model false   what docs/RECIPES.md recommends for air-gapped hosts
Printed per run: the wall time of `up`, the hub retry lines in rank 0's log, and the ratio to the first run.

Needs the cpu stack image (`dockerlaunch build --stack cpu ...`) in the local engine. Run (root, dockerd up):
  .venv/bin/python benchmarks/offline_swift.py [--image TAG]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.engine import engine  # noqa: E402
from dockerlaunch.images.stacks import load_matrix  # noqa: E402

MAKER = ROOT / "tests" / "integration" / "data" / "swift"
RETRY = re.compile(r"listing failed|retry in \d+s")
NAME = "dlbench-offline"


def dl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockerlaunch", *args], capture_output=True, text=True, timeout=1800)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=load_matrix().get("cpu").tag)
    ap.add_argument("--subnet", default="172.30.252.0/24")
    a = ap.parse_args()
    client = engine()
    client.images.get(a.image)  # fails here, not after the cluster is up, when the stack was not built
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cluster.yaml"
        sim.create(nodes=2, cluster=NAME, subnet=a.subnet, config_out=str(config))
        try:
            push = dl("push", a.image, "--config", str(config))
            if push.returncode:
                raise SystemExit(f"push failed: {push.stderr[-2000:]}")
            client.containers.run(a.image, ["python", "/maker/make_tiny_qwen2.py", "/shared/bench"], remove=True,
                                  network_mode="none", volumes={f"{NAME}-shared": {"bind": "/shared", "mode": "rw"},
                                                                str(MAKER): {"bind": "/maker", "mode": "ro"}})
            base = ["swift", "sft", "--model", "/shared/bench/model", "--model_type", "qwen2", "--template", "qwen",
                    "--dataset", "/shared/bench/train.jsonl", "--tuner_type", "lora", "--max_steps", "4",
                    "--per_device_train_batch_size", "2", "--save_steps", "4", "--dataloader_num_workers", "0",
                    "--report_to", "none", "--max_length", "128", "--add_version", "false"]
            runs = [("online", [], base), ("offline", ["--offline"], base),
                    ("offline + --check_model false", ["--offline"], base + ["--check_model", "false"])]
            rows = []
            for label, flags, command in runs:
                online_cfg = config if flags else _online(config)
                logs = Path(tmp) / f"logs-{len(rows)}"
                t0 = time.monotonic()
                r = dl("up", "--config", str(online_cfg), "--image", a.image, *flags, "--skip-preflight",
                       "--log-dir", str(logs), "--name", f"bench{len(rows)}", "--", *command,
                       "--output_dir", f"/shared/bench/out{len(rows)}")
                took = time.monotonic() - t0
                if r.returncode:
                    raise SystemExit(f"{label}: up exited {r.returncode}: {r.stdout[-3000:]}")
                rank0 = next(logs.rglob("rank0-*.log")).read_text(errors="replace")
                rows.append((label, took, sum(1 for line in rank0.splitlines() if RETRY.search(line))))
        finally:
            sim.remove(NAME, quiet=True)
    print(f"2-host swift sft (LoRA, 4 steps, tiny Qwen2) on the sim, image {a.image}\n")
    print("| run | up wall s | hub retry lines (rank 0) | x online |")
    print("|---|---|---|---|")
    for label, took, retries in rows:
        print(f"| {label} | {took:.1f} | {retries} | {took / rows[0][1]:.2f} |")


def _online(config: Path) -> Path:
    import yaml

    data = yaml.safe_load(config.read_text())
    data["job"]["offline"] = False
    out = config.with_name("online.yaml")
    out.write_text(yaml.safe_dump(data))
    return out


if __name__ == "__main__":
    main()
