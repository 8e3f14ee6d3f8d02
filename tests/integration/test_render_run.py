"""Rendered jobs run for real: the compose files of `render --to compose` start the 2-node demo on the sim nodes
(compose 1.29 talking to each node's own dockerd over SSH), and every node's ranks all_reduce together."""

import os
import subprocess

import pytest

from tests.integration.helpers import dl, job_name
from tests.integration.test_launch import TORCHRUN

pytestmark = pytest.mark.integration


def compose_home(tmp_path, cluster_config) -> str:
    """A HOME whose ~/.ssh holds the sim's key and pinned host keys (compose's paramiko reads ~/.ssh/config)."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text(f"Host *\n  User root\n  IdentityFile {cluster_config.ssh.identity_file}\n")
    (ssh / "known_hosts").write_text(open(cluster_config.ssh.known_hosts).read())
    for p in ssh.iterdir():
        p.chmod(0o600)
    return str(ssh.parent)


def test_rendered_compose_files_run_the_two_node_demo(sim_cluster, cluster_config, demo_image, job_containers,
                                                      tmp_path):
    job = job_name()
    out = tmp_path / "compose"
    r = dl("render", "--to", "compose", "--config", str(sim_cluster[1]), "--image", demo_image, "--nproc-per-node",
           "2", "--name", job, "--out", str(out), "--", "sh", "-c", TORCHRUN)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["node-0.yaml", "node-1.yaml"]
    home = compose_home(tmp_path, cluster_config)
    procs = []
    try:
        for rank, host in enumerate(cluster_config.hosts):
            env = {**os.environ, "HOME": home, "DOCKER_HOST": f"ssh://root@{host.address}",
                   "COMPOSE_PARAMIKO_SSH": "1"}
            procs.append(subprocess.Popen(
                ["docker-compose", "-f", f"node-{rank}.yaml", "up", "--abort-on-container-exit",
                 "--exit-code-from", "node"], cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for rank, host in enumerate(cluster_config.hosts):
            env = {**os.environ, "HOME": home, "DOCKER_HOST": f"ssh://root@{host.address}",
                   "COMPOSE_PARAMIKO_SSH": "1"}
            subprocess.run(["docker-compose", "-f", f"node-{rank}.yaml", "down"], cwd=out, env=env,
                           capture_output=True, timeout=120)
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    ok = [line for text in outputs for line in text.splitlines() if "all_reduce sum=10 expected=10 OK" in line]
    ranks = sorted(line.split(" rank ")[1].split("/")[0] for line in ok)
    assert ranks == ["0", "1", "2", "3"], "\n".join(outputs)[-3000:]
    assert job_containers(job) == []


def test_render_probe_asks_each_host_like_up(sim_cluster, demo_image, tmp_path):
    """`render --probe` connects over SSH as `up` does (pinned host keys) and writes each host's own values."""
    import yaml

    out = tmp_path / "probed"
    r = dl("render", "--to", "compose", "--probe", "--config", str(sim_cluster[1]), "--image", demo_image,
           "--out", str(out), "--", "true")
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        text = (out / f"node-{rank}.yaml").read_text()
        env = yaml.safe_load(text)["services"]["node"]["environment"]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"  # the sim nodes' NIC
        assert env["NODE_RANK"] == str(rank) and env["NPROC_PER_NODE"] == "1" and "note:" not in text
