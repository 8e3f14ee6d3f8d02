"""Claims the README, its docs/ pages and ARCHITECTURE make that no other test checked, each on the real sim cluster."""

import json
import secrets
import time

import pytest
import yaml

from tests.integration.helpers import (
    containers_on,
    dl,
    env_files_on,
    job_name,
    probe_containers_on,
    start_up,
    stop_up,
    variant,
    wait_for_ready,
)

pytestmark = pytest.mark.integration



@pytest.fixture
def only_on_node1(remotes, demo_image):
    """A tag that exists on node1 only (node2 cannot pull it: no registry)."""
    tag = f"dlt-only-node1:{secrets.token_hex(3)}"
    remotes[0].check(["docker", "tag", demo_image, tag], "tag")
    yield tag
    remotes[0].run(["docker", "rmi", tag])


def test_a_failed_start_on_one_host_tears_down_the_others(sim_cluster, tmp_path, remotes, only_on_node1):
    env_file = tmp_path / "s.env"
    env_file.write_text("TOKEN=x\n")
    cfg = variant(sim_cluster, tmp_path, container={"env_files": [str(env_file)]})
    job = job_name()
    r = dl("up", "--skip-preflight", "--config", cfg, "--image", only_on_node1, "--name", job, "--", "sleep", "600")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"host {sim_cluster[2][1].ip}: starting container {job}-1 failed" in r.stdout, r.stdout
    assert "start failed: stopping and removing" in r.stdout
    assert [containers_on(rm, job) for rm in remotes] == [[], []]
    assert [env_files_on(rm) for rm in remotes] == [[], []]  # removed on the failure path too


def test_a_failing_preflight_starts_nothing(sim_cluster, remotes, only_on_node1):
    job = job_name()
    r = dl("up", "--config", str(sim_cluster[1]), "--image", only_on_node1, "--name", job, "--", "sleep", "600")
    assert r.returncode == 1 and "preflight FAILED" in r.stdout and "nothing was started" in r.stdout, r.stdout
    assert [containers_on(rm, job) for rm in remotes] == [[], []]
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]  # doctor's probes are gone afterwards


def test_a_container_removed_mid_job_tears_down_the_rest(sim_cluster, remotes):
    job = job_name()
    p, lines, out = start_up("--skip-preflight", "--config", str(sim_cluster[1]), "--name", job, "--",
                             "sh", "-c", 'echo "ready $NODE_RANK"; sleep 600')
    try:
        assert wait_for_ready(lines, {"0", "1"}, 120) == {"0", "1"}, "".join(out)
        remotes[1].check(["docker", "rm", "-f", f"{job}-1"], "removing rank 1's container behind up's back")
        p.wait(timeout=60)
        assert p.returncode != 0, "".join(out)
        assert [containers_on(rm, job) for rm in remotes] == [[], []]
    finally:
        stop_up(p)
        dl("down", "--config", str(sim_cluster[1]), "--name", job)


def test_logs_follow_streams_until_the_containers_exit(sim_cluster):
    cfg = str(sim_cluster[1])
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--", "sh", "-c",
           'for i in 1 2 3; do echo "tick $i from $NODE_RANK"; sleep 1; done')
    assert r.returncode == 0, r.stderr
    try:
        t0 = time.monotonic()
        lg = dl("logs", "--follow", "--config", cfg, "--name", job, timeout=60)
        assert lg.returncode == 0, lg.stderr
        for rank in ("0", "1"):
            assert [f"tick {i} from {rank}" in lg.stdout for i in (1, 2, 3)] == [True] * 3, lg.stdout
        assert time.monotonic() - t0 >= 1.5  # it followed, it did not just print what was there
        st = dl("status", "--config", cfg, "--name", job, "--output", "json")
        assert [(c["status"], c["exit_code"]) for c in json.loads(st.stdout)["containers"]] == [("exited", 0)] * 2
    finally:
        dl("down", "--config", cfg, "--name", job)


def test_secret_files_are_0600_on_the_host_and_gone_when_the_command_returns(cluster_config, tmp_path):
    from dockerlaunch.backends.docker import secret_env
    from dockerlaunch.backends.docker.dockerhost import with_env_file
    from dockerlaunch.backends.docker.session import open_session

    session = open_session(cluster_config)
    paths = secret_env.env_file_paths(session, "dlt-perm")
    try:
        for h in session.fleet.hosts:
            [path] = paths[h.rank]
            # what `docker run --env-file` would see while it runs: the file, 0600, the secret lines
            seen = h.remote.check(with_env_file(path, ["sh", "-c", 'stat -c "%a %U" "$0"; cat "$0"', path]), "stat",
                                  stdin=b"TOKEN=x\n").stdout.split()
            assert seen == ["600", "root", "TOKEN=x"], seen
            assert not h.remote.run(["test", "-e", path]).ok
            assert not h.remote.run(["test", "-e", path.rsplit("/", 1)[0]]).ok  # its folder too
            # anything already at the folder's name (a link, a FIFO, a world-writable folder with a FIFO planted
            # where the file goes) is never written through or into; the command does not run
            folder = path.rsplit("/", 1)[0]
            plants = [["ln", "-s", "/tmp/dlt-victim", folder], ["mkfifo", folder],
                      ["sh", "-c", 'mkdir -m 0777 "$0" && mkfifo "$0/env"', folder]]
            for plant in plants:
                h.remote.check(plant, "planting")
                # a reader on the FIFO (as the attacker would run), for 3 s: it must get no byte
                h.remote.check(["sh", "-c", 'f="$0"; [ -d "$0" ] && f="$0/env"; [ -p "$f" ] || exit 0; '
                                '(timeout 3 cat "$f" > /tmp/dlt-fifo-got 2>/dev/null &) ; exit 0', folder], "reader")
                r = h.remote.run(with_env_file(path, ["echo", "ran"]), stdin=b"TOKEN=x\n")
                assert r.exit_status == 125 and "ran" not in r.stdout, (plant, r)
                assert not h.remote.run(["test", "-e", "/tmp/dlt-victim"]).ok
                time.sleep(3.5)
                got = h.remote.run(["sh", "-c", "cat /tmp/dlt-fifo-got 2>/dev/null; rm -f /tmp/dlt-fifo-got"])
                assert "TOKEN" not in got.stdout, plant
                h.remote.check(["rm", "-rf", folder], "cleaning up")
    finally:
        secret_env.remove_env_files(session, paths)
        session.close()


def test_doctor_fails_on_a_different_image_id_and_a_64mb_shm(sim_cluster, remotes, demo_image, tools_image, tmp_path):
    from tests.integration.test_launch import rows

    tag = f"dlt-differs:{secrets.token_hex(3)}"
    remotes[0].check(["docker", "tag", demo_image, tag], "tag")
    remotes[1].check(["docker", "tag", tools_image, tag], "tag")
    try:
        cfg = variant(sim_cluster, tmp_path, container={"ipc": "private"})  # private IPC, no shm_size: 64 MB
        r = dl("doctor", "--config", cfg, "--image", tag)
        assert r.returncode == 1, r.stdout
        ip1, ip2 = (n.ip for n in sim_cluster[2])
        assert "FAIL" in rows(r.stdout, "image")[ip2] and "on another host" in rows(r.stdout, "image")[ip2]
        assert "FAIL" in rows(r.stdout, "shm")[ip1] and "64 MB" in rows(r.stdout, "shm")[ip1]
        assert [probe_containers_on(rm) for rm in remotes] == [[], []]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", tag])


def test_accept_new_records_an_unknown_key_and_still_refuses_a_changed_one(sim_cluster, tmp_path):
    data = yaml.safe_load(open(sim_cluster[1]))
    known = tmp_path / "known_hosts"
    cfg = variant(sim_cluster, tmp_path, ssh={"known_hosts": str(known), "host_key_policy": "accept-new"})
    first = dl("doctor", "--config", cfg, "--image", data["image"])
    assert "HOST KEY" not in first.stdout and known.exists(), first.stdout
    recorded = known.read_text()
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    assert recorded.count(ip1) == 1 and recorded.count(ip2) == 1
    key1 = next(line for line in recorded.splitlines() if line.startswith(ip1 + " ")).split(" ", 1)[1]
    swapped = "\n".join(f"{ip2} {key1}" if line.startswith(ip2 + " ") else line for line in recorded.splitlines())
    known.write_text(swapped + "\n")
    second = dl("doctor", "--config", cfg, "--image", data["image"])
    assert second.returncode == 1 and "HOST KEY CHANGED" in second.stdout, second.stdout


def test_master_addr_is_resolved_at_launch_for_an_ssh_config_alias(sim_cluster, tmp_path):
    """Host 0 is an alias whose HostName is not an IP literal (here node1's address as one decimal number, which
    the resolver understands): the plan shows a placeholder, and `up` uses the address it actually reached."""
    import ipaddress

    data = yaml.safe_load(open(sim_cluster[1]))
    ip1 = sim_cluster[2][0].ip
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host gpu-a\n  HostName {int(ipaddress.IPv4Address(ip1))}\n  User root\n")
    known = tmp_path / "known_hosts"
    known.write_text(open(data["ssh"]["known_hosts"]).read())
    cfg = variant(sim_cluster, tmp_path, hosts=["gpu-a", data["hosts"][1]],
                  ssh={"config_file": str(ssh_config), "known_hosts": str(known), "host_key_policy": "accept-new"})
    dry = dl("up", "--dry-run", "--output", "json", "--config", cfg, "--", "true")
    assert dry.returncode == 0, dry.stderr
    assert "<resolved at launch" in json.loads(dry.stdout)["master_addr"]
    job = job_name()
    r = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--", "sh", "-c", 'echo "master=$MASTER_ADDR"')
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(f"master={ip1}") == 2, r.stdout


def test_push_full_sends_every_layer_and_an_unreachable_host_fails_alone(sim_cluster, engine, remotes, fresh_image,
                                                                         tmp_path):
    ref = fresh_image(mb=4)
    image = engine.images.get(ref)
    data = yaml.safe_load(open(sim_cluster[1]))
    dead = sim_cluster[2][0].ip.rsplit(".", 1)[0] + ".99"
    cfg = variant(sim_cluster, tmp_path, hosts=data["hosts"] + [{"address": dead}], ssh={"connect_timeout": 3})
    try:
        r = dl("push", ref, "--config", cfg, "--full", "--compress", "none", "--output", "json")
        assert r.returncode == 1, r.stdout + r.stderr
        rows = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
        assert rows[dead]["status"] == "failed" and "no answer" in rows[dead]["detail"]
        for n in sim_cluster[2]:
            assert rows[n.ip]["status"] == "pushed" and "thin" not in rows[n.ip]["detail"], rows[n.ip]
            assert rows[n.ip]["bytes_sent"] >= image.attrs["Size"] * 0.9  # every layer, not just the new one
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref, image.id])


def test_loading_a_corrupted_bundle_onto_hosts_tags_nothing(sim_cluster, engine, remotes, fresh_image, tmp_path):
    ref = fresh_image(mb=2)
    image_id = engine.images.get(ref).id
    bundle = tmp_path / "b.dlb"
    assert dl("save", ref, "-o", str(bundle)).returncode == 0
    data = bytearray(bundle.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    bundle.write_bytes(bytes(data))
    r = dl("load", str(bundle), "--config", str(sim_cluster[1]))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.count("failed") >= 2 and ("corrupted" in r.stdout or "checksum" in r.stdout), r.stdout
    for rm in remotes:
        assert not rm.run(["docker", "image", "inspect", ref]).ok
        assert not rm.run(["docker", "image", "inspect", image_id]).ok  # nothing loaded either


def test_doctor_fails_when_docker_is_not_usable_by_the_ssh_user(sim_cluster, remotes, demo_image):
    """A `docker` that refuses the user (as without the docker group) on node2: FAIL with the group hint."""
    shim = "/usr/local/bin/docker"
    remotes[1].check(["sh", "-c", f'printf "%s\\n" "#!/bin/sh" "echo \\"permission denied while trying to connect '
                                  f'to the Docker daemon socket\\" >&2" "exit 1" > {shim} && chmod 755 {shim}'],
                     "installing a docker that refuses")
    try:
        r = dl("doctor", "--config", str(sim_cluster[1]), "--image", demo_image, "--output", "json")
    finally:
        remotes[1].check(["rm", "-f", shim], "removing the shim")
    assert r.returncode == 1, r.stdout
    docker = {c["host"]: c for c in json.loads(r.stdout)["checks"] if c["check"] == "docker"}
    row = docker[sim_cluster[2][1].ip]
    assert row["verdict"] == "FAIL" and "permission denied" in row["reason"] and "docker group" in row["reason"], row
    assert docker[sim_cluster[2][0].ip]["verdict"] == "PASS"


@pytest.mark.parametrize("user_ifname", [False, True])
def test_doctor_route_and_reachability_when_master_addr_is_on_a_bridge(sim_cluster, remotes, demo_image, tmp_path,
                                                                       user_ifname):
    """MASTER_ADDR lives on a bridge-like interface of host 0 (what NCCL would pick up by mistake): route FAIL
    (WARN when the user set NCCL_SOCKET_IFNAME), and host 1 cannot reach it: reachability FAIL."""
    from tests.integration.test_launch import rows

    addr = "10.99.0.1"
    data = yaml.safe_load(open(sim_cluster[1]))
    hosts = data["hosts"]
    first = hosts[0] if isinstance(hosts[0], dict) else {"address": hosts[0]}
    env = {"NCCL_SOCKET_IFNAME": "eth0"} if user_ifname else {}
    cfg = variant(sim_cluster, tmp_path, hosts=[{**first, "advertise_addr": addr}, *hosts[1:]],
                  container={"env": env})
    remotes[0].check(["sh", "-c", f"ip link add br-0badbeef type bridge && ip addr add {addr}/32 dev br-0badbeef "
                                  "&& ip link set br-0badbeef up"], "adding a bridge-like interface")
    try:
        r = dl("doctor", "--config", cfg, "--image", demo_image)
    finally:
        remotes[0].check(["ip", "link", "del", "br-0badbeef"], "removing it")
    assert r.returncode == 1, r.stdout
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    route = rows(r.stdout, "route")[ip1]
    if user_ifname:
        assert "WARN" in route and "br-0badbeef" in route and "using your NCCL_SOCKET_IFNAME" in route, route
    else:
        assert "FAIL" in route and "br-0badbeef" in route, route
    reach = rows(r.stdout, "reachability")[ip2]
    assert "FAIL" in reach and f"cannot reach {addr}:" in reach, reach
    assert [probe_containers_on(rm) for rm in remotes] == [[], []]


def doctor_json(*args: str) -> tuple[int, dict[tuple[str, str], dict]]:
    """doctor --output json -> (exit code, {(host, check): row})."""
    r = dl("doctor", *args, "--output", "json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, {(c["host"], c["check"]): c for c in json.loads(r.stdout)["checks"]}


def test_doctor_hubs_asks_from_a_job_container_with_the_jobs_endpoints(sim_cluster, remotes, demo_image, tmp_path):
    """A web server on node1 stands in for huggingface.co (HF_ENDPOINT), nothing listens where MODELSCOPE_ENDPOINT
    points: with job.offline off the row WARNs about ModelScope only; with it on, the hubs are not asked."""
    port = 30000 + secrets.randbelow(5000)
    ip1 = sim_cluster[2][0].ip
    server = f"dlt-hub-{secrets.token_hex(3)}"
    remotes[0].check(["docker", "run", "-d", "--rm", "--network", "host", "--name", server, demo_image,
                      "python3", "-m", "http.server", "--bind", ip1, str(port)], "a stand-in hub")
    try:
        deadline = time.monotonic() + 30
        while remotes[1].run(["nc", "-z", "-w", "2", ip1, str(port)]).exit_status != 0:
            assert time.monotonic() < deadline, "the stand-in hub never listened"
            time.sleep(0.2)
        env = {"HF_ENDPOINT": f"http://{ip1}:{port}", "MODELSCOPE_ENDPOINT": "http://127.0.0.1:9"}
        online = variant(sim_cluster, tmp_path, container={"env": env}, job={"offline": False})
        _, checks = doctor_json("--config", online, "--image", demo_image)
        for n in sim_cluster[2]:
            hubs = checks[(n.ip, "hubs")]
            assert hubs["verdict"] == "WARN", hubs
            assert "modelscope.cn unreachable" in hubs["reason"] and "refused" in hubs["reason"], hubs
            assert "huggingface.co" not in hubs["reason"], hubs  # it answered
            assert "job.offline: true (up --offline)" in hubs["reason"]
        _, checks = doctor_json("--config", online, "--offline", "--image", demo_image)
        assert all(checks[(n.ip, "hubs")]["verdict"] == "PASS" for n in sim_cluster[2]), checks
        assert "job.offline" in checks[(ip1, "hubs")]["reason"]
        assert [probe_containers_on(rm) for rm in remotes] == [[], []]
    finally:
        remotes[0].run(["docker", "rm", "-f", server])


def test_doctor_memlock_fails_where_infiniband_is_used(sim_cluster, engine, remotes, demo_image, tmp_path):
    """The memlock verdict needs a job that uses InfiniBand: each node gets the device node the uverbs driver would
    create (/dev/infiniband/uverbs0, char 231:192), so `--device /dev/infiniband` works; these VMs cannot raise
    memlock (hard limit 8 MB on these VMs, docs/ARCHITECTURE.md), so the user's own 8 MB memlock (which wins over
    the IB profile's -1) is what the container gets, and doctor must FAIL it. With the profile's -1 the container
    cannot start at all."""
    nodes = [engine.containers.get(n.name) for n in sim_cluster[2]]
    for node in nodes:
        code, out = node.exec_run(["sh", "-c", "mkdir -p /dev/infiniband && mknod /dev/infiniband/uverbs0 c 231 192"])
        assert code == 0, out
    try:
        nofile = yaml.safe_load(open(sim_cluster[1]))["container"].get("ulimits", {})  # what the nodes can give
        low = variant(sim_cluster, tmp_path, container={"infiniband": "on",
                                                        "ulimits": {**nofile, "memlock": "8388608"}})
        code, checks = doctor_json("--config", low, "--image", demo_image)
        assert code == 1
        for n in sim_cluster[2]:
            memlock = checks[(n.ip, "memlock")]
            assert memlock["verdict"] == "FAIL", memlock  # docker's memlock is bytes, ulimit -l says KB
            assert memlock["reason"].startswith("ulimit -l in the container: 8192 (KB): InfiniBand needs"), memlock
            assert checks[(n.ip, "ib in container")]["verdict"] == "PASS"  # the device reached the container
            assert "uverbs0" in checks[(n.ip, "ib in container")]["reason"]
            assert checks[(n.ip, "infiniband")]["verdict"] == "FAIL"  # no ACTIVE port behind the node: said so
        profile = variant(sim_cluster, tmp_path, container={"infiniband": "on"})
        code, checks = doctor_json("--config", profile, "--image", demo_image)
        shm = checks[(sim_cluster[2][1].ip, "shm")]
        assert code == 1 and shm["verdict"] == "FAIL" and "did not start" in shm["reason"], shm
        assert [probe_containers_on(rm) for rm in remotes] == [[], []]
    finally:
        for node in nodes:
            node.exec_run(["rm", "-rf", "/dev/infiniband"])
