"""The `local` host: this machine's own Docker engine, no SSH, with the same launcher, watchdog and doctor."""

import signal
import subprocess
import sys
import time

import yaml

from .helpers import dl, job_name, start_up, stop_up, wait_for_ready

TORCHRUN = ('torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" '
            '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" /opt/dockerlaunch-demo/allreduce.py')


def engine_limits() -> dict[str, str]:
    """Open files this machine's dockerd can give a container: the test VMs' has 20000 and cannot raise it (no
    CAP_SYS_RESOURCE), so it refuses the launcher's default of 1048576."""
    pid = subprocess.run(["pidof", "-s", "dockerd"], capture_output=True, text=True, check=True).stdout.strip()
    with open(f"/proc/{pid}/limits") as f:
        hard = int(next(line for line in f if line.startswith("Max open files")).split()[-2])
    return {"nofile": str(hard)} if hard < 1048576 else {}


def config(tmp_path, image: str, hosts=("local",), **job) -> str:
    """This machine's own folders stay clean: diagnostics and logs go under the test's tmp_path."""
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump({"hosts": list(hosts), "image": image,
                                    "container": {"gpus": "none", "infiniband": "off", "ulimits": engine_limits()},
                                    "job": job, "diagnostics": {"dir": str(tmp_path / "diag")}}))
    return str(path)


def local_containers(job: str) -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"label=dockerlaunch.job={job}", "--format", "{{.Names}}"],
                       capture_output=True, text=True, check=True)
    return r.stdout.split()


def test_a_job_on_the_local_host_runs_without_ssh(demo_image, tmp_path):
    job = job_name()
    # -v: the whole pre-flight table (up prints only the rows that did not pass by default)
    r = dl("up", "-v", "--config", config(tmp_path, demo_image, name=job), "--nproc-per-node", "2", "--log-dir",
           str(tmp_path / "logs"), "--", "sh", "-c", TORCHRUN, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "local (no SSH)" in r.stdout and "every rank is on this machine" in r.stdout, r.stdout
    assert r.stdout.count("all_reduce sum=3 expected=3 OK") == 2, r.stdout
    assert "MASTER_ADDR=127.0.0.1" in r.stdout
    assert local_containers(job) == []
    assert sorted(p.name for p in (tmp_path / "diag" / job).iterdir()) == ["fr", "fr-pipe", "nccl"]


def test_two_local_hosts_form_one_world(demo_image, tmp_path):
    """Two "hosts" on one machine (e.g. one GPU each): NNODES=2 through loopback."""
    job = job_name()
    r = dl("up", "--config", config(tmp_path, demo_image, hosts=("local", "local"), name=job), "--skip-preflight",
           "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", TORCHRUN, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.count("all_reduce sum=3 expected=3 OK") == 2, r.stdout
    assert "(NODE_RANK=1, local rank 0)" in r.stdout
    assert local_containers(job) == []


def test_local_beside_ssh_hosts_without_advertise_addr_is_refused(tmp_path):
    r = dl("up", "--hosts", "local,10.0.0.2", "--image", "x", "--dry-run", "--", "true")
    assert r.returncode == 2 and "hosts[0] local: in a job with SSH hosts, give its advertise_addr" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_diagnostics_folder_another_user_made_is_refused_in_one_sentence_with_one_fix(demo_image, tmp_path):
    """Another login made the shared diagnostics parent first: `up` refuses in one line that says what is wrong and
    one fix, a folder beside it (never inside the folder it refuses), and starts nothing."""
    import getpass
    import os

    job = job_name()
    cfg = config(tmp_path, demo_image, name=job)
    diag = tmp_path / "diag"
    diag.mkdir()
    os.chown(diag, 65534, 65534)  # the suite runs as root (scripts/test installs as root; CI is root)
    r = dl("up", "--config", cfg, "--skip-preflight", "--", "true")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == (f"error: host local: preparing the diagnostics folder failed: {diag} belongs to uid 65534, "
                        "another user, who could swap the job's folder in it; set diagnostics.dir to a folder of the "
                        f"SSH user's own, e.g. {diag}-{getpass.getuser()}"), lines[0]
    assert local_containers(job) == [] and list(diag.iterdir()) == []


def test_a_killed_launcher_leaves_no_local_container(demo_image, tmp_path):
    """The local watchdog is a child of the launcher's own; SIGKILL closes its input, as a dropped SSH session
    would, and it removes the run's container after job.orphan_grace."""
    job = job_name()
    p, lines, seen = start_up("--config", config(tmp_path, demo_image, name=job, orphan_grace=3), "--skip-preflight",
                              "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", "echo ready 0; sleep 600")
    try:
        assert wait_for_ready(lines, {"0"}, timeout=120) == {"0"}, "".join(seen)
        assert local_containers(job)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 60
        while local_containers(job) and time.monotonic() < deadline:
            time.sleep(1)
        assert local_containers(job) == []
    finally:
        stop_up(p)
        subprocess.run([sys.executable, "-m", "dockerlaunch", "down", "--config",
                        config(tmp_path, demo_image, name=job)], capture_output=True)


def test_ctrl_c_on_the_local_host_tears_down(demo_image, tmp_path):
    """The launcher's children run in sessions of their own, as over SSH: SIGINT reaches only the launcher,
    which removes the container."""
    job = job_name()
    p, lines, seen = start_up("--config", config(tmp_path, demo_image, name=job), "--skip-preflight",
                              "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", "echo ready 0; sleep 600")
    try:
        assert wait_for_ready(lines, {"0"}, timeout=120) == {"0"}, "".join(seen)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 130
        assert local_containers(job) == [], "".join(seen)
        assert "interrupted: stopping and removing job containers" in "".join(seen)
    finally:
        stop_up(p)


def test_flight_recorder_dumps_are_read_by_pytorchs_analyzer_in_the_ranks_container(demo_image, tmp_path):
    """Real dumps (2 x H200, rank 1 asleep), analyzed where torch is: in rank 0's container (torch 2.13 CPU)."""
    import shutil
    from pathlib import Path

    from dockerlaunch.backends.docker.session import open_session
    from dockerlaunch.diagnostics.dump import HostDump, _analyze_flight_recorder
    from dockerlaunch.job.load import load_config

    job = job_name()
    path = config(tmp_path, demo_image, name=job)
    r = dl("up", "--config", path, "--skip-preflight", "--detach", "--", "sleep", "300")
    assert r.returncode == 0, r.stdout + r.stderr
    session = open_session(load_config(path))
    try:
        hd = HostDump(0, "local", tmp_path / "out" / "host0")
        (hd.folder / "fr").mkdir(parents=True)
        for f in (Path(__file__).parent.parent / "unit" / "data" / "hang" / "fr").iterdir():
            shutil.copy(f, hd.folder / "fr" / f.name)
        text = _analyze_flight_recorder(session, tmp_path / "out", [hd])
    finally:
        session.close()
        dl("down", "--config", path)
    assert "Not all ranks joining collective" in text and "missing ranks: {1}" in text, text
    assert (tmp_path / "out" / "fr_trace.txt").read_text() == text
    assert sorted(p.name for p in (tmp_path / "out" / "fr").iterdir()) == ["rank_0", "rank_1"]
    assert local_containers(job) == []
