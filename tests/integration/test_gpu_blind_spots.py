"""The GPU blind spots of issue 51 (part 4), end to end on the sim through the real probe.sh over SSH and the real
doctor CLI: a MIG leftover that per-process memory cannot show, an HGX A100 whose fabric manager is down while NVML
reports no fabric state, and XIDs in the kernel log judged against the driver's load (or a window the user sets).

Node 1 plays the GPU host. Stand-ins for dmesg and systemctl join the stand-in nvidia-smi (the only stand-ins the
project allows while no GPU is lent): each is a shell script in /usr/local/bin that prints what the real command
prints on such a host (the kernel log's `[seconds] NVRM: ...` lines, systemd's `is-active` word and exit status);
NVSwitch presence is what the probe looks for, /dev/nvidia-nvswitchN (here plain files: the probe tests `-e`); the
fabric manager outside systemd is a real process of its name, found by the probe's pgrep. The nvidia-smi outputs
are the written cases tests/data/nvidia-smi/mig-leftover, hgx-a100 and h100-healthy. Every run also checks that
the driver and archs rows still judge (PASS) beside the health row."""

import json
import secrets

import pytest

from tests import gpu_standin
from tests.integration.helpers import GPU_HOST_SETUP, GPU_HOST_TEARDOWN, dl, put_stub_driver, tar_files, variant

# code for both the A100 (8.0) and the H100 (9.0): archs passes on every case, so health is the row under test
LABELS = {"ai.dockerlaunch.pin.cuda": "13.0", "ai.dockerlaunch.cuda-archs": "8.0;9.0",
          "ai.dockerlaunch.stack": "swift4.6-mcore0.19-cu13-py313",
          "ai.dockerlaunch.compiled": "transformer-engine-torch,apex,flash-attn"}
STANDINS = ("nvidia-smi", "dmesg", "systemctl", "nv-fabricmanager")
NVSWITCHES = 6  # an HGX A100 8-GPU baseboard's

# the kernel log as `dmesg` prints it (`[%5lu.%06lu] text`); a time below zero is that many seconds before now (the
# node's /proc/uptime), for the window the user sets
BOOT = [(0.0, "Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0) "
              "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"),
        (4.431207, "nvidia: loading out-of-tree module taints kernel."),
        (4.612345, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
                   "(dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 09:55:41 UTC 2025")]
RELOAD = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025"


def xid(bus: str, code: int, words: str) -> str:
    return f"NVRM: Xid (PCI:{bus}): {code}, {words}"


FALLEN = "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
WARP = "pid=8812, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"
DBE = "pid='<unknown>', name=<unknown>, DBE (double bit error) ECC error"




def dmesg(lines: list[tuple[float, str]]) -> str:
    body = "".join(f"{at}|{text}\n" for at, text in lines)
    return ("#!/bin/sh\n# stand-in dmesg (tests only): the kernel log of a GPU host, as dmesg prints it\n"
            "awk -v u=\"$(cut -d ' ' -f 1 /proc/uptime)\" '{i = index($0, \"|\"); t = substr($0, 1, i - 1) + 0; "
            "if (t < 0) t = u + t; printf \"[%12.6f] %s\\n\", t, substr($0, i + 1)}' <<'DL_DMESG_EOF'\n"
            f"{body}DL_DMESG_EOF\n")


def systemctl(word: str, status: int) -> str:
    """systemd's answer to `systemctl is-active nvidia-fabricmanager` (active 0; inactive, failed 3)."""
    return ("#!/bin/sh\n# stand-in systemctl (tests only): what systemd says of nvidia-fabricmanager\n"
            'if [ "$1" = is-active ] && [ "$2" = nvidia-fabricmanager ]; then\n'
            f"  echo {word}\n  exit {status}\nfi\n"
            'echo "stand-in systemctl: $* is not recorded" >&2\nexit 1\n')


@pytest.fixture(scope="module")
def gpu_node(sim_cluster, engine, demo_image, tmp_path_factory):
    """Node 1 as a GPU host as far as its probe can tell (device nodes, stub driver libraries), an image with code
    for 8.0 and 9.0 there, and a real process of another user for the leftover. All taken away at the end."""
    node = engine.containers.get(sim_cluster[2][0].name)
    put_stub_driver(node, tmp_path_factory.mktemp("blind"))
    image = f"dlt-blind/{secrets.token_hex(3)}:labelled"
    dockerfile = f"FROM {demo_image}\n" + "".join(f'LABEL {k}="{v}"\n' for k, v in LABELS.items())
    setup = (f"{GPU_HOST_SETUP} && printf '%s' '{dockerfile}' | docker build -q -t {image} - "
             "&& su nobody -s /bin/sh -c 'sleep 86400 >/dev/null 2>&1 & echo $!'")
    code, out = node.exec_run(["sh", "-c", setup])
    pid = int(out.decode().strip().splitlines()[-1]) if code == 0 else None
    try:
        assert code == 0, out.decode()
        yield node, image, pid
    finally:
        node.exec_run(["sh", "-c", f"{f'kill {pid}; ' if pid else ''}"
                                   f"rm -f {' '.join(f'/usr/local/bin/{s}' for s in STANDINS)} "
                                   f"/dev/nvidia-nvswitch[0-9]*; {GPU_HOST_TEARDOWN}; docker rmi -f {image}"])


def _doctor(sim_cluster, tmp_path, node, image, smi: str, log: list[tuple[float, str]],
            fm: str | None = None, nvswitches: int = 0, **config) -> tuple[int, dict[str, tuple[str, str]]]:
    """One doctor run on node 1 with these stand-ins: nvidia-smi's script, the kernel log, systemctl's word for the
    fabric manager (None: no systemctl), so many NVSwitch device nodes."""
    files = {"nvidia-smi": (smi.encode(), 0o755), "dmesg": (dmesg(log).encode(), 0o755)}
    if fm is not None:
        files["systemctl"] = (systemctl(fm, 0 if fm == "active" else 3).encode(), 0o755)
    node.put_archive("/usr/local/bin", tar_files(files))
    switches = " ".join(f"/dev/nvidia-nvswitch{i}" for i in range(nvswitches))
    gone = "/dev/nvidia-nvswitch[0-9]*" + (" /usr/local/bin/systemctl" if fm is None else "")
    code, out = node.exec_run(["sh", "-c", f"rm -f {gone}" + (f" && touch {switches}" if switches else "")])
    assert code == 0, out
    host0 = sim_cluster[2][0].ip
    cfg = variant(sim_cluster, tmp_path, hosts=[{"address": host0}],
                  container={"gpus": "all", "gpu_mode": "devices"}, **config)
    r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert {c["host"] for c in report["checks"]} == {host0}
    rows = {c["check"]: (c["verdict"], c["reason"]) for c in report["checks"]}
    # the driver and archs rows judge beside whatever health finds
    assert rows["driver"] == ("PASS", "driver 580.95.05 (CUDA 13.0) runs the image's CUDA 13.0"), rows
    assert rows["archs"][0] == "PASS", rows
    return r.returncode, rows


def _only_health(rows: dict[str, tuple[str, str]], verdict: str) -> str:
    """The health row's reason, after checking it is the one row that is not PASS (or a SKIP/INFO).

    The disk row measures the real disk under the sim's docker root (a CI machine may have under 20 GB free): a WARN
    there is this machine's fact, not the GPU's, so it is allowed; any other verdict of it still fails the test."""
    off = {k: v for k, v in rows.items() if v[0] in ("FAIL", "ERROR", "WARN")
           and not (k == "disk" and v[0] == "WARN" and v[1].endswith("GB free under the docker root"))}
    assert list(off) == ["gpu health"] and off["gpu health"][0] == verdict, rows
    return off["gpu health"][1]


def test_a_mig_leftover_is_found_from_the_gpus_memory_and_named(sim_cluster, gpu_node, tmp_path):
    """MIG on GPU 0: --query-compute-apps prints `[N/A]` for the process's memory (drivers before R590), so only the
    GPU's own memory.used (11125 MiB) shows that the process of another user holds it."""
    node, image, pid = gpu_node
    code, rows = _doctor(sim_cluster, tmp_path, node, image, gpu_standin.script("mig-leftover", pid), BOOT)
    assert code == 1, rows
    assert _only_health(rows, "FAIL") == (
        f"GPU 0 (MIG) holds 11125 MiB used by pid {pid} (sleep, user nobody), not this job's: stop them "
        f"(kill {pid}) or give the job other GPUs; MIG is on for GPU 0: the job sees MIG instances, not whole GPUs")


def test_an_hgx_a100_without_its_fabric_manager_fails_and_passes_once_it_runs(sim_cluster, gpu_node, tmp_path):
    """An HGX A100: 6 NVSwitches, and NVML says fabric State/Status N/A whether or not the fabric manager trained the
    fabric (bottlerocket#3873): the manager's own state decides, from systemd or else from its process."""
    node, image, _ = gpu_node
    smi = gpu_standin.script("hgx-a100")
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, BOOT, fm="inactive", nvswitches=NVSWITCHES)
    assert code == 1, rows
    assert _only_health(rows, "FAIL") == (
        "6 NVSwitch device(s) but nvidia-fabricmanager is inactive: CUDA fails with \"system not yet initialized\" "
        "(error 802) until it trains the fabric: systemctl start nvidia-fabricmanager")

    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, BOOT, fm="active", nvswitches=NVSWITCHES)
    assert code == 0, rows
    assert rows["gpu health"] == ("PASS", "8 GPU(s): no memory held by other processes, no uncorrectable ECC errors "
                                          "or pending remaps, fabric manager active, no fatal XID since the driver "
                                          "loaded"), rows

    # no systemd (a container, another init): the probe looks for the manager's process, nv-fabricmanager (16
    # characters, one more than the kernel keeps of a process's name); and where systemd has no running unit for it
    # but the process runs (NVIDIA's GPU Operator starts it in its driver container), the process decides
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, BOOT, nvswitches=NVSWITCHES)
    assert code == 1 and "nvidia-fabricmanager is stopped" in _only_health(rows, "FAIL"), rows
    code, out = node.exec_run(["sh", "-c", "cp /bin/sleep /usr/local/bin/nv-fabricmanager && "
                                           "(/usr/local/bin/nv-fabricmanager 86400 >/dev/null 2>&1 & echo $!)"])
    assert code == 0, out
    fm_pid = int(out.decode().strip().splitlines()[-1])
    try:
        for fm in (None, "inactive"):
            code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, BOOT, fm=fm, nvswitches=NVSWITCHES)
            assert code == 0 and "fabric manager running" in rows["gpu health"][1], (fm, rows)
    finally:
        node.exec_run(["sh", "-c", f"kill {fm_pid}; rm -f /usr/local/bin/nv-fabricmanager /dev/nvidia-nvswitch[0-9]*"])


def test_a_fabric_manager_named_process_of_another_user_is_not_the_fabric_manager(sim_cluster, gpu_node, tmp_path):
    """Any user can start a process the kernel names nv-fabricmanage (a copy of sleep called nv-fabricmanager): the
    probe's pgrep found it and doctor passed an HGX A100 whose fabric was never trained (issue 60). Only root's
    counts."""
    node, image, _ = gpu_node
    smi = gpu_standin.script("hgx-a100")
    code, out = node.exec_run(["sh", "-c", "cp /bin/sleep /usr/local/bin/nv-fabricmanager && su nobody -s /bin/sh -c "
                                           "'/usr/local/bin/nv-fabricmanager 86400 >/dev/null 2>&1 & echo $!'"])
    assert code == 0, out
    fm_pid = int(out.decode().strip().splitlines()[-1])
    try:
        code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, BOOT, nvswitches=NVSWITCHES)
        assert code == 1 and "nvidia-fabricmanager is stopped" in _only_health(rows, "FAIL"), rows
    finally:
        node.exec_run(["sh", "-c", f"kill {fm_pid}; rm -f /usr/local/bin/nv-fabricmanager /dev/nvidia-nvswitch[0-9]*"])


def test_xid_lines_a_user_writes_into_the_kernel_log_are_not_xids(sim_cluster, gpu_node, tmp_path):
    """h100-healthy with one real fatal XID on GPU 0, then what any user can make the kernel print (issue 60): a
    segfault of a process named `Xid (PCI:0): 79`, one in a file named like an NVRM Xid line on GPU 1's bus, one in
    a file named like the driver's load line, and one in a file whose name holds a line feed and then such a line, as
    syslog(2) prints it (real lines: tests/unit/backends/docker/test_probe_gpu_words.py).
    Only the NVIDIA module's line counts, and the forged load does not make it older than the driver."""
    from tests.unit.backends.docker.test_probe_gpu_words import COMM_XID, FILE_LOAD, FILE_XID_GPU1, SYSLOG_RECORD

    node, image, _ = gpu_node
    smi = gpu_standin.script("h100-healthy")
    text = lambda line: line.split("] ", 1)[1]  # noqa: E731  (the stand-in prints each line's time)
    log = BOOT + [(5123.4, xid("0000:18:00", 79, FALLEN)), (6100.0, text(COMM_XID)), (6200.0, text(FILE_XID_GPU1)),
                  (6300.0, text(FILE_LOAD)), *((6400.0, text(line)) for line in SYSLOG_RECORD)]
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, log)
    assert code == 1, rows
    assert _only_health(rows, "FAIL") == (
        "GPU 0: XID 79 (GPU has fallen off the bus) x1 since the driver loaded (dmesg): drain the host and reset the "
        "GPU, or reboot")


def test_xids_fail_only_when_fatal_and_newer_than_the_drivers_load(sim_cluster, gpu_node, tmp_path):
    """h100-healthy (GPU 0 at 18:00.0, GPU 1 at 2A:00.0) with XIDs in its kernel log: a fatal one (79) after the
    driver's load fails naming the GPU; an application's (13) and a fatal one from before the driver was reloaded
    only warn; a window the user sets (diagnostics.xid_window) fails a fatal one inside it even across a reload."""
    node, image, _ = gpu_node
    smi = gpu_standin.script("h100-healthy")
    fresh = BOOT + [(5123.4, xid("0000:18:00", 79, FALLEN)), (6001.25, xid("0000:2a:00", 13, WARP))]
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, fresh)
    assert code == 1, rows
    assert _only_health(rows, "FAIL") == (
        "GPU 0: XID 79 (GPU has fallen off the bus) x1 since the driver loaded (dmesg): drain the host and reset the "
        "GPU, or reboot; XID errors since boot (dmesg before the driver's last load or of an application's fault): "
        "13 x1")

    # the same fatal XID, then the driver reloaded (a reset or a module reload): only a warning now; its time is
    # minutes ago (the window below measures back from now), a double-bit ECC error's just after boot
    code, out = node.exec_run(["cut", "-d", " ", "-f", "1", "/proc/uptime"])
    if float(out.decode()) < 900:
        pytest.skip("the kernel log's times are seconds since boot: this machine has been up under 15 minutes")
    reloaded = BOOT + [(4.9, xid("0000:2a:00", 48, DBE)), (-240.0, xid("0000:18:00", 79, FALLEN)),
                       (-200.0, xid("0000:2a:00", 13, WARP)), (-120.0, RELOAD)]
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, reloaded)
    assert code == 0, rows
    assert _only_health(rows, "WARN") == ("XID errors since boot (dmesg before the driver's last load or of an "
                                          "application's fault): 13 x1, 48 x1, 79 x1")

    # a user who wants the last 10 minutes judged (a GPU reset does not reload the driver): the 79 fails, the 48 of
    # long ago does not
    code, rows = _doctor(sim_cluster, tmp_path, node, image, smi, reloaded, diagnostics={"xid_window": "10m"})
    assert code == 1, rows
    assert _only_health(rows, "FAIL") == (
        "GPU 0: XID 79 (GPU has fallen off the bus) x1 in the last 10 minutes (diagnostics.xid_window) (dmesg): drain "
        "the host and reset the GPU, or reboot; XID errors since boot (dmesg, before the last 10 minutes or of an "
        "application's fault): 13 x1, 48 x1")
