"""A small real slice of scale (benchmarks/scale.py runs 8/64/256): 32 light sim hosts, each its own sshd with
OpenSSH's default limits and its own host key, served by 2 shared engines. Every host is its own: `up`'s
fail-fast removes all 32 containers, `status` lists each once, `down` leaves nothing on the engines."""

import os
import subprocess
import time

import pytest

from dockerlaunch import sim
from tests.integration.conftest import _leftovers
from tests.integration.helpers import dl, job_name, own_sim_state

pytestmark = pytest.mark.integration

HOSTS = 32


@pytest.fixture(scope="module")
def light(engine, tmp_path_factory):
    """(cluster name, config path, engine container names) of a 32-host light cluster, removed at the end."""
    name = f"dll{os.getpid()}"
    subnet = f"172.28.{4 * (os.getpid() % 60)}.0/22"
    with own_sim_state(tmp_path_factory, "light") as state:
        try:
            config = sim.create(nodes=HOSTS, cluster=name, subnet=subnet, light=True, light_engines=2,
                            config_out=str(state / "cluster.yaml"))
            yield name, str(config), [e for e, _, _ in sim.light_engines(name)]
        finally:
            sim.remove(name, quiet=True)
    assert _leftovers(engine, name) == []


def on_engines(engines: list[str], job: str) -> list[str]:
    """The job's containers, asked of the engines themselves (not through the launcher)."""
    names = []
    for e in engines:
        r = subprocess.run(["docker", "exec", e, "docker", "ps", "-a", "--filter", f"label=dockerlaunch.job={job}",
                            "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        names += r.stdout.split()
    return sorted(names)


def test_32_hosts_fail_fast_status_and_down(light):
    name, config, engines = light
    r = dl("sim", "status", "--name", name)
    assert r.returncode == 0 and r.stdout.count(f"{name}-node") == HOSTS, r.stdout[-2000:]

    # fail-fast: the last rank exits 1; every rank's line arrives, and nothing is left on any engine
    job = job_name()
    last = HOSTS - 1
    t0 = time.monotonic()
    r = dl("up", "--skip-preflight", "--config", config, "--name", job, "--log-dir", "", "--", "sh", "-c",
           f'echo "rank $NODE_RANK up"; if [ "$NODE_RANK" = {last} ]; then sleep 3; '
           'i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done; exit 1; fi; sleep 300',
           timeout=600)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"rank {last} " in r.stdout and "exited with 1" in r.stdout, r.stdout[-2000:]
    ups = {line.split("] rank ")[1] for line in r.stdout.splitlines() if "] rank " in line and line.endswith(" up")}
    assert ups == {f"{i} up" for i in range(HOSTS)}, sorted(ups)
    # the failed rank's last lines are the ones that say why: all of them, in order (Docker 20.10's
    # `logs --follow` may stop short when the container ends; the rest is read after it)
    tail = [int(x.rsplit(" ", 1)[1]) for x in r.stdout.splitlines() if x.startswith(f"[{last} ") and "] line " in x]
    assert tail == list(range(5000)), (len(tail), tail[-3:])
    assert on_engines(engines, job) == []
    assert took < 300, f"up took {took:.0f}s"  # a hang guard, not a speed goal (benchmarks/scale.py measures)

    # detached: each host's container listed once, under its own host; down removes them all
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", config, "--name", job, "--", "sleep", "300",
           timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert len(on_engines(engines, job)) == HOSTS
    r = dl("status", "--config", config, "--name", job, "--output", "json", timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    rows = json.loads(r.stdout)["containers"]
    assert sorted((c["rank"], c["host"]) for c in rows) == sorted(
        (i, h) for i, h in enumerate(_hosts(config))), rows
    r = dl("down", "--config", config, "--name", job, timeout=300)
    assert r.returncode == 0 and f"removed {HOSTS} container(s)" in r.stdout, r.stdout + r.stderr
    assert on_engines(engines, job) == []


def _hosts(config: str) -> list[str]:
    import yaml

    return [h["address"] for h in yaml.safe_load(open(config))["hosts"]]


# what sshd does to a connection it drops (MaxStartups, an overloaded host): accept it, close it before the banner
_DROP_ALL = ("use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 2201, Listen => 64, ReuseAddr => 1)"
             " or die $!; while (my $c = $s->accept) { close $c }")


def test_hosts_whose_sshd_refuses_every_login_or_drops_every_connection_are_named_and_nothing_starts(light, tmp_path):
    """Among 32 hosts, host 5's sshd refuses every login (a second real sshd on port 2200 that allows no user) and
    host 17's port drops every connection before the banner: `up` names both in one line; nothing starts."""
    import yaml

    name, config, engines = light
    node5, node17 = f"{name}-node5", f"{name}-node17"
    subprocess.run(["docker", "exec", node5, "/usr/sbin/sshd", "-p", "2200", "-o", "AllowUsers=nobody",
                    "-o", "PidFile=/run/sshd-refuse.pid", "-E", "/var/log/sshd-refuse.log"], check=True, timeout=60)
    subprocess.run(["docker", "exec", "-d", node17, "perl", "-e", _DROP_ALL], check=True, timeout=60)
    try:
        data = yaml.safe_load(open(config))
        ip5, ip17 = data["hosts"][4]["address"], data["hosts"][16]["address"]
        data["hosts"][4]["port"], data["hosts"][16]["port"] = 2200, 2201
        known = tmp_path / "known_hosts"
        lines = open(data["ssh"]["known_hosts"]).read().splitlines()
        # the refusing sshd has host 5's key, pinned for its port: the refusal, not the key, is what is tested
        lines += [f"[{ip5}]:2200 " + x.split(" ", 1)[1] for x in lines if x.split(" ", 1)[0] == ip5]
        known.write_text("\n".join(lines) + "\n")
        data["ssh"].update(known_hosts=str(known), connect_timeout=2)
        bad = tmp_path / "cluster.yaml"
        bad.write_text(yaml.safe_dump(data))
        job = job_name()
        t0 = time.monotonic()
        r = dl("up", "--config", str(bad), "--name", job, "--", "echo", "never", timeout=300)
        took = time.monotonic() - t0
        assert r.returncode != 0 and "never" not in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
        said = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(said) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert f"host {ip5}" in said[0] and "authentication" in said[0].lower(), said[0]
        assert f"host {ip17}" in said[0], said[0]
        assert [ip for ip in (h["address"] for h in data["hosts"]) if f"host {ip}:" in said[0]] == [ip5, ip17], said
        assert on_engines(engines, job) == []
        assert took < 60, f"up took {took:.0f}s to give up"  # retries are bounded by 3 x connect_timeout
    finally:
        subprocess.run(["docker", "exec", node5, "sh", "-c", "kill $(cat /run/sshd-refuse.pid)"], timeout=60)
        subprocess.run(["docker", "exec", node17, "pkill", "-f", "IO::Socket"], timeout=60)
