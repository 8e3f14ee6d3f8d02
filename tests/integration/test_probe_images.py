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

from dockerlaunch.diagnostics.dump import local_pyspy
from dockerlaunch.sim import cluster as sim
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
        engine.images.remove(tag, force=True)


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
        engine.images.remove(tag, force=True)


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


def test_a_bare_debian_image(sim_cluster, remotes, bare_image, tmp_path):
    """No nc, python3, ip or bash in the image: shm from its dash, reachability from the hosts (said in the row),
    hubs skipped naming python3."""
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    online = variant(sim_cluster, tmp_path, job={"offline": False})
    code, checks, took = doctor("--config", online, "--image", bare_image)
    no_blame(checks)
    assert code == 0, checks
    for ip in (ip1, ip2):
        assert checks[(ip, "shm")]["verdict"] == "PASS", checks[(ip, "shm")]
        hubs = checks[(ip, "hubs")]
        assert hubs["verdict"] == "SKIP" and hubs["reason"].startswith("the image has no python3"), hubs
    reach = checks[(ip2, "reachability")]
    assert reach["verdict"] == "PASS", reach
    assert reach["reason"].endswith("(checked from the host: the image has no nc or python3)"), reach
    assert took < 30, f"doctor took {took:.1f}s"
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def test_a_bare_image_on_a_host_without_nc_uses_bash(sim_cluster, engine, remotes, bare_image):
    """Node 2's own nc hidden: its connection is made by bash's /dev/tcp (with timeout) to node 1's listener."""
    node2 = engine.containers.get(sim_cluster[2][1].name)
    code, out = node2.exec_run(["mv", "/usr/bin/nc", "/usr/bin/nc.hidden"])
    assert code == 0, out
    try:
        code, checks, _ = doctor("--config", str(sim_cluster[1]), "--image", bare_image)
        no_blame(checks)
        reach = checks[(sim_cluster[2][1].ip, "reachability")]
        assert code == 0 and reach["verdict"] == "PASS" and "checked from the host" in reach["reason"], reach
    finally:
        node2.exec_run(["mv", "/usr/bin/nc.hidden", "/usr/bin/nc"])
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def test_an_image_with_only_a_static_binary(sim_cluster, remotes, static_image):
    """No /bin/sh: a WARN that names it and the fix (never a FAIL or a traceback); reachability from the hosts."""
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    code, checks, _ = doctor("--config", str(sim_cluster[1]), "--image", static_image)
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
