"""Every real nvidia-smi output of tests/data/nvidia-smi/real/ through the real probe over SSH on the sim: node 1 gets
each folder's replay (tests/gpu_standin.py's `replay`, the one stand-in allowed while no GPU is lent) as
/usr/local/bin/nvidia-smi and the folder's kernel log (gpu_standin's `dmesg`: empty where the folder has none) as
/usr/local/bin/dmesg, `probe.probe` asks them under the node's sh (Debian's dash) on one SSH connection, and the
answer is judged as tests/unit/gpu/test_real_outputs.py judges the same folder locally (the expectations and the
comparison, verdicts and whys, are that file's). Then one full `dockerlaunch doctor` on a healthy real H100 output:
no ERROR row."""

import json

import pytest

from dockerlaunch.backends.docker import probe as probelib
from tests import gpu_standin
from tests.integration.helpers import dl, variant
from tests.integration.helpers import tar_files as _tar
from tests.integration.test_gpu_doctor import gpu_node  # noqa: F401  (the fixture)
from tests.unit.gpu.test_real_outputs import differences, expected, judged

HEALTHY = "h100-sxm-590.48.01-exporter"
REPLAYS = "/opt/dl-smi-replays"


@pytest.fixture(scope="module")
def replay_node(sim_cluster, engine, remotes):
    """Node 1 with every folder's replay and kernel log (a `dmesg` stand-in: the sim's own would show this machine's;
    a log with nothing in it where the folder has no dmesg.txt) under REPLAYS (one archive); `use(folder)` makes one
    folder's its nvidia-smi and dmesg."""
    node = engine.containers.get(sim_cluster[2][0].name)
    remote = next(r for r in remotes if r.target.hostname == sim_cluster[2][0].ip)
    files = {f"{f}/{tool}": (script(f).encode(), 0o755) for f in gpu_standin.REAL_FOLDERS
             for tool, script in (("nvidia-smi", gpu_standin.replay), ("dmesg", gpu_standin.dmesg))}
    code, out = node.exec_run(["mkdir", "-p", REPLAYS])
    assert code == 0, out
    node.put_archive(REPLAYS, _tar(files))

    def use(folder: str) -> None:
        for tool in ("nvidia-smi", "dmesg"):
            code, out = node.exec_run(["ln", "-sfn", f"{REPLAYS}/{folder}/{tool}", f"/usr/local/bin/{tool}"])
            assert code == 0, out

    try:
        yield node, remote, use
    finally:
        node.exec_run(["rm", "-rf", REPLAYS, "/usr/local/bin/nvidia-smi", "/usr/local/bin/dmesg"])


def test_every_real_output_gets_its_verdicts_over_ssh(replay_node, sim_cluster):
    """One test over all folders (one connection, ~0.3 s a folder); the failures name their folders together."""
    node, remote, use = replay_node
    master = sim_cluster[2][0].ip
    failed = {}
    for folder in gpu_standin.REAL_FOLDERS:
        use(folder)
        p = probelib.probe(remote, master)
        diffs = differences(folder, p, judged(p))
        if diffs:
            failed[folder] = diffs
    assert not failed, "\n".join(f"{f}: {'; '.join(d)}" for f, d in failed.items())


def test_doctor_on_a_healthy_real_h100_has_no_error_row(replay_node, gpu_node, sim_cluster, tmp_path):  # noqa: F811
    """The whole CLI (probe, GPU container in device mode, judge) on a real R590 H100 output: no ERROR row, and the
    GPU rows its expected.yaml names."""
    _, _, use = replay_node
    _, image = gpu_node
    use(HEALTHY)
    host0 = sim_cluster[2][0].ip
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": host0}], container={"gpus": "all", "gpu_mode": "devices"})
    r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
    report = json.loads(r.stdout)
    rows = {c["check"]: (c["verdict"], c["reason"]) for c in report["checks"]}
    assert [k for k, v in rows.items() if v[0] == "ERROR"] == [], rows
    want = expected(HEALTHY)["verdicts"]
    assert {k: rows[k][0] for k in want} == want, rows
    assert r.returncode == 0, r.stdout + r.stderr


R465 = "rtx2080super-465.27-exporter"  # a real R465: its --help-query-gpu lists no remapped_rows.* and no compute_cap


@pytest.mark.parametrize("help_answers", [True, False], ids=["help decides", "rejections decide"])
def test_a_driver_that_rejects_optional_fields_still_gets_driver_archs_and_health(replay_node, sim_cluster,
                                                                                 help_answers):
    """Real nvidia-smi fails the whole --query-gpu on one field it does not know. Replayed from R465's own help:
    the probe asks only what the help lists; where the help says nothing, each rejection drops its field and the
    rest is asked again (same SSH round trip). Either way the unknown fields cost only themselves."""
    node, remote, use = replay_node
    script = gpu_standin.replay(R465)
    if not help_answers:
        script = script.replace("--help-query-gpu) mode=help ;;", "--help-query-gpu) exit 2 ;;", 1)
        assert "--help-query-gpu) exit 2" in script
    node.put_archive(REPLAYS, _tar({f"{R465}-x/nvidia-smi": (script.encode(), 0o755),
                                    f"{R465}-x/dmesg": (gpu_standin.dmesg(R465).encode(), 0o755)}))
    use(f"{R465}-x")
    p = probelib.probe(remote, sim_cluster[2][0].ip)
    host = p.gpu_host
    assert {"compute_cap", "remapped_rows.pending", "remapped_rows.failure"} <= set(host.unknown_fields), host
    assert host.errors == () and host.driver == "465.27" and len(host.gpus) == 1, host
    g = host.gpus[0]
    assert (g.compute_cap, g.arch, g.remap_pending) == (None, "7.5", None)  # the model's capability, from its name
    rows = judged(p)
    assert set(rows) == {"driver", "archs", "gpu health"} and all(v[0] != "ERROR" for v in rows.values()), rows
    assert rows["archs"][0] == "FAIL" and "7.5" in rows["archs"][1] and "model's name" in rows["archs"][1], rows
