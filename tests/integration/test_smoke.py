"""`doctor --smoke` on the sim, for real: the CPU path of scripts/smoke.py (a matmul, gloo all_reduce across the
hosts) in the job's image under torchrun, with node 2's smoke container slowed to a quarter of a CPU (`docker
update --cpus 0.25` by node 2's own engine as soon as the container exists: the nodes' engines put their containers
in cgroups of their own, so limiting the node itself would not reach them): the smoke names node 2 as the
straggler, every other row passes, and the library steps the CPU image lacks are SKIPs."""

import json
import threading
import time

from tests.integration.helpers import dl


def _slow_the_smoke_container(node, stop: threading.Event, done: list[str]) -> None:
    while not stop.is_set():
        code, out = node.exec_run(["docker", "ps", "-q", "--filter", "name=smoke"])
        ids = out.decode().split() if code == 0 else []
        for cid in ids:
            code, out = node.exec_run(["docker", "update", "--cpus", "0.25", cid])
            if code == 0:
                done.append(cid)
                return
        time.sleep(0.1)


def test_doctor_smoke_names_the_slowed_node(sim_cluster, engine, demo_image):
    ip1, ip2 = (n.ip for n in sim_cluster[2])
    node2 = engine.containers.get(sim_cluster[2][1].name)
    stop, slowed = threading.Event(), []
    t = threading.Thread(target=_slow_the_smoke_container, args=(node2, stop, slowed), daemon=True)
    t.start()
    try:
        r = dl("doctor", "--config", str(sim_cluster[1]), "--image", demo_image, "--smoke", "--output", "json",
               timeout=600)
    finally:
        stop.set()
        t.join(30)
    assert slowed, "node 2's smoke container was never seen"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {(c["host"], c["check"]): (c["verdict"], c["reason"]) for c in json.loads(r.stdout)["checks"]}
    for ip in (ip1, ip2):
        assert rows[(ip, "smoke matmul")][0] == "PASS", rows
        assert "GFLOP/s on 1 rank(s)" in rows[(ip, "smoke matmul")][1]
        assert rows[(ip, "smoke all_reduce world")][0] == "PASS", rows
        for lib in ("smoke te linear", "smoke flash-attn", "smoke apex norm"):
            assert rows[(ip, lib)][0] == "SKIP" and "not in the image" in rows[(ip, lib)][1], rows
    assert rows[(ip1, "smoke transport")][0] == "SKIP"  # gloo: NCCL's transport is read where it runs on GPUs
    stragglers = {k: v for k, v in rows.items() if k[1] == "straggler"}
    assert list(stragglers) == [(ip2, "straggler")], stragglers
    verdict, reason = stragglers[(ip2, "straggler")]
    assert verdict == "WARN" and reason.startswith("rank 1 (CPU) is ") and "slower than the median of its peers at " \
        "matmul" in reason, reason


def test_up_smoke_starts_the_job_only_after_the_smoke_passed(sim_cluster, demo_image, tools_image, job_containers):
    ok = dl("up", "--config", str(sim_cluster[1]), "--image", demo_image, "--name", "smoky", "--smoke", "--",
            "sh", "-c", "echo the-job-ran", timeout=600)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "smoke matmul" in ok.stdout and "the-job-ran" in ok.stdout
    assert ok.stdout.index("smoke matmul") < ok.stdout.index("the-job-ran")
    # an image the smoke cannot run in (no torch): FAIL, and the job never starts
    bad = dl("up", "--config", str(sim_cluster[1]), "--image", tools_image, "--name", "smoky2", "--smoke", "--",
             "sh", "-c", "echo the-job-ran", timeout=600)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-2000:]
    assert "smoke FAILED: the job was not started" in bad.stdout + bad.stderr
    assert "the-job-ran" not in bad.stdout
    assert job_containers("smoky2") == [] and job_containers("smoky2-smoke") == []
