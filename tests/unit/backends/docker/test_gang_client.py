"""The launcher as the gang's client (`status`, `ps`, `logs` of a job started with `up --detach`): the records
gang.py keeps on each host, read back with the same shell scripts the hosts run, and the rules that turn them into
lines and exit codes.

The records are real: `gang.py run` processes on 127.0.0.1 (one per rank, as each container runs it), their files
read through a `local` host (LocalRemote: the scripts run in `sh` here as over SSH there). Every process a test
starts carries a marker in its environment, and whatever still carries it at the end is SIGKILLed by pid."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dockerlaunch import gang
from dockerlaunch.backends.docker import gang_records as gr
from dockerlaunch.backends.docker.after_up import JobRow, JobStatus, _ended, read_results, run_label
from dockerlaunch.backends.docker.dockerhost import ContainerState, parse_inspect
from dockerlaunch.errors import SSHError
from dockerlaunch.hosts.fleet import Host
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.reporting import Reporter

GANG = str(Path(gang.__file__).resolve())
RUN = "20260102-030405-0a1b2c3d"
HOSTS = ["10.0.0.1", "10.0.0.2"]


class Said(Reporter):
    def __init__(self):
        self.said: list[tuple[str, str]] = []
        self.lines: list[tuple[int, str, str]] = []

    def say(self, msg: str, style: str = "bold") -> None:
        self.said.append((msg, style))

    def line(self, rank: int, host: str, text: str) -> None:
        self.lines.append((rank, host, text))


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if f"DL_TEST_GANG={marker}".encode() in env and stat[stat.rfind(")") + 2:].split()[0] != "Z":
            out.append(int(name))
    return out


@pytest.fixture
def run_gang(tmp_path):
    """run_gang(commands, folder, **settings) -> {rank: exit code}: the ranks' `gang.py run`, each rank's records
    in `folder` (one folder: as hosts that share it; the path is the same on every host, as `up` makes it)."""
    markers = []

    def run(commands: list[str], folder: Path, **extra) -> dict[int, int]:
        marker = uuid.uuid4().hex
        markers.append(marker)
        env = dict(os.environ, DL_TEST_GANG=marker)
        port, n, secret = _free_port(), len(commands), secrets.token_hex(32)
        procs = []
        for r, cmd in enumerate(commands):
            spec = dict(job="j", run=RUN, rank=r, nnodes=n, hosts=HOSTS[:n], host=HOSTS[r], addr="127.0.0.1",
                        port=port, dir=str(folder), max_restarts=0, backoff=0, hang_timeout=None,
                        progress_regex=None, host_timeout=5, start_timeout=20, tty=False,
                        secret_dir=str(tmp_path / f"secret-{marker}-{r}"), stop_grace=1)
            spec.update(extra)
            out = open(tmp_path / f"out-{marker}-{r}.txt", "wb")
            procs.append(subprocess.Popen([sys.executable, GANG, "run", json.dumps(spec), "--", "sh", "-c", cmd],
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=_default_signals))
            out.close()
        for r in range(n):
            took = subprocess.run([sys.executable, GANG, "take-secret", str(tmp_path / f"secret-{marker}-{r}")],
                                  input=secret + "\n", capture_output=True, text=True, env=env, timeout=20)
            assert took.returncode == 0, took.stderr
        codes = {r: p.wait(60) for r, p in enumerate(procs)}
        return codes

    yield run
    for marker in markers:
        for _ in range(3):
            for pid in _marked(marker):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not _marked(marker):
                break
            time.sleep(0.2)


def local_host(rank: int, address: str) -> Host:
    from dockerlaunch.hosts.local import LocalRemote

    target = SSHTarget("local", "localhost", "root", local=True)
    return Host(rank, address, target, LocalRemote(target))


def down_host(rank: int, address: str) -> Host:
    return Host(rank, address, SSHTarget(address, address, "root"),
                error=SSHError(address, "cannot connect: connection refused"))


# a restart, then the job's end: rank 1 exits 3 on attempt 0 and 5 on attempt 1 (no restart left); rank 0 prints
# and waits to be stopped by the gang
RESTARTED = ['echo "rank 0 attempt $DL_RESTART_COUNT"; exec sleep 30',
             'echo "rank 1 attempt $DL_RESTART_COUNT"; sleep 2; exit $((3 + 2 * DL_RESTART_COUNT))']


def test_a_real_runs_records_read_back_through_the_hosts_scripts(run_gang, tmp_path):
    folder = tmp_path / "job" / "runs" / RUN
    codes = run_gang(RESTARTED, folder, max_restarts=1)
    assert codes == {0: 5, 1: 5}  # every rank exits with the job's code: container codes alone blame rank 0 too
    runs = str(folder.parent)
    h0, h1 = local_host(0, HOSTS[0]), local_host(1, HOSTS[1])
    assert gr.latest_run(h0, runs) == RUN

    g = gr.read_gang([h0, h1], runs, RUN)
    assert g is not None and g.supervised and g.run == RUN and g.folder == f"{runs}/{RUN}"
    assert [h for h, _ in g.hosts] == HOSTS and g.unanswered == []
    r = g.result
    assert (r.cause, r.code, r.rank, r.host, r.exit_code, r.attempt) == ("rank failed", 5, 1, HOSTS[1], 5, 1)
    assert g.result_host == HOSTS[0]  # the first host in rank order that has one
    assert r.line() == (f"rank failed: rank 1 ({HOSTS[1]}) exited with 5; no restart left (job.max_restarts 1); "
                        "exit code 5")
    assert r.short() == "failed: rank 1 exited 5" and r.failed
    assert r.part_of(1) == "the cause: exited with 5" and r.part_of(0) == "stopped by the gang"
    assert set(r.to_dict()) == {"cause", "code", "rank", "host", "exit_code", "attempt", "ended", "detail", "line"}
    # both ranks appended every line to the one folder: each attempt and event is kept once
    assert [(a.attempt, a.cause, a.code, a.rank, a.exit_code) for a in g.attempts] == [
        (0, "rank failed", 3, 1, 3), (1, "rank failed", 5, 1, 5)]
    assert g.attempt == 1
    assert [e.event for e in g.events].count("restart") == 1 and g.events[-1].event == "ended"
    assert g.to_dict() == {"run": RUN, "folder": f"{runs}/{RUN}", "hosts": HOSTS}

    # the newest run when no container names one; a host that is down is named, the others answer
    g2 = gr.read_gang([h0, down_host(1, HOSTS[1])], runs, None)
    assert g2 is not None and g2.run == RUN and g2.result == r
    assert [h for h, _ in g2.hosts] == [HOSTS[0]] and g2.unanswered == [(HOSTS[1], "cannot connect: connection "
                                                                                    "refused")]

    # each attempt's output, as each rank's wrapper kept it (tail: the last lines of each)
    logs = gr.attempt_logs(h0, g.folder, 1, "all")
    assert [(rank, host) for rank, host, _ in logs] == [(0, HOSTS[0]), (1, HOSTS[1])]
    assert logs[0][2] == b"rank 0 attempt 1\n" and logs[1][2] == b"rank 1 attempt 1\n"
    assert [d for _, _, d in gr.attempt_logs(h0, g.folder, 0, "1")] == [b"rank 0 attempt 0\n", b"rank 1 attempt 0\n"]
    assert gr.attempt_logs(h0, g.folder, 7, "all") == []  # no such attempt: nothing, not an error


def test_a_succeeded_run_and_a_run_without_the_supervisor(run_gang, tmp_path):
    folder = tmp_path / "runs" / RUN
    assert run_gang(["echo a", "echo b"], folder) == {0: 0, 1: 0}
    h = local_host(0, HOSTS[0])
    g = gr.read_gang([h], str(folder.parent), RUN)
    assert g.result.short() == "succeeded" and not g.result.failed and g.result.code == 0
    assert g.result.part_of(0) == g.result.part_of(1) == "finished"
    assert g.result.line() == "succeeded; exit code 0"

    # an image without Python (gang-entry.sh leaves a marker), an attached run (no folder): no gang run
    plain = tmp_path / "runs" / "20260102-030406-00ff"
    plain.mkdir(parents=True)
    (plain / "unsupervised-rank0").touch()
    assert gr.read_gang([h], str(folder.parent), plain.name) is None
    assert gr.read_gang([h], str(folder.parent), "20260102-030407-abcd") is None
    assert gr.read_gang([h], str(tmp_path / "nothing-here"), None) is None
    # the newest by name (the run id starts with its time), whatever else lies there
    (tmp_path / "runs" / "zz-not-a-run").mkdir()
    (tmp_path / "runs" / "99999999-999999-Z").mkdir()
    assert gr.latest_run(h, str(folder.parent)) == "20260102-030406-00ff"


def test_a_rank_that_never_joined_keeps_its_own_result(run_gang, tmp_path):
    """Rank 1 alone (host 0 never came): its own record tells the end (start failed, 1), with no rank to blame."""
    folder = tmp_path / "runs" / RUN
    codes = run_gang(["exec sleep 30"], folder, nnodes=2, hosts=HOSTS, start_timeout=3, rank=1, host=HOSTS[1])
    assert codes == {0: gang.EXIT_START}
    rec = gr.parse_run(str(folder), *(((folder / n).read_text() if (folder / n).exists() else "")
                                      for n in gr.FILES), "")
    assert rec.result is not None and rec.result.cause == "start failed" and rec.result.code == 1
    assert rec.result.part_of(1) == "start failed" and rec.result.short() == "failed: start failed, code 1"


# ------------------------------------------------------------------------------------------- host's words

def test_records_that_are_not_what_gang_py_writes_are_dropped():
    good = json.dumps({"attempt": 0, "cause": "rank failed", "code": 3, "started": "2026-01-02T03:04:05",
                       "seconds": 1.5, "hosts": HOSTS, "rank": 1, "host": HOSTS[1], "exit_code": 3, "swaps": [],
                       "detail": ""})
    bad = [json.dumps(dict(json.loads(good), seconds="soon")), json.dumps(dict(json.loads(good), code=-1)),
           json.dumps(dict(json.loads(good), hosts="h1")), json.dumps(dict(json.loads(good), rank="1")),
           json.dumps(dict(json.loads(good), attempt=True)), "[1, 2]", "{", json.dumps({"attempt": 2})]
    rec = gr.parse_run("/f", '{"event": "formed", "text": "x"}\n{"event": 5}\nnot json\n[]\n',
                       "\n".join([*bad, good, good]), '{"cause": "rank failed", "code": 999}', "unsupervised-rank1 x")
    assert [a.attempt for a in rec.attempts] == [0] and rec.attempts[0].line().startswith("attempt 0: rank failed")
    assert [e.event for e in rec.events] == ["formed"] and rec.formed
    assert rec.result is None and rec.unsupervised == ["unsupervised-rank1"]
    assert gr.GangResult.parse('{"cause": "hang", "code": 124, "rank": "0", "detail": 7}') == gr.GangResult("hang", 124)
    assert gr.GangResult.parse("[]") is None and gr.GangResult.parse("") is None
    r = gr.GangResult("host lost", 75, rank=0, host=HOSTS[0], detail="silent for 5s")
    assert r.short() == "failed: host lost (rank 0), code 75" and r.part_of(0) == "the cause: host lost"


def test_attempt_log_frames_stop_at_the_first_that_is_not_one():
    data = b"rank0-10.0.0.1.log 6\na\nb\nc\n" + b"rank1-../../etc.log 2\nxx" + b"notes.txt 1\nz" + \
        b"rank2-h.log 99\nshort"
    assert gr.parse_attempt_logs(data) == [(0, "10.0.0.1", b"a\nb\nc\n")]
    assert gr.parse_attempt_logs(b"") == [] and gr.parse_attempt_logs(b"no newline") == []
    assert gr.parse_attempt_logs(b"rank3-h_x.log 0\n") == [(3, "h_x", b"")]


def test_attempt_logs_skip_links_and_read_only_rank_files(tmp_path):
    d = tmp_path / "attempt-0"
    d.mkdir()
    (d / "rank0-h0.log").write_bytes(b"one\ntwo\n")
    (d / "rank1-h1.log").symlink_to("/etc/hostname")
    (d / "stacks-rank0.txt").write_text("stacks")
    got = gr.attempt_logs(local_host(0, "h0"), str(tmp_path), 0, "all")
    assert got == [(0, "h0", b"one\ntwo\n")]


# ------------------------------------------------------------------------------------------- the client's rules

def _container(rank: int, run: str | None = RUN, status: str = "exited", code: int = 3) -> ContainerState:
    return ContainerState(f"j-{rank}", rank, status, code, "", "", run=run)


def test_the_run_label_is_read_and_the_newest_valid_one_names_the_run():
    text = json.dumps([{"Name": "/j-0", "State": {"Status": "exited", "ExitCode": 3},
                        "Config": {"Labels": {"dockerlaunch.job": "j", "dockerlaunch.rank": "0",
                                              "dockerlaunch.run": RUN}}}])
    [c] = parse_inspect(text)
    assert c.run == RUN and c.job == "j"
    newer = "20260102-030406-ffff"
    assert run_label([("a", _container(0)), ("b", _container(1, newer))]) == newer
    assert run_label([("a", _container(0, "../../etc")), ("b", _container(1, None))]) is None


def _gang(result: gr.GangResult | None, hosts=HOSTS) -> gr.GangRun:
    return gr.GangRun(RUN, f"/x/runs/{RUN}", [(h, gr.RunRecords("/x", events=[gr.GangEvent("formed", "")],
                                                                result=result)) for h in hosts])


def test_status_exits_with_the_jobs_code_and_1_for_a_host_that_did_not_answer():
    failed = gr.GangResult("rank failed", 3, rank=1, host=HOSTS[1], exit_code=3)
    ok = gr.GangResult("succeeded", 0)
    st = lambda gang, down=(): JobStatus("j", HOSTS, [], list(down), gang)  # noqa: E731
    assert st(_gang(failed)).code == 3
    assert st(_gang(failed), [(HOSTS[0], "refused")]).code == 3  # the result is known: the job's code
    assert st(_gang(ok)).code == 0 and st(_gang(None)).code == 0  # succeeded; running
    assert st(_gang(ok), [(HOSTS[1], "refused")]).code == 1
    assert st(None).code == 0 and st(None, [(HOSTS[1], "refused")]).code == 1  # attached: as before


def test_logs_ends_with_the_result_line_and_follow_with_the_jobs_code():
    failed = gr.GangResult("rank failed", 3, rank=1, host=HOSTS[1], exit_code=3)
    said = Said()
    assert _ended("j", _gang(failed), True, 0, said) == 3
    assert said.said == [(f"job j ended: rank failed: rank 1 ({HOSTS[1]}) exited with 3; exit code 3", "bold red")]
    assert _ended("j", _gang(failed), False, 0, Said()) == 0  # without --follow: the logs were shown
    assert _ended("j", _gang(None), True, 1, Said()) == 1  # still running (a stream ended): as before
    assert _ended("j", None, True, 0, Said()) == 0


def test_ps_reads_each_supervised_jobs_result_from_its_hosts(run_gang, tmp_path):
    """A job's records are read from the hosts it has containers on; a job without records (attached, or started
    with another config's folder) keeps the keys it always had."""
    from dockerlaunch.cli.jobs import _states
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.job.load import validate_config

    root = tmp_path / "diag"
    assert run_gang(RESTARTED, root / "sup" / "runs" / RUN) == {0: 3, 1: 3}
    config = validate_config({"hosts": ["local", "local"], "diagnostics": {"dir": str(root)}})
    fleet = Fleet(config, [local_host(0, "local"), down_host(1, "h1")])
    sup = JobRow("sup", [("local", _container(0)), ("local", _container(1))])
    plain = JobRow("plain", [("local", _container(0, "20260102-030405-00"))])
    odd = JobRow("../sup", [("local", _container(0))])
    try:
        read_results(fleet, [sup, plain, odd])
    finally:
        fleet.close()
    assert sup.failed and sup.result.short() == "failed: rank 1 exited 3" and _states(sup) == sup.result.short()
    assert plain.gang is None and odd.gang is None and not plain.failed
    now = datetime.now(timezone.utc)
    assert sup.to_dict(now)["result"]["code"] == 3 and "result" not in plain.to_dict(now)
    assert _states(plain) == "exited 3"
    running = JobRow("r", [("local", _container(0, status="running", code=0))], gang=_gang(None))
    assert running.to_dict(now)["result"] is None and _states(running) == "running"
