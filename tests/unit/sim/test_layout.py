import re
from pathlib import Path

import pytest
import yaml

from dockerlaunch import sim
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import make_plan
from dockerlaunch.sim import SimError, node_layout, parse_rate, render_cluster_config


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
    assert c.infiniband is False and c.gpu is None  # IB and GPUs off: left to the host are the NIC and SELinux
    assert [u.split(":")[0] for u in c.unresolved()] == ["env NCCL_SOCKET_IFNAME", "env GLOO_SOCKET_IFNAME",
                                                        "label dockerlaunch.run", "selinux"]


@pytest.mark.parametrize("rate", ["200mbit", "1gbit", "1.5mbit"])
def test_rate_ok(rate):
    assert parse_rate(rate) == rate


@pytest.mark.parametrize("rate", ["fast", "200", "200 mbit", "1gb;reboot"])
def test_rate_rejected(rate):
    with pytest.raises(SimError):
        parse_rate(rate)


def test_slurm_conf_names_every_node_with_its_address_and_the_real_cpus():
    from dockerlaunch.sim import parse_slurmd_hw, render_slurm_conf

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


# ---------------------------------------------------------------- light clusters (`sim up --light`)


@pytest.mark.parametrize("nodes, want", [(1, 1), (8, 1), (32, 1), (33, 2), (64, 2), (100, 4), (256, 8), (512, 8)])
def test_light_default_engines(nodes, want):
    assert sim.default_light_engines(nodes) == want
    assert len(sim.light_layout("c", nodes, sim.DEFAULT_LIGHT_SUBNET)[1]) == want


def test_light_hosts_round_robin_over_engines():
    hosts, engines = sim.light_layout("lt", 10, "172.28.0.0/24", engines=3)
    assert [e.name for e in engines] == ["lt-engine1", "lt-engine2", "lt-engine3"]
    assert [h.served_by for h in hosts] == [f"lt-engine{(i - 1) % 3 + 1}" for i in range(1, 11)]
    assert [e.hosts for e in engines] == [(1, 4, 7, 10), (2, 5, 8), (3, 6, 9)]
    by_name = {e.name: e for e in engines}
    assert all(h.advertise_addr == by_name[h.served_by].ip for h in hosts)
    assert [h.name for h in hosts[:2]] == ["lt-node1", "lt-node2"] and hosts[0].ip == "172.28.0.11"  # as regular
    assert {e.sock_volume for e in engines} == {"lt-engine1-sock", "lt-engine2-sock", "lt-engine3-sock"}
    assert all(h.volume == "" for h in hosts) and len({e.volume for e in engines}) == 3


@pytest.mark.parametrize("nodes, engines, subnet", [
    (256, None, sim.DEFAULT_LIGHT_SUBNET), (512, None, sim.DEFAULT_LIGHT_SUBNET), (512, 64, sim.DEFAULT_LIGHT_SUBNET),
    (235, 9, "172.28.4.0/24"), (1, None, "172.28.8.0/28"),
])
def test_light_addresses_unique_inside_the_subnet_and_apart(nodes, engines, subnet):
    import ipaddress

    hosts, engine_list = sim.light_layout("lt", nodes, subnet, engines)
    net = ipaddress.ip_network(subnet)
    ips = [h.ip for h in hosts] + [e.ip for e in engine_list]
    assert len(set(ips)) == len(ips) == nodes + len(engine_list)
    assert all(ipaddress.ip_address(ip) in net and ipaddress.ip_address(ip) not in (net.network_address,
               net.broadcast_address, next(net.hosts())) for ip in ips)  # .1 is the bridge's gateway
    assert sorted(i for e in engine_list for i in e.hosts) == list(range(1, nodes + 1))
    assert len(hosts) == nodes and len({h.name for h in hosts} | {e.name for e in engine_list}) == len(ips)


def test_light_subnet_too_small_is_one_line():
    with pytest.raises(SimError, match=r"subnet 172.30.0.0/24 is too small for 256 light hosts and 8 engine") as e:
        sim.light_layout("lt", 256, "172.30.0.0/24")
    assert "\n" not in str(e.value) and "--subnet 172.28.0.0/22" in str(e.value)
    sim.light_layout("lt", 235, "172.28.0.0/24", engines=9)  # exactly fits: 10 below host 1 + 235 + 9 = 254
    with pytest.raises(SimError, match="too small"):
        sim.light_layout("lt", 236, "172.28.0.0/24", engines=9)


@pytest.mark.parametrize("nodes, engines, needle", [
    (0, None, "at least 1"), (513, None, "at most 512"), (4, 5, "give 1 to 4"), (4, 0, "give 1 to 4"),
    (200, 65, "give 1 to 64"),
])
def test_light_limits(nodes, engines, needle):
    with pytest.raises(SimError, match=re.escape(needle)):
        sim.light_layout("lt", nodes, sim.DEFAULT_LIGHT_SUBNET, engines)


def test_light_config_advertises_each_hosts_engine():
    hosts, engines = sim.light_layout("lt", 5, sim.DEFAULT_LIGHT_SUBNET, engines=2)
    text = render_cluster_config("lt", hosts, Path("/state/lt"), "tools:1", 20000)
    assert "Light cluster: 5 hosts" in text and "2 shared engine(s)" in text
    cfg = ClusterConfig.model_validate(yaml.safe_load(text))
    assert [h.address for h in cfg.hosts] == [h.ip for h in hosts]
    assert [h.advertise_addr for h in cfg.hosts] == [engines[(i - 1) % 2].ip for i in range(1, 6)]
    assert cfg.ssh.host_key_policy == "strict" and cfg.image == "tools:1"
    assert make_plan(cfg).master_addr == engines[0].ip  # host 0's job container lives in engine1's netns
    # regular clusters are unchanged: no advertise_addr
    assert "advertise_addr" not in render_cluster_config("c", node_layout("c", 2, "172.30.0.0/24"), Path("/s"), "t")


def test_light_refuses_what_it_cannot_simulate():
    with pytest.raises(SimError, match="--light cannot run Slurm"):
        sim.create(nodes=2, cluster="lt", light=True, slurm=True)
    with pytest.raises(SimError, match="--light cannot shape egress"):
        sim.create(nodes=2, cluster="lt", light=True, egress_rate="1gbit")
    with pytest.raises(SimError, match="add --light"):
        sim.create(nodes=2, cluster="lt", light_engines=2)
    with pytest.raises(SimError, match="at most 64 regular nodes"):
        sim.create(nodes=65, cluster="lt")
    with pytest.raises(SimError, match="one engine kind for the whole cluster"):
        sim.create(nodes=2, cluster="lt", light=True, engines="20.10,26")


@pytest.mark.parametrize("args, needle", [
    (["--nodes", "65"], "at most 64 regular nodes"),
    (["--light", "--nodes", "513"], "513 is not in the range 1<=x<=512"),
    (["--light-engines", "2"], "add --light"),
])
def test_cli_node_limits(args, needle):
    from click.testing import CliRunner

    from dockerlaunch.cli import sim as _registers_sim  # noqa: F401
    from dockerlaunch.cli.main import cli

    result = CliRunner().invoke(cli, ["sim", "up", "--name", "lt", *args])
    assert result.exit_code != 0 and needle in result.output
