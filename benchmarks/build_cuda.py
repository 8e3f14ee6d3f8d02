"""The recommended CUDA stack built for real on this machine, measured: per layer, per compiled package, the image.

    .venv/bin/python benchmarks/build_cuda.py [--stack NAME] [--cuda-archs 9.0] [--scenarios cold,rebuild,bump,second]

Scenarios, each a real `dockerlaunch build` (its log under --logs):
- cold: the build as the cache stands (run it first on an empty cache, or with --clear-wheel-cache and
  --prune-buildkit, for the cold figure; a compile killed halfway resumes, so a cold build may span runs);
- rebuild: BuildKit's cache pruned (`docker builder prune -af`), the wheel cache kept: nothing compiles;
- bump: a copy of Dockerfiles/ whose stack has another ms-swift, locked again (network), built: the top layers run;
- second: a copy with a second stack on the same torch/CUDA/Python (another ms-swift line), locked and built.
For each: wall time, which packages compiled and which came from the cache, which BuildKit steps ran (with their
times), the image's size. For every compiled package: wall, CPU time, peak memory and wheel size as recorded when
it was compiled (its wheel.json in the cache), objects, jobs. Layers: `docker history` sizes. Then verify's table.
Goals (issue 32): rebuild and second under 10 minutes, bump under 5, each compiling nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dockerlaunch.images import wheels  # noqa: E402
from dockerlaunch.images.build import cached_steps  # noqa: E402
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix  # noqa: E402

STACK = "swift4.6-mcore0.19-cu13-py313"
BUMP = {"ms_swift": "4.5.3", "transformers": "5.16.1", "peft": "0.20.0"}  # ms-swift 4.5.3's own caps hold
SECOND = {"ms_swift": "4.5.3", "transformers": "5.16.1", "peft": "0.20.0", "megatron_core": "0.18.2"}


def dl(*args: str, env: dict | None = None, log: Path | None = None,
       timeout: float = 6 * 3600) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dockerlaunch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    out = []
    assert proc.stdout is not None
    with open(log, "w") if log else open(os.devnull, "w") as f:
        for line in proc.stdout:
            out.append(line)
            f.write(line)
            f.flush()
            if line.startswith("[dockerlaunch]"):
                print("   ", line.rstrip()[:160], flush=True)
    code = proc.wait(timeout=timeout)
    return code, "".join(out), time.monotonic() - t0


def step_times(log: str) -> dict[str, float]:
    """`stage N/M RUN ...` -> seconds, for the BuildKit steps that ran (`#12 DONE 56.6s`). A build's log holds
    several BuildKit runs (the builder stage, then the image), each numbering its steps from #1."""
    names, done, run = {}, {}, 0
    for line in log.splitlines():
        if re.match(r"^#1 \[internal\] load build definition", line):
            run += 1
        m = re.match(r"^#(\d+) \[(\S+\s+\d+/\d+)\] (RUN .*)$", line)
        if m:
            names[(run, m.group(1))] = f"{m.group(2)} {m.group(3)[:60]}"
        m = re.match(r"^#(\d+) DONE ([\d.]+)s", line)
        if m:
            done[(run, m.group(1))] = float(m.group(2))
    return {names[k]: done[k] for k in names if k in done}


def compiled_from(log: str) -> tuple[list[str], list[str]]:
    """(packages compiled in this build, packages taken from the wheel cache)."""
    compiled = re.findall(r"^\[dockerlaunch\] (\S+ \S+): compiling in ", log, re.M)
    cached = re.findall(r"^\[dockerlaunch\] (\S+ \S+): cached wheel \S+ \(key", log, re.M)
    return compiled, cached


def image_size(tag: str) -> int:
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True)
    return int(r.stdout.strip() or 0)


def layers(tag: str) -> list[tuple[str, int]]:
    r = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", tag],
                       capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        size, _, what = line.partition("\t")
        m = re.match(r"([\d.]+)\s*([kMG]?B)", size)
        if not m:
            continue
        n = float(m.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
        if n >= 1e6:
            label = re.sub(r"\s+", " ", what.replace("|", " "))
            label = re.search(r"lock/(\S+)\.txt", label)
            out.append((label.group(1) if label else what.split("#(nop)")[-1].strip()[:50], int(n)))
    return list(reversed(out))


def compiled_records() -> list[dict]:
    out = []
    for folder in sorted((wheels.cache_root() / "compiled").glob("*")):
        e = wheels.Entry(folder)
        try:
            info, key = e.done, e.key
        except (OSError, ValueError):
            continue
        if info:
            out.append({"package": key["package"], "version": key["version"], "key": folder.name[-16:],
                        "archs": key["flags"].get("TORCH_CUDA_ARCH_LIST"), **info})
    return out


def copy_with(stack: str, name: str, changes: dict, env_dir: Path) -> Path:
    """Dockerfiles/ copied, with `name` = `stack` changed by `changes`, locked again for real (network)."""
    d = env_dir / "Dockerfiles"
    shutil.copytree(default_dockerfiles_dir(), d)
    data = yaml.safe_load((d / "stacks.yaml").read_text())
    data["stacks"][name] = {**data["stacks"][stack], **changes}
    (d / "stacks.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    if name != stack:  # a stack derived from another starts from its lock's versions (`stacks lock` keeps them)
        shutil.copy(d / "locks" / f"{stack}.lock", d / "locks" / f"{name}.lock")
    code, out, secs = dl("stacks", "lock", "--stack", name, env={"DOCKERLAUNCH_DOCKERFILES": str(d)})
    if code != 0:
        raise SystemExit(f"stacks lock of {name} failed: {out[-600:]}")
    print(f"  locked {name} in {secs:.0f} s")
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default=STACK)
    ap.add_argument("--cuda-archs", default="9.0")
    ap.add_argument("--scenarios", default="cold,rebuild,bump,second")
    ap.add_argument("--clear-wheel-cache", action="store_true", help="delete the compiled wheels first (hours)")
    ap.add_argument("--prune-buildkit", action="store_true", help="docker builder prune -af before the cold build")
    ap.add_argument("--logs", default="benchmarks/logs", help="where each build's log goes")
    args = ap.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    stack = load_matrix().get(args.stack)
    results = {}
    if args.clear_wheel_cache:
        shutil.rmtree(wheels.cache_root() / "compiled", ignore_errors=True)
    for scenario in args.scenarios.split(","):
        env, name = {}, stack.name
        tmp = Path(tempfile.mkdtemp(prefix=f"build-cuda-{scenario}-"))
        if scenario == "rebuild" or (scenario == "cold" and args.prune_buildkit):
            subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True)
        if scenario == "bump":
            env = {"DOCKERLAUNCH_DOCKERFILES": str(copy_with(stack.name, stack.name, BUMP, tmp))}
        elif scenario == "second":
            name = stack.name + "-second"
            env = {"DOCKERLAUNCH_DOCKERFILES": str(copy_with(stack.name, name, SECOND, tmp))}
        print(f"== {scenario}: dockerlaunch build --stack {name} --cuda-archs {args.cuda_archs}", flush=True)
        code, log, secs = dl("build", "--stack", name, "--cuda-archs", args.cuda_archs, env=env,
                             log=logs / f"build_cuda-{scenario}.log")
        compiled, cached = compiled_from(log)
        _, ran = cached_steps(log)
        tag = next(iter(re.findall(r"naming to docker\.io/(\S+) done", log)[-1:]), "")
        results[scenario] = {"rc": code, "wall_s": round(secs, 1), "compiled": compiled, "from_cache": cached,
                             "steps_ran": step_times(log), "image": tag, "image_bytes": image_size(tag) if tag else 0}
        r = results[scenario]
        print(f"   rc {code}, {secs / 60:.1f} min; compiled {compiled or 'nothing'}; from the cache {cached}; "
              f"{len(ran)} BuildKit RUN steps ran; image {r['image']} {r['image_bytes'] / 1e9:.2f} GB", flush=True)
        for step, t in r["steps_ran"].items():
            print(f"      {t:7.1f} s  {step}")
        verify = re.findall(r"^(?:verify|  (?:PASS|FAIL|NOTE|SKIP)).*$", log, re.M)
        if verify:
            print("   " + "\n   ".join(verify[-40:]))
        shutil.rmtree(tmp, ignore_errors=True)
    print("== compiled packages (as recorded when compiled)")
    for rec in compiled_records():
        print(f"   {rec['package']} {rec['version']} sm {rec['archs']}: {rec['wall_s'] / 60:.1f} min wall, "
              f"{rec['cpu_s'] / 60:.0f} CPU-min, peak {rec['peak_rss'] / 2**30:.1f} GB, {rec['objects']} objects "
              f"({rec['objects_this_run']} in the last run), MAX_JOBS={rec['jobs']}, "
              f"wheel {rec['size'] / 2**20:.0f} MB, {rec['built']}")
    for scenario, r in results.items():
        if r["image"]:
            print(f"== layers of {r['image']} ({scenario})")
            for what, n in layers(r["image"]):
                print(f"   {n / 1e9:6.2f} GB  {what}")
            break
    (logs / "build_cuda.json").write_text(json.dumps({"results": results, "compiled": compiled_records()}, indent=1))
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
