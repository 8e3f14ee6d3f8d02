"""A detached job keeps every guarantee with the launcher gone (issue 59), on the real 2-node sim: fail-fast, the
restart barrier, hang dumps, a frozen host, a launcher killed mid-start or cut off by the nodes' firewall, strangers
on the gang's port. Every time is read from independent clocks' words -- the command's own `date`, Docker's
FinishedAt -- never from dockerlaunch's own records."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from tests.integration.helpers import SCRATCH, default_signals, dl, job_name, until, variant

pytestmark = pytest.mark.integration


@pytest.fixture
def job(sim_cluster):
    """A job name whose containers are removed after the test, whatever it asserted (a job left running would hold
    host 0's gang port for the next test)."""
    name = job_name()
    yield name
    dl("down", "--config", str(sim_cluster[1]), "--name", name, "--ignore-missing")


def state(remote, name: str) -> tuple[str, int, float | None]:
    """(status, exit code, FinishedAt as epoch seconds) of a container, as the node's engine says."""
    r = remote.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}", name],
                   timeout=30)
    if not r.ok:
        return "missing", -1, None
    status, code, finished = r.stdout.split()
    return status, int(code), _epoch(finished)


def _epoch(rfc3339: str) -> float | None:
    if rfc3339.startswith("0001-"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", rfc3339)
    assert m, rfc3339
    whole = datetime.fromisoformat(m[1]).replace(tzinfo=timezone.utc).timestamp()
    return whole + float(f"0.{m[2] or 0}")


def node_exec(engine, node, *argv: str) -> str:
    """A command in a sim node itself (not over SSH: the tests below cut SSH off)."""
    code, out = engine.containers.get(node.name).exec_run(list(argv))
    assert code == 0, (argv, out)
    return out.decode(errors="replace")


def records(remote, job: str) -> dict:
    """The newest run's records on a host, read with the shell (not dockerlaunch's reader)."""
    r = remote.run(["sh", "-c", 'd=$(ls -1td /var/tmp/dockerlaunch/"$1"/runs/*/ | head -n 1); echo "$d"; '
                    'cat "$d/result.json" 2>/dev/null', "sh", job], timeout=30)
    folder, _, result = r.stdout.partition("\n")
    return {"dir": folder.strip().rstrip("/"), "result": json.loads(result) if result.strip() else None}


def launcher_processes(job: str) -> list[str]:
    """Processes of this machine whose command line names the job (a dockerlaunch left behind). The sim's job
    containers run on this kernel too, in PID namespaces of their own: only this machine's namespace counts."""
    out = []
    mine = os.readlink("/proc/self/ns/pid")
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != mine:
                continue
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if job in cmd and "dockerlaunch" in cmd:
            out.append(f"{pid}: {cmd}")
    return out


# rank 1 fails after 8 s, saying when by its own clock; rank 0 ignores SIGTERM (each `sleep` dies, the loop stays)
FAIL_FAST = ('if [ "$NODE_RANK" = 1 ]; then sleep 8; date +FAILED_AT=%s.%N; exit 3; fi; '
             'trap "" TERM; echo rank0 up; while :; do sleep 1; done')


def test_a_rank_fails_with_the_launcher_gone_and_cut_off_and_the_gang_stops_within_10s(job, sim_cluster, engine,
                                                                                        remotes, tmp_path, demo_image):
    """`up --detach` returns with no dockerlaunch process left here; the nodes' firewall then drops this machine.
    Rank 1 exits 3: rank 0, which ignores SIGTERM, is stopped within 10 s. Once reachable again, `status`,
    `ps` and `logs --follow` exit non-zero naming rank 1 and code 3, not rank 0."""
    cfg = variant(sim_cluster, tmp_path, job={"host_timeout": 30})
    nodes = sim_cluster[2]
    r = dl("up", "--detach", "--skip-preflight", "--config", cfg, "--name", job, "--image", demo_image,
           "--", "sh", "-c", FAIL_FAST, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the hosts watch the job" in r.stdout, r.stdout
    assert launcher_processes(job) == []
    gateway = node_exec(engine, nodes[0], "sh", "-c", "ip route | awk '/default/ {print $3; exit}'").strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", gateway), gateway
    rule = ["INPUT", "-s", gateway, "-p", "tcp", "--dport", "22", "-j", "DROP"]
    cut = []
    try:
        for n in nodes:
            node_exec(engine, n, "iptables", "-I", *rule)
            cut.append(n)
        # the launcher's machine cannot reach the nodes now (checked, not assumed)
        probe = subprocess.run(["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{nodes[0].ip}/22"],
                               capture_output=True)
        assert probe.returncode != 0
        c = engine.containers.get(nodes[0].name)
        done = until(lambda: b"running" not in c.exec_run(["docker", "inspect", "-f", "{{.State.Status}}",
                                                           f"{job}-0"])[1], 60)
        assert done is not None, "rank 0 kept running after rank 1 failed"
    finally:
        for n in cut:
            node_exec(engine, n, "iptables", "-D", *rule)
    failed_at = float(re.search(r"FAILED_AT=([\d.]+)", remotes[1].run(["docker", "logs", f"{job}-1"]).stdout)[1])
    status0, code0, finished0 = state(remotes[0], f"{job}-0")
    assert status0 == "exited" and finished0 is not None
    took = finished0 - failed_at
    assert took <= 10, f"rank 0 stopped {took:.1f}s after rank 1 failed (must be within 10 s)"
    for rm in remotes:
        rec = records(rm, job)["result"]
        assert rec["rank"] == 1 and rec["exit_code"] == 3 and rec["cause"] == "rank failed", rec
    print(f"\n[detached] rank 1 failed; rank 0 (ignoring SIGTERM) stopped {took:.1f}s later, launcher cut off")

    st = dl("status", "--config", cfg, "--name", job)
    assert st.returncode == 3, st.stdout + st.stderr
    assert f"rank 1 ({nodes[1].ip}) exited with 3" in st.stdout, st.stdout
    ps = dl("ps", "--config", cfg)
    assert ps.returncode == 1, ps.stdout + ps.stderr
    follow = dl("logs", "--follow", "--config", cfg, "--name", job, timeout=120)
    assert follow.returncode == 3, follow.stdout + follow.stderr
    assert "rank 1" in follow.stdout and "exited with 3" in follow.stdout
    dl("down", "--config", cfg, "--name", job)


def test_a_launcher_killed_mid_start_leaves_nothing_running_past_the_start_deadline(job, sim_cluster, engine, remotes,
                                                                                    tmp_path, demo_image):
    """node2's `docker run` of rank 1 is held (a slow engine); the launcher is SIGKILLed once rank 0 runs: rank 0
    never sees its gang form and stops within job.start_timeout."""
    cfg = variant(sim_cluster, tmp_path, job={"start_timeout": 10})
    shim = ('#!/bin/sh\ncase "$*" in *"--name ' + job + '-1 "*) sleep 90 ;; esac\nexec /usr/bin/docker "$@"\n')
    node_exec(engine, sim_cluster[2][1], "sh", "-c", f"printf '%s' {shlex.quote(shim)} > /usr/local/bin/docker "
              "&& chmod 755 /usr/local/bin/docker")
    p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "up", "--detach", "--skip-preflight", "--config", cfg,
                          "--name", job, "--image", demo_image, "--", "sh", "-c", "sleep 600"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=SCRATCH, preexec_fn=default_signals)
    try:
        started = until(lambda: state(remotes[0], f"{job}-0")[0] == "running", 120)
        assert started is not None, "rank 0 never started"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        t0 = time.monotonic()
        stopped = until(lambda: state(remotes[0], f"{job}-0")[0] != "running", 10 + 30)
        assert stopped is not None, "rank 0 kept running with its launcher killed mid-start"
        print(f"\n[detached] launcher killed mid-start: rank 0 stopped {time.monotonic() - t0:.1f}s later "
              "(job.start_timeout 10)")
    finally:
        if p.poll() is None:
            p.kill()
        node_exec(engine, sim_cluster[2][1], "sh", "-c", "rm -f /usr/local/bin/docker; pkill -f 'sleep [9]0' || true")
        dl("down", "--config", cfg, "--name", job)


# attempt 0: rank 0 records its pid and ignores SIGTERM; rank 1 fails. Attempt 1: rank 0 says whether attempt 0's
# process is still there (same container: its /tmp), both ranks succeed.
BARRIER = ('echo "attempt $DL_RESTART_COUNT rank $NODE_RANK"; '
           'if [ "$DL_RESTART_COUNT" = 0 ]; then '
           '  if [ "$NODE_RANK" = 1 ]; then sleep 3; exit 3; fi; '
           '  echo $$ > /tmp/attempt0.pid; trap "" TERM; while :; do sleep 1; done; '
           'fi; '
           'if [ "$NODE_RANK" = 0 ]; then '
           '  if kill -0 "$(cat /tmp/attempt0.pid)" 2>/dev/null; then echo "OLD STILL ALIVE"; '
           '  else echo "old gone"; fi; '
           'fi; sleep 2')


def test_a_detached_restart_waits_for_every_process_of_the_attempt(job, sim_cluster, remotes, tmp_path, demo_image):
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 1})
    r = dl("up", "--detach", "--skip-preflight", "--max-restarts", "1", "--config", cfg, "--name", job,
           "--image", demo_image, "--", "sh", "-c", BARRIER, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    follow = dl("logs", "--follow", "--config", cfg, "--name", job, timeout=180)
    out = follow.stdout + follow.stderr
    assert follow.returncode == 0, out
    assert "old gone" in out and "OLD STILL ALIVE" not in out, out
    for rank in (0, 1):
        assert f"attempt 1 rank {rank}" in out, out
    rec = records(remotes[0], job)
    assert rec["result"]["cause"] == "succeeded" and rec["result"]["attempts"] == 2, rec
    attempts = remotes[1].run(["cat", f"{rec['dir']}/attempts.jsonl"]).stdout.splitlines()
    assert [(json.loads(a)["attempt"], json.loads(a)["cause"]) for a in attempts] == [
        (0, "rank failed"), (1, "succeeded")]
    # each attempt's lines are kept apart on every host
    log0 = remotes[0].run(["sh", "-c", f'cat {rec["dir"]}/attempt-1/rank0-*.log']).stdout
    assert "attempt 1 rank 0" in log0 and "attempt 0" not in log0
    dl("down", "--config", cfg, "--name", job)


HUNG = """\
import os, sys, time
def wait_for_data():
    time.sleep(600)
print("attempt", os.environ["DL_RESTART_COUNT"], "rank", os.environ["NODE_RANK"], flush=True)
if os.environ["DL_RESTART_COUNT"] == "0":
    wait_for_data()
"""


def test_a_detached_hang_keeps_every_ranks_stacks_and_restarts(job, sim_cluster, remotes, tmp_path, demo_image):
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 0})
    r = dl("up", "--detach", "--skip-preflight", "--max-restarts", "1", "--hang-timeout", "10", "--config", cfg,
           "--name", job, "--image", demo_image, "--", "python3", "-c", HUNG, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    done = until(lambda: (records(remotes[0], job)["result"] or {}).get("cause") is not None, 150, step=1)
    assert done is not None, "the hung job never ended"
    rec = records(remotes[0], job)
    assert rec["result"]["cause"] == "succeeded" and rec["result"]["attempts"] == 2, rec
    for rank, rm in enumerate(remotes):
        stacks = rm.run(["cat", f"{rec['dir']}/attempt-0/stacks-rank{rank}.txt"])
        assert stacks.ok and "wait_for_data" in stacks.stdout, stacks.stdout + stacks.stderr
    events = remotes[1].run(["cat", f"{rec['dir']}/events.jsonl"]).stdout
    kinds = [json.loads(x)["event"] for x in events.splitlines()]
    assert "hang" in kinds and kinds.count("dump") == 2 and "restart" in kinds, kinds
    dl("down", "--config", cfg, "--name", job)


def test_a_frozen_host_stops_the_rest_within_host_timeout(job, sim_cluster, engine, remotes, tmp_path, demo_image):
    """node2 freezes (docker pause) during a detached run: rank 0 stops within host_timeout + 5 s; once node2
    thaws, its rank, which lost the others, stops itself."""
    timeout = 5
    cfg = variant(sim_cluster, tmp_path, job={"host_timeout": timeout})
    node2 = engine.containers.get(sim_cluster[2][1].name)
    r = dl("up", "--detach", "--skip-preflight", "--config", cfg, "--name", job, "--image", demo_image,
           "--", "sh", "-c", "sleep 600", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    paused = False
    try:
        # the whole host: the sim node and its job container (the node's engine puts its containers' processes in
        # cgroups beside the node's own, not under it, so pausing the node alone leaves the job running)
        assert remotes[1].run(["docker", "pause", f"{job}-1"]).ok
        node2.pause()
        paused = True
        frozen_at = time.time()
        stopped = until(lambda: state(remotes[0], f"{job}-0")[0] != "running", timeout + 60)
        assert stopped is not None, "rank 0 kept running beside a frozen host"
        took = state(remotes[0], f"{job}-0")[2] - frozen_at
        assert took <= timeout + 5, f"rank 0 stopped {took:.1f}s after node2 froze (host_timeout {timeout})"
        node2.unpause()
        paused = False
        assert remotes[1].run(["docker", "unpause", f"{job}-1"]).ok
        alone = until(lambda: state(remotes[1], f"{job}-1")[0] != "running", timeout + 30)
        assert alone is not None, "node2's rank kept running after it lost the others"
        assert state(remotes[0], f"{job}-0")[1] == 75 and state(remotes[1], f"{job}-1")[1] == 75
        print(f"\n[detached] node frozen: rank 0 stopped {took:.1f}s later (host_timeout {timeout}); node2's rank "
              f"stopped itself {alone:.1f}s after it thawed")
    finally:
        if paused:
            node2.unpause()
            remotes[1].run(["docker", "unpause", f"{job}-1"])
        dl("down", "--config", cfg, "--name", job)


STRANGER = """\
import json, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
for attempt in ("wrong", "garbage", "long"):
    s = socket.create_connection((addr, port), 5)
    f = s.makefile("rwb")
    hello = json.loads(f.readline())
    if attempt == "wrong":
        f.write(json.dumps({"rank": 1, "nonce": "0" * 32, "mac": "f" * 64}).encode() + b"\\n")
    elif attempt == "garbage":
        f.write(b"\\x00\\xff{not json\\n")
    else:
        f.write(b"x" * 200000)
    try:
        f.flush()
        said = f.readline()[:80]
    except OSError as e:  # an over-long line: the coordinator closes while we still write
        said = type(e).__name__.encode()
    print(attempt, repr(said), flush=True)
    s.close()
"""


def test_a_stranger_on_the_gang_port_changes_nothing(job, sim_cluster, engine, remotes, tmp_path, demo_image):
    """From a job host, on the gang's port: a wrong proof, garbage, an over-long line. The job runs on and ends
    as it would have; the coordinator logs the stranger once per address."""
    cfg = variant(sim_cluster, tmp_path)
    nodes = sim_cluster[2]
    r = dl("up", "--detach", "--skip-preflight", "--config", cfg, "--name", job, "--image", demo_image,
           "--", "sh", "-c", "sleep 12; echo done", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    # the run's secret is nowhere a host's other users or tools read: not in inspect, not left in the tmpfs
    for rank, rm in enumerate(remotes):
        fields = ("{{json .Config.Env}} {{json .Args}} {{json .Path}} {{json .Config.Labels}} {{json .Mounts}} "
                  "{{json .HostConfig.Tmpfs}} {{json .Config.Entrypoint}} {{json .Config.Cmd}}")
        inspect = rm.run(["docker", "inspect", "-f", fields, f"{job}-{rank}"]).stdout
        hexes = set(re.findall(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])", inspect))  # the secret's form
        assert "gang-entry.sh" in inspect and not hexes, f"64-hex values in inspect: {hexes}"
        left = rm.run(["docker", "exec", f"{job}-{rank}", "sh", "-c", "ls -A /run/dockerlaunch/gang"])
        assert left.ok and left.stdout.strip() == "", left.stdout
    probe = remotes[1].run(["docker", "run", "--rm", "--network", "host", demo_image, "python3", "-c", STRANGER,
                            nodes[0].ip, "29499"], timeout=60)
    assert probe.ok, probe.stdout + probe.stderr
    assert "wrong b''" in probe.stdout, probe.stdout  # refused: the connection closed, nothing said
    done = until(lambda: (records(remotes[0], job)["result"] or {}).get("cause") is not None, 60, step=1)
    assert done is not None
    rec = records(remotes[0], job)
    assert rec["result"]["cause"] == "succeeded", rec
    events = [json.loads(x) for x in remotes[0].run(["cat", f"{rec['dir']}/events.jsonl"]).stdout.splitlines()]
    strangers = [e for e in events if e["event"] == "stranger"]
    assert len(strangers) == 1 and nodes[1].ip in strangers[0]["text"], strangers
    dl("down", "--config", cfg, "--name", job)


def test_an_image_without_python_runs_detached_unsupervised_after_one_warning(job, sim_cluster, remotes, tmp_path,
                                                                             tools_image):
    """The sim's tools image has no Python: `up --detach` says in one line that nothing watches the job once it
    returns, and the job runs as it did before (its command, its own exit)."""
    cfg = variant(sim_cluster, tmp_path)
    r = dl("up", "--detach", "--skip-preflight", "--config", cfg, "--name", job, "--image", tools_image,
           "--", "sh", "-c", 'echo "rank $NODE_RANK ran"; sleep 1', timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    warned = [line for line in out.splitlines() if "no Python >= 3.8" in line]
    assert len(warned) == 1 and "nothing stops the other ranks" in warned[0], out
    for rank, rm in enumerate(remotes):
        assert until(lambda rm=rm, rank=rank: state(rm, f"{job}-{rank}")[0] == "exited", 60) is not None
        assert state(rm, f"{job}-{rank}")[1] == 0
        assert f"rank {rank} ran" in rm.run(["docker", "logs", f"{job}-{rank}"]).stdout
    dl("down", "--config", cfg, "--name", job)
