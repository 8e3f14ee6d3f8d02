"""Forward compatibility end to end on the sim, with no nvidia/cuda image (none can be pulled here): a local image
FROM the demo image carrying cuda-compat the way nvidia/cuda lays it out (/usr/local/cuda/compat/libcuda.so.580.65.06,
a stub with the `.note.cuda.fwd_compatibility` ELF note, and nvidia/cuda 13.0's CUDA_VERSION/NVIDIA_REQUIRE_CUDA).
`dockerlaunch verify` reads it inside the image; the real doctor, over SSH through the real probe, judges it against
the stand-in nvidia-smi (tests/gpu_standin.py) answering as R570 on H100s (WARN: forward compatibility, and device
mode puts the compat folder first) and as the same driver on GeForce cards (FAIL naming CUDA error 804)."""

import json
import secrets

import pytest

from dockerlaunch.cache import image_needs_path, load_image_needs
from dockerlaunch.gpu.needs import CudaCompat
from tests import gpu_standin
from tests.integration.helpers import GPU_HOST_SETUP, GPU_HOST_TEARDOWN, dl, put_stub_driver, tar_files, variant
from tests.unit.gpu.test_compat import REQUIRE, compat_stub

pytestmark = pytest.mark.integration

COMPAT = "580.65.06"
NOTE = {"Format": 1, "CUDA Version": "13.0", "Driver": [535, 550, 570, 575, 580], "Device": [1, 2, 7, 8, 9, 10]}
CONTEXT = {"libcuda.so.580.65.06": (compat_stub(NOTE), 0o755)}


def dockerfile(base: str) -> str:
    return (f"FROM {base}\n"
            f"COPY libcuda.so.{COMPAT} /usr/local/cuda-13.0/compat/\n"
            f"RUN ln -s libcuda.so.{COMPAT} /usr/local/cuda-13.0/compat/libcuda.so.1 && "
            "ln -s cuda-13.0 /usr/local/cuda\n"
            "ENV CUDA_VERSION=13.0.1\n"
            f"ENV NVIDIA_REQUIRE_CUDA=\"{REQUIRE}\"\n")


@pytest.fixture(scope="module")
def compat_node(sim_cluster, engine, demo_image, tmp_path_factory):
    """Node 1 as a GPU host as far as its probe can tell (as test_gpu_doctor's, without the labelled image) and the
    compat image built there; all taken away at the end."""
    node = engine.containers.get(sim_cluster[2][0].name)
    put_stub_driver(node, tmp_path_factory.mktemp("compat"))
    image = f"dlt-compat/{secrets.token_hex(3)}:cuda13"
    ctx = f"/tmp/{image.split('/')[1].replace(':', '-')}"
    node.exec_run(["mkdir", "-p", ctx])
    node.put_archive(ctx, tar_files({**CONTEXT, "Dockerfile": (dockerfile(demo_image).encode(), 0o644)}))
    setup = f"{GPU_HOST_SETUP} && docker build -q -t {image} {ctx}"
    code, out = node.exec_run(["sh", "-c", setup])
    try:
        assert code == 0, out.decode()
        yield node, image
    finally:
        node.exec_run(["sh", "-c", f"rm -rf {ctx} /usr/local/bin/nvidia-smi; {GPU_HOST_TEARDOWN}; "
                                   f"docker rmi -f {image}"])


def _doctor(sim_cluster, tmp_path, node, image, smi: str):
    node.put_archive("/usr/local/bin", tar_files({"nvidia-smi": (smi.encode(), 0o755)}))
    host0 = sim_cluster[2][0].ip
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": host0}],
                  container={"gpus": "all", "gpu_mode": "devices"})
    r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    report = json.loads(r.stdout)
    return r, {c["check"]: (c["verdict"], c["reason"]) for c in report["checks"]}


def test_an_r570_data_center_host_runs_a_cuda_13_image_through_forward_compatibility(sim_cluster, compat_node,
                                                                                   tmp_path):
    node, image = compat_node
    r, rows = _doctor(sim_cluster, tmp_path, node, image, gpu_standin.script("driver-570"))
    assert rows["driver"][0] == "WARN", rows
    assert "driver 570.86.15 (CUDA 12.8): CUDA 13.0 via forward compatibility (compat 580.65.06 over R570)" \
        in rows["driver"][1]
    # the GPU container doctor started in device mode put the image's compat folder first, and says so
    assert rows["gpus"][0] == "PASS", rows
    assert "the image's cuda-compat (/usr/local/cuda/compat) goes first on LD_LIBRARY_PATH" in rows["gpus"][1]
    assert not [k for k, v in rows.items() if v[0] in ("FAIL", "ERROR")], rows
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_geforce_host_of_the_same_driver_fails_naming_804(sim_cluster, compat_node, tmp_path):
    node, image = compat_node
    smi = gpu_standin.script("driver-570")
    assert "NVIDIA H100 80GB HBM3" in smi, "the stand-in's model name moved"
    r, rows = _doctor(sim_cluster, tmp_path, node, image, smi.replace("NVIDIA H100 80GB HBM3",
                                                                      "NVIDIA GeForce RTX 4090"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert {k for k, v in rows.items() if v[0] in ("FAIL", "ERROR")} == {"driver"}, rows
    assert "NVIDIA GeForce RTX 4090: CUDA error 804" in rows["driver"][1], rows


def test_verify_reads_the_compat_library_and_its_elf_note_into_the_images_record(engine, demo_image, tmp_path):
    """verify runs its scan inside the image (here, the same image built on this machine) and keeps what doctor
    will read by the Image ID."""
    for name, (data, mode) in CONTEXT.items():
        (tmp_path / name).write_bytes(data)
        (tmp_path / name).chmod(mode)
    (tmp_path / "Dockerfile").write_text(dockerfile(demo_image))
    tag = f"dlt-compat/{secrets.token_hex(3)}:verify"
    image = engine.images.build(path=str(tmp_path), tag=tag, rm=True)[0]
    try:
        r = dl("verify", tag, "--checks", "dists", "--output", "json", timeout=300)
        report = json.loads(r.stdout)
        rows = {c["check"]: (c["verdict"], c["detail"]) for c in report["checks"]}
        assert rows["cuda-compat"] == ("NOTE", "cuda-compat 580.65.06 in /usr/local/cuda/compat (CUDA 13.0): forward "
                                               "compatibility for R535, R550, R570, R575, from its ELF note: used "
                                               "only where a host's driver is older than the image's CUDA needs "
                                               "(doctor judges each host's)"), rows
        needs = load_image_needs(image.id)
        assert needs is not None and needs.compat == CudaCompat(COMPAT, (535, 550, 570, 575),
                                                                "/usr/local/cuda/compat", "13.0")
    finally:
        image_needs_path(image.id).unlink(missing_ok=True)
        engine.images.remove(tag, force=True)
