"""The benchmarks still run: a tiny distribution benchmark on its own 2-node sim cluster (figures not checked)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _nothing_left(engine):
    """Each benchmark's sim cluster is gone after the module, also after a benchmark that failed halfway."""
    yield
    from dockerlaunch import sim

    label = {"label": sim.SIM_LABEL}
    left = ([c.name for c in engine.containers.list(all=True, filters=label, ignore_removed=True)]
            + [n.name for n in engine.networks.list(filters=label)]
            + [v.name for v in engine.volumes.list(filters=label)])
    assert [x for x in left if "dlbench" in x] == []


def test_distribution_benchmark_runs_and_prints_its_table(engine):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "distribute.py"), "--nodes", "2",
                        "--size-mb", "8", "--top-mb", "2", "--subnet", "172.30.251.0/24"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| ")}
    assert {"star", "chain", "thin re-push"} <= set(rows), r.stdout
    assert "x S/B" in rows["chain"] and "x layer" in rows["thin re-push"]
    assert not [c.name for c in engine.containers.list(all=True) if c.name.startswith("dlbench")]  # torn down


def test_ship_benchmark_runs_and_prints_its_table(engine):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ship.py"), "--size-mb", "48", "--top-mb", "2",
                        "--subnet", "172.30.252.0/24"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line[:55].strip(): line for line in r.stdout.splitlines()[1:]}
    assert {"ssh stream: bulk (OpenSSH) / OpenSSH", "ssh stream: paramiko / OpenSSH", "push / hand pipeline",
            "push over paramiko / hand pipeline", "resume after a cut at 50%",
            "delta bundle after a top-layer change", "load of a split bundle (4 parts) / of the whole file"} <= set(
        rows), r.stdout
    assert "resumed at" in rows["resume after a cut at 50%"]
    assert "over OpenSSH" in rows["push / hand pipeline"], rows["push / hand pipeline"]  # the sim's sshd: OpenSSH
    assert not [c.name for c in engine.containers.list(all=True) if c.name.startswith("dlbench")]  # torn down


def test_the_first_push_benchmark_runs_and_prints_its_table(engine):
    """Issue 58's benchmark at a tiny size (the sim's Debian base, 1 repeat): every push in its table, the routes
    the rule gives a cold and a warm cache, and nothing left behind (its cluster, its background fills)."""
    from dockerlaunch.sim.images import ensure_base_image
    from dockerlaunch.sim.measure import background_fills

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_push.py"), "--base",
                        ensure_base_image(engine), "--runs", "1", "--subnet", "172.30.245.0/24"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| ")}
    assert {"thin, cold cache", "thin, forced fill", "full", "thin, warm cache"} <= set(rows), r.stdout
    assert "| save |" in rows["thin, cold cache"] and "| cache |" in rows["thin, warm cache"], r.stdout
    assert "route of the cold push: the layer cache lacks " in r.stdout, r.stdout
    assert not [c.name for c in engine.containers.list(all=True) if c.name.startswith("dlbench")]  # torn down
    assert background_fills() == []
