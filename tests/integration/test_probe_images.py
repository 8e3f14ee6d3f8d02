"""doctor with the images users bring, on the real sim cluster: a bare Debian (no nc, python3, ip or bash) and an
image holding one static binary (no /bin/sh at all). Every check must run through a fallback or say exactly what
the image lacks; none may blame a firewall for a missing tool."""

import io
import json
import secrets
import subprocess
import tarfile
import time

import pytest

from dockerlaunch import sim
from dockerlaunch.backends.docker.pyspy import local_pyspy
from dockerlaunch.container import NOFILE
from dockerlaunch.sim.layout import NODE_NOFILE
from tests.integration.helpers import dl, probe_containers_on, variant

pytestmark = pytest.mark.integration

NO_TOOLS = "for t in nc python3 ip bash; do if command -v $t; then exit 1; fi; done"


def _load_into_nodes(image: str, sim_cluster) -> None:
    """`docker save` here, `docker load` in each node's engine (as the sim seeds its images; push is tested
    elsewhere and is not what these tests are about)."""
    for node in sim_cluster[2]:
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "exec", "-i", node.name, "docker", "load", "-q"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=300)
        save.stdout.close()
        assert save.wait(timeout=60) == 0 and load.returncode == 0, load.stderr


@pytest.fixture(scope="module")
def bare_image(engine, sim_cluster, remotes):
    """Debian bookworm minbase (dockerlaunch/debian:bookworm) without bash: /bin/sh (dash) and coreutils only."""
    tag = f"dlt-bare:{secrets.token_hex(3)}"
    base = sim.ensure_base_image(engine)
    dockerfile = f"FROM {base}\nRUN rm -f /usr/bin/bash /bin/bash /usr/bin/rbash && {NO_TOOLS}\n"
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="host", rm=True)
    try:
        _load_into_nodes(tag, sim_cluster)
        yield tag
    finally:
        for r in remotes:
            r.run(["docker", "rmi", tag])
        try:
            engine.images.remove(tag, force=True)
        except Exception:
            pass  # already gone


@pytest.fixture(scope="module")
def static_image(engine, sim_cluster, remotes):
    """`docker import` of a tar holding one static executable (dockerlaunch's own py-spy): no shell, no libc."""
    pyspy = local_pyspy()
    assert pyspy is not None, "py-spy is a dependency of dockerlaunch"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(pyspy), arcname="py-spy")
    tag = f"dlt-static:{secrets.token_hex(3)}"
    r = subprocess.run(["docker", "import", "-", tag], input=buf.getvalue(), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        _load_into_nodes(tag, sim_cluster)
        yield tag
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", tag])
        try:
            engine.images.remove(tag, force=True)
        except Exception:
            pass  # already gone


@pytest.fixture(scope="module")
def engine_hard_nofile(remotes) -> int:
    """The open-files hard limit of the nodes' dockerd: what an engine without CAP_SYS_RESOURCE can give at most
    (sim.layout.NODE_NOFILE on every machine)."""
    r = remotes[0].check(["sh", "-c", 'grep "open files" "/proc/$(pidof dockerd)/limits"'], "dockerd's limits")
    return int(r.stdout.split()[-2])


def engine_can_give(hard: int) -> dict:
    """container: settings for open files the nodes' engines can give (the default, 1048576, they may refuse)."""
    return {} if hard >= 1048576 else {"ulimits": {"nofile": str(hard)}}


@pytest.fixture(scope="module")
def config(sim_cluster, engine_hard_nofile, tmp_path_factory) -> str:
    return variant(sim_cluster, tmp_path_factory.mktemp("cfg"), container=engine_can_give(engine_hard_nofile))


def doctor(*args: str) -> tuple[int, dict[tuple[str, str], dict], float]:
    """doctor --output json -> (exit code, {(host, check): row}, seconds)."""
    t0 = time.monotonic()
    r = dl("doctor", *args, "--output", "json")
    took = time.monotonic() - t0
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, {(c["host"], c["check"]): c for c in json.loads(r.stdout)["checks"]}, took


def no_blame(checks: dict) -> None:
    blamed = [c for c in checks.values() if "firewall" in c["reason"].lower()]
    assert blamed == [], blamed


def test_a_bare_debian_image(sim_cluster, remotes, bare_image, engine_hard_nofile, tmp_path):
    """No nc, python3, ip or bash in the image: shm from its dash, reachability from the hosts (said in the row),
    hubs skipped naming python3."""
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    online = variant(sim_cluster, tmp_path, job={"offline": False}, container=engine_can_give(engine_hard_nofile))
    code, checks, took = doctor("--config", online, "--image", bare_image)
    no_blame(checks)
    assert code == 0, checks
    for ip in (ip1, ip2):
        assert checks[(ip, "shm")]["verdict"] == "PASS", checks[(ip, "shm")]
        assert checks[(ip, "nofile")]["verdict"] == "PASS", checks[(ip, "nofile")]
        hubs = checks[(ip, "hubs")]
        assert hubs["verdict"] == "SKIP" and hubs["reason"].startswith("the image has no python3"), hubs
    reach = checks[(ip2, "reachability")]
    assert reach["verdict"] == "PASS", reach
    assert reach["reason"].endswith("(checked from the host: the image has no nc or python3)"), reach
    assert took < 90, f"doctor took {took:.1f}s: hung?"  # a hang guard (3 x a slow CI run), not a speed claim
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def test_a_bare_image_on_a_host_without_nc_uses_bash(sim_cluster, engine, remotes, bare_image, config):
    """Node 2's own nc hidden: its connection is made by bash's /dev/tcp (with timeout) to node 1's listener."""
    node2 = engine.containers.get(sim_cluster[2][1].name)
    code, out = node2.exec_run(["mv", "/usr/bin/nc", "/usr/bin/nc.hidden"])
    assert code == 0, out
    try:
        code, checks, _ = doctor("--config", config, "--image", bare_image)
        no_blame(checks)
        reach = checks[(sim_cluster[2][1].ip, "reachability")]
        assert code == 0 and reach["verdict"] == "PASS" and "checked from the host" in reach["reason"], reach
    finally:
        node2.exec_run(["mv", "/usr/bin/nc.hidden", "/usr/bin/nc"])
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def test_an_image_with_only_a_static_binary(sim_cluster, remotes, static_image, config):
    """No /bin/sh: a WARN that names it and the fix (never a FAIL or a traceback); reachability from the hosts."""
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    code, checks, _ = doctor("--config", config, "--image", static_image)
    no_blame(checks)
    assert code == 0, checks
    for ip in (ip1, ip2):
        shm = checks[(ip, "shm")]
        assert shm["verdict"] == "WARN", shm
        assert shm["reason"].startswith("the image has no /bin/sh: shm/memlock/nofile not checked inside it;"), shm
        assert "/dev/shm is the host's (ipc: host)" in shm["reason"] and "add a shell" in shm["reason"], shm
    reach = checks[(ip2, "reachability")]
    assert reach["verdict"] == "PASS" and "checked from the host: the image has no /bin/sh" in reach["reason"], reach
    assert not [c for c in checks.values() if c["verdict"] == "FAIL"], checks
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


# ---------------------------------------------------------------- nofile (Docker 29 gives containers 1024)


def test_nofile_the_engine_refuses_is_named_with_the_fix(sim_cluster, remotes, bare_image, engine_hard_nofile,
                                                         tmp_path):
    """The default (1048576) on engines that cannot raise their own hard limit, as the sim's nodes: runc refuses
    the start; doctor names the limit and the setting that fixes it."""
    assert engine_hard_nofile == NODE_NOFILE < NOFILE.hard  # the sim's fixed limit, on every machine
    default = variant(sim_cluster, tmp_path, container={"ulimits": {}})  # whatever the sim's config sets
    code, checks, _ = doctor("--config", default, "--image", bare_image)
    no_blame(checks)
    assert code == 1
    for n in sim_cluster[2]:
        nofile = checks.get((n.ip, "nofile"))
        assert nofile is not None, [c for c in checks.values() if c["host"] == n.ip]
        assert nofile["verdict"] == "FAIL", nofile
        assert nofile["reason"].startswith("the engine refused --ulimit nofile=1048576:1048576"), nofile
        assert "set container.ulimits.nofile to at most" in nofile["reason"], nofile
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def test_nofile_reaches_the_probe_and_the_job(sim_cluster, bare_image, engine_hard_nofile, tmp_path):
    """container.ulimits.nofile (here the engine's own maximum) wins: doctor's row sees it in a container with the
    job's flags, and the job's containers run with it."""
    cfg = variant(sim_cluster, tmp_path, container={"ulimits": {"nofile": str(engine_hard_nofile)}})
    code, checks, _ = doctor("--config", cfg, "--image", bare_image)
    no_blame(checks)
    assert code == 0, checks
    for n in sim_cluster[2]:
        nofile = checks[(n.ip, "nofile")]
        assert nofile == {"host": n.ip, "check": "nofile", "verdict": "PASS",
                          "reason": f"ulimit -n in the container: {engine_hard_nofile}"}
    job = f"t{secrets.token_hex(3)}"
    r = dl("up", "--skip-preflight", "--config", cfg, "--image", bare_image, "--name", job, "--log-dir",
           str(tmp_path / "logs"), "--", "sh", "-c", 'echo "rank $NODE_RANK nofile=$(ulimit -n):$(ulimit -Hn)"',
           timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank} nofile={engine_hard_nofile}:{engine_hard_nofile}" in r.stdout, r.stdout[-2000:]
