"""The smoke's judge (pure) on the lines scripts/smoke.py prints, and the script's GPU plan (its --dry-run)."""

import subprocess
import sys

from dockerlaunch.backends.docker.doctor.report import Report
from dockerlaunch.diagnostics import script
from dockerlaunch.diagnostics import smoke as s

H1, H2 = "10.0.0.1", "10.0.0.2"


def step(name, rank, addr, value, ok=True, unit="TFLOP/s", local=0, **kw):
    return {"kind": "step", "step": name, "rank": rank, "local_rank": local, "host": f"node{addr[-1]}",
            "gpu": "NVIDIA H100 80GB HBM3", "ok": ok, "value": value, "unit": unit, "addr": addr, "err": 0.004,
            "tol": 0.02, **kw}


def rows(records, hosts=(H1, H2), code=0):
    return {(r.host, r.check): (r.verdict, r.detail) for r in s.judge(records, list(hosts), None, code)}


def test_a_gpu_20_percent_slower_than_its_peers_is_named_and_nothing_fails():
    recs = [step("matmul", r, H1 if r < 2 else H2, v, local=r % 2) for r, v in enumerate((700, 690, 705, 480))]
    got = rows(recs)
    assert got[(H1, "smoke matmul")] == ("PASS", "690..700 TFLOP/s on 2 rank(s), max error 0.004 (tolerance 0.02)")
    assert got[(H2, "straggler")][0] == "WARN"
    assert got[(H2, "straggler")][1].startswith("rank 3 GPU 1 (NVIDIA H100 80GB HBM3) is 31% slower than the "
                                                "median of its peers at matmul (480 TFLOP/s)")
    assert [k for k in got if k[1] == "straggler"] == [(H2, "straggler")]


def test_for_times_lower_is_better():
    recs = [step("te linear", r, H1 if r == 0 else H2, v, unit="ms") for r, v in enumerate((2.0, 2.1, 3.0))]
    assert [k for k, v in rows(recs).items() if k[1] == "straggler"] == [(H2, "straggler")]
    assert "rank 2" in rows(recs)[(H2, "straggler")][1]


def test_a_wrong_result_or_an_error_fails_naming_rank_gpu_and_why():
    recs = [step("flash-attn", 0, H1, 1.2, unit="ms"),
            step("flash-attn", 1, H2, 1.2, ok=False, unit="ms", err=0.9),
            step("apex norm", 0, H1, None, ok=False, error="RuntimeError: CUDA error: no kernel image is "
                                                           "available for execution on the device")]
    got = rows(recs)
    assert got[(H2, "smoke flash-attn")] == ("FAIL", "rank 1 GPU 0 (NVIDIA H100 80GB HBM3): error 0.9 above 0.02 "
                                                     "against the reference")
    assert got[(H1, "smoke apex norm")][0] == "FAIL" and "no kernel image" in got[(H1, "smoke apex norm")][1]


def test_a_step_the_image_lacks_is_a_skip_and_a_silent_host_a_failure():
    recs = [step("matmul", 0, H1, 700), {**step("te linear", 0, H1, None), "skip": "not in the image (x)"}]
    got = rows(recs)
    assert got[(H1, "smoke te linear")] == ("SKIP", "not in the image (x)")
    assert got[(H2, "smoke")] == ("FAIL", "no rank on this host reported (the smoke job's output is above)")
    assert rows([], code=137)[(H1, "smoke")][0] == "FAIL"


def test_rows_go_into_a_doctor_report_by_host_rank():
    report = Report()
    s.add_to(report, s.SmokeResult(s.judge([step("matmul", 0, H2, 1.0)], [H1, H2], None, 0), [], 0), [H1, H2])
    assert [(c.host, c.check, c.rank) for c in report.checks] == [(H1, "smoke", 0), (H2, "smoke matmul", 1)]


def test_the_gpu_steps_are_ready_and_need_no_torch_to_list():
    r = subprocess.run([sys.executable, "-S", "-c", script("smoke.py"), "--dry-run"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    for name in ("matmul", "te linear", "flash-attn", "apex norm", "all_reduce host", "all_reduce world"):
        assert f"  {name} " in r.stdout
    compile(script("smoke.py"), "smoke.py", "exec")  # every GPU step's code at least parses


def test_the_cpu_path_says_its_transport_is_gloo():
    got = rows([{"kind": "header", "backend": "gloo"}, step("matmul", 0, H1, 1.0)], hosts=(H1,))
    assert got[(H1, "smoke transport")][0] == "SKIP" and "gloo over TCP" in got[(H1, "smoke transport")][1]
