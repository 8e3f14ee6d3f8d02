"""Slurm in the sim (`sim up --slurm`): sbatch a 2-node job whose tasks `docker run` on their own node's dockerd."""

import io
import os
import re
import subprocess
import tarfile
import time

import pytest
import yaml

from dockerlaunch import sim
from tests import cli

from .conftest import _inside_nodes, _leftovers
from .helpers import SCRATCH

pytestmark = pytest.mark.integration

NODES = 2


def _dl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli.dl(*args, timeout=timeout, cwd=SCRATCH)


@pytest.fixture(scope="module")
def slurm_cluster(engine, tmp_path_factory):
    """A 2-node Slurm sim cluster of its own (name and subnet apart from the session's and the other tests'),
    started by the CLI as a user would. Yields (name, layout, tools image, node1 container)."""
    name = f"dlslurm{os.getpid()}"
    subnet = f"172.31.{200 + os.getpid() % 50}.0/24"
    state = tmp_path_factory.mktemp("slurm-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKERLAUNCH_STATE_DIR", str(state))  # the CLI's subprocess writes the cluster's state here
        try:
            t0 = time.monotonic()
            r = _dl("sim", "up", "--slurm", "--nodes", str(NODES), "--name", name, "--subnet", subnet,
                    "--seed-image", sim.build_demo_image())
            print(f"\nsim up --slurm ({NODES} nodes): {time.monotonic() - t0:.1f}s")
            assert r.returncode == 0, r.stdout + r.stderr
            tools = yaml.safe_load(open(r.stdout.strip().splitlines()[-1]))["image"]
            yield name, sim.node_layout(name, NODES, subnet), tools, engine.containers.get(f"{name}-node1")
            assert _inside_nodes(engine, name) == []
        finally:
            sim.remove(name)
    assert _leftovers(engine, name) == []
    assert not (state / "sim" / name).exists()


def _put(container, path: str, text: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(os.path.basename(path))
        data = text.encode()
        info.size, info.mode, info.mtime = len(data), 0o755, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    assert container.put_archive(os.path.dirname(path), buf.getvalue())


def _sbatch_wait(node1, script: str) -> tuple[int, str, str]:
    """sbatch --wait on node1 (bounded); returns (exit code, job id, the job's output file)."""
    code, out = node1.exec_run(["timeout", "120", "sbatch", "--wait", "--chdir", sim.SHARED_DIR, script])
    text = out.decode(errors="replace")
    m = re.search(r"Submitted batch job (\d+)", text)
    assert m and code != 124, text
    job = m.group(1)
    code_cat, log = node1.exec_run(["cat", f"{sim.SHARED_DIR}/slurm-{job}.out"])
    assert code_cat == 0, log
    return code, job, log.decode(errors="replace")


BATCH = """#!/bin/sh
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={shared}/slurm-%j.out
set -e
srun --nodes=2 --ntasks-per-node=1 \\
  docker run --rm --network host -e SLURM_NODEID -e SLURM_JOB_ID {image} sh -c {task}
"""


def test_sinfo_and_status_show_every_node_idle(slurm_cluster):
    name, layout, _, node1 = slurm_cluster
    states = sim.slurm_node_states(node1)
    assert states == {f"node{n.index}": "idle" for n in layout}
    r = _dl("sim", "status", "--name", name)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == [name]]
    assert [(row[1], row[2], row[-1]) for row in rows] == [(n.name, n.ip, "idle") for n in layout]


def test_sbatch_runs_a_container_on_each_allocated_node(slurm_cluster):
    """Each task's `docker run --network host` goes to the dockerd of the node it runs on: the container sees
    that node's hostname and eth0 address."""
    _, layout, tools, node1 = slurm_cluster
    task = ("'echo node=$(hostname) id=$SLURM_NODEID job=$SLURM_JOB_ID "
            "ip=$(ip -o -4 addr show eth0 | awk \"{print \\$4}\")'")
    _put(node1, f"{sim.SHARED_DIR}/ok.sh", BATCH.format(shared=sim.SHARED_DIR, image=tools, task=task))
    t0 = time.monotonic()
    code, job, log = _sbatch_wait(node1, f"{sim.SHARED_DIR}/ok.sh")
    print(f"\nsbatch --wait (2 nodes, docker run per task): {time.monotonic() - t0:.1f}s")
    assert code == 0, log
    lines = sorted(line for line in log.splitlines() if line.startswith("node="))
    assert lines == [f"node=node{n.index} id={n.index - 1} job={job} ip={n.ip}/24" for n in layout], log


def test_a_failing_task_fails_the_job(slurm_cluster):
    _, _, tools, node1 = slurm_cluster
    task = "'[ \"$SLURM_NODEID\" != 1 ] || exit 3'"  # node2's task fails
    _put(node1, f"{sim.SHARED_DIR}/fail.sh", BATCH.format(shared=sim.SHARED_DIR, image=tools, task=task))
    code, job, log = _sbatch_wait(node1, f"{sim.SHARED_DIR}/fail.sh")
    assert code == 3, log  # sbatch --wait exits with the job's exit code
    assert "node2: task 1: Exited with exit code 3" in log
    state = node1.exec_run(["scontrol", "show", "job", job])[1].decode()
    assert "JobState=FAILED" in state and "ExitCode=3:0" in state, state


def _run_rendered(node1, out, job: str, timeout: int) -> tuple[int, str]:
    """`render --to slurm`'s plain-Docker script, submitted as it is: (sbatch's exit code, the job's output)."""
    _put(node1, f"{sim.SHARED_DIR}/{job}.docker.sbatch", (out / f"{job}.docker.sbatch").read_text())
    code, out_text = node1.exec_run(["timeout", str(timeout), "sbatch", "--wait", "--chdir", sim.SHARED_DIR,
                                     f"{sim.SHARED_DIR}/{job}.docker.sbatch"])
    m = re.search(r"Submitted batch job (\d+)", out_text.decode())
    assert m, out_text
    return code, node1.exec_run(["cat", f"{sim.SHARED_DIR}/{job}-{m.group(1)}.out"])[1].decode(errors="replace")


RENDER_CONFIG = """
container: {gpus: none, infiniband: "off"}
job: {offline: true}
"""


def test_rendered_sbatch_runs_the_two_node_demo(slurm_cluster, tmp_path):
    """`render --to slurm`'s plain-Docker script, submitted as it is: Slurm picks the nodes, each task's script
    finds MASTER_ADDR and its NIC, and `docker run` (the docker backend's own argv) runs torchrun there."""
    from tests.integration.test_launch import TORCHRUN

    _, _, _, node1 = slurm_cluster
    config = tmp_path / "job.yaml"
    data = yaml.safe_load(RENDER_CONFIG)
    limit = sim.engine_nofile(node1)  # the nodes' dockerd cannot give more open files (Docker in a container)
    if limit is not None and limit < 1048576:
        data["container"]["ulimits"] = {"nofile": str(limit)}
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "slurm"
    r = _dl("render", "--to", "slurm", "--config", str(config), "--nodes", "2", "--image", sim.build_demo_image(),
            "--nproc-per-node", "2", "--name", "slurmdemo", "--out", str(out), "--", "sh", "-c", TORCHRUN)
    assert r.returncode == 0, r.stderr
    code, log = _run_rendered(node1, out, "slurmdemo", 240)
    assert code == 0, log[-3000:]
    ok = [line for line in log.splitlines() if "all_reduce sum=10 expected=10 OK" in line]
    assert sorted(line.split("rank ")[1].split("/")[0] for line in ok) == ["0", "1", "2", "3"], log[-3000:]
    assert "NODE_RANK=0" in log and "NODE_RANK=1" in log, log[-3000:]


def test_rendered_sbatch_keeps_template_markers_in_values_byte_exact(slurm_cluster, tmp_path):
    """Values that read like the templates' own markers (`@@COMMAND@@`, `@@IMAGE@@`, the name token) reach the
    container as those bytes under the real Slurm: the render fills its markers once and never rescans a value."""
    _, _, _, node1 = slurm_cluster
    config = tmp_path / "job.yaml"
    data = yaml.safe_load(RENDER_CONFIG)
    data["container"]["env"] = {"A": "@@COMMAND@@", "B": "x@@CONTAINER_NAME@@y"}
    limit = sim.engine_nofile(node1)  # as in the demo above: Docker in a container gives fewer open files
    if limit is not None and limit < 1048576:
        data["container"]["ulimits"] = {"nofile": str(limit)}
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "slurm"
    r = _dl("render", "--to", "slurm", "--config", str(config), "--nodes", "2", "--image", sim.build_demo_image(),
            "--nproc-per-node", "1", "--name", "markers", "--out", str(out), "--",
            "sh", "-c", 'printf "values:%s|%s|%s|%s\\n" "$A" "$B" "$1" "$2"', "sh", "@@IMAGE@@", "@@CONTAINER_NAME@@")
    assert r.returncode == 0, r.stderr
    code, log = _run_rendered(node1, out, "markers", 120)
    assert code == 0, log[-3000:]
    lines = [ln for ln in log.splitlines() if "values:" in ln]
    assert len(lines) == 2 and all(ln.endswith("values:@@COMMAND@@|x@@CONTAINER_NAME@@y|@@IMAGE@@|"
                                                "@@CONTAINER_NAME@@") for ln in lines), log[-3000:]
