"""backends/docker/session.py: the probes' answers turned into HostFacts, or one line naming every host that
cannot be planned."""

from types import SimpleNamespace

import pytest

from dockerlaunch.backends.docker.probe import parse_probe
from dockerlaunch.backends.docker.session import Session, gather_facts
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import make_plan, resolve


def session(**container) -> Session:
    config = ClusterConfig.model_validate({
        "hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:1", "ssh": {"config_file": None},
        "container": {"gpus": "none", "infiniband": "off", **container}, "job": {"nproc_per_node": 1}})
    return Session(SimpleNamespace(config=config), make_plan(config))  # type: ignore[arg-type]


ROUTE = "route=10.0.0.1 via 10.0.0.254 dev eth0 src 10.0.0.5 uid 0\nhas_ip=1\n"
LABELS = ROUTE + "selinuxfs=/sys/fs/selinux\nselinux_enforce=1\nsecurity_options=[\"name=selinux\"]\n"
NO_SELINUX = ROUTE + "selinuxfs=\n"
UNKNOWN = ROUTE + "selinuxfs=/sys/fs/selinux\nselinux_enforce=1\nsecurity_options=\n"  # the engine did not answer


def test_each_hosts_engine_decides_its_containers_labels():
    s = session()
    facts = gather_facts(s, probes=[parse_probe(LABELS, "a"), parse_probe(NO_SELINUX, "b")])
    assert (facts[0].selinux, facts[1].selinux) == (True, False)
    applied = resolve(s.plan, facts, run_id="r")
    assert [h.container.label_disable for h in applied.hosts] == [True, False]


def test_auto_never_guesses_a_host_whose_engine_did_not_say():
    with pytest.raises(DockerlaunchError) as e:
        gather_facts(session(), probes=[parse_probe(UNKNOWN, "a"), parse_probe(NO_SELINUX, "b")])
    said = str(e.value)
    assert said.startswith("host 10.0.0.1: could not tell whether its engine labels containers") and "\n" not in said
    assert "(enforcing)" in said and "container.selinux: disable" in said and "10.0.0.2" not in said


@pytest.mark.parametrize("mode, expected", [("disable", True), ("keep", False)])
def test_disable_and_keep_plan_a_host_whose_engine_did_not_say(mode, expected):
    s = session(selinux=mode)
    facts = gather_facts(s, probes=[parse_probe(UNKNOWN, "a"), parse_probe(UNKNOWN, "b")])
    assert all(h.container.label_disable is expected for h in resolve(s.plan, facts, run_id="r").hosts)
