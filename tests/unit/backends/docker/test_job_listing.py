"""`ps` and the unknown-name errors, on fixture output: labelled containers from `docker inspect`, grouped per job
(once each where hosts share an engine), their states, ages and the one-line list of the jobs there are."""

import json
from datetime import datetime, timezone

from dockerlaunch.backends.docker import after_up
from dockerlaunch.backends.docker.after_up import age_text, group_jobs, jobs_line, parse_all_jobs
from dockerlaunch.backends.docker.doctor.report import FAIL, PASS, SKIP, WARN, Report
from dockerlaunch.backends.docker.runs import saved_jobs
from dockerlaunch.reporting import preflight_line


def _inspect(job, rank, host, status="running", code=0, image="img:1", created="2026-11-26T15:41:14.123456789Z",
             cid=None):
    return {"Id": cid or f"{job}-{rank}-{host}", "Name": f"/{job}-{rank}", "Created": created,
            "State": {"Status": status, "ExitCode": code, "StartedAt": "2026-11-26T15:41:15.1Z",
                      "FinishedAt": "0001-01-01T00:00:00Z"},
            "Config": {"Image": image, "Labels": {"dockerlaunch.job": job, "dockerlaunch.rank": str(rank),
                                                  "dockerlaunch.host": host}}}


def test_labelled_containers_become_job_containers_and_others_are_left_out():
    unlabelled = {"Id": "x", "Name": "/other", "Created": "", "State": {}, "Config": {"Labels": {}}}
    text = json.dumps([_inspect("det", 1, "h2", "exited", 3), unlabelled])
    [c] = parse_all_jobs(text)
    assert (c.job, c.name, c.rank, c.status, c.exit_code, c.image, c.host) == ("det", "det-1", 1, "exited", 3,
                                                                                "img:1", "h2")
    assert c.state == "exited 3"
    assert parse_all_jobs("") == [] and parse_all_jobs("\n") == []


def test_jobs_are_grouped_by_name_in_rank_order_and_a_shared_engine_counts_each_container_once():
    a0, a1 = _inspect("a", 0, "h1"), _inspect("a", 1, "h2", "exited", 1)
    b0 = _inspect("b", 0, "h1", created="2026-11-26T15:00:00Z", image="other:2")
    # h1 and h2 share one engine: each sees every container; each goes to the host its label names
    both = parse_all_jobs(json.dumps([a1, b0, a0]))
    rows = group_jobs(["h1", "h2"], [both, both])
    assert [r.name for r in rows] == ["a", "b"]
    assert [(h, c.name) for h, c in rows[0].containers] == [("h1", "a-0"), ("h2", "a-1")]
    assert [c.state for _, c in rows[0].containers] == ["running", "exited 1"]
    assert rows[0].running and rows[1].image == "other:2" and rows[1].hosts == ["h1"]
    # a label naming no host of this config (a host since dropped): the first host that saw it
    gone = parse_all_jobs(json.dumps([_inspect("c", 0, "h9")]))
    [row] = group_jobs(["h1", "h2"], [gone, gone])
    assert row.hosts == ["h1"]


def test_age_and_json_row():
    [c] = parse_all_jobs(json.dumps([_inspect("a", 0, "h1", created="2026-11-26T15:41:14.999999999Z")]))
    [row] = group_jobs(["h1"], [[c]])
    now = datetime(2026, 11, 26, 15, 44, 14, tzinfo=timezone.utc)
    assert row.age(now) == 180 and age_text(row.age(now)) == "3m"
    d = row.to_dict(now)
    assert d["name"] == "a" and d["age_seconds"] == 180 and d["hosts"][0]["exit_code"] is None
    assert set(d["hosts"][0]) == {"host", "rank", "container", "state", "exit_code", "started_at", "finished_at"}
    assert [age_text(s) for s in (None, 5, 59, 3600 * 2 + 61, 86400 * 3 + 7200)] == ["?", "5s", "59s", "2h01m",
                                                                                     "3d02h"]


def test_the_one_line_list_of_jobs_names_running_and_finished_jobs():
    rows = group_jobs(["h1", "h2"], [parse_all_jobs(json.dumps([_inspect("det", 0, "h1")])),
                                     parse_all_jobs(json.dumps([_inspect("det", 1, "h2", "exited", 3)]))])
    line = jobs_line(rows, {"old": "20261126-150000", "det": "20261126-150100"}, "logs")
    assert line == "jobs on the hosts: det (1 running, 1 exited 3); finished, logs kept under logs/: old"
    assert jobs_line([], {}, "logs") == "no dockerlaunch job on the hosts"
    assert jobs_line(rows, {}, "logs", skip="det") == "no dockerlaunch job on the hosts"


def test_an_unknown_name_and_a_finished_job_are_told_apart(tmp_path):
    from dockerlaunch.job.config import ClusterConfig

    (tmp_path / "done-20261126-150000" / "attempt-0").mkdir(parents=True)
    rows = group_jobs(["h1"], [parse_all_jobs(json.dumps([_inspect("det", 0, "h1")]))])
    cfg = ClusterConfig.model_validate({"hosts": ["h1", "h2"], "job": {"name": "typo-job"}})
    e = str(after_up.missing_job(cfg, rows, str(tmp_path)))
    assert e == (f"no job named typo-job: no containers on 2 host(s) and no saved logs under {tmp_path}/; "
                 f"jobs on the hosts: det (1 running); finished, logs kept under {tmp_path}/: done")
    cfg = ClusterConfig.model_validate({"hosts": ["h1", "h2"], "job": {"name": "done"}})
    e = str(after_up.missing_job(cfg, rows, str(tmp_path)))
    assert e.startswith("job done: no containers on 2 host(s) (it ended; its logs are kept under") and "\n" not in e
    assert "jobs on the hosts: det (1 running)" in e and "finished, logs kept" not in e  # itself is not listed
    # `logs --attempt N` asks no host: the message says only what the log folder holds
    cfg = ClusterConfig.model_validate({"hosts": ["h1"], "job": {"name": "nope"}})
    e = str(after_up.missing_job(cfg, None, str(tmp_path), "--attempt: "))
    assert e == f"--attempt: no saved logs of job nope under {tmp_path}/; finished, logs kept under {tmp_path}/: done"


def test_saved_jobs_are_the_run_folders_names(tmp_path):
    for name in ("a-20261126-150000", "a-20261126-160000.2", "a-b-20261126-150000", "notarun", "x-2026-1"):
        (tmp_path / name).mkdir()
    (tmp_path / "f-20261126-150000").write_text("a file, not a run")
    assert saved_jobs(str(tmp_path)) == {"a": "20261126-160000", "a-b": "20261126-150000"}
    assert saved_jobs(str(tmp_path / "missing")) == {}


def test_the_preflight_count_line():
    r = Report()
    for i in range(23):
        r.add("h1", f"c{i}", PASS, "ok")
    for i in range(4):
        r.add("h2", f"s{i}", SKIP, "no GPUs asked")
    assert preflight_line(r.counts(), 2, 1.83) == "doctor: 23 PASS, 4 SKIP on 2 hosts in 1.8 s"
    r.add("h2", "disk", WARN, "low")
    r.add("h2", "image", FAIL, "missing")
    assert preflight_line(r.counts(), 1, 0.04) == "doctor: 23 PASS, 1 WARN, 1 FAIL, 4 SKIP on 1 host in 0.0 s"
    assert preflight_line(Report().counts(), 2, 1) == "doctor: 0 PASS on 2 hosts in 1.0 s"


def test_logs_of_an_attempt_that_left_no_file_say_its_recorded_cause(tmp_path):
    """A refused pre-flight leaves attempts.jsonl and no attempt folder; a failed start an empty one: `logs` says
    why each attempt ended instead of `no log file`."""
    from dockerlaunch.backends.docker.runs import RunFolder
    from dockerlaunch.job.config import ClusterConfig
    from dockerlaunch.job.recovery import AttemptRecord, Cause, Ending
    from dockerlaunch.reporting import Reporter

    class Said(Reporter):
        def __init__(self):
            self.lines = []

        def say(self, msg, style="bold"):
            self.lines.append(msg)

    cfg = ClusterConfig.model_validate({"hosts": ["h1", "h2"], "job": {"name": "j"}})
    run = RunFolder.create(str(tmp_path), "j")
    run.record(AttemptRecord.of(0, Ending(1, Cause.PREFLIGHT_FAILED), "2026-11-26T15:00:00", 2.0, ["h1", "h2"], []))
    said = Said()
    assert after_up.saved_logs(cfg, None, "all", said, None, str(tmp_path)) == 0
    assert said.lines == [f"job j: attempt 0 logged nothing ({run.root}/): preflight failed, after 2.0s; "
                          "up's exit code 1"]
    run.attempt_dir(1)
    run.record(AttemptRecord.of(1, Ending(1, Cause.START_FAILED, 1, "h2", detail="host h2: starting container j-1 "
                                          "failed: no such user"), "2026-11-26T15:00:05", 1.0, ["h1", "h2"], []))
    said = Said()
    assert after_up.saved_logs(cfg, None, "all", said, None, str(tmp_path)) == 0
    assert said.lines[0].startswith("job j: attempt 1 logged nothing") and said.lines[0].endswith("no such user")
    said = Said()
    assert after_up.saved_logs(cfg, None, "all", said, 0, str(tmp_path)) == 0 and "preflight failed" in said.lines[0]


def test_exec_into_an_exited_rank_says_the_jobs_state_and_what_to_run():
    """Quoted: `exec` into an exited rank printed Docker's `Container ... is not running`."""
    from dockerlaunch.backends.docker.after_up import not_running
    from dockerlaunch.backends.docker.dockerhost import ContainerState
    from dockerlaunch.job.invocation import Invocation
    from dockerlaunch.job.load import validate_config

    config = validate_config({"hosts": ["h1", "h2"], "job": {"name": "ux4"}})
    config._invocation = Invocation(config="/c.yaml", log_dir="/runs")
    r0 = ContainerState("ux4-0", 0, "running", 0, "2025-01-02T03:04:05Z", "0001-01-01T00:00:00Z")
    r1 = ContainerState("ux4-1", 1, "exited", 3, "2025-01-02T03:04:05Z", "2025-01-02T03:09:00.5Z")
    said = str(not_running(config, 1, r1, "h2", [("h1", r0), ("h2", r1)]))
    assert said == ("exec: rank 1 of job ux4 exited with code 3 at 2025-01-02 03:09:00: its container ux4-1 on h2 runs "
                    "nothing to exec into (the job: rank 0 running, rank 1 exited 3); exec into a running rank (0), "
                    "or see what rank 1 printed, fix: dockerlaunch logs --rank 1 --config /c.yaml --log-dir /runs")
    both = str(not_running(config, 1, r1, "h2", [("h2", r1)]))
    assert "nothing of job ux4 runs (`down` removes its containers)" in both
