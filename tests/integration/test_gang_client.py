"""The launcher as a client of the gang supervisor, on the real 2-node sim: a job started with `up --detach` is
decided on the hosts, and `logs --follow`, `status` and `ps` read how it went from the hosts' records (every
container exits with the job's code, so the records, not the container codes, name the rank that failed): the job's
exit code, the rank's part, each attempt's output after `down`; and the same answers, naming it, while a host does
not answer."""

import json

import pytest
import yaml

from tests.integration.helpers import containers_on, dl, job_name, variant

pytestmark = pytest.mark.integration

# rank 1 fails after a moment; rank 0 ignores SIGTERM (the gang's SIGKILL ends it STOP_GRACE later)
FAIL_ONE = ('echo "rank $NODE_RANK attempt $DL_RESTART_COUNT here"; if [ "$NODE_RANK" = 1 ]; then sleep 3; exit 3; '
            'fi; trap "" TERM; sleep 600')


def _row(out: str, first: str) -> str:
    [row] = [x for x in out.splitlines() if x.split()[:1] == [first]]
    return row


def _host_down(sim_cluster, tmp_path, rank: int) -> str:
    """The config with rank's host at a port where nothing listens: it refuses every connection at once."""
    data = yaml.safe_load(open(sim_cluster[1]))
    hosts = [dict(h) if isinstance(h, dict) else {"address": h} for h in data["hosts"]]
    hosts[rank]["port"] = 2222
    return variant(sim_cluster, tmp_path, hosts=hosts, ssh={"connect_timeout": 3})


def test_a_failed_rank_is_the_jobs_code_in_logs_status_and_ps_also_with_a_host_down(sim_cluster, remotes,
                                                                                     demo_image, tmp_path):
    cfg, job = str(sim_cluster[1]), job_name()
    ip0, ip1 = (n.ip for n in sim_cluster[2])
    logs = str(tmp_path / "logs")  # nothing is saved there: a detached run's records are on the hosts
    ended = f"job {job} ended: rank failed: rank 1 ({ip1}) exited with 3; exit code 3"
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--image", demo_image, "--name", job,
           "--log-dir", logs, "--", "sh", "-c", FAIL_ONE)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        # follow: every rank's stream, the gang's events on rank 0's, then the result line and the job's code
        fol = dl("logs", "--follow", "--config", cfg, "--name", job, "--log-dir", logs, timeout=120)
        assert fol.returncode == 3, fol.stdout + fol.stderr
        out = fol.stdout
        assert "rank 0 attempt 0 here" in out and "rank 1 attempt 0 here" in out, out
        assert f"[dockerlaunch] rank 1 ({ip1}) exited with 3: stopping every rank" in out, out
        assert out.rstrip().splitlines()[-1] == f"[dockerlaunch] {ended}", out
        assert containers_on(remotes[0], job) == [f"{job}-0"]  # `logs` removes nothing

        # status: the cause is rank 1, rank 0 was stopped (both containers exited 3); exit code 3
        st = dl("status", "--config", cfg, "--name", job, "--log-dir", logs)
        assert st.returncode == 3, st.stdout + st.stderr
        assert "stopped by the gang" in _row(st.stdout, "0") and " 3 " in _row(st.stdout, "0"), st.stdout
        assert "the cause: exited with 3" in _row(st.stdout, "1"), st.stdout
        assert ended in st.stdout and f"attempt 0: rank failed: rank 1 ({ip1}) exited with 3" in st.stdout
        js = dl("status", "--config", cfg, "--name", job, "--log-dir", logs, "--output", "json")
        assert js.returncode == 3, js.stderr
        data = json.loads(js.stdout)
        assert {k: data["result"][k] for k in ("cause", "code", "rank", "host", "exit_code", "attempt")} == {
            "cause": "rank failed", "code": 3, "rank": 1, "host": ip1, "exit_code": 3, "attempt": 0}
        assert data["records"]["hosts"] == [ip0, ip1] and data["unanswered"] == [] and data["run"] is None
        assert data["records"]["folder"] == f"/var/tmp/dockerlaunch/{job}/runs/{data['records']['run']}"
        assert [a["cause"] for a in data["attempts"]] == ["rank failed"]

        # ps: the job's state is the gang's word; a failed job makes ps exit 1
        ps = dl("ps", "--config", cfg, "--log-dir", logs)
        assert ps.returncode == 1, ps.stdout + ps.stderr
        assert "failed: rank 1 exited 3" in _row(ps.stdout, job), ps.stdout
        pj = dl("ps", "--config", cfg, "--log-dir", logs, "--output", "json")
        assert pj.returncode == 1
        [mine] = [j for j in json.loads(pj.stdout)["jobs"] if j["name"] == job]
        assert mine["result"]["code"] == 3 and mine["result"]["rank"] == 1

        # host 1 does not answer: each command names it and answers from host 0's records
        down = _host_down(sim_cluster, tmp_path, 1)
        st = dl("status", "--config", down, "--name", job, "--log-dir", logs, timeout=120)
        assert st.returncode == 3, st.stdout + st.stderr  # the result is known: the job's code
        assert f"host {ip1}: did not answer" in st.stdout and ended in st.stdout, st.stdout
        assert "unknown (its host did not answer)" in _row(st.stdout, "1"), st.stdout
        lg = dl("logs", "--follow", "--config", down, "--name", job, "--log-dir", logs, timeout=120)
        assert lg.returncode == 3, lg.stdout + lg.stderr
        assert f"host {ip1} (rank 1) did not answer" in lg.stdout and "rank 0 attempt 0 here" in lg.stdout, lg.stdout
        assert "rank 1 attempt 0 here" not in lg.stdout and ended in lg.stdout, lg.stdout
        ps = dl("ps", "--config", down, "--log-dir", logs, timeout=120)
        assert ps.returncode == 1 and f"host {ip1}: did not answer" in ps.stdout, ps.stdout + ps.stderr
        assert "failed: rank 1 exited 3" in _row(ps.stdout, job), ps.stdout
        # host 0 (the coordinator's) does not answer: host 1 keeps the whole record too
        down0 = _host_down(sim_cluster, tmp_path, 0)
        st = dl("status", "--config", down0, "--name", job, "--log-dir", logs, "--output", "json", timeout=120)
        assert st.returncode == 3, st.stdout + st.stderr
        data = json.loads(st.stdout)
        assert data["result"]["rank"] == 1 and [u["host"] for u in data["unanswered"]] == [ip0], data
    finally:
        d = dl("down", "--config", cfg, "--name", job, "--log-dir", logs)
    assert d.returncode == 0, d.stdout + d.stderr

    # once the containers are gone: the records stay on the hosts; logs reads each attempt's output there
    st = dl("status", "--config", cfg, "--name", job, "--log-dir", logs)
    assert st.returncode == 3 and "no containers on 2 host(s)" in st.stdout and ended in st.stdout, st.stdout
    lg = dl("logs", "--config", cfg, "--name", job, "--log-dir", logs)
    assert lg.returncode == 0, lg.stdout + lg.stderr
    assert f"[0 {ip0}] rank 0 attempt 0 here" in lg.stdout and f"[1 {ip1}] rank 1 attempt 0 here" in lg.stdout
    assert "logs of attempt 0 of run" in lg.stdout and ended in lg.stdout, lg.stdout
    one = dl("logs", "--config", cfg, "--name", job, "--log-dir", logs, "--attempt", "0", "--rank", "1")
    assert one.returncode == 0 and "rank 1 attempt 0 here" in one.stdout and "rank 0 attempt" not in one.stdout
    bad = dl("logs", "--config", cfg, "--name", job, "--log-dir", logs, "--attempt", "4")
    assert bad.returncode == 2 and "--attempt 4:" in bad.stderr and "has attempt(s) 0" in bad.stderr, bad.stderr
    fol = dl("logs", "--follow", "--config", cfg, "--name", job, "--log-dir", logs)
    assert fol.returncode == 3, fol.stdout + fol.stderr
    assert [containers_on(rm, job) for rm in remotes] == [[], []]


def test_a_restart_then_success_exits_0_and_keeps_each_attempts_output(sim_cluster, remotes, demo_image,
                                                                       tmp_path):
    cfg, job = variant(sim_cluster, tmp_path, job={"restart_backoff": 1}), job_name()
    ip1 = sim_cluster[2][1].ip
    logs = str(tmp_path / "logs")
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--image", demo_image, "--name", job,
           "--max-restarts", "1", "--log-dir", logs, "--", "sh", "-c",
           'echo "rank $NODE_RANK attempt $DL_RESTART_COUNT"; '
           'if [ "$DL_RESTART_COUNT" = 0 ]; then if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 600; fi')
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        fol = dl("logs", "--follow", "--config", cfg, "--name", job, "--log-dir", logs, timeout=180)
        assert fol.returncode == 0, fol.stdout + fol.stderr
        assert "restarting every rank in 1s: attempt 1 of at most 1 restart(s)" in fol.stdout, fol.stdout
        assert "rank 0 attempt 1" in fol.stdout and "rank 1 attempt 1" in fol.stdout, fol.stdout
        assert fol.stdout.rstrip().splitlines()[-1] == f"[dockerlaunch] job {job} ended: succeeded; exit code 0"

        st = dl("status", "--config", cfg, "--name", job, "--log-dir", logs)
        assert st.returncode == 0, st.stdout + st.stderr
        assert f"attempt 0: rank failed: rank 1 ({ip1}) exited with 3" in st.stdout and "attempt 1: succeeded" in \
            st.stdout, st.stdout
        assert "finished" in _row(st.stdout, "0") and "finished" in _row(st.stdout, "1"), st.stdout
        pj = dl("ps", "--config", cfg, "--log-dir", logs, "--output", "json")
        [mine] = [j for j in json.loads(pj.stdout)["jobs"] if j["name"] == job]
        assert mine["result"]["cause"] == "succeeded" and mine["result"]["code"] == 0
        ps = dl("ps", "--config", cfg, "--log-dir", logs)
        assert "succeeded" in _row(ps.stdout, job), ps.stdout

        first = dl("logs", "--config", cfg, "--name", job, "--log-dir", logs, "--attempt", "0")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "rank 0 attempt 0" in first.stdout and "rank 1 attempt 0" in first.stdout, first.stdout
        assert "rank 0 attempt 1" not in first.stdout and "ended" not in first.stdout, first.stdout
    finally:
        d = dl("down", "--config", cfg, "--name", job, "--log-dir", logs)
    assert d.returncode == 0, d.stdout + d.stderr
    assert [containers_on(rm, job) for rm in remotes] == [[], []]
