"""Does a built image keep its pins? Two ordinary `pip install`s in the real image, offline, from a folder that also
holds torch 2.11's own cuBLAS (13.1.0.3, the one TE's core cannot run on):

  1. another peft (0.18.1; the image has 0.19.1): needs nothing new of torch, so it must succeed and leave cuBLAS,
     TE, NCCL and torch where they are;
  2. nvidia-cublas==13.1.0.3 itself: would move cuBLAS, so it must fail in pip's own words, naming the constraint.

With --control IMAGE (an image of the same stack built before dockerlaunch kept pins), case 1 runs there too: it
shows what happens without the constraint (cuBLAS goes back to 13.1.0.3).

  .venv/bin/python benchmarks/kept_pins.py --image dockerlaunch/train:cu130-py313-...-swift4.6.0 [--control OLD]

Prints one line per case and exits 1 if a case does not behave as stated. Needs PyPI once for the two wheels
(kept in ~/.cache/dockerlaunch/bench-wheels/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from dockerlaunch.cache import cache_root

WATCH = ("nvidia-cublas", "torch", "transformer-engine-cu13", "nvidia-nccl-cu13", "peft")
WHEELS = ("peft==0.18.1", "nvidia-cublas==13.1.0.3")


def wheels() -> Path:
    folder = cache_root() / "bench-wheels" / "kept-pins"
    folder.mkdir(parents=True, exist_ok=True)
    for req in WHEELS:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:",
                            "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_28_x86_64",
                            "--platform", "manylinux2014_x86_64", "--python-version", "3.13", "-q", "-d",
                            str(folder), req], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            sys.exit(f"kept_pins: cannot download {req}: {r.stderr.strip().splitlines()[-1:]}")
    folder.chmod(0o755)
    return folder


def run(image: str, folder: Path, req: str, constraint: bool = True) -> tuple[int, str, dict[str, str]]:
    unset = "" if constraint else "PIP_CONSTRAINT= "
    script = (f"{unset}pip install --no-cache-dir --no-index --find-links /w '{req}' > /tmp/out 2>&1; rc=$?; "
              "tail -n 12 /tmp/out; echo RC=$rc; pip list --format=freeze 2>/dev/null | sed 's/^/V /'")
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{folder}:/w:ro", "--entrypoint", "bash",
                        image, "-c", script], capture_output=True, text=True, timeout=1800)
    out = r.stdout
    rc = int(out.split("RC=")[-1].split()[0])
    listed = dict(ln[2:].split("==", 1) for ln in out.splitlines() if ln.startswith("V ") and "==" in ln)
    canon = {k.lower().replace("_", "-"): v for k, v in listed.items()}
    return rc, out.split("RC=")[0].strip(), {n: canon.get(n, "absent") for n in WATCH}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", required=True)
    ap.add_argument("--control", help="the same stack built before dockerlaunch kept pins")
    args = ap.parse_args()
    folder = wheels()
    ok = True
    _, _, before = run(args.image, folder, "pip")  # `pip` is installed: nothing changes, only the versions print
    print(f"image {args.image}: {' '.join(f'{k} {v}' for k, v in before.items())}")

    rc, tail, after = run(args.image, folder, "peft==0.18.1")
    moved = {k: (before[k], after[k]) for k in before if k != "peft" and before[k] != after[k]}
    good = rc == 0 and not moved and after["peft"] == "0.18.1"
    ok &= good
    print(f"{'OK  ' if good else 'BAD '} another peft (0.18.1): exit {rc}, peft {after['peft']}, "
          f"moved: {moved or 'nothing'}")

    rc, tail, after = run(args.image, folder, "nvidia-cublas==13.1.0.3")
    named = "constraint" in tail and "nvidia-cublas==13.3.0.5" in tail
    good = rc != 0 and named and after == before
    ok &= good
    line = next((ln.strip() for ln in tail.splitlines() if "constraint" in ln), tail.splitlines()[-1:] or [""])
    print(f"{'OK  ' if good else 'BAD '} nvidia-cublas==13.1.0.3: exit {rc}, pip says: {line}")

    if args.control:
        _, _, cbefore = run(args.control, folder, "pip")
        rc, tail, cafter = run(args.control, folder, "peft==0.18.1")
        print(f"control {args.control} (no kept pins): another peft exit {rc}, nvidia-cublas {cbefore['nvidia-cublas']}"
              f" -> {cafter['nvidia-cublas']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
