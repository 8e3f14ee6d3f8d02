"""`dockerlaunch up` / doctor / down / status / logs / exec on a real 2-node sim cluster."""

import json
import re
import secrets
import signal
import subprocess
import time

import pytest
import yaml

from dockerlaunch.backends.docker.doctor.observations import listening_ports
from tests.conftest import venv_tool
from tests.integration.helpers import dl, job_name, start_up, stop_up, variant, wait_for_ready

pytestmark = pytest.mark.integration

TORCHRUN = ('torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" '
            '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" /opt/dockerlaunch-demo/allreduce.py')


def test_two_node_torchrun_job(sim_cluster, demo_image, job_containers, tmp_path):
    job = job_name()
    r = dl("up", "--config", str(sim_cluster[1]), "--image", demo_image, "--nproc-per-node", "2", "--name", job,
           "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", TORCHRUN, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ok = [line for line in r.stdout.splitlines() if "all_reduce sum=10 expected=10 OK" in line]
    assert sorted(line.split("] rank ")[1].split("/")[0] for line in ok) == ["0", "1", "2", "3"], r.stdout[-3000:]
    # preflight ran and passed: its count line, no FAIL or ERROR among them
    assert re.search(r"^\[dockerlaunch\] doctor: \d+ PASS(, \d+ (WARN|SKIP))* on 2 hosts in ", r.stdout, re.M), r.stdout
    # per-host log files hold each host's own ranks
    [run_dir] = list((tmp_path / "logs").iterdir())
    logs = {p.name: p.read_text() for p in (run_dir / "attempt-0").iterdir()}
    assert len(logs) == 2
    [attempt] = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert attempt["attempt"] == 0 and attempt["cause"] == "succeeded" and attempt["code"] == 0, attempt
    rank0 = next(v for k, v in logs.items() if k.startswith("rank0-"))
    assert "rank 0/4" in rank0 and "rank 1/4" in rank0 and "rank 2/4" not in rank0
    assert job_containers(job) == []


EIGHT_RANKS = ("for l in 0 1 2 3 4 5 6 7; do LOCAL_RANK=$l python -c 'import os; r = os.environ[\"LOCAL_RANK\"]\n"
               "for i in range(400): print(\"step\", r, i, \"x\" * (i % 40), 4.0)' & done; wait")


def test_eight_processes_per_host_print_whole_lines(sim_cluster, demo_image, job_containers, tmp_path):
    """8 processes per host print at once, each print in pieces (the image sets PYTHONUNBUFFERED=1): on the job's
    terminal every line arrives whole and in order, on the screen and in the per-rank files."""
    import re

    job = job_name()
    r = dl("up", "--skip-preflight", "--config", str(sim_cluster[1]), "--image", demo_image, "--name", job,
           "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", EIGHT_RANKS, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    line = re.compile(r"\[(\d) (\S+)\] step (\d) (\d+) x* 4\.0")
    seen: dict[tuple[str, str], list[int]] = {}
    for text in r.stdout.splitlines():
        if "step" in text:
            m = line.fullmatch(text)
            assert m, f"a cut line: {text!r}"
            seen.setdefault((m[1], m[3]), []).append(int(m[4]))
    assert len(seen) == 16 and all(v == list(range(400)) for v in seen.values()), {k: len(v) for k, v in seen.items()}
    [run_dir] = list((tmp_path / "logs").iterdir())
    for f in (run_dir / "attempt-0").iterdir():
        lines = f.read_text().splitlines()
        assert len(lines) == 8 * 400 and all(re.fullmatch(r"step \d \d+ x* 4\.0", x) for x in lines), f.name
    assert job_containers(job) == []


def test_failing_rank_stops_everything_and_sets_exit_code(sim_cluster, job_containers):
    job = job_name()
    # rank 0 would run for 10 minutes: only the teardown lets `up` return inside the timeout
    r = dl("up", "--skip-preflight", "--config", str(sim_cluster[1]), "--name", job, "--",
           "sh", "-c",
           'if [ "$NODE_RANK" = 1 ]; then sleep 1; echo rank1-fails; exit 3; fi; echo rank0-waits; sleep 600',
           timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "rank 1 (" in r.stdout and "exited with 3" in r.stdout
    assert job_containers(job) == []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_tears_down_every_host(sim_cluster, job_containers, sig, code):
    job = job_name()
    p, lines, _ = start_up("--skip-preflight", "--config", str(sim_cluster[1]), "--name", job, "--",
                           "sh", "-c", 'echo "ready $NODE_RANK"; sleep 600')
    try:
        assert wait_for_ready(lines, {"0", "1"}, 120) == {"0", "1"}
        assert len(job_containers(job)) == 2
        t0 = time.monotonic()
        p.send_signal(sig)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:  # say where it hangs
            dump = subprocess.run([venv_tool("py-spy") or "py-spy", "dump", "--pid", str(p.pid)], capture_output=True,
                                  text=True, timeout=60)
            raise AssertionError(f"up did not exit 60 s after {signal.Signals(sig).name}; its threads:\n"
                                 f"{dump.stdout[-6000:]}{dump.stderr[-500:]}") from None
        took = time.monotonic() - t0
        assert p.returncode == code
        assert job_containers(job) == []
        assert took < 45, f"teardown after {sig!r} took {took:.1f}s: hung?"  # a hang guard (3 x 15 s)
        print(f"\n[fault] {signal.Signals(sig).name} while running: torn down in {took:.1f}s")
    finally:
        stop_up(p)
        dl("down", "--config", str(sim_cluster[1]), "--name", job)


def test_detach_status_logs_exec_down(sim_cluster, job_containers, remotes):
    cfg = str(sim_cluster[1])
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--",
           "sh", "-c", 'echo "hello from $NODE_RANK"; sleep 600')
    assert r.returncode == 0, r.stderr
    try:
        assert sorted(c.split(":")[2] for c in job_containers(job)) == ["running", "running"]
        marker = f"/var/tmp/dockerlaunch/{job}/nccl/marker"  # the running job's diagnostics
        for rm in remotes:
            rm.check(["touch", marker], "planting")
        again = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--", "true")
        assert (again.returncode == 1 and "already has containers" in again.stderr
                and f"down --name {job}" in again.stderr)
        assert all(rm.run(["test", "-e", marker]).ok for rm in remotes)  # refused before touching anything

        st = dl("status", "--config", cfg, "--name", job)
        assert st.returncode == 0 and st.stdout.count("running") == 2 and f"{job}-1" in st.stdout
        st = dl("status", "--config", cfg, "--name", job, "--output", "json")
        assert st.returncode == 0, st.stderr
        found = json.loads(st.stdout)
        assert found["job"] == job and [(c["rank"], c["status"]) for c in found["containers"]] == [
            (0, "running"), (1, "running")]

        ex = dl("exec", "--config", cfg, "--name", job, "--rank", "1", "--",
                "sh", "-c", 'echo "rank=$NODE_RANK"; exit 4')
        assert ex.returncode == 4 and ex.stdout.strip() == "rank=1"

        for _ in range(20):
            lg = dl("logs", "--config", cfg, "--name", job)
            if "hello from 1" in lg.stdout and "hello from 0" in lg.stdout:
                break
            time.sleep(0.5)
        assert "[0 " in lg.stdout and "hello from 0" in lg.stdout and "hello from 1" in lg.stdout
        one = dl("logs", "--config", cfg, "--name", job, "--rank", "1")
        assert "hello from 1" in one.stdout and "hello from 0" not in one.stdout
        bad = dl("logs", "--config", cfg, "--name", job, "--rank", "5")
        assert bad.returncode == 2 and "ranks 0..1" in bad.stderr
    finally:
        d = dl("down", "--config", cfg, "--name", job)
    assert d.returncode == 0 and "removed 2 container(s)" in d.stdout
    assert job_containers(job) == []


def test_secret_env_file_reaches_the_container_but_no_command_line_log_or_file(sim_cluster, tmp_path, remotes,
                                                                              job_containers):
    secret = f"hunter2-{secrets.token_hex(6)}"
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"API_TOKEN={secret}\n")
    cfg = variant(sim_cluster, tmp_path, container={"env_files": [str(env_file)]})
    job = job_name()
    check = ('test "$API_TOKEN" = "$(cat /proc/1/environ | tr "\\0" "\\n" | sed -n "s/^API_TOKEN=//p")" && '
             'test -n "$API_TOKEN" && echo secret-ok; ps -eo args; echo "ready $NODE_RANK"; sleep 4')
    p, lines, out = start_up("--skip-preflight", "--config", cfg, "--name", job, "--log-dir", str(tmp_path / "logs"),
                             "--", "sh", "-c", check)
    try:
        assert wait_for_ready(lines, {"0", "1"}, 120) == {"0", "1"}, "".join(out)
        for remote in remotes:  # while the job runs: no argv on the host, no file left with the value
            ps = remote.check(["ps", "-eo", "args"], "ps")
            assert secret not in ps.stdout
            grep = remote.run(["sh", "-c", 'grep -rlsF -- "$1" /tmp /var/tmp /root /etc; true', "sh", secret])
            assert grep.ok and grep.stdout.strip() == "", grep.stdout
        p.wait(timeout=120)
        assert p.returncode == 0, "".join(out)
    finally:
        stop_up(p)
    text = "".join(out)
    assert "secret-ok" in text and secret not in text
    logs = list((tmp_path / "logs").rglob("*.log"))
    assert len(logs) == 2
    for log in logs:
        assert secret not in log.read_text()
        assert log.stat().st_mode & 0o777 == 0o600  # a rank may print its environment
    assert job_containers(job) == []


def test_missing_env_file_is_a_clear_error(sim_cluster, tmp_path, job_containers):
    cfg = variant(sim_cluster, tmp_path, container={"env_files": [str(tmp_path / "nope.env")]})
    job = job_name()
    r = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--", "true")
    assert r.returncode == 2 and "container.env_files" in r.stderr and "nope.env" in r.stderr
    assert job_containers(job) == []


# ---------------------------------------------------------------- doctor verdicts


def rows(out: str, check: str) -> dict[str, str]:
    """host -> the table row of one check."""
    import re

    found = {}
    for line in out.splitlines():
        m = re.match(rf"^(\S+)\s+{re.escape(check)}\s+(PASS|FAIL|WARN|SKIP)\s", line)
        if m:
            found[m.group(1)] = line
    return found


def test_doctor_passes_on_a_good_cluster(sim_cluster, demo_image):
    r = dl("doctor", "--config", str(sim_cluster[1]), "--image", demo_image)
    assert r.returncode == 0, r.stdout + r.stderr
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    assert "PASS" in rows(r.stdout, "reachability")[ip2]
    assert "PASS" in rows(r.stdout, "route")[ip1] and "eth0" in rows(r.stdout, "route")[ip1]
    assert "/dev/shm 2 GB" in rows(r.stdout, "shm")[ip2]
    js = dl("doctor", "--config", str(sim_cluster[1]), "--image", demo_image, "--output", "json")
    assert js.returncode == 0, js.stdout + js.stderr
    report = json.loads(js.stdout)
    assert report["ok"] is True and report["counts"]["FAIL"] == 0
    verdicts = {(c["host"], c["check"]): c["verdict"] for c in report["checks"]}
    assert verdicts[(ip2, "reachability")] == "PASS" and verdicts[(ip1, "master port")] == "PASS"
    assert {h for h, _ in verdicts} == {ip1, ip2} and sum(report["counts"].values()) == len(report["checks"])


def test_doctor_fails_when_image_missing_on_one_host(sim_cluster, remotes, demo_image):
    only = f"dlt-only-node1:{secrets.token_hex(3)}"
    remotes[0].check(["docker", "tag", demo_image, only], "tag")
    try:
        r = dl("doctor", "--config", str(sim_cluster[1]), "--image", only)
    finally:
        remotes[0].run(["docker", "rmi", only])
    assert r.returncode == 1
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    image = rows(r.stdout, "image")
    assert "PASS" in image[ip1]
    # not on this machine either: a push would fail when pasted, so the fix is to build or pull it first
    assert "FAIL" in image[ip2] and "missing" in image[ip2] and "build or pull it first" in image[ip2]


def test_doctor_fails_when_master_port_is_taken(sim_cluster, remotes, cluster_config):
    port = 30000 + secrets.randbelow(5000)
    name = f"squat-{secrets.token_hex(3)}"
    remotes[0].check(["docker", "run", "-d", "--rm", "--network", "host", "--name", name, cluster_config.image,
                      "nc", "-lk", str(port)], "listener")
    try:
        deadline = time.monotonic() + 30
        while True:  # the listener is up once the host's own socket table shows it (poll, do not guess)
            tcp = remotes[0].run(["cat", "/proc/net/tcp", "/proc/net/tcp6"])
            assert tcp.ok, tcp.stderr
            if port in listening_ports(tcp.stdout) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert port in listening_ports(tcp.stdout), f"nc -lk {port} never listened"
        r = dl("doctor", "--config", str(sim_cluster[1]), "--master-port", str(port))
    finally:
        remotes[0].run(["docker", "rm", "-f", name])
    assert r.returncode == 1
    row = rows(r.stdout, "master port")[sim_cluster[2][0].ip]
    assert "FAIL" in row and f"port {port} is already in use" in row


def test_doctor_fails_when_a_host_is_unreachable(sim_cluster, tmp_path):
    layout = sim_cluster[2]
    dead = layout[0].ip.rsplit(".", 1)[0] + ".99"  # inside our own sim subnet; nobody lives there
    data = yaml.safe_load(open(sim_cluster[1]))
    cfg = variant(sim_cluster, tmp_path, hosts=data["hosts"] + [{"address": dead}], ssh={"connect_timeout": 3})
    r = dl("doctor", "--config", cfg)
    assert r.returncode == 1
    row = rows(r.stdout, "ssh")[dead]
    assert "FAIL" in row and ("no answer" in row or "cannot connect" in row)
    assert "PASS" in rows(r.stdout, "ssh")[layout[1].ip]  # the others are still checked


def test_doctor_fails_on_host_key_mismatch(sim_cluster, tmp_path, job_containers):
    layout = sim_cluster[2]
    data = yaml.safe_load(open(sim_cluster[1]))
    lines = open(data["ssh"]["known_hosts"]).read().splitlines()
    key2 = next(line for line in lines if line.startswith(layout[1].ip + " ")).split(" ", 1)[1]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{layout[0].ip} {key2}\n{layout[1].ip} {key2}\n")
    cfg = variant(sim_cluster, tmp_path, ssh={"known_hosts": str(kh)})
    r = dl("doctor", "--config", cfg)
    assert r.returncode == 1
    row = rows(r.stdout, "ssh")[layout[0].ip]
    assert "FAIL" in row and "HOST KEY CHANGED" in row
    assert "PASS" in rows(r.stdout, "ssh")[layout[1].ip]

    job = job_name()
    up = dl("up", "--config", cfg, "--name", job, "--", "sleep", "600")  # up refuses before starting anything
    assert up.returncode == 1 and "HOST KEY CHANGED" in (up.stdout + up.stderr)
    assert job_containers(job) == []


def test_doctor_checks_mounts_and_shared_storage(sim_cluster, tmp_path, remotes):
    token = secrets.token_hex(4)
    local_dir = f"/tmp/dlt-local-{token}"  # exists on each node, but separately: not shared
    for r in remotes:
        r.check(["mkdir", "-p", local_dir], "mkdir")
    try:
        cfg = variant(sim_cluster, tmp_path, container={"mounts": [
            {"source": local_dir, "target": "/data", "shared": True}, f"/nonexistent-{token}:/x"]})
        r = dl("doctor", "--config", cfg)
    finally:
        for rm in remotes:
            rm.run(["rm", "-rf", local_dir])
    assert r.returncode == 1
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    assert "FAIL" in rows(r.stdout, "mounts")[ip1] and f"/nonexistent-{token}" in rows(r.stdout, "mounts")[ip1]
    assert "FAIL" in rows(r.stdout, "shared")[ip2] and "not the same storage" in rows(r.stdout, "shared")[ip2]
