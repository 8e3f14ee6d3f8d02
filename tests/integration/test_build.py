"""The cpu stack, built for real (the `cpu_stack` fixture: fetched wheelhouse, offline build), verify, layer reuse
on an ms-swift bump."""

import os
import re
import shutil
from pathlib import Path

import docker
import pytest
import yaml

from dockerlaunch.gpu import labels
from dockerlaunch.images.build import cached_steps
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix
from tests import cli

pytestmark = pytest.mark.integration

OTHER_SWIFT = "4.0.3"


def dl(*args, env=None, timeout=1800):
    return cli.dl(*args, env=env, timeout=timeout)


# The cpu stack's torch (2.13.0+cpu) is on the PyTorch index, which this machine cannot reach; pip's config here
# points at a folder that has it (PIP_FIND_LINKS), and `stacks lock` is told the same.
LOCAL_TORCH = "/opt/wheels"


def lock_args() -> list[str]:
    local = Path(LOCAL_TORCH)
    if local.is_dir() and any(local.glob("torch-*+cpu-*.whl")):
        return ["--find-links", LOCAL_TORCH, "--torch-index", "none"]
    return []


@pytest.fixture(scope="module")
def bumped_dockerfiles(tmp_path_factory):
    """A copy of Dockerfiles/ whose cpu stack differs only in its ms-swift pin, locked again as a user would."""
    d = tmp_path_factory.mktemp("dockerfiles")
    src = default_dockerfiles_dir()
    shutil.copy(src / "train.Dockerfile", d / "train.Dockerfile")
    shutil.copytree(src / "locks", d / "locks")
    data = yaml.safe_load((src / "stacks.yaml").read_text())
    data["stacks"] = {"cpu": {**data["stacks"]["cpu"], "ms_swift": OTHER_SWIFT}}
    data.pop("recommended", None)  # a matrix of the cpu stack alone: its recommended stack is not in it
    (d / "stacks.yaml").write_text(yaml.safe_dump(data))
    env = {"DOCKERLAUNCH_DOCKERFILES": str(d)}
    stale = dl("stacks", "check", env=env)
    assert stale.returncode == 1 and f"ms-swift==4.0.4 -> ms-swift=={OTHER_SWIFT}" in stale.stdout, stale.stdout
    locked = dl("stacks", "lock", "--stack", "cpu", *lock_args(), env=env, timeout=900)  # the registry, for real
    assert locked.returncode == 0 and "locked cpu:" in locked.stdout, locked.stderr[-2000:]
    fresh = dl("stacks", "check", env=env)
    assert fresh.returncode == 0, fresh.stdout
    # the relock keeps the committed lock's versions: below ms-swift's layer nothing moved, hashes included
    from dockerlaunch.images import lock as locks
    before = locks.parse((src / "locks" / "cpu.lock").read_text(), src / "locks" / "cpu.lock")
    after = locks.parse((d / "locks" / "cpu.lock").read_text(), d / "locks" / "cpu.lock")
    lower = [e for e in before.entries if e.layer != "7-top"]
    assert lower and lower == [e for e in after.entries if e.layer != "7-top"]
    return d


def own_copy(wheelhouse: Path, dest: Path) -> Path:
    """The session's wheelhouse for one test to change: its big files hard-linked (fetch and this test replace
    files, never write into them), its stamps and per-layer locks copied (fetch rewrites those in place)."""
    shutil.copytree(wheelhouse, dest, copy_function=os.link)
    for f in dest.iterdir():
        if f.is_file():
            f.unlink()
            shutil.copy2(wheelhouse / f.name, f)
    return dest


def test_cpu_stack_offline_build_verify_and_layer_reuse(engine, cpu_stack, bumped_dockerfiles, tmp_path):
    stack = load_matrix().get("cpu")
    bumped_tag = stack.tag.replace(f"swift{stack.ms_swift}", f"swift{OTHER_SWIFT}")
    base_image, log = cpu_stack.base_image, cpu_stack.log
    wheelhouse = own_copy(cpu_stack.wheelhouse, tmp_path / "wh")  # the other tests keep the cpu stack's own
    try:
        assert "verify: PASS" in log
        for row in (r"import torch\s+PASS", r"import megatron\.core\s+PASS", r"import swift\s+PASS",
                    rf"version ms_swift\s+PASS\s+pinned {re.escape(stack.ms_swift)}, installed "):
            assert re.search(rf"^{row}", log, re.M), row
        # where the torch layer ran (not from an earlier build's cache), pip read the wheelhouse, not an index
        assert re.search(r"Looking in links: (/wheelhouse/\S+, )*/wheelhouse/1-torch", log) or \
            re.search(r"^#\d+ CACHED", log, re.M)
        assert "Looking in indexes" not in log  # pip never asked an index: the build was offline
        labels = engine.images.get(stack.tag).labels
        assert labels["ai.dockerlaunch.stack"] == "cpu" and labels["ai.dockerlaunch.pin.torch"] == stack.torch
        assert labels["ai.dockerlaunch.verify"] == "/opt/dockerlaunch/verify.json"  # the report is in the image
        report = engine.containers.run(stack.tag, ["cat", "/opt/dockerlaunch/verify.txt"], remove=True).decode()
        assert report.rstrip().endswith("verify: PASS") and re.search(r"^import swift\s+PASS", report, re.M)
        freeze = engine.containers.run(stack.tag, ["cat", "/opt/dockerlaunch/pip-freeze.txt"], remove=True).decode()
        assert re.search(rf"^ms[-_]swift=={re.escape(stack.ms_swift)}$", freeze, re.M | re.I), freeze[:500]

        # verify as its own command, on the built image
        v = dl("verify", stack.tag)
        assert v.returncode == 0 and v.stdout.strip().endswith("verify: PASS"), v.stdout + v.stderr

        # Only the ms-swift pin changes: every layer below ms-swift must come from the cache.
        env = {"DOCKERLAUNCH_DOCKERFILES": str(bumped_dockerfiles)}
        f = dl("fetch", "--stack", "cpu", "-o", str(wheelhouse), env=env)
        assert f.returncode == 0, f.stderr[-2000:]
        said = f.stdout + f.stderr  # only the layer whose pins changed is asked of the index again
        assert "1-torch: up to date" in said and "6-megatron: up to date" in said, said[-2000:]
        assert re.search(rf"7-top: downloading \d+ locked distributions for Python 3\.11 \(.*ms-swift=={OTHER_SWIFT}",
                         said), said[-2000:]
        r2 = dl("build", "--stack", "cpu", "--wheelhouse", str(wheelhouse), "--offline", "--base-image", base_image,
                env=env)
        log2 = r2.stdout + r2.stderr
        assert r2.returncode == 0, log2[-4000:]
        cached, ran = cached_steps(log2)
        # at most the top layer ran (the last step of the train stage; it is cached too when an earlier run of this
        # test on this machine built the same bump): every layer below it came from the cache
        assert all(step.split()[0].split("/")[0] == step.split()[0].split("/")[1] for step in ran), ran
        assert len(ran) <= 1 and len(cached) >= 8, (cached, ran)  # system, pip env, toolkit, torch, build, TE, ...
        assert re.search(rf"^version ms_swift\s+PASS\s+pinned {OTHER_SWIFT}, installed ms-swift {OTHER_SWIFT}", log2,
                         re.M), log2[-3000:]
    finally:
        try:
            engine.images.remove(bumped_tag, force=True)  # the cpu stack itself stays for the ms-swift tests
        except Exception:
            pass


def test_offline_build_without_wheelhouse_is_refused():
    r = dl("build", "--stack", "cpu", "--offline")
    assert r.returncode == 2 and "--offline needs --wheelhouse" in r.stderr


def test_a_wheelhouse_file_that_is_not_the_locked_one_stops_the_build_in_one_line(engine, cpu_stack, tmp_path):
    """The fetched wheelhouse with one wheel swapped for other bytes: the offline build checks every file against
    the committed lock before it starts, names the file in one line, and tags nothing."""
    wheelhouse = own_copy(cpu_stack.wheelhouse, tmp_path / "wh")
    [peft] = list((wheelhouse / "7-top").glob("peft-*.whl"))
    peft.unlink()  # a new file, not the hard-linked one the other tests share
    peft.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    tag = "dockerlaunch/train:tampered"
    r = dl("build", "--stack", "cpu", "--wheelhouse", str(wheelhouse), "--offline",
           "--base-image", cpu_stack.base_image, "--tag", tag)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and err and err[-1].startswith("error: build of stack cpu: 7-top/peft-"), r.stderr[-2000:]
    assert "does not match the lock's hash" in err[-1] and "dockerlaunch fetch --stack cpu" in err[-1]
    assert "nothing was tagged" in err[-1]
    with pytest.raises(docker.errors.ImageNotFound):
        engine.images.get(tag)


# ---- what the built image keeps and what `build` stamps (issue 50)


def test_the_built_images_constraint_file_keeps_its_pins_against_a_later_pip_install(engine, cpu_stack, tmp_path):
    """The cpu image as `build` made it: train.Dockerfile's top layer put the file keep_pins_text generates
    from the lock at /etc/dockerlaunch/constraints.txt and PIP_CONSTRAINT names it. An offline `pip install` in the
    image of something that needs another torch fails naming the pin; one that takes the image's torch moves
    nothing; with PIP_CONSTRAINT emptied (how the file says to move a pin on purpose) pip would move torch: the
    constraint is what holds it."""
    from dockerlaunch.images import build_context
    from dockerlaunch.images import lock as locks
    from tests.integration.test_verify import tiny_wheel

    stack = load_matrix().get("cpu")
    lock_path = default_dockerfiles_dir() / "locks" / "cpu.lock"
    generated = build_context.keep_pins_text(stack, locks.parse(lock_path.read_text(), lock_path))
    assert f"torch=={stack.torch}\n" in generated, generated
    env = dict(kv.split("=", 1) for kv in engine.images.get(cpu_stack.tag).attrs["Config"]["Env"])
    assert env["PIP_CONSTRAINT"] == "/etc/dockerlaunch/constraints.txt", env

    links = tmp_path / "links"
    links.mkdir()
    tiny_wheel(links, "torch", [])  # torch 1.0: another torch, only metadata
    tiny_wheel(links, "dlt-needs-torch", ["torch>=2.0"])
    tiny_wheel(links, "dlt-wants-other-torch", ["torch==1.0"])
    links.chmod(0o755)
    script = ("cat /etc/dockerlaunch/constraints.txt; echo '@@ MOVE'; "
              "pip install --no-cache-dir --no-index --find-links /w dlt-wants-other-torch 2>&1; echo \"@@ RC=$?\"; "
              "echo '@@ TAKE'; pip install --no-cache-dir --no-index --find-links /w dlt-needs-torch 2>&1; "
              "echo \"@@ RC=$?\"; echo '@@ FREE'; PIP_CONSTRAINT= pip install --dry-run --no-cache-dir --no-index "
              "--find-links /w dlt-wants-other-torch 2>&1; echo \"@@ RC=$?\"; "
              "python -c 'import importlib.metadata as m; print(\"@@ TORCH\", m.version(\"torch\"))'")
    out = engine.containers.run(cpu_stack.tag, ["sh", "-c", script], entrypoint=[], network_mode="none",
                                volumes={str(links): {"bind": "/w", "mode": "ro"}}, remove=True).decode()
    in_image, move, take, free = re.split(r"^@@ (?:MOVE|TAKE|FREE)\n", out, flags=re.M)
    assert in_image == generated, (in_image, generated)
    assert "@@ RC=0" not in move and f"torch=={stack.torch}" in move and "constraint" in move, move
    assert take.rstrip().endswith("@@ RC=0") and "Successfully installed dlt-needs-torch-1.0" in take, take
    assert "Would install dlt-wants-other-torch-1.0 torch-1.0" in free and "@@ RC=0" in free, free
    assert out.rstrip().endswith(f"@@ TORCH {stack.torch}"), out[-2000:]


def test_a_verify_that_ends_in_error_fails_the_build_and_leaves_the_image_unstamped(engine, cpu_stack, tmp_path):
    """`build` whose verify could not run one check (a pyelftools that cannot be imported: the symbol scan is an
    ERROR) and failed none: exit 1, the report ends in ERROR, and no report or verify label goes into the image,
    so nothing later reads it as verified."""
    from tests.integration.test_verify import broken_tool_cache

    tag = "dlt-build/verify-error:1"
    try:
        r = dl("build", "--stack", "cpu", "--wheelhouse", str(cpu_stack.wheelhouse), "--offline",
               "--base-image", cpu_stack.base_image, "--tag", tag, env=broken_tool_cache(tmp_path, "pyelftools"))
        out = r.stdout
        assert r.returncode == 1 and out.rstrip().endswith("verify: ERROR"), (out[-3000:], r.stderr[-2000:])
        assert re.search(r"^symbols\b.*\bERROR\b.*pyelftools could not be imported", out, re.M), out[-3000:]
        assert re.search(rf"^verify {tag}: \d+ PASS, 0 FAIL, 1 ERROR\b", out, re.M), out[-3000:]  # no FAIL
        assert "verify report in the image" not in out
        image = engine.images.get(tag)  # built and tagged, but carries no verdict
        assert labels.VERIFY not in image.labels, image.labels
        ls = engine.containers.run(tag, ["sh", "-c", "ls /opt/dockerlaunch/"], entrypoint=[], network_mode="none",
                                   remove=True).decode().split()
        assert "verify.json" not in ls and "verify.txt" not in ls and "pip-freeze.txt" in ls, ls
    finally:
        try:
            engine.images.remove(tag, force=True)
        except docker.errors.APIError:
            pass
