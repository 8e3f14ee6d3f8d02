"""Every printed fix works as printed (issue 52): each test provokes a hint on the sim through the CLI, takes the
`fix: dockerlaunch ...` line exactly as it was printed, runs it, and checks that it did what the hint was about.
The user's own --config (and --name, --hosts) must be in it: the hints that dropped --config failed when pasted."""

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.integration.helpers import containers_on, dl, job_name

pytestmark = pytest.mark.integration

FIX = re.compile(r"fix: (dockerlaunch .+?)(?:\)|$)", re.M)


def run_fix(text: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The first `fix: dockerlaunch ...` in `text`, run as a user would paste it (shell words, this dockerlaunch)."""
    m = FIX.search(text)
    assert m, f"no fix printed in: {text}"
    words = shlex.split(m.group(1))
    assert words[0] == "dockerlaunch"
    return subprocess.run([sys.executable, "-m", "dockerlaunch", *words[1:]], capture_output=True, text=True,
                          timeout=timeout)


def test_the_push_hint_of_a_missing_image_runs_as_printed(sim_cluster, remotes, demo_image, engine):
    cfg = str(sim_cluster[1])
    tag = f"dlt-hint/{job_name()}:1"
    engine.images.get(demo_image).tag(tag)  # here, on no host: one push away
    try:
        r = dl("doctor", "--config", cfg, "--image", tag, "--output", "json")
        assert r.returncode == 1, r.stdout + r.stderr
        rows = [c for c in json.loads(r.stdout)["checks"] if c["check"] == "image"]
        assert rows and all(c["verdict"] == "FAIL" for c in rows), rows
        reason = rows[0]["reason"]
        assert f"fix: dockerlaunch push {tag} --config {cfg}" in reason, reason
        # quoted: `up` with the image missing ended with `Fix the above or use --skip-preflight`
        up = dl("up", "--config", cfg, "--image", tag, "--name", job_name(), "--", "true")
        assert up.returncode == 1 and "nothing was started" in up.stdout + up.stderr, up.stdout + up.stderr
        assert "--skip-preflight" not in up.stdout + up.stderr and f"fix: dockerlaunch push {tag}" in up.stdout
        pushed = run_fix(reason, timeout=600)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        again = dl("doctor", "--config", cfg, "--image", tag, "--output", "json")
        assert {c["verdict"] for c in json.loads(again.stdout)["checks"] if c["check"] == "image"} == {"PASS"}
    finally:
        for remote in remotes:
            remote.run(["docker", "rmi", tag])
        engine.images.remove(tag)


def test_the_logs_hint_after_detach_and_the_down_hint_of_a_running_name_run_as_printed(sim_cluster, remotes,
                                                                                       tmp_path):
    cfg = str(sim_cluster[1])
    job = job_name()
    try:
        r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--", "sh", "-c",
               "echo hint-ran; sleep 600")
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout + r.stderr
        assert f"follow with: fix: dockerlaunch logs --follow --name {job} --config {cfg}" in out, out
        # as printed it follows forever: it must find the job (the old hint said `no hosts to run on`)
        m = FIX.search(out[out.index("follow with:"):])
        words = shlex.split(m.group(1))
        p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", *words[1:]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            got, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.terminate()
            got, err = p.communicate(timeout=30)
        assert "hint-ran" in got and "error" not in err.lower(), got + err

        # the same name again: refused, with the fix that removes the running job
        again = dl("up", "--skip-preflight", "--config", cfg, "--name", job, "--", "true")
        assert again.returncode != 0 and "already has containers" in again.stderr, again.stdout + again.stderr
        assert f"fix: dockerlaunch down --name {job} --config {cfg}" in again.stderr, again.stderr
        down = run_fix(again.stderr)
        assert down.returncode == 0, down.stdout + down.stderr
        assert all(containers_on(remote, job) == [] for remote in remotes)
    finally:
        dl("down", "--config", cfg, "--name", job, "--ignore-missing")
