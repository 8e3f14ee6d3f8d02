"""What verify takes from an image's scan (issue 60, findings 2 and 8): the scan runs under the image's own python3,
so what it says is that image's word. Its cuobjdump answers are kept for that Image ID only (as the launcher read it
from the engine before the scan), never read for another image; its output is read in bounded chunks.

Through the real `verify()` with a stand-in `docker` (a Python script here) that answers `image inspect` and, for
`run`, does what scripts/verify_image.py's list_cubins does: a file whose key (realpath|size|mtime_ns) is in the
mounted cache is taken from it, the others are "read" and handed back in cubin_cache_new."""

import json
import shlex
import sys
import tracemalloc
from pathlib import Path

import pytest

from dockerlaunch.images import verify as verifylib
from dockerlaunch.images.verify_judges import FAIL, PASS
from dockerlaunch.images.verify_tools import VerifyError

EVIL, VICTIM = "sha256:" + "e1" * 32, "sha256:" + "b2" * 32
# a file of a public base layer both images hold: the same realpath, size and mtime in each
SHARED = "/usr/local/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so|873120|1700000000000000000"
TRUTH = {"elf": ["sm_90"], "ptx": []}
FORGED = {"elf": ["sm_90", "sm_100"], "ptx": ["sm_100"]}

FAKE_DOCKER = r'''
import json, os, sys
state = json.load(open(os.environ["FAKE_DOCKER_STATE"]))
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_STATE"] + ".calls", "a") as f:
    f.write(json.dumps(args) + "\n")
if args[:2] == ["image", "inspect"]:
    image_id = state["tags"].get(args[-1]) or (args[-1] if args[-1] in state["scans"] else None)
    if image_id is None:
        sys.exit("Error: No such image: " + args[-1])
    print("null amd64 " + image_id)
elif args[:1] == ["rm"]:
    pass
elif args[:1] == ["run"]:
    mounts = {}
    for flag, value in zip(args, args[1:]):
        if flag == "-v":
            source, target = value.split(":")[:2]
            mounts[target] = source
    image = args[args.index("--entrypoint") + 2]
    image_id = state["tags"].get(image, image)
    scan = state["scans"][image_id]
    cache_file = mounts.get("/opt/dockerlaunch-verify/cubins.json")
    cache = json.load(open(cache_file)) if cache_file else {}
    with open(os.environ["FAKE_DOCKER_STATE"] + ".seen", "a") as f:
        f.write(json.dumps({"ran": image, "cache": cache}) + "\n")
    out = sys.stdout.buffer
    for stream, n in ((sys.stderr.buffer, scan.get("flood_stderr", 0)), (out, scan.get("flood_stdout", 0))):
        block = b"x" * (1 << 20) + b"\n"
        for _ in range(n):
            stream.write(block)
        stream.flush()
    cubins, new = {}, {}
    for key, entry in scan["files"].items():
        lib = key.split("|")[0].rsplit("/", 1)[-1]
        if key in cache:
            cubins[lib] = cache[key]
        else:
            cubins[lib] = entry
            new[key] = entry
    new.update(scan.get("plant", {}))
    out.write(json.dumps({"cubins": cubins, "cubin_cache_new": new, "device_dists": {}}).encode() + b"\n")
'''


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """The stand-in docker's path; its state file says which tag is which ID and what each image's scan does."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verifylib, "ensure_tool", lambda tool: tmp_path / "tools" / tool.name)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({
        "tags": {"evil:1": EVIL, "victim:1": VICTIM},
        "scans": {EVIL: {"files": {SHARED: TRUTH}, "plant": {SHARED: FORGED}},
                  VICTIM: {"files": {SHARED: TRUTH}}}}))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    path = tmp_path / "docker"
    path.write_text(f"#!{shlex.quote(sys.executable)}\n{FAKE_DOCKER}")
    path.chmod(0o755)
    return path


def seen(docker: Path) -> list[dict]:
    return [json.loads(x) for x in (docker.parent / "state.json.seen").read_text().splitlines()]


def calls(docker: Path) -> list[list[str]]:
    return [json.loads(x) for x in (docker.parent / "state.json.calls").read_text().splitlines()]


def archs_row(report) -> tuple[str, str]:
    [row] = [c for c in report.checks if c.check.startswith("archs")]
    return row.verdict, row.detail


def test_an_image_cannot_plant_cuobjdump_answers_for_another_images_files(docker):
    """The review's case: an image's scan hands back a forged answer (sm_100) for a file of a public base layer;
    the next verify of another image holding that file must read the file itself, not the planted answer (which
    would pass it for a GPU it has no code for, and doctor reads the same record)."""
    from dockerlaunch.cache import load_image_needs

    verifylib.verify("evil:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
    report = verifylib.verify("victim:1", docker=str(docker), cuda_archs="10.0", checks=("archs",))
    verdict, detail = archs_row(report)
    assert verdict == FAIL and detail.endswith("no cubin for sm_100; cubins: sm_90"), (verdict, detail)
    assert seen(docker)[1] == {"ran": VICTIM, "cache": {}}, seen(docker)  # by the ID it read, with no one's cache
    needs = load_image_needs(VICTIM)
    assert [c.cubins for c in needs.code] == [("sm_90",)], needs
    # the same image verified again reads its own answers (the cache still spares cuobjdump's work), and only its own
    verifylib.verify("victim:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
    assert seen(docker)[2] == {"ran": VICTIM, "cache": {SHARED: TRUTH}}, seen(docker)
    # the forger reads back its own word only: the planted answer never left its Image ID
    verifylib.verify("evil:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
    assert seen(docker)[3] == {"ran": EVIL, "cache": {SHARED: FORGED}}, seen(docker)


def test_the_scan_runs_the_image_whose_id_keys_its_answers(docker):
    """verify reads the Image ID first and runs that ID, not the tag: a tag moved between the two cannot file one
    image's answers under another's ID."""
    verifylib.verify("victim:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
    [run] = [c for c in calls(docker) if c[:1] == ["run"]]
    assert VICTIM in run and "victim:1" not in run, run


def test_the_shared_cache_of_earlier_versions_is_never_read_and_is_removed(docker, tmp_path):
    shared = tmp_path / "cache" / "verify" / "cubins.json"
    shared.parent.mkdir(parents=True)
    shared.write_text(json.dumps({SHARED: FORGED}))
    report = verifylib.verify("victim:1", docker=str(docker), cuda_archs="10.0", checks=("archs",))
    assert archs_row(report)[0] == FAIL and seen(docker)[0]["cache"] == {}
    assert not shared.exists()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_scan_that_prints_without_end_never_fills_the_launchers_memory(docker, stream):
    """64 MB from the image: stdout is read in chunks and cut at SCAN_OUTPUT_LIMIT (8 MB: the scan's answer is one
    JSON line, far smaller), and that is an ERROR line naming the image, its container removed; stderr keeps its
    last 64 KB and the answer after it is judged as usual."""
    state_file = docker.parent / "state.json"
    state = json.loads(state_file.read_text())
    state["scans"][VICTIM][f"flood_{stream}"] = 64
    state_file.write_text(json.dumps(state))
    tracemalloc.start()
    try:
        if stream == "stdout":
            with pytest.raises(VerifyError) as e:
                verifylib.verify("victim:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
            msg = str(e.value)
            assert msg.startswith("verify victim:1: ") and "more than 8 MB on stdout" in msg and "\n" not in msg, msg
            [run] = [c for c in calls(docker) if c[:1] == ["run"]]
            assert ["rm", "-f", run[run.index("--name") + 1]] in calls(docker), calls(docker)
        else:
            report = verifylib.verify("victim:1", docker=str(docker), cuda_archs="9.0", checks=("archs",))
            assert archs_row(report)[0] == PASS, report.render()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, f"the launcher held {peak / 2**20:.0f} MB of the image's output"
