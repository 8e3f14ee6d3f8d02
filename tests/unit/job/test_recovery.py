"""Gang restarts without a host: the config fields, the restart rule, spares taking ranks, attempt records, the
run folder that keeps each attempt's evidence, and hang detection's progress clock."""

import io
import os
import time

import pytest
from rich.console import Console

from dockerlaunch.backends import Unsupported
from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.backends.docker.runs import RunFolder, runs_of, saved_attempt, tail_lines
from dockerlaunch.cli.console import RichReporter
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig, parse_duration
from dockerlaunch.job.flags import Overrides
from dockerlaunch.job.load import load_config
from dockerlaunch.job.plan import make_plan
from dockerlaunch.job.recovery import (
    AttemptRecord,
    Cause,
    Ending,
    NoSpareLeft,
    should_restart,
    swap_hosts,
)
from tests.silent_ssh import up_mid_connect


def cfg(**job) -> ClusterConfig:
    return ClusterConfig.model_validate({"hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:1",
                                         "ssh": {"config_file": None}, "container": {"gpus": "none"},
                                         "spares": ["10.0.0.8", "10.0.0.9"], "job": job})


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5h", 5400),
                                          ("1d", 86400), (" 45 s ", 45)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("job,words", [
    ({"hang_timeout": "3x"}, ["job.hang_timeout", "'3x' is not a duration", "30m"]),
    ({"hang_timeout": "5s"}, ["job.hang_timeout", "10"]),
    ({"hang_timeout": "30m", "progress_regex": "iter(ation"}, ["job.progress_regex", "not a regular expression"]),
    ({"progress_regex": "iteration"}, ["progress_regex is only read with hang_timeout"]),
    ({"max_restarts": -1}, ["job.max_restarts"]),
    ({"max_restarts": 100000}, ["job.max_restarts"]),
])
def test_bad_recovery_settings_are_one_line_errors(job, words):
    with pytest.raises(ConfigError) as e:
        _validate(job)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def _validate(job):
    from dockerlaunch.job.load import validate_config

    return validate_config({"hosts": ["a", "b"], "job": job})


@pytest.mark.parametrize("data,words", [
    ({"hosts": ["a", "b"], "spares": ["b"]}, ["spare 'b' is listed twice", "hosts[1]", "spares[0]"]),
    ({"hosts": ["a", "b"], "spares": ["c", "c"]}, ["spare 'c' is listed twice", "spares[0]", "spares[1]"]),
    ({"hosts": ["a", "b"], "spares": ["local"]}, ["spares[0] local"]),
    ({"hosts": ["a"], "spares": ["x;rm -rf /"]}, ["spares", "not a host name"]),
])
def test_bad_spares_are_one_line_errors(data, words):
    from dockerlaunch.job.load import validate_config

    with pytest.raises(ConfigError) as e:
        validate_config(data)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_flags_set_restarts_hang_timeout_and_spares_over_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("hosts: [a, b]\nspares: [{address: c, user: ops}, d]\njob: {max_restarts: 1}\n")
    c = load_config(str(f), Overrides(max_restarts=3, hang_timeout="20m", spares=["c", "e:2222"]))
    assert c.job.max_restarts == 3 and c.job.hang_timeout == 1200
    assert [(s.address, s.user, s.port) for s in c.spares] == [("c", "ops", None), ("e", None, 2222)]
    with pytest.raises(ConfigError, match=r"^--spares: 'a b' is not a host name"):
        load_config(str(f), Overrides(spares=["a b"]))


def test_the_restart_variables_are_set_per_attempt_and_reserved():
    plan = make_plan(cfg(), attempt=2)
    for hp in plan.hosts:
        assert hp.container.env["DL_RESTART_COUNT"] == "2" and hp.container.env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert make_plan(cfg()).hosts[0].container.env["DL_RESTART_COUNT"] == "0"
    with pytest.raises(ConfigError, match="container.env.DL_RESTART_COUNT is set per rank"):
        make_plan(ClusterConfig.model_validate({"hosts": ["a"], "image": "i", "container": {
            "env": {"DL_RESTART_COUNT": "5"}}}))


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize("cause,attempt,limit,again", [
    (Cause.SUCCEEDED, 0, 5, False),  # a finished job is never started again
    (Cause.INTERRUPTED, 0, 5, False),  # Ctrl-C / SIGTERM
    (Cause.PREFLIGHT_FAILED, 0, 5, False),
    (Cause.DETACHED, 0, 5, False),
    (Cause.RANK_FAILED, 0, 0, False),  # the default: no restarts
    (Cause.RANK_FAILED, 0, 1, True),
    (Cause.RANK_FAILED, 1, 1, False),  # the restarts are used up
    (Cause.HOST_LOST, 2, 3, True),
    (Cause.HANG, 0, 1, True),
    (Cause.START_FAILED, 0, 1, True),
])
def test_only_failures_restart_and_only_while_restarts_are_left(cause, attempt, limit, again):
    assert should_restart(Ending(1, cause), attempt, limit) is again


def test_a_spare_takes_the_lost_rank_and_rank_0s_spare_is_the_new_master():
    c = cfg()
    new, swaps = swap_hosts(c, {0: "host lost"})
    assert [h.address for h in new.hosts] == ["10.0.0.8", "10.0.0.2"]
    assert [s.address for s in new.spares] == ["10.0.0.9"]  # a used spare is no spare any more
    assert str(swaps[0]) == "rank 0: 10.0.0.1 -> spare 10.0.0.8 (host lost)"
    plan = make_plan(new)
    assert plan.master_addr == "10.0.0.8"
    assert [hp.container.env["NODE_RANK"] for hp in plan.hosts] == ["0", "1"]
    assert plan.hosts[0].container.labels["dockerlaunch.host"] == "10.0.0.8"
    assert c.hosts[0].address == "10.0.0.1"  # the old config is untouched


def test_no_spare_left_names_every_rank_that_needs_one():
    c = cfg()
    new, _ = swap_hosts(c, {1: "doctor: gpus"})
    with pytest.raises(NoSpareLeft) as e:
        swap_hosts(new, {0: "host lost", 1: "host lost"})
    assert str(e.value) == ("rank 0 (10.0.0.1: host lost), rank 1 (10.0.0.8: host lost) must be replaced and "
                            "1 spare(s) left")


def test_attempt_records_read_back_and_say_what_ended_them():
    rec = AttemptRecord.of(1, Ending(3, Cause.RANK_FAILED, 1, "10.0.0.2", 3), "2026-11-24T03:00:00", 754.2,
                           ["10.0.0.1", "10.0.0.2"], ["rank 1: 10.0.0.5 -> spare 10.0.0.2 (host lost)"])
    assert AttemptRecord.from_json(rec.to_json()) == rec
    assert rec.line() == ("attempt 1: rank failed: rank 1 (10.0.0.2) exited with 3, after 12m34s; up's exit code 3; "
                          "rank 1: 10.0.0.5 -> spare 10.0.0.2 (host lost)")
    ok = AttemptRecord.of(2, Ending(0, Cause.SUCCEEDED), "t", 3.25, [], [])
    assert ok.line() == "attempt 2: succeeded, after 3.2s; up's exit code 0"


# ---------------------------------------------------------------- run folders


def test_run_folders_keep_attempts_and_never_mix_jobs(tmp_path):
    run = RunFolder.create(str(tmp_path), "a")
    assert not run.root.exists()  # made with its first attempt
    d0, d1 = run.attempt_dir(0), run.attempt_dir(1)
    (d0 / "rank1-10.0.0.2.log").write_bytes(b"one\ntwo\n")
    (d0 / "rank0-10.0.0.1.log").write_bytes(b"zero\n")
    (d1 / "rank0-10.0.0.1.log").write_bytes(b"again\n")
    run.record(AttemptRecord.of(0, Ending(3, Cause.RANK_FAILED), "t", 1, [], []))
    with open(run.root / "attempts.jsonl", "a") as f:
        f.write('{"attempt": 1, "cau')  # a launcher killed mid-write
    assert [a.attempt for a in run.attempts()] == [0]
    other = RunFolder.create(str(tmp_path), "a-b")
    other.attempt_dir(0)
    assert [r.root for r in runs_of(str(tmp_path), "a")] == [run.root]
    same_second = RunFolder.create(str(tmp_path), "a")
    assert same_second.root.name == run.root.name + ".2"
    same_second.attempt_dir(0)
    assert runs_of(str(tmp_path), "a")[-1].root == same_second.root
    found, n = saved_attempt(str(tmp_path), "a-b", None)
    assert found.root == other.root and n == 0
    assert [(r, h) for r, h, _ in run.rank_files(0)] == [(0, "10.0.0.1"), (1, "10.0.0.2")]
    with pytest.raises(ConfigError, match=r"--attempt 4: .* has attempt\(s\) 0"):
        saved_attempt(str(tmp_path), "a", 4)
    with pytest.raises(ConfigError, match="no containers on the hosts and no saved logs under"):
        saved_attempt(str(tmp_path), "nope", None)
    path = d0 / "rank1-10.0.0.2.log"
    assert tail_lines(path, "all") == [b"one", b"two"] and tail_lines(path, "1") == [b"two"]
    assert tail_lines(path, "0") == []
    with pytest.raises(ConfigError, match="--tail 'x'"):
        tail_lines(path, "x")


# ---------------------------------------------------------------- hang detection's clock


def test_progress_is_any_line_or_only_lines_matching_the_regex():
    import re

    reporter = RichReporter(Console(file=io.StringIO(), width=200, color_system=None))
    every = LogSink(reporter, 0, "h", None)
    only = LogSink(reporter, 1, "h", None, progress=re.compile(r"iteration +\d+"))
    t0 = every.progress_at
    time.sleep(0.01)
    for sink in (every, only):
        sink(b"loading data\n")
    assert every.progress_at > t0 and only.progress_at == pytest.approx(t0, abs=0.005)
    only(b" iteration   12 | loss 2.1\n")
    assert only.progress_at > t0


# ---------------------------------------------------------------- render


def test_render_gives_restarts_to_jobset_only_and_refuses_up_only_fields():
    from tests.unit.backends.test_render import plan_of, rendered

    text = rendered("jobset", plan_of(job__max_restarts=3))["sft-qwen.jobset.yaml"]
    assert "maxRestarts: 3" in text and "up to 3 time(s)" in text
    for target in ("k8s", "compose", "slurm"):
        with pytest.raises(Unsupported, match="job.max_restarts 3.*--to jobset"):
            rendered(target, plan_of(job__max_restarts=3))
    with pytest.raises(Unsupported, match="job.hang_timeout"):
        rendered("jobset", plan_of(job__hang_timeout="30m"))
    with pytest.raises(Unsupported, match="spares"):
        rendered("compose", plan_of(spares=["10.0.0.9"]))


def test_no_run_folder_is_left_by_a_refused_launch(tmp_path, cli):
    r = cli("up", "--hosts", "10.255.255.1", "--image", "i:1", "--max-restarts", "2", "--detach", "--log-dir",
            str(tmp_path), "--master-port", "29499", "--", "true")
    assert r.returncode != 0 and "gang_port 29499 is the master_port too" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_a_detached_dry_run_shows_the_gang_supervisor_as_the_entrypoint(cli):
    """`up --detach` runs every rank under the gang supervisor: the dry run shows exactly that argv, with what only
    the hosts can tell (the run's settings, the image's ENTRYPOINT) as placeholders, and no secret anywhere."""
    import json

    args = ["up", "--dry-run", "--detach", "--hosts", "10.0.0.1,10.0.0.2", "--image", "i:1", "--max-restarts", "1",
            "--", "python", "t.py"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "--entrypoint /bin/sh \\\n" in r.stdout
    assert "--tmpfs /run/dockerlaunch:rw,nosuid,nodev,noexec,mode=1777,size=1m \\\n" in r.stdout
    assert ("i:1 /.dockerlaunch/gang-entry.sh run '<resolved at launch: the gang'\"'\"'s settings (JSON): run id, "
            "MASTER_ADDR, job.gang_port, restarts, timeouts>' -- '<resolved at launch: the image'\"'\"'s ENTRYPOINT, "
            "if any>' python t.py") in r.stdout, r.stdout
    assert "/var/tmp/dockerlaunch/dockerlaunch/bin:/.dockerlaunch:ro" in r.stdout
    j = json.loads(cli(*args[:1], "--output", "json", *args[1:]).stdout)
    assert j["supervised"] is True
    attached = json.loads(cli("up", "--dry-run", "--output", "json", *args[3:]).stdout)
    assert attached["supervised"] is False and "gang-entry" not in json.dumps(attached)


def test_the_dry_run_says_what_happens_after_a_failure(cli):
    import json

    args = ["up", "--dry-run", "--hosts", "10.0.0.1,10.0.0.2", "--image", "i:1", "--max-restarts", "2", "--spares",
            "10.0.0.9", "--hang-timeout", "30m", "--", "python", "t.py"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert ("After a failure: up to 2 gang restart(s), 10s apart; hang after 1800s without a line; spares 10.0.0.9"
            in r.stdout)
    assert "--env DL_RESTART_COUNT=0" in r.stdout
    j = json.loads(cli(*args[:1], "--output", "json", *args[1:]).stdout)
    assert j["recovery"] == {"max_restarts": 2, "restart_backoff": 10.0, "hang_timeout": 1800.0,
                             "progress_regex": None, "spares": ["10.0.0.9"]}
    plain = cli("up", "--dry-run", "--hosts", "10.0.0.1", "--image", "i:1", "--", "true")
    assert "After a failure" not in plain.stdout


@pytest.mark.parametrize("nohup", [False, True])
def test_sighup_stops_up_unless_it_was_started_under_nohup(nohup, tmp_path):
    """`nohup dockerlaunch up ... &`: SIGHUP (the terminal closed) is ignored on entry and must stay so; without
    nohup it stops `up` like SIGTERM. SIGTERM stops it either way. `up` waits here on an SSH server that accepts
    and never answers (a real socket), so the signal arrives mid-connect."""
    import signal

    def child() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)

    with up_mid_connect(tmp_path, child) as p:
        p.send_signal(signal.SIGHUP)
        if nohup:
            time.sleep(2)
            assert p.poll() is None, p.communicate()
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 143
        else:
            assert p.wait(timeout=20) == 129, p.communicate()


def test_a_signal_whose_exception_threading_turned_into_another_still_ends_as_that_signal(monkeypatch, capsys):
    """Seen under load: SIGHUP's exception landed in Condition.wait's lock re-acquire and came out as
    `RuntimeError: release unlocked lock`, so `up` ended with a traceback and exit 1 instead of 129."""
    import importlib
    import signal

    cli_main = importlib.import_module("dockerlaunch.cli.main")  # the module (the package exports its main())

    def stopped(**kw):
        try:
            cli_main._terminate(signal.SIGHUP, None)
        except BaseException:  # noqa: BLE001 - what threading does to it
            raise RuntimeError("release unlocked lock") from None

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    monkeypatch.setattr(cli_main.cli, "main", stopped)
    monkeypatch.setattr(cli_main, "_SIGNALLED", [])
    try:
        with pytest.raises(SystemExit) as ended:
            cli_main.main(["status"])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert ended.value.code == 129
    assert capsys.readouterr().err.strip() == "terminated (SIGHUP)"

    def broken(**kw):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(cli_main.cli, "main", broken)
    monkeypatch.setattr(cli_main, "_SIGNALLED", [])
    try:
        with pytest.raises(RuntimeError, match="a real bug"):  # no signal: a bug stays a bug
            cli_main.main(["status"])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_a_runs_folder_and_files_are_the_launching_users_only(tmp_path):
    """Rank logs and attempts.jsonl may hold what a rank printed of its environment: 0700 folders, 0600 files,
    whatever the umask."""
    from dockerlaunch.reporting import Reporter

    old = os.umask(0)
    try:
        run = RunFolder.create(str(tmp_path / "logs"), "job")
        d = run.attempt_dir(1)
        sink = LogSink(Reporter(), 0, "h", d / "rank0-h.log")
        sink(b"HF_TOKEN=x\n")
        sink.close()
        run.record(AttemptRecord(1, "exited", 0, "2026-11-25T09:00:00", 1.0))
    finally:
        os.umask(old)
    assert (run.root.stat().st_mode & 0o777, d.stat().st_mode & 0o777) == (0o700, 0o700)
    assert (d / "rank0-h.log").stat().st_mode & 0o777 == 0o600
    assert (run.root / "attempts.jsonl").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GH_TOKEN"])
def test_a_secret_looking_env_name_warns_once_with_the_fix(cli, name):
    r = cli("up", "--dry-run", "--hosts", "10.0.0.1", "--image", "i", "--env", f"{name}=x", "--env", "FOO=1", "--",
            "true")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and name in warnings[0] and "container.env_files" in warnings[0], r.stderr
    assert "FOO" not in warnings[0]
    assert not [ln for ln in cli("up", "--dry-run", "--hosts", "10.0.0.1", "--image", "i", "--env", "FOO=1", "--",
                                 "true").stderr.splitlines() if ln.startswith("warning:")]
