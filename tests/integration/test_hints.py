"""Every printed command works as printed, pasted in ANOTHER folder (issues 52 and 58): each test provokes a hint on
the sim through the CLI, in a project folder that holds the config as ./dockerlaunch.yaml (the default) or as a
relative --config, takes the command exactly as it was printed, runs it from another folder, and checks that it did
what the hint was about. Hints that carried no --config (the default file) or a relative one failed there with
`no hosts to run on`; a doctor pointer that dropped --image checked another image and printed a false all-clear."""

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.cli import paste
from tests.integration.helpers import containers_on, default_signals, dl, job_name, probe_containers_on, until

pytestmark = pytest.mark.integration

FIX = re.compile(r"fix: (dockerlaunch .+?)(?:\)|$)", re.M)


@pytest.fixture
def folders(sim_cluster, tmp_path):
    """(project, elsewhere): the sim's config as project/dockerlaunch.yaml and project/ux/v2.yaml; another folder
    to paste in."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "ux").mkdir(parents=True)
    elsewhere.mkdir()
    text = Path(sim_cluster[1]).read_text()
    (project / "dockerlaunch.yaml").write_text(text)
    (project / "ux" / "v2.yaml").write_text(text)
    return project, elsewhere


def fix_in(text: str) -> str:
    m = FIX.search(text)
    assert m, f"no fix printed in: {text}"
    return m.group(1)


def after_label(label: str, text: str) -> str:
    """The command on the line that starts with `label` (one label, then the command whole)."""
    lines = [line for line in text.splitlines() if line.startswith(label + " ")]
    assert len(lines) == 1, f"no single `{label}` line in: {text}"
    return lines[0][len(label) + 1:]


@pytest.mark.hint("doctor.push", "up.doctor")
def test_the_push_hint_and_the_doctor_pointer_run_as_printed_from_another_folder(folders, remotes, demo_image,
                                                                                   engine):
    """The default ./dockerlaunch.yaml; quoted: after `up --image myteam/train:v3` failed pre-flight, the pointer
    `dockerlaunch doctor --hosts ... --name ux4` dropped --image (pasted: it checked v1, 23 PASS)."""
    project, elsewhere = folders
    cfg = project / "dockerlaunch.yaml"
    tag = f"dlt-hint/{job_name()}:3"
    job = job_name()
    engine.images.get(demo_image).tag(tag)  # here, on no host: one push away
    try:
        r = dl("doctor", "--image", tag, "--output", "json", cwd=project)
        assert r.returncode == 1, r.stdout + r.stderr
        rows = [c for c in json.loads(r.stdout)["checks"] if c["check"] == "image"]
        assert rows and all(c["verdict"] == "FAIL" for c in rows), rows
        assert f"fix: dockerlaunch push {tag} --config {cfg}" in rows[0]["reason"], rows[0]["reason"]

        up = dl("up", "--image", tag, "--name", job, "--", "true", cwd=project)
        out = up.stdout + up.stderr
        assert up.returncode == 1 and "nothing was started" in out and "--skip-preflight" not in out, out
        assert "answered" not in out, out  # no progress line where no terminal is
        # the row's command is under the table, whole, after its one label
        assert "fix: [1]" in up.stdout and f"\n[1] dockerlaunch push {tag} --config {cfg}\n" in up.stdout, up.stdout
        pointer = after_label("check without starting:", up.stdout)
        assert pointer == f"dockerlaunch doctor --config {cfg} --name {job} --image {tag}", pointer
        checked = paste(pointer + " --output json", elsewhere)
        assert checked.returncode == 1, checked.stdout + checked.stderr  # the image asked for, not the file's
        assert {c["verdict"] for c in json.loads(checked.stdout)["checks"] if c["check"] == "image"} == {"FAIL"}

        pushed = paste(after_label("[1]", up.stdout), elsewhere, timeout=600)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        again = paste(pointer + " --output json", elsewhere)
        assert {c["verdict"] for c in json.loads(again.stdout)["checks"] if c["check"] == "image"} == {"PASS"}
    finally:
        for remote in remotes:
            remote.run(["docker", "rmi", tag])
        engine.images.remove(tag)


def test_the_pointer_after_a_master_port_in_use_keeps_the_port_and_names_what_it_leaves_out(folders):
    """A relative --config; quoted: the same dropped flag after `up --master-port 22`. An --env value whose name
    looks secret is never repeated; up's own flags are named."""
    project, elsewhere = folders
    job = job_name()
    up = dl("up", "--config", "ux/v2.yaml", "--name", job, "--master-port", "22", "--max-restarts", "1",
            "--env", "HF_TOKEN=hf_not_for_logs", "--env", "A=1", "--", "true", cwd=project)
    out = up.stdout + up.stderr
    assert up.returncode == 1 and "port 22 is already in use on host 0" in out, out
    pointer = after_label("check without starting:", up.stdout)
    assert pointer == (f"dockerlaunch doctor --config {project / 'ux' / 'v2.yaml'} --name {job} --master-port 22 "
                       "--env A=1"), pointer
    assert ("that doctor leaves out --max-restarts (doctor does not take it); --env HF_TOKEN (looks secret: add it "
            "yourself)") in up.stdout, up.stdout
    assert "hf_not_for_logs" not in out
    checked = paste(pointer + " --output json", elsewhere)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert [c["verdict"] for c in json.loads(checked.stdout)["checks"] if c["check"] == "master port"] == ["FAIL"]


@pytest.mark.hint("up.follow", "up.down-running")
def test_the_follow_and_down_hints_run_as_printed_from_another_folder(folders, remotes):
    """A relative --config; quoted: `follow with: fix: dockerlaunch logs --follow --name train` had two labels."""
    project, elsewhere = folders
    cfg = project / "ux" / "v2.yaml"
    job = job_name()
    try:
        r = dl("up", "--skip-preflight", "--detach", "--config", "ux/v2.yaml", "--name", job, "--", "sh", "-c",
               "echo hint-ran; sleep 600", cwd=project)
        assert r.returncode == 0, r.stdout + r.stderr
        follow = after_label("follow with:", r.stdout)
        assert follow == (f"dockerlaunch logs --follow --name {job} --config {cfg} --log-dir "
                          f"{project / 'dockerlaunch-logs'}"), follow
        assert "fix:" not in r.stdout, r.stdout
        env = {k: v for k, v in os.environ.items() if k != "DOCKERLAUNCH_CONFIG"}
        p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", *shlex.split(follow)[1:]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=elsewhere, env=env)
        try:
            got, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.terminate()
            got, err = p.communicate(timeout=30)
        assert "hint-ran" in got and "error" not in err.lower(), got + err

        # the same name again: refused, with the fix that removes the running job
        again = dl("up", "--skip-preflight", "--config", "ux/v2.yaml", "--name", job, "--", "true", cwd=project)
        assert again.returncode != 0 and "already has containers" in again.stderr, again.stdout + again.stderr
        assert f"); fix: dockerlaunch down --name {job} --config {cfg}" in again.stderr, again.stderr
        down = paste(fix_in(again.stderr), elsewhere)
        assert down.returncode == 0, down.stdout + down.stderr
        assert all(containers_on(remote, job) == [] for remote in remotes)
    finally:
        dl("down", "--config", str(cfg), "--name", job, "--ignore-missing")


@pytest.mark.hint("down.again")
def test_down_with_a_host_that_does_not_answer_removes_the_rest_and_its_fix_the_rest_once_it_answers(
        folders, sim_cluster, engine, remotes):
    """Host 0 died mid-run: `down` (and `exec` on another rank) needed every host to answer, so it removed nothing
    and the other hosts' ranks kept running. Now the others' containers go, the silent host is named (exit 1), and
    the printed command, pasted once it answers again, removes its container too."""
    project, elsewhere = folders
    job = job_name()
    node1 = engine.containers.get(sim_cluster[2][0].name)
    ip0 = sim_cluster[2][0].ip
    # new SSH connections to host 0 are refused (the suite's own connection, already up, goes on)
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "--syn", "-j", "REJECT", "--reject-with", "tcp-reset"]
    try:
        r = dl("up", "--skip-preflight", "--detach", "--name", job, "--", "sleep", "600", cwd=project)
        assert r.returncode == 0, r.stdout + r.stderr
        assert node1.exec_run(["iptables", "-I", *rule]).exit_code == 0
        try:
            # exec needs only its rank's host
            ex = dl("exec", "--name", job, "--rank", "1", "--", "echo", "rank-1-answers", cwd=project, timeout=120)
            assert ex.returncode == 0 and ex.stdout.strip() == "rank-1-answers", ex.stdout + ex.stderr
            ex = dl("exec", "--name", job, "--rank", "0", "--", "true", cwd=project, timeout=120)
            assert ex.returncode == 1 and f"host {ip0}" in ex.stderr, ex.stdout + ex.stderr
            d = dl("down", "--name", job, cwd=project, timeout=180)
            assert d.returncode == 1, d.stdout + d.stderr
            assert containers_on(remotes[1], job) == [] and containers_on(remotes[0], job) == [f"{job}-0"]
            assert f"removed 1 container(s) of job {job} on 1 of 2 host(s)" in d.stdout, d.stdout + d.stderr
            [line] = [x for x in d.stderr.splitlines() if x.strip()]
            assert f"host {ip0}: did not answer" in line and "still there; once it answers, fix: " in line, line
            again = fix_in(line)
            assert again == f"dockerlaunch down --ignore-missing --config {project / 'dockerlaunch.yaml'} --name " \
                            f"{job} --log-dir {project / 'dockerlaunch-logs'}", again
        finally:
            node1.exec_run(["iptables", "-D", *rule])
        pasted = paste(again, elsewhere)
        assert pasted.returncode == 0, pasted.stdout + pasted.stderr
        assert containers_on(remotes[0], job) == [], pasted.stdout
    finally:
        dl("down", "--name", job, "--ignore-missing", cwd=project)


@pytest.mark.hint("exec.logs")
def test_exec_into_an_exited_rank_says_the_jobs_state_and_its_fix_runs_from_another_folder(folders, remotes):
    """Quoted: `exec` into an exited rank printed Docker's `Container ... is not running`."""
    project, elsewhere = folders
    job = job_name()
    try:
        r = dl("up", "--skip-preflight", "--detach", "--name", job, "--", "sh", "-c",
               'if [ "$NODE_RANK" = 1 ]; then echo rank1-said-this; exit 3; fi; sleep 600', cwd=project)
        assert r.returncode == 0, r.stdout + r.stderr
        assert until(lambda: "exited" in dl("status", "--name", job, cwd=project).stdout, 60) is not None
        ex = dl("exec", "--name", job, "--rank", "1", "--", "true", cwd=project)
        assert ex.returncode == 1 and "is not running" not in ex.stderr, ex.stderr
        assert f"exec: rank 1 of job {job} exited with code 3" in ex.stderr, ex.stderr
        assert "(the job: rank 0 running, rank 1 exited 3); exec into a running rank (0)" in ex.stderr, ex.stderr
        logs = paste(fix_in(ex.stderr), elsewhere)
        assert logs.returncode == 0 and "rank1-said-this" in logs.stdout, logs.stdout + logs.stderr
    finally:
        dl("down", "--name", job, "--ignore-missing", cwd=project)


def test_a_wrong_ssh_port_says_where_the_port_came_from(folders, sim_cluster):
    """Quoted: `cannot connect to 172.30.10.11:2222: Unable to connect to port 2222`, with no fix."""
    project, _ = folders
    ip = sim_cluster[2][0].ip
    r = dl("status", "--hosts", f"{ip}:2222", cwd=project)
    assert r.returncode != 0, r.stdout + r.stderr
    assert (f"cannot connect to {ip}:2222: connection refused (the address answered, but nothing listens on port "
            "2222); the port is the host's entry (host:PORT in --hosts or hosts:, or its port:)") in r.stderr, r.stderr
    assert "Unable to connect" not in r.stderr


SLOW = "dlt-slowprobe:1"  # the demo image with an entrypoint that waits 5 s: every probe container takes that long


@pytest.fixture
def slow_image(remotes, sim_cluster):
    image = yaml.safe_load(Path(sim_cluster[1]).read_text())["image"]
    entry = 'ENTRYPOINT ["sh", "-c", "sleep 5; exec \\"$@\\"", "sh"]'
    for remote in remotes:
        name = f"dlt-slow-{job_name()}"
        for argv in (["docker", "create", "--name", name, image, "true"],
                     ["docker", "commit", "--change", entry, name, SLOW], ["docker", "rm", name]):
            r = remote.run(argv, timeout=120)
            assert r.ok, r.stderr
    yield SLOW
    for remote in remotes:
        remote.run(["docker", "rmi", "-f", SLOW])


def test_preflight_shows_progress_on_a_terminal_and_an_interrupt_removes_its_probe_containers(folders, remotes,
                                                                                             slow_image):
    """Quoted: pre-flight printed nothing for its whole length (8 s; minutes at 64 hosts); a Ctrl-C during it left
    a `dlprobe-reach-*` container on the nodes."""
    project, _ = folders
    master, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "150"}
    p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "up", "--image", slow_image, "--name", job_name(),
                          "--", "true"], stdin=subprocess.DEVNULL, stdout=child, stderr=child, cwd=project, env=env,
                         preexec_fn=default_signals)
    os.close(child)
    seen = b""

    def read(until_s: float) -> None:
        nonlocal seen
        end = time.monotonic() + until_s
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + 120
        while b"host(s) answered" not in seen and time.monotonic() < deadline and p.poll() is None:
            read(0.5)
        text = seen.decode(errors="replace")
        assert re.search(r"\[dockerlaunch\] pre-flight: \d of 2 host\(s\) answered \([a-z ]+\), \d+ s", text), text
        assert until(lambda: any(probe_containers_on(r) for r in remotes), 60) is not None, "no probe container"
        p.send_signal(signal.SIGINT)
        while p.poll() is None and time.monotonic() < deadline:
            read(0.5)
        read(0.5)
        assert p.returncode == 130, (p.returncode, seen.decode(errors="replace"))
        # gone before `up` exited: nothing waits for them to end by themselves
        assert [probe_containers_on(r) for r in remotes] == [[], []], seen.decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        os.close(master)
