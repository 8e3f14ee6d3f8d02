"""What every import order costs: `dockerlaunch verify` on one image by the code of two commits, in one run.

The "before" commit is the one before verify imported each component alone and in both orders (9ee14ae^ by
default); "after" is this checkout. Both use the same cubin cache (warmed by a first, untimed run of "after"), so
the difference is the import-order processes, not cuobjdump.

  .venv/bin/python benchmarks/verify_time.py --image dockerlaunch/train:cu130-py313-...-swift4.6.0 [--before REV]

Prints each run's wall time, rows and verdict, and after/before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(src: Path, image: str) -> tuple[float, dict]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from dockerlaunch.cli.main import main; main(sys.argv[2:])",
                        str(src), "verify", image, "--output", "json"], capture_output=True, text=True, cwd=src)
    wall = time.monotonic() - t0
    try:
        report = json.loads(r.stdout)
    except ValueError:
        sys.exit(f"verify_time: verify by {src} printed no JSON (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    return wall, report


def describe(report: dict) -> str:
    counts: dict[str, int] = {}
    for c in report.get("checks", []):
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--before", default="9ee14ae^")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before],
                       check=True, capture_output=True)
        try:
            run(REPO, args.image)  # warm the cubin cache and the page cache
            rows = []
            for name, src in (("before", before), ("after", REPO), ("before", before), ("after", REPO)):
                wall, report = run(src, args.image)
                rows.append((name, wall))
                print(f"{name:6} {wall:7.1f} s  {describe(report)}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)],
                           capture_output=True)
    b = min(w for n, w in rows if n == "before")
    a = min(w for n, w in rows if n == "after")
    print(f"best of two: before {b:.1f} s, after {a:.1f} s, after/before {a / b:.2f}")


if __name__ == "__main__":
    main()
