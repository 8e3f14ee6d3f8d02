"""A real 2-node simulated cluster for the whole session (real dockerd, sshd, paramiko)."""

import os

import pytest

from dockerlaunch.sim import cluster as sim
from dockerlaunch.cluster.config import load_config


def _leftovers(client, cluster: str) -> list[str]:
    label = {"label": f"{sim.SIM_LABEL}={cluster}"}
    return (
        [f"container {c.name}" for c in client.containers.list(all=True, filters=label)]
        + [f"network {n.name}" for n in client.networks.list(filters=label)]
        + [f"volume {v.name}" for v in client.volumes.list(filters=label)]
    )


@pytest.fixture(scope="session")
def engine():
    if os.environ.get("DOCKERLAUNCH_SKIP_INTEGRATION") == "1":
        pytest.skip("DOCKERLAUNCH_SKIP_INTEGRATION=1")
    return sim.engine()  # fails (not skips) with the fix when no engine runs: CI must have one


@pytest.fixture(scope="session")
def sim_cluster(engine, tmp_path_factory):
    """Yields (cluster name, config path, layout). Removed at the end; asserts nothing is left."""
    state = tmp_path_factory.mktemp("state")
    os.environ["DOCKERLAUNCH_STATE_DIR"] = str(state)
    name = f"dlt{os.getpid()}"
    subnet = f"172.30.{100 + os.getpid() % 100}.0/24"
    config_path = state / "cluster.yaml"
    demo = sim.build_demo_image()  # cached by content hash: built once per machine
    sim.up(nodes=2, cluster=name, subnet=subnet, config_out=str(config_path), seed_images=(demo,))
    try:
        yield name, config_path, sim.node_layout(name, 2, subnet)
    finally:
        sim.down(name)
        assert _leftovers(engine, name) == []


@pytest.fixture(scope="session")
def cluster_config(sim_cluster):
    return load_config(str(sim_cluster[1]))


@pytest.fixture(scope="session")
def tools_image(cluster_config):
    return cluster_config.image


@pytest.fixture(scope="session")
def demo_image(sim_cluster):
    return sim.build_demo_image()


@pytest.fixture(scope="session")
def remotes(cluster_config):
    from dockerlaunch.cluster.ssh import Remote
    from dockerlaunch.cluster.targets import resolve_target

    out = [Remote(resolve_target(h, cluster_config.ssh)) for h in cluster_config.hosts]
    yield out
    for r in out:
        r.close()


@pytest.fixture
def job_containers(remotes):
    """Job containers left on any host, by job name (asked over SSH, as a user would)."""
    from dockerlaunch.cluster.dockerhost import DockerHost

    def find(job: str) -> list[str]:
        return [f"{r.name}:{s.name}:{s.status}" for r in remotes for s in DockerHost(r).job_containers(job)]

    return find
