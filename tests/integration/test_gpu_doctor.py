"""doctor joins the image and the hosts, end to end on the sim: a stand-in nvidia-smi (tests/gpu_standin.py, the
one stand-in allowed while no GPU is lent) on node 1's PATH, dummy /dev/nvidia0 and /dev/nvidiactl and stub driver
libraries so that the job's GPU container starts in device mode; the readings reach doctor through the real probe
over SSH. Each broken case must be the only FAIL of its run, naming the host, the values and the fix; the healthy
one passes."""

import json
import secrets

import pytest

from tests import gpu_standin
from tests.integration.helpers import (
    GPU_HOST_SETUP,
    GPU_HOST_TEARDOWN,
    dl,
    put_stub_driver,
    tar_files,
    variant,
)

LABELS = {"ai.dockerlaunch.pin.cuda": "13.0", "ai.dockerlaunch.cuda-archs": "9.0",
          "ai.dockerlaunch.stack": "swift4.6-mcore0.19-cu13-py313",
          "ai.dockerlaunch.compiled": "transformer-engine-torch,apex,flash-attn"}


@pytest.fixture(scope="module")
def gpu_node(sim_cluster, engine, demo_image, tmp_path_factory):
    """Node 1 as a GPU host as far as its probe can tell, and an image with the recommended stack's labels there.
    Everything is taken away at the end (the other tests share the cluster)."""
    node = engine.containers.get(sim_cluster[2][0].name)
    put_stub_driver(node, tmp_path_factory.mktemp("gpu"))
    image = f"dlt-gpu/{secrets.token_hex(3)}:labelled"
    dockerfile = f"FROM {demo_image}\n" + "".join(f"LABEL {k}={v}\n" for k, v in LABELS.items())
    setup = f"{GPU_HOST_SETUP} && printf '%s' '{dockerfile}' | docker build -q -t {image} -"
    code, out = node.exec_run(["sh", "-c", setup])
    try:
        assert code == 0, out.decode()
        yield node, image
    finally:
        node.exec_run(["sh", "-c", f"rm -f /usr/local/bin/nvidia-smi; {GPU_HOST_TEARDOWN}; docker rmi -f {image}; "
                                   "pkill -f 'sleep 86400' || true"])


def _doctor(sim_cluster, tmp_path, node, image, case: str, pid: int | None = None):
    node.put_archive("/usr/local/bin", tar_files({"nvidia-smi": (gpu_standin.script(case, pid).encode(), 0o755)}))
    host0 = sim_cluster[2][0].ip
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": host0}],
                  container={"gpus": "all", "gpu_mode": "devices"})
    r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert {c["host"] for c in report["checks"]} == {host0}
    return r, {c["check"]: (c["verdict"], c["reason"]) for c in report["checks"]}


def test_doctor_passes_a_healthy_h100_host(sim_cluster, gpu_node, tmp_path):
    node, image = gpu_node
    r, rows = _doctor(sim_cluster, tmp_path, node, image, "h100-healthy")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows["gpus"][0] == "PASS" and "2 GPU(s) visible in the container" in rows["gpus"][1], rows
    assert rows["driver"] == ("PASS", "driver 580.95.05 (CUDA 13.0) runs the image's CUDA 13.0")
    assert rows["archs"][0] == "PASS" and rows["gpu health"][0] == "PASS", rows


@pytest.mark.parametrize("case, check, words", [
    ("driver-570", "driver", "driver 570.86.15 runs CUDA <= 12.8; the image needs 13.0 (R580+): upgrade the driver"),
    ("a100", "archs", "GPUs 0,1 NVIDIA A100-SXM4-80GB (8.0, sm_80): the image's transformer-engine-torch, apex, "
                      "flash-attn hold code only for 9.0"),
])
def test_doctor_fails_one_row_for_what_the_image_cannot_run_on(sim_cluster, gpu_node, tmp_path, case, check, words):
    node, image = gpu_node
    r, rows = _doctor(sim_cluster, tmp_path, node, image, case)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = {k: v for k, v in rows.items() if v[0] in ("FAIL", "ERROR")}
    assert list(failed) == [check], rows
    assert words in failed[check][1]


def test_doctor_names_a_leftover_process_holding_a_gpu(sim_cluster, gpu_node, tmp_path):
    node, image = gpu_node
    # a real process of another user on the host: the probe's ps tells its owner
    code, out = node.exec_run(["sh", "-c", "su nobody -s /bin/sh -c 'sleep 86400 >/dev/null 2>&1 & echo $!'"])
    assert code == 0, out
    pid = int(out.decode().strip().splitlines()[-1])
    r, rows = _doctor(sim_cluster, tmp_path, node, image, "leftover", pid=pid)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = {k: v for k, v in rows.items() if v[0] in ("FAIL", "ERROR")}
    assert list(failed) == ["gpu health"], rows
    assert failed["gpu health"][1] == (f"GPU 0 holds 71234 MiB of pid {pid} (sleep, user nobody), not "
                                       f"this job's: a leftover of another job? stop it (kill {pid}) or give the job "
                                       "other GPUs")


# nvidia-smi(1)'s words when one GPU's handle cannot be had; exit 255, "other error" (RETURN VALUE)
APPS_FAIL = "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error"


def test_a_check_that_could_not_run_alone_exits_1_and_stops_up(sim_cluster, gpu_node, remotes, tmp_path):
    """A healthy H100 host whose nvidia-smi cannot list the processes on its GPUs: doctor's only non-PASS row is the
    ERROR of a check that could not run (no FAIL anywhere). It proves nothing, so doctor exits 1 and `up` starts
    nothing, as for a FAIL, through the real CLI and probe over SSH."""
    from tests.integration.helpers import containers_on, job_name

    node, image = gpu_node
    head, branch, rest = gpu_standin.script("h100-healthy").partition("  --query-compute-apps=*)\n")
    recorded, end, tail = rest.partition("    ;;\n")
    assert branch and "DL_SMI_EOF" in recorded, "the stand-in's compute-apps branch moved"
    smi = f"{head}{branch}    echo '{APPS_FAIL}'\n    exit 255\n{end}{tail}"
    node.put_archive("/usr/local/bin", tar_files({"nvidia-smi": (smi.encode(), 0o755)}))
    host0 = sim_cluster[2][0].ip
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": host0}],
                  container={"gpus": "all", "gpu_mode": "devices"})

    r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
    report = json.loads(r.stdout)
    rows = {c["check"]: (c["verdict"], c["reason"]) for c in report["checks"]}
    assert {k: v for k, v in rows.items() if v[0] in ("FAIL", "ERROR")} == {"gpu health": (
        "ERROR", f"could not check: nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory "
                 f"--format=csv,noheader,nounits: {APPS_FAIL}")}, rows
    assert rows["driver"][0] == rows["archs"][0] == rows["gpus"][0] == "PASS", rows  # the rest of it is healthy
    assert r.returncode == 1, r.stdout + r.stderr
    assert report["counts"]["FAIL"] == 0 and report["ok"] is False, report["counts"]

    job = job_name()
    up = dl("up", "--config", cfg, "--image", image, "--name", job, "--", "sleep", "600", timeout=600)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "preflight FAILED (1 check(s)); nothing was started" in up.stdout, up.stdout
    assert containers_on(remotes[0], job) == []
