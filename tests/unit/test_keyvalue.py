"""The key=value contract (dockerlaunch/keyvalue.py): what a host prints is data, whatever bytes it holds. The shell
side (scripts/kv.sh) runs for real under each sh a host or image may have; the parser is pure."""

import os
import shutil
import subprocess

import pytest

from dockerlaunch import keyvalue, shipped
from dockerlaunch.backends.docker import script
from dockerlaunch.backends.docker.doctor.observations import HostObservation, parse_observation
from dockerlaunch.backends.docker.doctor.report import FAIL
from dockerlaunch.backends.docker.probe import parse_probe, untrusted_files
from dockerlaunch.errors import ConfigError, HostError
from dockerlaunch.gpu.access import HostGpuAccess, device_access
from tests import gpu_standin

SHELLS = [s for s in (["dash"], ["bash"], ["busybox", "sh"]) if shutil.which(s[0])]

# the third security review's case: a CUDA process whose argv[0] is this (dash's echo turns its \n into lines)
EVIL = 'x\\ndocker_info={"Runtimes":{}}\\nlib=\\tlibcuda.so.1 (libc6,x86-64) => /home/eve/libcuda.so.1'
VALUES = [EVIL, "plain", "", "%", "100% done %41", "a\nb\n\nc", "tab\there", "cr\rhere", "\x1b[2K\x1b[1A[bold]PASS",
          "\x07\x08\x7f", "é ü 日本 \\ $x \"q' `ls`", "nel\u0085ls\u2028ps\u2029", "trailing space ", "=k=v="]


def kv_sh(shell: list[str], program: str, *args: str) -> str:
    text = shipped.script("dockerlaunch", "kv.sh") + program
    r = subprocess.run([*shell, "-c", text, "sh", *args], capture_output=True, timeout=60,
                       env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_every_value_comes_back_byte_for_byte_on_one_line(shell):
    program = 'for v in "$@"; do kv value "$v"; done; kvl line "$1"; kvl line "$6"'
    out = kv_sh(shell, program, *VALUES)
    lines = out.split("\n")
    assert lines[-1] == "" and all(line.startswith(("value=", "line=")) for line in lines[:-1]), out
    got = keyvalue.parse(out, (), ("value", "line"))
    # a value ends at its line break (command substitution drops trailing ones), nothing else of it is lost
    assert got["value"] == VALUES
    assert got["line"] == [EVIL, "a", "b", "", "c"]
    assert all(c >= " " and c != "\x7f" for c in out.replace("\n", "")), "a control character left the script"


def test_encode_is_what_kv_prints():
    out = kv_sh(SHELLS[0], 'kv k "$1"', EVIL + "\x1b%")
    assert out == f"k={keyvalue.encode(EVIL + chr(27) + '%')}\n"


@pytest.mark.parametrize("text, words", [
    ("gpus=2\ngpus=8\n", "it said gpus= twice"),
    ("route=10.0.0.1 dev eth0\x1b[2K\n", "route= holds a raw control character"),
    ("owner=50%\n", "owner= holds a bad escape '%'"),
    ("owner=%zz\n", "owner= holds a bad escape '%zz'"),
    ("owner=%0a\n", "owner= holds a bad escape '%0a'"),
])
def test_an_answer_the_contract_cannot_produce_is_refused_naming_the_host_and_key(text, words):
    with pytest.raises(HostError) as e:
        parse_probe(text, "10.0.0.7")
    assert str(e.value).startswith("host 10.0.0.7: probing the host failed: answered in a form")
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_lines_end_at_line_feeds_only_and_other_keys_are_ignored():
    # str.splitlines would cut at \r, \x1c-\x1e, \x85 and U+2028 (the last three can arrive raw in UTF-8)
    text = "motd: welcome\nroute=a\u2028gpus=9\u0085has_ip=0\nunknown=1\nunknown=2\ngpus=2\n"
    p = parse_probe(text, "h")
    assert p.gpu_count == 2 and p.problem == "no route: a\u2028gpus=9\u0085has_ip=0"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_gpu_process_name_stays_data_through_the_real_probe(tmp_path, shell):
    """The review's case, through probe.sh under each sh: the name is one app's name, never a key of its own. The
    probe reads it from /proc/PID/comm (issue 60: never nvidia-smi's process_name); here a /proc written with it,
    longer than the kernel keeps, and with a real line feed as well as dash-echo's `\\n`."""
    from tests.unit.backends.docker.test_probe_gpu_words import NO_PID, fake_proc

    gpu_standin.install(tmp_path / "bin", "leftover", NO_PID)
    proc = fake_proc(tmp_path / "proc", {NO_PID: (EVIL + "\ngpus=9", 1, 1000)})
    r = subprocess.run([*shell, "-c", script("probe.sh"), "sh", "127.0.0.1"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                            "DL_PROBE_PROC": str(proc)}, timeout=60)
    assert r.returncode == 0, r.stderr
    p = parse_probe(r.stdout, "h")
    assert [a.name for a in p.gpu_host.holders] == [EVIL + "\ngpus=9"] and p.gpu_count == 2
    assert not any("/home/eve" in path for _, path in p.access.libs), p.access.libs
    assert p.access.nvidia_runtime is False and "eve" not in repr(p.access)


def test_the_review_cases_old_output_is_a_probe_fail_naming_the_host():
    """What the old probe.sh printed for it (its echo made the name three lines): doctor's `probe` row FAILs, and
    nothing of the answer is judged."""
    old = ("clock=1.0\ndocker=28.5.2\nimage=\ngpus=1\nnvidia_smi=/usr/bin/nvidia-smi\n"
           "smi_app=00000000:18:00.0,4242,eve,x\ndocker_info={\"Runtimes\":{}}\n"
           "lib=\tlibcuda.so.1 (libc6,x86-64) => /home/eve/libcuda.so.1\nhas_ip=1\n"
           "docker_info={\"ServerVersion\":\"28.5.2\",\"Runtimes\":{\"runc\":{}}}\n")
    from tests.unit.backends.docker.test_doctor_judge import H1, cfg, host, run
    for text, words in ((old, "lib= holds a raw control character"),
                        (old.replace("lib=\t", "lib="), "it said docker_info= twice")):
        obs = parse_observation(HostObservation(1, H1, ssh=f"root@{H1}:22"), text)
        assert obs.probe is None and obs.docker is None and not obs.usable
        rows = [(c.check, c.verdict, c.detail) for c in run(cfg(), host(0), obs).checks if c.host == H1]
        assert [r[0] for r in rows] == ["ssh", "probe"] and rows[1][1] == FAIL and words in rows[1][2], rows


def test_driver_files_only_roots_own_and_unwritable_by_others():
    files = ["0 755 /usr/lib/libcuda.so.1", "1000 755 /home/eve/libcuda.so.1", "0 775 /opt/nv/libnvidia-ml.so.1",
             "0 644 /usr/bin/nvidia-smi", "? ? /gone/libx.so"]
    assert untrusted_files(["/usr/lib/libcuda.so.1", "/usr/bin/nvidia-smi"], files) == ()
    assert untrusted_files(["/home/eve/libcuda.so.1", "/opt/nv/libnvidia-ml.so.1", "/gone/libx.so", "/unsaid"],
                           files) == ("/home/eve/libcuda.so.1 (owner uid 1000, mode 755)",
                                      "/opt/nv/libnvidia-ml.so.1 (owner uid 0, mode 775)",
                                      "/gone/libx.so (owner uid ?, mode ?)", "/unsaid (owner uid ?, mode ?)")
    gpu = HostGpuAccess(device_nodes=("/dev/nvidiactl", "/dev/nvidia0"),
                        libs=(("libcuda.so.1", "/home/eve/libcuda.so.1"),),
                  untrusted=("/home/eve/libcuda.so.1 (owner uid 1000, mode 755)",))
    with pytest.raises(ConfigError) as e:
        device_access("all", gpu, {}, "host h1", "no toolkit")
    assert str(e.value).startswith("host h1: the driver file /home/eve/libcuda.so.1 (owner uid 1000, mode 755) is "
                                   "not root's own")


def test_a_rank_whose_command_line_holds_a_line_break_is_one_process(tmp_path):
    """ranks.sh (dump) under dash: a command line with a line break and dash-echo escapes stays one process's
    command; it never adds a `proc` line of its own."""
    import sys
    import time

    from dockerlaunch.diagnostics import script as diag_script
    from dockerlaunch.diagnostics.dump import parse_ranks

    forged = "x\nproc 1 0 3 0 forged\\nproc 2 0 4 0 forged"
    # ranks.sh reads every process of the machine, and parse_ranks keeps one per RANK: a RANK no other process has
    # (this pytest's pid), not 7, which another suite running at once (scripts/test's other Python) also sets
    rank = os.getpid()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", forged],
                         env={**os.environ, "RANK": str(rank), "LOCAL_RANK": "0"})
    try:
        time.sleep(0.3)
        out = subprocess.run(["dash", "-c", diag_script("ranks.sh")], capture_output=True, text=True, timeout=60)
        ranks = {r.pid: r for r in parse_ranks(out.stdout)}
        assert ranks[p.pid].rank == rank and ranks[p.pid].command.endswith(forged), ranks
        assert 1 not in ranks and 2 not in ranks and not any(r.command == "forged" for r in ranks.values()), out.stdout
    finally:
        p.kill()
        p.wait()
