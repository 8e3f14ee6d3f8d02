"""Recovery on the real 2-node sim: gang restarts after a failed rank, evidence per attempt (folders, summaries,
`logs` and `status` once the containers are gone), a hang dumped and failed, a signal during the backoff, and
spares that take a lost or unreachable host's rank (host 0's too: a new MASTER_ADDR), with the image copied from
a host that has it."""

import json
import re
import secrets
import signal
import time

import pytest
import yaml

from tests.cli import paste
from tests.integration.helpers import containers_on, dl, job_name, start_up, stop_up, until, variant
from tests.integration.test_hints import fix_in

pytestmark = pytest.mark.integration

FAIL_FIRST = ('echo "attempt $DL_RESTART_COUNT rank $NODE_RANK torchelastic $TORCHELASTIC_RESTART_COUNT"; '
              'if [ "$DL_RESTART_COUNT" = 0 ]; then if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 600; fi')


def attempts(log_dir) -> list[dict]:
    [run] = [p for p in log_dir.iterdir()]
    return [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]


def test_a_failed_rank_restarts_every_host_and_the_evidence_stays(sim_cluster, remotes, tmp_path):
    """Attempt 0: rank 1 exits 3, rank 0 is torn down. Attempt 1 (DL_RESTART_COUNT=1) succeeds on both, and
    nothing starts after it. Each attempt keeps its own per-rank files; once the containers are gone `logs` reads
    them (any attempt) and `status` lists the attempts."""
    job, logs = job_name(), tmp_path / "logs"
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 1})
    r = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--max-restarts", "3", "--log-dir", str(logs),
           "--", "sh", "-c", FAIL_FIRST, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    ip0, ip1 = (n.ip for n in sim_cluster[2])
    assert f"attempt 0: rank failed: rank 1 ({ip1}) exited with 3" in out, out[-3000:]
    assert "restarting every host in 1s: attempt 1 of at most 3 restart(s) (DL_RESTART_COUNT=1)" in out
    assert "attempt 1: succeeded" in out and "attempt 2" not in out
    for rank in (0, 1):
        assert f"attempt 1 rank {rank} torchelastic 1" in out, out[-3000:]
    recs = attempts(logs)
    assert [(a["attempt"], a["cause"], a["code"], a["rank"], a["exit_code"]) for a in recs] == [
        (0, "rank failed", 3, 1, 3), (1, "succeeded", 0, None, None)]
    assert recs[0]["hosts"] == [ip0, ip1]
    [run] = list(logs.iterdir())
    assert (run / "attempt-0" / f"rank1-{ip1}.log").read_text().strip() == "attempt 0 rank 1 torchelastic 0"
    assert (run / "attempt-1" / f"rank0-{ip0}.log").read_text().strip() == "attempt 1 rank 0 torchelastic 1"
    assert [containers_on(rm, job) for rm in remotes] == [[], []]

    saved = dl("logs", "--config", cfg, "--name", job, "--log-dir", str(logs))
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "saved logs of attempt 1" in saved.stdout and "attempt 1 rank 1 torchelastic 1" in saved.stdout
    assert "No such container" not in saved.stdout + saved.stderr
    first = dl("logs", "--config", cfg, "--name", job, "--log-dir", str(logs), "--attempt", "0", "--rank", "1")
    assert first.returncode == 0 and "attempt 0 rank 1" in first.stdout and "rank 0" not in first.stdout, first.stdout
    st = dl("status", "--config", cfg, "--name", job, "--log-dir", str(logs))
    assert st.returncode == 0, st.stderr
    assert f"attempt 0: rank failed: rank 1 ({ip1}) exited with 3" in st.stdout and "attempt 1: succeeded" in st.stdout
    bad = dl("logs", "--config", cfg, "--name", job, "--log-dir", str(logs), "--attempt", "7")
    assert bad.returncode != 0 and "--attempt 7:" in bad.stderr and "Traceback" not in bad.stderr


def test_restarts_run_out_and_up_exits_with_the_last_attempts_code(sim_cluster, remotes, tmp_path):
    job, logs = job_name(), tmp_path / "logs"
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 0})
    r = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--max-restarts", "1", "--log-dir", str(logs),
           "--", "sh", "-c", 'if [ "$NODE_RANK" = 0 ]; then exit $((5 + DL_RESTART_COUNT)); fi; sleep 600',
           timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 6, out[-3000:]
    assert "no restart left (job.max_restarts 1): the job failed" in out
    assert [(a["attempt"], a["exit_code"]) for a in attempts(logs)] == [(0, 5), (1, 6)]
    assert [containers_on(rm, job) for rm in remotes] == [[], []]

HUNG = """\
import os, time
def wait_for_data():
    time.sleep(600)
def save_checkpoint():
    time.sleep(600)
print("step 1", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(3)
    print("step 2", flush=True)
    save_checkpoint()
wait_for_data()
"""


def test_a_hang_is_dumped_then_fails_the_attempt(sim_cluster, remotes, demo_image, tmp_path):
    """No rank prints for job.hang_timeout: `up` names the quietest rank, dumps every rank's Python stack into the
    attempt's folder (each rank where it waits), tears down and exits 124 (no restarts asked)."""
    job, logs = job_name(), tmp_path / "logs"
    cfg = variant(sim_cluster, tmp_path, job={"hang_timeout": "10s"})
    t0 = time.monotonic()
    r = dl("up", "--skip-preflight", "--config", cfg, "--image", demo_image, "--name", job, "--log-dir", str(logs),
           "--", "sh", "-c", 'RANK="$NODE_RANK" exec python3 -c "$1"', "sh", HUNG, timeout=400)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 124, out[-3000:]
    ip0 = sim_cluster[2][0].ip
    assert f"no rank printed a line for 10s: the job hangs (quietest: rank 0 ({ip0})" in out, out[-3000:]
    [run] = list(logs.iterdir())
    summary = run / "attempt-0" / "hang-dump" / "summary.txt"
    assert summary.is_file(), out[-3000:]
    text = summary.read_text()
    assert "# dockerlaunch: dump" in text, text
    assert re.search(r"^- rank 0: .*wait_for_data", text, re.M) and re.search(r"^- rank 1: .*save_checkpoint", text,
                                                                              re.M), text
    [rec] = attempts(logs)
    assert rec["cause"] == "hang" and rec["rank"] == 0 and "hang-dump" in rec["detail"], rec
    assert [containers_on(rm, job) for rm in remotes] == [[], []]
    assert took < 300, f"the hang took {took:.0f}s to end"


def test_sigterm_during_the_backoff_starts_nothing(sim_cluster, remotes, tmp_path):
    job, logs = job_name(), tmp_path / "logs"
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 60})
    p, lines, seen = start_up("--skip-preflight", "--config", cfg, "--name", job, "--max-restarts", "2",
                              "--log-dir", str(logs), "--", "sh", "-c", "exit 9")
    try:
        assert until(lambda: any("restarting every host in 60s" in x for x in seen), 120) is not None, "".join(seen)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        assert p.returncode == 143, "".join(seen)
        [run] = list(logs.iterdir())
        assert not (run / "attempt-1").exists()
        assert [a["attempt"] for a in attempts(logs)] == [0]
        assert [containers_on(rm, job) for rm in remotes] == [[], []]
    finally:
        stop_up(p)


@pytest.mark.parametrize("spare_holds", ["nothing", "another build"])
def test_an_unreachable_host_is_replaced_by_a_spare_that_gets_the_image_from_a_host(sim_cluster, engine, remotes,
                                                                                    tmp_path, demo_image,
                                                                                    spare_holds):
    """hosts: [node1, a dead address], spares: [node2]. The dead host is replaced before anything starts; node2
    lacks the job's image (tagged on node1 only), or holds another build under its tag (last week's: a spare with
    the tag at all was taken as it was), and gets it from node1 over the launcher, verified by ID."""
    job = job_name()
    node1, node2 = sim_cluster[2]
    tag = f"dlt-spare:{secrets.token_hex(3)}"
    base = yaml.safe_load(open(sim_cluster[1]))["image"]  # the tools image every sim node holds
    src = engine.containers.get(node1.name)
    assert src.exec_run(["docker", "tag", base, tag]).exit_code == 0
    if spare_holds == "another build":
        assert engine.containers.get(node2.name).exec_run(["docker", "tag", demo_image, tag]).exit_code == 0
    dead = node1.ip.rsplit(".", 1)[0] + ".98"
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": node1.ip}, {"address": dead}],
                  spares=[{"address": node2.ip}], ssh={"connect_timeout": 3}, image=tag)
    try:
        r = dl("up", "--config", cfg, "--name", job, "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c",
               'echo "rank $NODE_RANK of $NNODES on $(hostname) master $MASTER_ADDR"', timeout=400)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        assert f"replacing rank 1: {dead} -> spare {node2.ip}" in out, out[-3000:]
        assert f"copying {tag} from {node1.ip} to spare {node2.ip}" in out and "verified" in out, out[-3000:]
        assert ("(it holds " in out) == (spare_holds == "another build"), out[-3000:]
        assert "rank 1 of 2 on" in out and f"master {node1.ip}" in out
        ids = [rm.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag]).stdout.strip() for rm in remotes]
        assert ids[0] and ids[0] == ids[1]
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", tag])
        dl("down", "--config", cfg, "--name", job)


@pytest.mark.hint("up.push-spare")
def test_a_spare_no_host_can_copy_the_image_onto_gets_a_push_that_runs_as_printed(sim_cluster, engine, remotes,
                                                                                  tmp_path, demo_image):
    """hosts: [a dead address], spares: [node2], the image tagged on this machine only: the spare takes rank 0 and no
    host of the job holds the image to copy, so `up` stops before starting anything with the push that puts it
    there; pasted in another folder, it does."""
    job = job_name()
    _, node2 = sim_cluster[2]
    tag = f"dlt-spare-push:{secrets.token_hex(3)}"
    engine.images.get(demo_image).tag(tag)
    dead = node2.ip.rsplit(".", 1)[0] + ".98"
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": dead}], spares=[{"address": node2.ip}],
                  ssh={"connect_timeout": 3}, image=tag)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        r = dl("up", "--config", cfg, "--name", job, "--log-dir", str(tmp_path / "logs"), "--", "true", timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and f"spare {node2.ip} lacks {tag} and no other host of the job has it" in out, out
        assert containers_on(remotes[1], job) == [], out  # nothing started
        pushed = paste(fix_in(out), elsewhere, timeout=600)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        held = remotes[1].run(["docker", "image", "inspect", "--format", "{{.Id}}", tag]).stdout.strip()
        assert held == engine.images.get(tag).id and remotes[0].run(["docker", "image", "inspect", tag]).exit_status
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", tag])
        engine.images.remove(tag)
        dl("down", "--config", cfg, "--name", job, "--ignore-missing")


def test_a_lost_host_0_is_replaced_by_a_spare_that_becomes_the_master(sim_cluster, engine, remotes, tmp_path):
    """A one-host job on node1 with node2 as its spare: node1 freezes (docker pause) during attempt 0; attempt 1
    runs on node2 as rank 0 with MASTER_ADDR = node2. node1 removes its own container once it thaws."""
    job = job_name()
    node1, node2 = sim_cluster[2]
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": node1.ip}], spares=[{"address": node2.ip}],
                  job={"host_timeout": 5, "orphan_grace": 2, "restart_backoff": 1})
    frozen = engine.containers.get(node1.name)
    p, lines, seen = start_up("--skip-preflight", "--config", cfg, "--name", job, "--max-restarts", "1",
                              "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c",
                              'echo "attempt $DL_RESTART_COUNT master $MASTER_ADDR"; '
                              'if [ "$DL_RESTART_COUNT" = 0 ]; then sleep 600; fi')
    paused = False
    try:
        assert until(lambda: any("attempt 0 master" in x for x in seen), 120) is not None, "".join(seen)
        frozen.pause()
        paused = True
        p.wait(timeout=180)
        out = "".join(seen)
        assert p.returncode == 0, out[-3000:]
        assert f"replacing rank 0: {node1.ip} -> spare {node2.ip} (host lost)" in out, out[-3000:]
        assert f"attempt 1 master {node2.ip}" in out, out[-3000:]
        assert "attempt 0: host lost" in out and "attempt 1: succeeded" in out
        frozen.unpause()
        paused = False
        assert until(lambda: not containers_on(remotes[0], job), 90) is not None, "node1 kept its container"
        assert containers_on(remotes[1], job) == []
    finally:
        if paused:
            frozen.unpause()
        stop_up(p)
        dl("down", "--config", cfg, "--name", job)
