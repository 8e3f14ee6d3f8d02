"""Jobs you can find (issue 52): `ps` lists every dockerlaunch job on the hosts; an unknown `--name` in `status`,
`logs`, `exec` and `down` says so with the jobs there are; `logs` after a failed start prints why; `up` prints its
pre-flight quietly. Each behaviour the issue quoted is run again here, as quoted, on the sim through the CLI."""

import json
import re

import pytest

from tests.cli import paste
from tests.integration.helpers import containers_on, dl, job_name, variant

pytestmark = pytest.mark.integration

RANK_LINE = re.compile(r"^\[\d+ \S+\] ")  # a line of the job's own output


def _one_error_line(r) -> str:
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_ps_lists_every_job_and_an_unknown_name_lists_them(sim_cluster, remotes, tools_image, tmp_path):
    cfg, logs = str(sim_cluster[1]), str(tmp_path / "logs")
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    job = job_name()
    # a container carrying the job label that dockerlaunch never named: its label is host text (ESC, markup)
    made = remotes[0].check(["docker", "create", "--label", "dockerlaunch.job=ev\x1b[2Jil[bold]", "--label",
                             "dockerlaunch.rank=0", tools_image, "true"], "creating a labelled container")
    planted = made.stdout.strip()
    try:
        r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--", "sleep", "600")
        assert r.returncode == 0, r.stdout + r.stderr

        ps = dl("ps", "--config", cfg, "--log-dir", logs)
        assert ps.returncode == 0, ps.stdout + ps.stderr
        [row] = [x for x in ps.stdout.splitlines() if x.split()[:1] == [job]]
        assert f"{ip1}, {ip2}" in row and "running (all 2)" in row and tools_image in row, ps.stdout
        assert re.search(r"\s\d+[smhd]\S*\s", row), row  # its age
        [odd] = [x for x in ps.stdout.splitlines() if "ev^[[2Jil[bold]" in x]
        assert "created" in odd and "\x1b" not in ps.stdout, ps.stdout  # shown as text, never as a control

        js = dl("ps", "--config", cfg, "--log-dir", logs, "--output", "json")
        assert js.returncode == 0, js.stderr
        data = json.loads(js.stdout)
        assert data["hosts"] == 2 and data["unanswered"] == [] and data["saved"] == []
        jobs = {j["name"]: j for j in data["jobs"]}
        mine = jobs[job]
        assert set(mine) == {"name", "image", "created", "age_seconds", "hosts"} and mine["image"] == tools_image
        assert [(h["host"], h["rank"], h["container"], h["state"], h["exit_code"]) for h in mine["hosts"]] == [
            (ip1, 0, f"{job}-0", "running", None), (ip2, 1, f"{job}-1", "running", None)]
        assert set(mine["hosts"][0]) == {"host", "rank", "container", "state", "exit_code", "started_at",
                                         "finished_at"}
        assert [h["state"] for h in jobs["ev\x1b[2Jil[bold]"]["hosts"]] == ["created"]  # JSON keeps the raw value

        # quoted: `status` without `--name` reports the config's job (`no containers`) while another job runs
        st = dl("status", "--config", cfg, "--log-dir", logs)
        assert st.returncode == 0, st.stdout + st.stderr
        assert "no containers on 2 host(s)" in st.stdout and "jobs on the hosts: " in st.stdout, st.stdout
        assert f"{job} (2 running)" in st.stdout, st.stdout

        # an unknown --name: one line naming the jobs there are, exit 1
        for args in (("status",), ("logs",), ("exec", "--rank", "0", "--", "true")):
            bad = dl(args[0], "--config", cfg, "--name", "typo-job", "--log-dir", logs, *args[1:])
            assert bad.returncode == 1, (args, bad.stdout, bad.stderr)
            line = _one_error_line(bad)
            assert "no job named typo-job" in line and f"{job} (2 running)" in line, line
        # quoted: `down --name typo-job` printed `removed 0 container(s)` and exited 0
        down = dl("down", "--config", cfg, "--name", "typo-job", "--log-dir", logs)
        assert down.returncode == 1 and "removed 0" not in down.stdout, down.stdout + down.stderr
        line = _one_error_line(down)
        assert "no job named typo-job" in line and f"{job} (2 running)" in line and "--ignore-missing" in line, line
        quiet = dl("down", "--config", cfg, "--name", "typo-job", "--ignore-missing")
        assert quiet.returncode == 0 and "nothing to remove" in quiet.stdout, quiet.stdout + quiet.stderr
        assert [containers_on(rm, job) for rm in remotes] == [[f"{job}-0"], [f"{job}-1"]]  # nothing else touched
    finally:
        d = dl("down", "--config", cfg, "--name", job)
        remotes[0].run(["docker", "rm", "-f", planted])
    assert d.returncode == 0 and "removed 2 container(s)" in d.stdout, d.stdout + d.stderr
    gone = dl("ps", "--config", cfg, "--log-dir", logs)
    assert gone.returncode == 0 and job not in gone.stdout and "ev^[" not in gone.stdout, gone.stdout


@pytest.mark.hint("ps.logs")
def test_logs_after_a_failed_start_prints_the_start_error(sim_cluster, tmp_path):
    """Quoted: `logs` after a failed start said `attempt-0: no log file` while `status` had the cause."""
    cfg = variant(sim_cluster, tmp_path, container={"user": "nosuchuser"})  # docker run itself refuses
    logs, job = str(tmp_path / "logs"), job_name()
    up = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--log-dir", logs, "--", "sleep", "600")
    assert up.returncode == 1 and "start failed" in up.stdout, up.stdout + up.stderr
    lg = dl("logs", "--config", cfg, "--name", job, "--log-dir", logs)
    assert lg.returncode == 0, lg.stdout + lg.stderr
    assert "no log file" not in lg.stdout + lg.stderr, lg.stdout + lg.stderr
    assert f"job {job}: attempt 0 logged nothing" in lg.stdout and "start failed" in lg.stdout, lg.stdout
    assert "unable to find user nosuchuser" in lg.stdout, lg.stdout  # docker's own words, as `up` saw them
    # a finished job whose logs are kept is known: status reports it; an unknown name lists it among the finished
    st = dl("status", "--config", cfg, "--name", job, "--log-dir", logs)
    assert st.returncode == 0 and "start failed" in st.stdout, st.stdout + st.stderr
    bad = dl("status", "--config", cfg, "--name", "typo-job", "--log-dir", logs)
    assert bad.returncode == 1 and f"finished, logs kept under {logs}/: {job}" in _one_error_line(bad), bad.stderr
    # `ps` names the finished job with the command that shows its logs, which runs as printed in another folder
    listed = dl("ps", "--config", cfg, "--log-dir", logs)
    pointer = re.search(r"\(`(dockerlaunch logs [^`]+)` shows it\)", listed.stdout)
    assert pointer, listed.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = paste(pointer.group(1), elsewhere)
    assert shown.returncode == 0 and "unable to find user nosuchuser" in shown.stdout, shown.stdout + shown.stderr
    down = dl("down", "--config", cfg, "--name", job, "--log-dir", logs)
    assert down.returncode == 1 and "it ended; its logs are kept" in _one_error_line(down), down.stderr


def test_up_prints_at_most_three_lines_before_the_jobs_output(sim_cluster, tmp_path):
    """Quoted: `up` printed a 28-line all-PASS pre-flight table before the first log line. Now: the rows that did
    not pass (none on healthy hosts; a host short of disk gets its WARN row and the table's header) and one count
    line; `-v` shows the whole table."""
    cfg, logs = str(sim_cluster[1]), str(tmp_path / "logs")
    up = dl("up", "--config", cfg, "--name", job_name(), "--log-dir", logs, "--", "sh", "-c", "echo first-line")
    assert up.returncode == 0, up.stdout + up.stderr
    lines = up.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if RANK_LINE.match(x))
    before = lines[:first]
    assert "first-line" in lines[first], lines
    count = [x for x in before if re.match(r"^\[dockerlaunch\] doctor: \d+ PASS.* on 2 hosts in \d+\.\d s", x)]
    assert len(count) == 1, before
    said = [x for x in before if x.startswith("[dockerlaunch] ")]
    assert len(said) <= 3, before  # the count line, `starting`, `started ...; logs: DIR`
    table = [x for x in before if not x.startswith("[dockerlaunch] ")]
    if table:  # the rows that did not pass, under the table's header
        assert table[0].split() == ["host", "check", "verdict", "reason"], before
        assert all(re.search(r"\s(WARN|FAIL|ERROR)\s", x) and not re.search(r"\s(PASS|SKIP)\s", x)
                   for x in table[1:]), before
    else:
        assert len(before) <= 3, before

    verbose = dl("up", "-v", "--config", cfg, "--name", job_name(), "--log-dir", logs, "--", "true")
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    ssh_rows = [x for x in verbose.stdout.splitlines() if re.match(r"^\s*\S+\s+ssh\s+PASS\s", x)]
    assert len(ssh_rows) == 2, verbose.stdout  # the whole table, PASS rows too
