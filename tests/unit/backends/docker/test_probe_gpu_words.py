"""What another login on a GPU host can make the probe believe (issue 60, findings 3, 4 and 7), through the REAL
probe.sh in a local sh: a real nvidia-smi output replayed (tests/gpu_standin.py), stand-ins for `dmesg`, `docker`
and `systemctl`, real processes where the kernel's own answer is the point (a name with a line feed, a process of
another user named like the fabric manager), and a /proc of written files (DL_PROBE_PROC) where the case needs root's
processes the test cannot start (MPS's control daemon and its server).

The kernel log lines are real: each says where it was printed. The segfault lines were printed by the kernel of the
machine these tests were written on (Linux 6.18, `debug.exception-trace=1`, util-linux 2.38 dmesg) for a process that
any user can run: one named `Xid (PCI:0): 79` (15 characters, a comm's limit), and ones faulting inside a copy of
libc.so.6 whose file name reads like an NVRM line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dockerlaunch.backends.docker.probe import Probe, parse_probe, probe_argv
from dockerlaunch.gpu import health
from dockerlaunch.gpu.host import Holder
from dockerlaunch.verdict import Verdict
from tests import gpu_standin

FOLDER = "h100-sxm-590.48.01-exporter"  # a real healthy H100 on R590, GPU 0 at 00000000:00:09.0
HGX_A100 = "a100-sxm4-40gb-hgx-fabric-na-bottlerocket3873"  # NVML tells no fabric state: the manager's own decides
BUS = "00000000:00:09.0"

# NVIDIA/NVSentinel#155 (dmesg on an R570 host)
LOAD = ("[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  "
        "(dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025")
# leptonai/gpud#500 (the NVRM text as gpud quoted it from dmesg; the time added, the bus as printed there)
GSP_TIMEOUT = ("NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s of waiting for RPC "
               "response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801702 0x4).")
# the same line on this replay's GPU (its bus the only change)
GSP_TIMEOUT_HERE = "[ 3112.200317] " + GSP_TIMEOUT.replace("PCI:0000:9b:00", "PCI:0000:00:09")
# the forgeries, as the kernel printed them for an unprivileged process: its name, and a file it faulted in
COMM_XID = ("[11752.291722] Xid (PCI:0): 79[28058]: segfault at 0 ip 00007f2fbf785ad8 sp 00007ffee946bd28 error 4 in "
            "libc.so.6[167ad8,7f2fbf644000+156000] likely on CPU 0 (core 0, socket 0)")
FILE_XID = ("[11995.446947] python3[10343]: segfault at 0 ip 00007fc3cab0aad8 sp 00007ffc97143598 error 4 in "
            "NVRM: Xid (PCI:0000:00:09): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
            "[167ad8,7fc3ca9c9000+156000] likely on CPU 1 (core 1, socket 0)")
FILE_XID_GPU1 = ("[12470.597113] python3[30242]: segfault at 0 ip 00007fab8554cad8 sp 00007ffcdf0a0558 error 4 in "
                 "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
                 "[167ad8,7fab8540b000+156000] likely on CPU 1 (core 1, socket 0)")  # (the sim's h100-healthy GPU 1)
FILE_LOAD = ("[12016.715248] python3[341]: segfault at 0 ip 00007f49bdefead8 sp 00007fff1ded6968 error 4 in "
             "NVRM: loading NVIDIA UNIX x86_64 Kernel Module[167ad8,7f49bddbd000+156000] likely on CPU 1 (core 1, "
             "socket 0)")
# a segfault in a file whose name holds a line feed, as `dmesg -S` (syslog(2)) prints the record: its second line gets
# the record's prefix (util-linux's default, reading /dev/kmsg, indents it instead); GPU 1's bus of the sim's case
SYSLOG_RECORD = ["[12535.296795] python3[846]: segfault at 0 ip 00007f6b395a0ad8 sp 00007ffc6a097c68 error 4 in x",
                 "[12535.296795] NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus."
                 "[167ad8,7f6b3945f000+156000] likely on CPU 1 (core 1, socket 0)"]
NO_PID = 4999990  # above the kernel's PID_MAX_LIMIT (4194304): no real process has it


def fake_proc(root: Path, procs: dict[int, tuple[str, int, int]]) -> Path:
    """A /proc of `{pid: (comm, ppid, uid)}`: each pid's comm (as the kernel prints it, with its line feed) and the
    start of its status (the kernel escapes a line feed in `Name:`), as Linux writes them."""
    for pid, (comm, ppid, uid) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_bytes(comm.encode() + b"\n")
        name = comm.replace("\\", "\\\\").replace("\n", "\\n")
        (d / "status").write_text(f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
                                  f"Pid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                  f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return root


def _tool(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def probed(tmp_path: Path, log: list[str] = (), apps: list[tuple[str, int, str, str]] = (), proc: Path | None = None,
           systemctl: str | None = None, pgrep: str | None = None, folder: str = FOLDER) -> Probe:
    """The real probe.sh over FOLDER's replay, whose --query-compute-apps lists `apps` (bus, pid, used MiB, the name
    nvidia-smi would print: the process's command line, raw, when process_name is asked); `log` is the kernel log."""
    bin_dir = tmp_path / "bin"
    gpu_standin.install_replay(bin_dir / "replay", folder)
    named = "".join(f"{bus}, {pid}, {used}, {name}\n" for bus, pid, used, name in apps)
    bare = "".join(f"{bus}, {pid}, {used}\n" for bus, pid, used, _ in apps)
    _tool(bin_dir / "nvidia-smi", "#!/bin/sh\n# stand-in nvidia-smi (tests only): the replay, with these compute apps\n"
          f"case $1 in\n  --query-compute-apps=*process_name*) cat <<'EOF'\n{named}EOF\n    ;;\n"
          f"  --query-compute-apps=*) cat <<'EOF'\n{bare}EOF\n    ;;\n"
          f'  *) exec "{bin_dir / "replay" / "nvidia-smi"}" "$@" ;;\nesac\n')
    # (it answers `--version` with the log too: not util-linux, so the probe reads it as syslog(2)'s, busybox's)
    _tool(bin_dir / "dmesg", "#!/bin/sh\n# stand-in dmesg (tests only)\ncat <<'EOF'\n" + "".join(f"{x}\n" for x in log)
          + "EOF\n")
    _tool(bin_dir / "docker", "#!/bin/sh\nexit 1\n")
    _tool(bin_dir / "systemctl", "#!/bin/sh\n# stand-in systemctl (tests only): no unit runs\n"
          + (f"echo {systemctl}\nexit 3\n" if systemctl else "exit 1\n"))
    if pgrep is not None:
        _tool(bin_dir / "pgrep", f"#!/bin/sh\n# stand-in pgrep (tests only)\n[ \"$2\" = {pgrep.split()[0]} ] && "
                                 f"echo {pgrep.split()[1]}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if proc is not None:
        env["DL_PROBE_PROC"] = str(proc)
    r = subprocess.run(probe_argv("127.0.0.1"), capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return parse_probe(r.stdout, "h")


def health_row(p: Probe) -> tuple[Verdict, str]:
    f = health.judge(p.gpu_host)
    return f.verdict, f.detail


# ---------------------------------------------------------------- finding 3: a fatal XID anyone can write


def test_a_process_name_or_file_name_writes_no_xid_and_no_driver_load(tmp_path):
    """A process named `Xid (PCI:0): 79` (15 characters) that segfaults, one faulting in a file named like an NVRM
    Xid line on this host's own GPU, and one in a file named like the driver's load line: none is the NVIDIA
    module's, so no XID is read, the GPU stays healthy, and a real fatal XID is not demoted by the forged load (the
    old sed took `Xid (PCI:...): N` and `NVRM: loading` anywhere in a line)."""
    p = probed(tmp_path / "forged", [LOAD, COMM_XID, FILE_XID, FILE_LOAD])
    assert p.gpu_host.xids == () and p.gpu_host.driver_loaded_s == 1843.439669
    verdict, detail = health_row(p)
    assert verdict == Verdict.PASS and "no fatal XID since the driver loaded" in detail, detail

    p = probed(tmp_path / "real", [LOAD, GSP_TIMEOUT_HERE, COMM_XID, FILE_XID, FILE_LOAD])
    assert [(x.code, x.bus, x.at_s) for x in p.gpu_host.xids] == [(119, "0000:00:09", 3112.200317)]
    assert p.gpu_host.driver_loaded_s == 1843.439669
    assert health_row(p) == (Verdict.FAIL, "GPU 0: XID 119 (GSP RPC timeout) x1 since the driver loaded (dmesg): "
                                           "drain the host and reset the GPU, or reboot")


@pytest.mark.parametrize("line, read", [
    (GSP_TIMEOUT_HERE, ("3112.200317", 119)),
    # CONFIG_PRINTK_CALLER: the kernel's own prefix (`dmesg -S`), and util-linux's since 2.40 (a blank between)
    (GSP_TIMEOUT_HERE.replace("] NVRM", "][ T4071838] NVRM"), ("3112.200317", 119)),
    (GSP_TIMEOUT_HERE.replace("] NVRM", "] [   T4071838] NVRM"), ("3112.200317", 119)),
    (GSP_TIMEOUT_HERE.replace("[ 3112.200317] ", "[    C12] "), (None, 119)),
    (GSP_TIMEOUT.replace("PCI:0000:9b:00", "PCI:0000:00:09"), (None, 119)),  # printk.time=0: no prefix at all
    # not the module's: a continuation line (util-linux indents a record's next lines), a line quoting one
    ("               " + GSP_TIMEOUT, None),
    ("[ 3112.200318] foo: NVRM: Xid (PCI:0000:00:09): 79, GPU has fallen off the bus.", None),
    # the kernel's record of a segfault whose name holds a line feed, read through syslog(2) (`dmesg -S`): its second
    # line gets the record's prefix, and the name's 15 characters cannot reach a bus
    ("[11752.381995] NVRM: Xid (P[28099]: segfault at 0 ip 00007ff790585ad8 sp 00007ffe68214ce8 error 4 in "
     "libc.so.6[167ad8,7ff790444000+156000] likely on CPU 0 (core 0, socket 0)", None),
])
def test_the_nvidia_modules_xid_lines_are_read_in_each_form_the_kernel_prefixes(tmp_path, line, read):
    p = probed(tmp_path, [LOAD, line])
    got = [(None if x.at_s is None else f"{x.at_s:.6f}", x.code) for x in p.gpu_host.xids]
    assert got == ([read] if read else []), got


def test_a_line_feed_in_a_file_name_writes_no_xid_where_dmesg_reads_through_syslog(tmp_path):
    """Through syslog(2) (busybox's dmesg, or util-linux's without /dev/kmsg, as in a container: this stand-in says it
    is not util-linux) every line of a record carries the record's prefix: a line with the same prefix as the line
    before it is the record's own text, not a line the module printed. The module's own lines around it still are."""
    here = [x.replace("PCI:0000:2a:00", "PCI:0000:00:09") for x in SYSLOG_RECORD]
    p = probed(tmp_path, [LOAD, *SYSLOG_RECORD, *here, GSP_TIMEOUT_HERE.replace("3112.200317", "12600.000001")])
    assert [(x.code, x.bus, x.at_s) for x in p.gpu_host.xids] == [(119, "0000:00:09", 12600.000001)]


def test_a_fatal_xid_on_a_bus_none_of_the_hosts_gpus_is_on_warns_naming_the_bus(tmp_path):
    """The module's own line on a bus where this host has no GPU (here the bus gpud#500 printed) says nothing of the
    GPUs a job would get: a WARN naming the bus, never "the GPU at ...: reset the GPU"."""
    p = probed(tmp_path, [LOAD, "[ 3112.200317] " + GSP_TIMEOUT])
    verdict, detail = health_row(p)
    assert verdict == Verdict.WARN, detail
    assert detail.startswith("XID 119 (GSP RPC timeout) x1 since the driver loaded (dmesg) on PCI 0000:9b:00, where "
                             "none of this host's 1 GPU(s) is: not judged"), detail


# ---------------------------------------------------------------- finding 4: a line feed in a process name


@pytest.fixture
def named_process(request):
    """Start a real process named NAME (prctl PR_SET_NAME: the kernel keeps 15 bytes), another user's (nobody) when
    these tests run as root; -> its pid."""
    started = []

    def start(name: str) -> int:
        code = ("import ctypes, os, sys, time\n"
                "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
                "if os.getuid() == 0:\n    os.setgid(65534)\n    os.setuid(65534)\n"
                "print('ready', flush=True)\ntime.sleep(120)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def test_a_line_feed_in_a_process_name_adds_no_gpu_holder(tmp_path, named_process):
    """A process whose name holds a line feed and then a row of nvidia-smi's CSV (a bus, pid 1, 75 GB): nvidia-smi
    prints process_name raw, so the old probe read two processes and doctor FAILed "stop it (kill 1)". The probe no
    longer asks for process_name: the one process holds its 10 MiB, named by the kernel (/proc/PID/comm, 15 bytes)
    and kept as data."""
    name = f"x\n{BUS}, 1, 75000, forged"
    pid = named_process(name)
    p = probed(tmp_path, [LOAD], apps=[(BUS, pid, "10", name)])
    holders = p.gpu_host.holders
    assert [(h.pid, h.used_mib, h.name) for h in holders] == [(pid, 10, name[:15])], holders
    if os.getuid() == 0:
        assert holders[0].owner == "nobody", holders
    verdict, detail = health_row(p)
    assert verdict == Verdict.PASS and "(1 small or MPS)" in detail and "kill" not in detail, detail


# ---------------------------------------------------------------- finding 7: names another user can take

MPS_SERVER, MPS_CONTROL = "nvidia-cuda-mps-server", "nvidia-cuda-mps-control"


def test_only_an_mps_server_started_by_roots_control_daemon_is_exempt(tmp_path):
    """Two processes named nvidia-cuda-mps-server (the kernel keeps nvidia-cuda-mps) hold 30 GB each: the one root's
    nvidia-cuda-mps-control started (it runs as its client, uid 1000) is MPS's; the one a user started from a shell
    is a leftover like any other (the old rule exempted every process of that name)."""
    server, impostor = NO_PID + 1, NO_PID + 2
    proc = fake_proc(tmp_path / "proc", {
        NO_PID: (MPS_CONTROL[:15], 1, 0), server: (MPS_SERVER[:15], NO_PID, 1000),
        NO_PID + 3: ("bash", 1, 1001), impostor: (MPS_SERVER[:15], NO_PID + 3, 1001)})
    p = probed(tmp_path, [LOAD], apps=[(BUS, server, "30000", MPS_SERVER), (BUS, impostor, "30000", MPS_SERVER)],
               proc=proc)
    assert health_row(p) == (Verdict.FAIL, f"GPU 0 holds 30000 MiB of pid {impostor} (nvidia-cuda-mps), not this "
                                           f"job's: a leftover of another job? stop it (kill {impostor}) or give the "
                                           "job other GPUs")
    by_pid = {h.pid: h for h in p.gpu_host.holders}
    assert health.mps_server(by_pid[server]) and not health.mps_server(by_pid[impostor])
    # a server whose parent is a user's process named like the control daemon is not MPS's either
    assert not health.mps_server(Holder(BUS, 5, "bob", 30000, MPS_SERVER[:15], MPS_CONTROL[:15], parent_root=False))


def test_a_fabric_manager_named_process_of_another_user_does_not_count(tmp_path, named_process):
    """An HGX host whose systemd runs no nvidia-fabricmanager: a process of another user named nv-fabricmanage (what
    the kernel keeps of nv-fabricmanager) is not the manager (the old `pgrep -x` took any user's): FAIL; root's is."""
    proc = tmp_path / "proc"
    for i in range(6):
        (proc / "driver" / "nvidia-nvswitch" / "devices" / f"0000:0{i}:00.0").mkdir(parents=True)
    pid = named_process("nv-fabricmanage")
    (proc / str(pid)).symlink_to(f"/proc/{pid}")  # the real process, as the kernel shows it
    p = probed(tmp_path, [LOAD], proc=proc, systemctl="inactive", folder=HGX_A100)
    assert (p.gpu_host.nvswitches, p.gpu_host.fabric_manager) == (6, "inactive")
    verdict, detail = health_row(p)
    assert verdict == Verdict.FAIL and "nvidia-fabricmanager is inactive" in detail, detail

    fake_proc(proc, {NO_PID: ("nv-fabricmanage", 1, 0)})  # root's (a stand-in pgrep lists it)
    p = probed(tmp_path / "root", [LOAD], proc=proc, systemctl="inactive", pgrep=f"nv-fabricmanage {NO_PID}",
               folder=HGX_A100)
    assert p.gpu_host.fabric_manager == "running" and health_row(p)[0] == Verdict.PASS, health_row(p)
