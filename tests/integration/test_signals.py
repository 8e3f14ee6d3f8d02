"""A signal that comes twice, 10 ms apart, to `up` (attached), `logs --follow` and `push` on a real 2-node sim
cluster: one line, 143 / 130, no traceback, nothing left running (issue 60, item 11).

Quoted: `timeout 60 dockerlaunch logs --follow --name dga` ended in `Traceback ... dockerlaunch.errors.Terminated:
15`, raised inside the handler's own `terminated (SIGTERM)` line. coreutils' `timeout` signals the command and then
its process group; a terminal's Ctrl-C reaches the whole foreground group, twice for a double Ctrl-C. Here SIGTERM
goes as `timeout` sends it (the command, then its group), SIGINT as a terminal does (the group, twice). Each command
leads a session of its own, so its group holds only it and what it started."""

import os
import queue
import re
import signal
import subprocess
import time

import pytest

from tests.integration.helpers import dl, job_name, start_cli, until, wait_for_ready

pytestmark = pytest.mark.integration

SIGNALS = [pytest.param(signal.SIGTERM, 143, "terminated", id="SIGTERM"),
           pytest.param(signal.SIGINT, 130, "interrupted", id="SIGINT")]


def start(*args: str) -> tuple[subprocess.Popen, "queue.Queue[str]", list[str]]:
    """The CLI in the background, leading a session of its own (`timeout` and a terminal signal its group)."""
    return start_cli(*args, new_session=True)


def twice(p: subprocess.Popen, sig: int) -> None:
    """The signal twice, 10 ms apart: SIGTERM as `timeout` sends it (the command, then its process group), SIGINT
    as a terminal's double Ctrl-C (the group both times)."""
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)
    else:
        os.kill(p.pid, sig)
    time.sleep(0.01)
    os.killpg(p.pid, sig)


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, parent, session) of a process, None once it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[3])


def descendants(pid: int) -> set[int]:
    """The processes `pid` started, and theirs (ssh, docker save, zstd, the registry)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(d)) is not None:
            parents[int(d)] = st[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def left_running(pid: int, before: set[int]) -> list[str]:
    """What of the command still runs after it exited: its session's processes, and those it had started."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(d)) is not None and st[0] != "Z" and (st[2] == pid or int(d) in before):
            try:
                out.append(f"{d}: {open(f'/proc/{d}/cmdline').read().replace(chr(0), ' ')[:200]}")
            except OSError:
                pass
    return out


def end_after(p: subprocess.Popen, sig: int, seen: list[str], timeout: float = 60) -> tuple[str, list[str]]:
    """The signal twice; the command's whole output once it exited, and what of it was left running."""
    before = descendants(p.pid)
    twice(p, sig)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {timeout:.0f} s after two {signal.Signals(sig).name}s:\n"
                             + "".join(seen)[-3000:]) from None
    time.sleep(0.3)  # the pump's last lines
    until(lambda: not left_running(p.pid, before), 5)  # a child that ends with its parent has a moment to
    return "".join(seen), left_running(p.pid, before)


def judge(out: str, p: subprocess.Popen, sig: int, code: int, word: str) -> None:
    assert p.returncode == code, (p.returncode, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    said = [line for line in out.splitlines() if re.search(word, line)]
    assert len(said) == 1, f"{signal.Signals(sig).name} said {len(said)} times:\n{out[-3000:]}"


@pytest.mark.parametrize("sig, code, word", SIGNALS)
def test_up_attached_signalled_twice_tears_down_once(sim_cluster, job_containers, sig, code, word):
    job = job_name()
    p, lines, seen = start("up", "--skip-preflight", "--config", str(sim_cluster[1]), "--name", job, "--",
                           "sh", "-c", 'echo "ready $NODE_RANK"; sleep 600')
    try:
        assert wait_for_ready(lines, {"0", "1"}, 120) == {"0", "1"}, "".join(seen)[-3000:]
        assert len(job_containers(job)) == 2
        out, left = end_after(p, sig, seen)
        judge(out, p, sig, code, word)
        assert re.search(rf"\] ({word}): stopping and removing job containers on 2 host", out), out[-3000:]
        assert job_containers(job) == []
        assert left == [], left
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        dl("down", "--config", str(sim_cluster[1]), "--name", job)


def docker_logs_on(remote, job: str) -> list[str]:
    """`docker logs` clients on the host that follow the job's containers."""
    r = remote.run(["pgrep", "-af", f"docker logs .*{job}-"])
    assert r.exit_status in (0, 1), r.stderr
    return [line for line in r.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.parametrize("sig, code, word", SIGNALS)
def test_logs_follow_signalled_twice_ends_in_one_line(sim_cluster, remotes, sig, code, word):
    cfg = str(sim_cluster[1])
    job = job_name()
    r = dl("up", "--skip-preflight", "--detach", "--config", cfg, "--name", job, "--",
           "sh", "-c", 'while true; do echo "tick $NODE_RANK"; sleep 0.2; done')
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    p = None
    try:
        p, lines, seen = start("logs", "--follow", "--config", cfg, "--name", job)
        ticks: set[str] = set()
        deadline = time.monotonic() + 60
        while ticks != {"0", "1"} and time.monotonic() < deadline:
            try:
                m = re.search(r"tick (\d)$", lines.get(timeout=0.5).strip())
            except queue.Empty:
                continue
            if m:
                ticks.add(m.group(1))
        assert ticks == {"0", "1"}, "".join(seen)[-3000:]
        out, left = end_after(p, sig, seen)
        judge(out, p, sig, code, word)
        assert left == [], left
        assert until(lambda: not any(docker_logs_on(rm, job) for rm in remotes), 15) is not None, \
            [docker_logs_on(rm, job) for rm in remotes]
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        dl("down", "--config", cfg, "--name", job)


def docker_loads_on(remote) -> list[str]:
    r = remote.run(["pgrep", "-af", "^docker load"])
    assert r.exit_status in (0, 1), r.stderr
    return r.stdout.splitlines()


@pytest.mark.parametrize("sig, code, word", SIGNALS)
def test_push_signalled_twice_mid_stream_ends_in_one_line(sim_cluster, engine, remotes, fresh_image, sig, code,
                                                         word):
    """A fresh image on its way to both nodes when the signals come: no load outlives the push, no tag is set."""
    ref = fresh_image(mb=300)
    p = None
    try:
        p, _, seen = start("push", ref, "--config", str(sim_cluster[1]))
        loading = until(lambda: p.poll() is not None or all(docker_loads_on(rm) for rm in remotes), 120, 0.05)
        assert loading is not None and p.poll() is None, "".join(seen)[-3000:]
        out, left = end_after(p, sig, seen)
        judge(out, p, sig, code, word)
        assert left == [], left
        assert until(lambda: not any(docker_loads_on(rm) for rm in remotes), 30) is not None, \
            [docker_loads_on(rm) for rm in remotes]
        tagged = [rm.run(["docker", "image", "inspect", ref]).ok for rm in remotes]
        assert tagged == [False, False], (tagged, out[-2000:])
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", ref])
