"""The everyday loop (edit, build, push, up) on the sim, with a real rebuild under the same tag (issue 58): doctor
and `up`'s pre-flight compare every host's build with the one this machine holds, the printed push makes them pass,
`up --push` runs the new build, and hosts holding a NEWER build than this machine are never pushed over.

Each build is checked with figures the product does not compute: the Image IDs docker gives here and on each node
(over SSH), and the file the build wrote, as the job's containers print it."""

import io
import json
import re
import secrets
import shlex
import subprocess

import pytest

from tests.cli import paste
from tests.integration.helpers import dl, ids_on_nodes, job_name
from tests.integration.test_hints import fix_in

pytestmark = pytest.mark.integration


@pytest.fixture
def stale(engine, tools_image, remotes):
    """Builds `dlt-stale/<random>:v1` here (each call a new build under the same tag, writing its word to /build);
    removes the tag and every build here and on the nodes at the end."""
    tag = f"dlt-stale/{secrets.token_hex(3)}:v1"
    ids: list[str] = []

    def build(word: str) -> str:
        dockerfile = f"FROM {tools_image}\nRUN echo {word} > /build\nLABEL dlt.word={word}\n"
        image, _ = engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                                       network_mode="host", nocache=True)
        ids.append(image.id)
        return image.id

    build.tag = tag
    yield build
    for r in remotes:
        r.run(["docker", "rmi", tag])
        for i in ids:
            r.run(["docker", "rmi", i])
    for i in [tag, *ids]:
        try:
            engine.images.remove(i, force=True)
        except Exception:
            pass


def image_rows(cfg: str, tag: str) -> list[dict]:
    r = dl("doctor", "--config", cfg, "--image", tag, "--output", "json")
    rows = [c for c in json.loads(r.stdout)["checks"] if c["check"] == "image"]
    assert len(rows) == 2, r.stdout + r.stderr
    return rows


def test_a_rebuild_not_pushed_fails_preflight_and_up_push_runs_the_new_build(sim_cluster, remotes, stale,
                                                                           job_containers, tmp_path):
    cfg, tag = str(sim_cluster[1]), stale.tag
    old = stale("old")
    pushed = dl("push", tag, "--config", cfg, timeout=600)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert ids_on_nodes(remotes, tag) == [old, old]
    new = stale("new")  # the user edits a file and builds again, under the same tag
    assert new != old

    # quoted: `image PASS 31916a83fd0f` on both hosts, and `up` ran the OLD build
    rows = image_rows(cfg, tag)
    assert {c["verdict"] for c in rows} == {"FAIL"}, rows
    for c in rows:
        assert f"{tag} is {old[7:19]} (built " in c["reason"] and f"but {new[7:19]} (built " in c["reason"], c
        assert "on this machine" in c["reason"] and f"fix: dockerlaunch push {tag} --config {cfg}" in c["reason"]

    job = job_name()
    up = dl("up", "--config", cfg, "--image", tag, "--name", job, "--", "cat", "/build")
    assert up.returncode == 1 and "nothing was started" in up.stdout, up.stdout + up.stderr
    assert job_containers(job) == []

    fixed = paste(fix_in(rows[0]["reason"]), tmp_path, timeout=600)  # the printed push, pasted in another folder
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert ids_on_nodes(remotes, tag) == [new, new]
    assert {c["verdict"] for c in image_rows(cfg, tag)} == {"PASS"}

    newest = stale("newest")
    dry = dl("up", "--push", "--dry-run", "--config", cfg, "--image", tag, "--name", job, "--", "cat", "/build")
    assert dry.returncode == 0 and f"First: push {tag} ({newest[7:19]}" in dry.stdout, dry.stdout + dry.stderr
    assert ids_on_nodes(remotes, tag) == [new, new]  # a dry run contacts no host
    ran = dl("up", "--push", "--config", cfg, "--image", tag, "--name", job, "--", "cat", "/build", timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ids_on_nodes(remotes, tag) == [newest, newest]
    said = [line.split("] ", 1)[1].strip() for line in ran.stdout.splitlines() if line.startswith(("[0 ", "[1 "))]
    assert sorted(said) == ["newest", "newest"], ran.stdout
    assert job_containers(job) == []


def test_up_push_without_the_image_here_is_one_line_and_starts_nothing(sim_cluster, job_containers):
    cfg, job = str(sim_cluster[1]), job_name()
    missing = f"dlt-stale/absent-{secrets.token_hex(3)}:v1"
    for extra in (["--dry-run"], []):
        r = dl("up", "--push", *extra, "--config", cfg, "--image", missing, "--name", job, "--", "true")
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
        assert len(lines) == 1 and missing in lines[0] and "--push" in lines[0], lines
    assert job_containers(job) == []


@pytest.mark.hint("doctor.remove-older")
def test_hosts_holding_a_newer_build_are_not_pushed_over(sim_cluster, remotes, stale, engine):
    """A teammate's (or CI's) newer build reached the hosts; this machine still holds the older one."""
    cfg, tag = str(sim_cluster[1]), stale.tag
    older = stale("older")
    newer = stale("newer")
    pushed = dl("push", tag, "--config", cfg, timeout=600)
    assert pushed.returncode == 0 and ids_on_nodes(remotes, tag) == [newer, newer], pushed.stdout + pushed.stderr
    engine.images.get(older).tag(tag)  # this machine's tag points at the older build again
    rows = image_rows(cfg, tag)
    for c in rows:
        assert c["verdict"] == "FAIL" and f"is {newer[7:19]} (built " in c["reason"], c
        assert f"newer than this machine's {older[7:19]}" in c["reason"] and "dockerlaunch push" not in c["reason"]
    # the way the row offers to run the hosts' build: drop the older tag here (its command, run as printed); the
    # hosts agree, so doctor passes
    remove = re.search(r"remove the older tag here \(`(docker image rm [^`]+)`\)", rows[0]["reason"])
    assert remove, rows[0]["reason"]
    removed = subprocess.run(shlex.split(remove.group(1)), capture_output=True, text=True, timeout=60)
    assert removed.returncode == 0, removed.stderr
    assert {c["verdict"] for c in image_rows(cfg, tag)} == {"PASS"}
    assert ids_on_nodes(remotes, tag) == [newer, newer]
