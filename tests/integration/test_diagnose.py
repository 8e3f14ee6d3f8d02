"""Diagnostics on a real 3-node sim cluster: `dump` of a hung gloo job, `transport` and `up`'s transport lines
from real NCCL log lines (recorded on H200s: the CPU nodes cannot make them), `commtest` and `--pairwise`."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from dockerlaunch import sim
from dockerlaunch.job.load import load_config

from .conftest import _inside_nodes, _leftovers
from .helpers import containers_on, dl, job_name, start_up, stop_up, wait_for_ready

DATA = Path(__file__).parent.parent / "unit" / "data"

HANG = """\
import os, time
import torch
import torch.distributed as dist


def wait_for_peers(x):
    dist.all_reduce(x)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(4)
    wait_for_peers(x)
    os.write(1, f"ready {rank}\\n".encode())
    if rank == int(os.environ["ODD_RANK"]):
        time.sleep(3600)
    wait_for_peers(x)


main()
"""
HANG_LINE = next(i + 1 for i, line in enumerate(HANG.splitlines()) if "time.sleep" in line)
TORCHRUN = ('torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" '
            '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" /tmp/hang.py')


def with_file(path: str, text: str, then: str) -> str:
    """A shell command that writes `text` to `path` in the container, then runs `then`."""
    return f"printf %s {shlex.quote(text)} > {path} && {then}"


@pytest.fixture(scope="module")
def trio(sim_cluster, engine, demo_image, tmp_path_factory):
    """A 3-node cluster of its own (the session's has 2): yields (name, config path, layout, remotes)."""
    from dockerlaunch.hosts.ssh import Remote
    from dockerlaunch.hosts.targets import resolve_target

    name = f"dld{os.getpid()}"
    subnet = f"172.31.{100 + os.getpid() % 100}.0/24"
    config_path = tmp_path_factory.mktemp("trio") / "cluster.yaml"
    sim.create(nodes=3, cluster=name, subnet=subnet, config_out=str(config_path), seed_images=(demo_image,))
    cfg = load_config(str(config_path))
    remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
    try:
        yield name, str(config_path), sim.node_layout(name, 3, subnet), remotes
        assert _inside_nodes(engine, name) == []
    finally:
        for r in remotes:
            r.close()
        sim.remove(name)
        assert _leftovers(engine, name) == []


@pytest.mark.parametrize("diagnostics", [True, False], ids=["py-spy-in-image", "sidecar"])
def test_dump_names_the_rank_that_is_elsewhere(trio, demo_image, tmp_path, diagnostics):
    """With py-spy in the image, dump uses it; without (the job deletes it from its own container, and runs
    without SYS_PTRACE), dockerlaunch's own py-spy runs in a sidecar that joins the rank's PID namespace."""
    _, config, layout, remotes = trio
    job = job_name()
    odd = 3  # the second process on host 1
    run = with_file("/tmp/hang.py", HANG, TORCHRUN)
    p, lines, seen = start_up("--config", config, "--image", demo_image, "--name", job, "--nproc-per-node", "2",
                              "--skip-preflight", "--env", f"ODD_RANK={odd}",
                              *([] if diagnostics else ["--no-diagnostics"]),
                              "--", "sh", "-c", run if diagnostics else f"rm /opt/venv/bin/py-spy && {run}")
    try:
        ready = wait_for_ready(lines, {str(r) for r in range(6)}, timeout=240)
        assert ready == {str(r) for r in range(6)}, "".join(seen)[-3000:]
        out = tmp_path / "dump"
        r = dl("dump", "--config", config, "--name", job, "--out", str(out), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        said = r.stdout.replace("\n", " ")
        assert re.search(r"5 ranks \(0-2,4-5\) in all_reduce at hang\.py:\d+ \(in wait_for_peers\)", said), said
        assert f"odd one out: rank {odd} ({layout[1].ip}) in main at hang.py:{HANG_LINE}" in said, said
        if diagnostics:
            assert "py-spy: the image's own" in said, said
        else:
            assert "py-spy: dockerlaunch's own, in a sidecar container" in said, said
        summary = (out / "summary.txt").read_text()
        assert f"odd one out: rank {odd}" in summary
        dumped = out / f"host1-{layout[1].ip}" / f"rank{odd}.pyspy.txt"
        assert "time.sleep" not in dumped.read_text() and f"main (hang.py:{HANG_LINE})" in dumped.read_text()
        assert sorted(x.name for x in out.glob("host*/rank*.pyspy.txt")) == [f"rank{i}.pyspy.txt" for i in range(6)]
        # the sidecar is gone; the job's containers are all still there (dump changes nothing)
        for remote in remotes:
            ps = remote.run(["docker", "ps", "-a", "--filter", "label=dockerlaunch.dump", "--format", "{{.Names}}"])
            assert ps.ok and ps.stdout.strip() == "", ps.stdout
        assert all(containers_on(remote, job) for remote in remotes)
    finally:
        stop_up(p)
        dl("down", "--config", config, "--name", job)
    assert not any(containers_on(remote, job) for remote in remotes)


def test_dump_of_a_job_that_is_not_running_says_so(trio, tmp_path):
    _, config, _, _ = trio
    r = dl("dump", "--config", config, "--name", job_name(), "--out", str(tmp_path / "d"))
    assert r.returncode == 1 and "no container" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr


def recorded_socket_log() -> str:
    """NCCL's own lines from the 2 x H200 recording where same-host ranks talk through NET/Socket (both processes
    in one file: the parser splits them by their `host:pid` prefix)."""
    return "".join(p.read_text() for p in sorted((DATA / "nccl" / "socket").glob("*.log")))


def test_up_prints_the_transport_and_warns_and_transport_reads_it_after(trio, demo_image):
    """The job writes recorded NCCL lines where NCCL_DEBUG_FILE points, as NCCL would; `up`'s watcher must find
    them within its window and say what they mean, and `transport` must read them once the job is gone."""
    _, config, layout, remotes = trio
    job = job_name()
    # where NCCL would write: NCCL_DEBUG_FILE with its %h and %p filled in
    write = ('f=$(printf %s "$NCCL_DEBUG_FILE" | sed "s/%h/$(hostname)/; s/%p/1/") && cat /tmp/nccl.log > "$f" '
             '&& sleep 12')
    r = dl("up", "--config", config, "--image", demo_image, "--name", job, "--skip-preflight", "--hosts",
           layout[0].ip, "--", "sh", "-c", with_file("/tmp/nccl.log", recorded_socket_log(), write), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"transport rank 0 ({layout[0].ip}): network Socket (eth0); GDRDMA no; intra-host NET/Socket"
            in r.stdout), r.stdout
    assert "WARN" in r.stdout and "ranks on this host talk through the network" in r.stdout, r.stdout

    t = dl("transport", "--config", config, "--name", job, "--hosts", layout[0].ip, "--output", "json")
    assert t.returncode == 0, t.stdout + t.stderr
    data = json.loads(t.stdout)
    assert data["hosts"][0]["transport"]["intra"] == ["NET/Socket"], data
    assert "talk through the network" in data["findings"][0]["message"], data

    # the next `up` of the job starts from an empty folder: old lines would mislead
    r = dl("up", "--config", config, "--image", demo_image, "--name", job, "--skip-preflight", "--hosts",
           layout[0].ip, "--", "true", timeout=300)
    assert r.returncode == 0 and "transport rank" not in r.stdout, r.stdout
    ls = remotes[0].run(["sh", "-c", f"ls /var/tmp/dockerlaunch/{job}/nccl | wc -l"])
    assert ls.ok and ls.stdout.strip() == "0", ls.stdout
    dirs = remotes[0].run(["ls", f"/var/tmp/dockerlaunch/{job}"])
    assert dirs.stdout.split() == ["fr", "fr-pipe", "nccl"], dirs.stdout


def test_transport_of_a_gloo_job_says_there_is_nothing(trio):
    _, config, _, _ = trio
    r = dl("transport", "--config", config, "--name", job_name())
    assert r.returncode == 0 and "no NCCL transport lines" in r.stdout, r.stdout + r.stderr


def test_commtest_on_two_hosts_prints_the_table_and_a_verdict(trio, demo_image):
    _, config, layout, remotes = trio
    hosts = f"{layout[0].ip},{layout[1].ip}"
    r = dl("commtest", "--config", config, "--hosts", hosts, "--image", demo_image, "--sizes", "1M:4M",
           timeout=300)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "commtest: gloo all_reduce (float32, sum), 2 host(s), 2 rank(s)" in r.stdout, r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"^\s*[124]M\s+\d+\s+float\s", line)]
    assert [row[0] for row in rows] == ["1M", "2M", "4M"], r.stdout
    assert all(row[-1] == "0" and float(row[-2]) > 0 for row in rows)  # no wrong results, a bandwidth
    verdict = re.search(r"\] (PASS|WARN|FAIL): busbw [\d.]+ GB/s at 4M is \d+% of the 1\.25 GB/s that 10 Gb/s eth0",
                        r.stdout)
    assert verdict, r.stdout
    assert r.returncode == (1 if verdict[1] == "FAIL" else 0)
    job = load_config(config).job.name + "-commtest"
    assert not any(containers_on(remote, job) for remote in remotes)


def test_pairwise_names_the_host_in_every_slow_pair(trio, demo_image):
    name, config, layout, _ = trio
    sim.shape(name, "100mbit", nodes=[3])
    try:
        r = dl("commtest", "--config", config, "--image", demo_image, "--sizes", "4M", "--pairwise", timeout=600)
    finally:
        sim.shape(name, None)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"slow: host 2 ({layout[2].ip}) is in every slow pair" in r.stdout, r.stdout
    assert len(re.findall(r"^\s*\d-\d\s", r.stdout, re.M)) == 3, r.stdout


def test_bad_sizes_are_refused_before_any_host_is_touched(trio):
    _, config, _, _ = trio
    r = dl("commtest", "--config", config, "--sizes", "1G:1M")
    assert r.returncode == 2 and "--sizes 1G:1M" in r.stderr and "Traceback" not in r.stderr, r.stderr


class _Payload:
    """A flight-recorder "dump" whose unpickling runs code: what a local user who can write the fr folder plants."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


def test_a_planted_flight_recorder_pickle_runs_with_nothing_to_reach(trio, demo_image, tmp_path):
    """issue 42, finding 3: fr_trace unpickles every rank_* file dump fetched; one planted beside the real ones must
    find no job secret in its environment, no network and no writable file system (it ran in dump's sandbox, not in
    rank 0's container)."""
    import pickle

    _, config, layout, remotes = trio
    job = job_name()
    secret = "s3cret-" + job
    run = with_file("/tmp/hang.py", HANG, TORCHRUN)
    p, lines, seen = start_up("--config", config, "--image", demo_image, "--name", job, "--nproc-per-node", "1",
                              "--skip-preflight", "--env", "ODD_RANK=1", "--env", f"DL_SECRET_MARK={secret}",
                              "--", "sh", "-c", run)
    try:
        ready = wait_for_ready(lines, {"0", "1", "2"}, timeout=240)
        assert ready == {"0", "1", "2"}, "".join(seen)[-3000:]
        code = ("import os, socket\n"
                "print('PAYLOAD-RAN secret=' + str(os.environ.get('DL_SECRET_MARK')))\n"
                f"try:\n    socket.create_connection(('{layout[0].ip}', 22), 3); print('PAYLOAD-NET-OK')\n"
                "except Exception as e:\n    print('PAYLOAD-NET-FAIL', type(e).__name__)\n"
                "try:\n    open('/fr/written', 'w').write('x'); print('PAYLOAD-WROTE')\n"
                "except Exception as e:\n    print('PAYLOAD-NO-WRITE', type(e).__name__)\n")
        blob = pickle.dumps(_Payload(code))
        fr = f"/var/tmp/dockerlaunch/{job}/fr"
        remotes[0].check(["sh", "-c", 'mkdir -p "$1" && cat > "$1/rank_99"', "sh", fr], "planting", stdin=blob)
        out = tmp_path / "dump"
        r = dl("dump", "--config", config, "--name", job, "--out", str(out), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        analysis = (out / "fr_trace.txt").read_text()
        assert "PAYLOAD-RAN secret=None" in analysis, analysis[-3000:]  # it ran, and saw none of the job's env
        assert secret not in analysis and secret not in r.stdout
        assert "PAYLOAD-NET-FAIL" in analysis and "PAYLOAD-NET-OK" not in analysis
        assert "PAYLOAD-NO-WRITE" in analysis
        for remote in remotes:  # the sandbox is gone
            ps = remote.run(["docker", "ps", "-a", "--filter", "label=dockerlaunch.dump", "--format", "{{.Names}}"])
            assert ps.ok and ps.stdout.strip() == "", ps.stdout
    finally:
        stop_up(p)
        dl("down", "--config", config, "--name", job)


# the process's own peak RSS: VmHWM of its address space. Not getrusage's ru_maxrss, which Linux carries over
# from the address space exec replaced, here the forked (or vfork-shared) pytest process: after a few hundred
# tests it read 511 MB for a dump whose own peak was under 80 MB
PEAK = ("import atexit, re, sys\n"
        "atexit.register(lambda: print('peak-rss-kb ' + re.search(r'VmHWM:\\s+(\\d+)', "
        "open('/proc/self/status').read()).group(1), file=sys.stderr))\n"
        "from dockerlaunch.cli.main import main\nmain(sys.argv[1:])\n")


def test_dump_keeps_one_budget_across_hosts_on_disk_and_caps_what_it_prints(sim_cluster, demo_image, remotes,
                                                                             tmp_path):
    """issue 50, findings 6 and 3, through a real `dump` of a sim job: host 1's 300 MB of NCCL logs are past the
    dump's budget (200 MB, lowered for the test) and stay there, host 0's flight-recorder file comes; the launcher
    never holds the files (its peak RSS stays far below them); fr_trace's sandbox prints 3 MB with terminal
    controls, of which 1 MB is kept and none reaches the terminal as controls or as a line longer than the cap."""
    import pickle
    import subprocess
    import sys

    from dockerlaunch.cli.diagnose import PRINTED_CHARS
    from dockerlaunch.diagnostics.dump import BUDGET_ENV, FR_TRACE_KEEP

    config = str(sim_cluster[1])
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", config, "--image", demo_image, "--name", job, "--",
           "sh", "-c", "sleep 600")
    assert r.returncode == 0, r.stderr
    try:
        where = f"/var/tmp/dockerlaunch/{job}"
        flood = "import sys\nsys.stdout.write('\\x1b[2K\\x1b[1A[bold]PASS' + 'x' * 3_000_000 + '\\n')\n"
        remotes[0].check(["sh", "-c", 'mkdir -p "$1" && cat > "$1/rank_0"', "sh", f"{where}/fr"], "planting",
                         stdin=pickle.dumps(_Payload(flood)))
        remotes[1].check(["sh", "-c", 'for i in 1 2 3; do head -c 100M /dev/urandom > "$1/big$i.log" || exit 1; '
                          'done', "sh", f"{where}/nccl"], "300 MB of NCCL logs")
        out = tmp_path / "dump"
        r = subprocess.run([sys.executable, "-c", PEAK, "dump", "--config", config, "--name", job, "--out",
                            str(out)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, BUDGET_ENV: "200M"})
        peak_mb = int(re.findall(r"peak-rss-kb (\d+)", r.stderr)[-1]) // 1024
        print(f"\n[dump] peak RSS {peak_mb} MB with 300 MB of logs on host 1")
        assert peak_mb < 200, (peak_mb, r.stdout[-2000:])
        said = r.stdout.replace("\n", " ")
        assert "past what is left of this dump's 200 MB for all hosts" in said, said[-3000:]
        assert not list(out.glob("host1-*/nccl/big*")) and list(out.glob("host0-*/fr/rank_0")), said[-3000:]
        kept = (out / "fr_trace.txt").read_text()
        assert len(kept) <= FR_TRACE_KEEP + 300 and "bytes more: cut at 1 MB" in kept, kept[-300:]
        assert "\x1b" not in r.stdout and "\x9b" not in r.stdout, repr(r.stdout[:500])
        assert max(len(x) for x in r.stdout.splitlines()) <= PRINTED_CHARS + 120, r.stdout[:3000]
    finally:
        dl("down", "--config", config, "--name", job)
        for remote in remotes:
            remote.run(["rm", "-rf", f"/var/tmp/dockerlaunch/{job}"])
