import re
from pathlib import Path

import pytest
import yaml

from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import make_plan
from dockerlaunch.sim import cluster as sim
from dockerlaunch.sim.cluster import SimError, node_layout, parse_rate, render_cluster_config


def test_layout_fixed_ips_and_names():
    nodes = node_layout("c", 3, "172.30.0.0/24")
    assert [n.ip for n in nodes] == ["172.30.0.11", "172.30.0.12", "172.30.0.13"]
    assert [n.name for n in nodes] == ["c-node1", "c-node2", "c-node3"]
    assert len({n.volume for n in nodes}) == 3


def test_layout_limits():
    with pytest.raises(SimError):
        node_layout("c", 0, "172.30.0.0/24")
    with pytest.raises(SimError, match="too small"):
        node_layout("c", 10, "172.30.0.0/29")


def test_rendered_config_is_a_valid_cluster_config():
    layout = node_layout("c", 2, "172.30.0.0/24")
    text = render_cluster_config("c", layout, Path("/state/c"), "tools:1")
    cfg = ClusterConfig.model_validate(yaml.safe_load(text))
    assert cfg.ssh.host_key_policy == "strict" and cfg.ssh.known_hosts == "/state/c/known_hosts"
    plan = make_plan(cfg)
    assert plan.master_addr == "172.30.0.11"
    c = plan.hosts[0].container
    assert c.infiniband is False and c.gpu is None  # IB and GPUs off: nothing left to the host but the NIC
    assert [u.split(":")[0] for u in c.unresolved()] == ["env NCCL_SOCKET_IFNAME", "env GLOO_SOCKET_IFNAME",
                                                        "label dockerlaunch.run"]


@pytest.mark.parametrize("rate", ["200mbit", "1gbit", "1.5mbit"])
def test_rate_ok(rate):
    assert parse_rate(rate) == rate


@pytest.mark.parametrize("rate", ["fast", "200", "200 mbit", "1gb;reboot"])
def test_rate_rejected(rate):
    with pytest.raises(SimError):
        parse_rate(rate)


def test_slurm_conf_names_every_node_with_its_address_and_the_real_cpus():
    from dockerlaunch.sim.cluster import parse_slurmd_hw, render_slurm_conf

    hw = parse_slurmd_hw("NodeName=node1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 "
                         "RealMemory=24000\nUpTime=0-01:00:00\n")
    assert hw["CPUs"] == "2" and "RealMemory" not in hw  # every node shares this machine's memory
    layout = node_layout("My_Sim", 3, "172.30.0.0/24")
    conf = dict(line.split("=", 1) for line in render_slurm_conf("My_Sim", layout, hw).splitlines()
                if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert conf["ClusterName"] == "mysim" and conf["SlurmctldHost"] == "node1(172.30.0.11)"
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    nodes = [line for line in render_slurm_conf("My_Sim", layout, hw).splitlines() if line.startswith("NodeName=")]
    assert [n.split()[:2] for n in nodes] == [[f"NodeName=node{i}", f"NodeAddr=172.30.0.{10 + i}"] for i in (1, 2, 3)]
    assert all("CPUs=2" in n for n in nodes)
    with pytest.raises(SimError, match="no CPU count"):
        parse_slurmd_hw("slurmd: error: something broke")


# ---------------------------------------------------------------- engine kinds (`sim up --engines`)


def test_engines_one_per_node_or_one_for_all():
    kinds = sim.parse_engines("20.10,26,28,28-containerd", None)
    assert [k.name for k in kinds] == ["20.10", "26", "28", "28-containerd"]
    assert [k.suite for k in kinds] == ["bookworm", "trixie", "sid", "sid"]
    assert [k.containerd_store for k in kinds] == [False, False, False, True]
    assert [k.name for k in sim.parse_engines("26", 3)] == ["26", "26", "26"]
    assert [k.name for k in sim.parse_engines(None, 2)] == ["20.10", "20.10"]


@pytest.mark.parametrize("spec, nodes, needle", [
    ("27", None, "engine '27': use one of 20.10, 26, 28, 28-containerd"),
    ("20.10,docker", 2, "engine 'docker'"),
    ("20.10,26", 3, "names 2 engine(s) for 3 node(s)"),
])
def test_engines_bad_input_names_the_entry(spec, nodes, needle):
    with pytest.raises(sim.SimError, match=re.escape(needle)):
        sim.parse_engines(spec, nodes)


def test_engine_base_images_are_per_suite():
    assert sim.ENGINES["26"].base_tag == "dockerlaunch/debian:trixie"
    assert "debian:13" in sim.ENGINES["26"].base_candidates
    assert sim.ENGINES["20.10"].base_candidates[-1] == sim.BASE_TAG


@pytest.mark.parametrize("text, want", [
    ('20.10.24+dfsg1|overlay2|[["Backing Filesystem","extfs"]]', ("20.10.24+dfsg1", "overlay2")),
    ('28.5.2+dfsg4|overlayfs|[["driver-type","io.containerd.snapshotter.v1"]]',
     ("28.5.2+dfsg4", "containerd (overlayfs)")),
    ("", ("?", "?")),
])
def test_engine_info_names_the_image_store(text, want):
    assert sim.parse_engine_info(text) == want
