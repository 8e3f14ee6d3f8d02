"""A host's words are data (issue 50, finding 1), end to end on the sim: node 1 made a GPU host as far as its probe
can tell (test_gpu_doctor's fixture: a stand-in nvidia-smi, dummy device nodes, stub driver libraries), the real
probe over SSH under the node's sh (Debian's dash), the real `up` and `doctor`."""

import json
import secrets
import time

from tests import gpu_standin
from tests.integration.helpers import GPU_LIBDIR as LIBDIR
from tests.integration.helpers import dl, variant
from tests.integration.helpers import tar_files as _tar
from tests.integration.test_gpu_doctor import gpu_node  # noqa: F401  (the fixture)

# the review's case: another login starts a CUDA process whose argv[0] is this; dash's echo made its \n lines
EVIL = 'x\\ndocker_info={"Runtimes":{}}\\nlib=\\tlibcuda.so.1 (libc6,x86-64) => /home/eve/libcuda.so.1'
MARK = "DL-PLANTED-LIBCUDA"
# the name the kernel keeps for a process (/proc/PID/comm, 15 bytes), which the probe reads since issue 60: real line
# feeds (printf's format)
HOSTILE = ("x\\ngpus=8\\nlib=/h", "x\ngpus=8\nlib=/h")


def _named(node, fmt: str) -> int:
    """A process of another user (nobody) on the node whose kernel name is printf's `fmt` (it writes its own
    /proc/PID/comm: any process may); -> its pid."""
    body = f"#!/bin/sh\nprintf '{fmt}' > /proc/$$/comm\nwhile sleep 1; do :; done\n"
    node.put_archive("/usr/local/bin", _tar({"dl-named": (body.encode(), 0o755)}))
    code, out = node.exec_run(["sh", "-c", "su nobody -s /bin/sh -c '/usr/local/bin/dl-named >/dev/null 2>&1 & "
                                           "echo $!'"])
    assert code == 0, out
    pid = int(out.decode().strip().splitlines()[-1])
    for _ in range(100):  # until it has named itself
        code, out = node.exec_run(["cat", f"/proc/{pid}/comm"])
        if code == 0 and out.decode() != "dl-named\n":
            return pid
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} never renamed itself: {out!r}")


def _smi_naming(pid: int, name: str) -> str:
    """The leftover case's stand-in, answering as nvidia-smi does when process_name is asked: the name raw."""
    head, branch, rest = gpu_standin.script("leftover", pid).partition("  --query-compute-apps=*)\n")
    assert branch, "the stand-in's compute-apps branch moved"
    return (f"{head}  --query-compute-apps=*process_name*)\ncat <<'DL_NAMED_EOF'\n00000000:18:00.0, {pid}, 71234, "
            f"{name}\nDL_NAMED_EOF\n    ;;\n{branch}{rest}")


def _config(sim_cluster, tmp_path):
    return variant(sim_cluster, tmp_path, hosts=[{"address": sim_cluster[2][0].ip}],
                   container={"gpus": "all", "gpu_mode": "auto"})


def _rows(stdout: str) -> dict[str, tuple[str, str]]:
    return {c["check"]: (c["verdict"], c["reason"]) for c in json.loads(stdout)["checks"]}


def test_a_gpu_process_name_never_becomes_probe_structure(sim_cluster, gpu_node, tmp_path):  # noqa: F811
    """The review's name as nvidia-smi would print it (never asked since issue 60) and a kernel name with line feeds
    (what the probe reads): neither becomes a key, a library or a process of its own."""
    node, image = gpu_node
    plant = (f"mkdir -p /home/eve && printf '%s\\n' {MARK} > /home/eve/libcuda.so.1 && chmod 644 /home/eve/libcuda.so.1"
             " && chown -R nobody /home/eve")
    code, out = node.exec_run(["sh", "-c", plant])
    assert code == 0, out
    pid = _named(node, HOSTILE[0])
    smi = _smi_naming(pid, EVIL)
    node.put_archive("/usr/local/bin", _tar({"nvidia-smi": (smi.encode(), 0o755)}))
    cfg = _config(sim_cluster, tmp_path)
    try:
        # the job as `up` starts it (the leftover holds a GPU: doctor would stop it, so the probe alone decides)
        job = f"words-{secrets.token_hex(3)}"
        look = (f"echo planted=$(cat /usr/local/nvidia/lib64/* 2>/dev/null | grep -c {MARK}) "
                "mounts=$(grep -c /home/eve /proc/self/mountinfo) libs=$(ls /usr/local/nvidia/lib64 | tr '\\n' ,)")
        up = dl("up", "--skip-preflight", "--config", cfg, "--image", image, "--name", job, "--", "sh", "-c", look,
                timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "planted=0 mounts=0 libs=libcuda.so.1,libnvidia-ml.so.1," in up.stdout, up.stdout
        # doctor: the name is one process's name in the gpu health row, never a fact of its own
        r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
        rows = _rows(r.stdout)
        assert "probe" not in rows and rows["gpus"][0] == "PASS", rows
        assert rows["gpu health"][0] == "FAIL" and f"of pid {pid} ({HOSTILE[1]}, user nobody)" in rows["gpu health"][1]
        assert "eve" not in rows["gpu health"][1], rows
    finally:
        node.exec_run(["sh", "-c", f"kill {pid}; rm -rf /home/eve /usr/local/bin/nvidia-smi /usr/local/bin/dl-named"])


def test_a_host_whose_answer_repeats_a_key_is_a_probe_fail_naming_it(sim_cluster, gpu_node, tmp_path):  # noqa: F811
    """A login whose rc file prints `gpus=8` (Debian's bash reads ~/.bashrc for an SSH command): the old parser took
    the first value, 8 GPUs; now the answer is refused in one row naming the host and the key, and `up` stops."""
    node, image = gpu_node
    node.put_archive("/usr/local/bin", _tar({"nvidia-smi": (gpu_standin.script("h100-healthy").encode(), 0o755)}))
    rc = "/root/.bashrc"
    code, out = node.exec_run(["sh", "-c", f"cp -p {rc} {rc}.dl-saved 2>/dev/null; echo 'echo gpus=8' >> {rc}"])
    assert code == 0, out
    cfg = _config(sim_cluster, tmp_path)
    host0 = sim_cluster[2][0].ip
    try:
        r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
        assert r.returncode == 1, r.stdout + r.stderr
        rows = _rows(r.stdout)
        assert rows["probe"] == ("FAIL", "probing the host failed: answered in a form the launcher does not write "
                                         "(it said gpus= twice): something on the host printed into the probe (a "
                                         "login file such as ~/.bashrc that prints?); nothing of its answer was "
                                         "used"), rows
        assert [k for k, v in rows.items() if v[0] != "PASS"] == ["probe"], rows
        up = dl("up", "--config", cfg, "--image", image, "--", "true", timeout=600)
        assert up.returncode == 1 and "preflight FAILED (1 check(s)); nothing was started" in up.stdout, up.stdout
        assert f"{host0}" in up.stdout and "it said gpus= twice" in up.stdout, up.stdout
        # `up`'s own steps frame every answer: the rc file's line before them is not a step (it was a traceback)
        skip = dl("up", "--skip-preflight", "--config", cfg, "--image", image, "--", "true", timeout=600)
        assert skip.returncode == 0 and "Traceback" not in skip.stderr, skip.stdout + skip.stderr
    finally:
        node.exec_run(["sh", "-c", f"if [ -e {rc}.dl-saved ]; then mv {rc}.dl-saved {rc}; else rm -f {rc}; fi"])


def test_a_driver_library_another_user_owns_is_never_mounted(sim_cluster, gpu_node, tmp_path):  # noqa: F811
    """ldconfig names a driver file that is not root's own: doctor's gpus row FAILs naming it and its owner, and
    `up` refuses in one line before any container starts."""
    node, image = gpu_node
    node.put_archive("/usr/local/bin", _tar({"nvidia-smi": (gpu_standin.script("h100-healthy").encode(), 0o755)}))
    lib = f"{LIBDIR}/libnvidia-ml.so.1"
    code, out = node.exec_run(["chown", "nobody", lib])
    assert code == 0, out
    cfg = _config(sim_cluster, tmp_path)
    host0 = sim_cluster[2][0].ip
    # ldconfig names it where its cache found it (/lib is /usr/lib on a merged-/usr Debian)
    why = "libnvidia-ml.so.1 (owner uid 65534, mode 755) is not root's own or is writable by others"
    try:
        r = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
        assert r.returncode == 1, r.stdout + r.stderr
        rows = _rows(r.stdout)
        assert rows["gpus"][0] == "FAIL" and why in rows["gpus"][1], rows
        job = f"words-{secrets.token_hex(3)}"
        up = dl("up", "--skip-preflight", "--config", cfg, "--image", image, "--name", job, "--", "true",
                timeout=600)
        assert up.returncode != 0 and "Traceback" not in up.stderr, up.stdout + up.stderr
        assert f"{host0}: the driver file /" in up.stderr and why in up.stderr, up.stdout + up.stderr
        code, out = node.exec_run(["sh", "-c", f"docker ps -aq --filter label=dockerlaunch.job={job} | wc -l"])
        assert out.decode().strip() == "0", out
    finally:
        node.exec_run(["chown", "root", lib])


def test_a_gpu_process_name_with_terminal_controls_shows_as_text_in_doctors_table(sim_cluster, gpu_node,  # noqa: F811
                                                                                   tmp_path):
    """Finding 3 through the real CLI: a process name that moves the cursor up, writes the clipboard (OSC 52) and
    holds rich markup reaches doctor's table over SSH as visible text; `--output json` keeps the raw name."""
    import os
    import subprocess
    import sys

    node, image = gpu_node
    # the kernel keeps 15 bytes of a name: a line up, the start of an OSC 52 clipboard write and its end, markup
    pid = _named(node, "\\033[1A\\033]52;c;\\007[b]")
    name = "\x1b[1A\x1b]52;c;\x07[b]"
    node.put_archive("/usr/local/bin", _tar({"nvidia-smi": (gpu_standin.script("leftover", pid).encode(), 0o755)}))
    cfg = _config(sim_cluster, tmp_path)
    try:
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "doctor", "--config", cfg, "--image", image],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "400"})
        assert r.returncode == 1, r.stdout + r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout, repr(r.stdout)
        assert "^[[1A^[]52;c;\\x07[b]" in r.stdout, r.stdout
        j = dl("doctor", "--config", cfg, "--image", image, "--output", "json")
        assert f"of pid {pid} ({name}, user nobody)" in _rows(j.stdout)["gpu health"][1]
    finally:
        node.exec_run(["sh", "-c", f"kill {pid}; rm -f /usr/local/bin/nvidia-smi /usr/local/bin/dl-named"])
