"""benchmarks/gpu_stack.sh without a GPU: its --dry-run prints the plan (docker run --gpus all per step, the torchrun
TP=2 step) and compiles benchmarks/gpu_stack.py, touching neither docker nor nvidia-smi; a bad option is a one-line
usage error with exit status 2. The checks themselves need a GPU host (benchmarks/RESULTS.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_stack.sh"


@pytest.fixture
def run(tmp_path):
    """Run the script with `docker` and `nvidia-smi` on PATH as fakes that leave a mark when called, and this
    interpreter as python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marks = tmp_path / "called"
    for tool in ("docker", "nvidia-smi"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> "{marks}"\nexit 99\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def go(*args: str) -> subprocess.CompletedProcess:
        p = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=30)
        p.called = marks.read_text().split() if marks.exists() else []
        return p

    return go


def test_dry_run_prints_the_plan_and_runs_nothing(run):
    p = run("--dry-run", "--image", "some:image")
    assert p.returncode == 0, p.stderr
    assert p.called == []  # neither docker nor nvidia-smi ran
    plan = [line[2:] for line in p.stdout.splitlines() if line.startswith("+ ")]
    assert plan[0] == "nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv"
    docker = [c for c in plan if " docker run " in c]
    assert len(docker) == 5  # versions, te, flash, apex, tp
    for c in docker:
        assert "docker run --rm --gpus all --network host --ipc host" in c
        assert " some:image " in c and "gpu_stack.py:/gpu_stack/gpu_stack.py:ro" in c
        assert "--privileged" not in c and "--shm-size" not in c
    steps = [c.split()[-1] for c in docker]
    assert steps == ["versions", "te", "flash", "apex", "tp"]
    assert docker[-1].endswith("some:image torchrun --standalone --nproc_per_node 2 /gpu_stack/gpu_stack.py tp")
    assert "py_compile benchmarks/gpu_stack.py ok" in p.stdout
    assert not list((ROOT / "benchmarks").glob("__pycache__/gpu_stack*"))  # compiled into a temporary folder


def test_local_dry_run_runs_the_checks_here_and_knows_one_gpu_skips_tp(run):
    p = run("--dry-run", "--local", "--gpus", "1")
    assert p.returncode == 0, p.stderr
    assert "docker" not in p.stdout and p.called == []
    assert f"python3 {ROOT}/benchmarks/gpu_stack.py te" in p.stdout
    assert "TP=2 would be a SKIP line (--gpus 1)" in p.stdout
    assert f"torchrun --standalone --nproc_per_node 2 {ROOT}/benchmarks/gpu_stack.py tp" in p.stdout


def test_an_odd_image_name_is_quoted_for_a_shell(run):
    p = run("--dry-run", "--image", "it's $odd")
    assert p.returncode == 0, p.stderr
    assert "'it'\\''s $odd' python3" in p.stdout


@pytest.mark.parametrize("args", [["--bogus"], ["--gpus", "two"], ["--image"], ["--dry-run", "extra"]])
def test_bad_usage_is_one_line_and_exit_2(run, args):
    p = run(*args)
    assert p.returncode == 2
    assert p.stdout == "" and p.called == []
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "usage: benchmarks/gpu_stack.sh [--dry-run]" in lines[0]


def test_dry_run_fails_when_the_python_part_does_not_compile(tmp_path):
    copy = tmp_path / "repo" / "benchmarks"
    copy.mkdir(parents=True)
    (copy / "gpu_stack.sh").write_text(SCRIPT.read_text())
    (copy / "gpu_stack.py").write_text("def broken(:\n")
    p = subprocess.run(["bash", str(copy / "gpu_stack.sh"), "--dry-run"], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                                           f"{os.environ.get('PATH', '')}"})
    assert p.returncode != 0
    assert "SyntaxError" in p.stderr and "nothing run" not in p.stdout
