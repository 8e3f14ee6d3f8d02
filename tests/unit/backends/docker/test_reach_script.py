"""doctor's reach.sh (backends/docker/scripts) with only some tools on PATH: it must use what is there, say which,
and tell a connection that failed from a tool that failed or is missing (never a network fault for a missing tool).
The same program runs in a job container and on a host; the sim nodes' nc is exercised by the integration tests."""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from dockerlaunch.backends.docker.doctor.observations import parse_reach
from dockerlaunch.backends.docker.doctor.observe import REACH


def tools(tmp_path, *names: str, fake: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose PATH holds only these tools (and fake ones written as shell scripts)."""
    d = tmp_path / "bin"
    d.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = sys.executable if name == "python3" else shutil.which(name)
        assert target, f"{name} is not installed here"
        (d / name).symlink_to(target)
    for name, body in (fake or {}).items():
        (d / name).write_text("#!/bin/sh\n" + body)
        (d / name).chmod(0o755)
    return {"PATH": str(d)}


def reach(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["/bin/sh", "-c", REACH, "sh", *args], capture_output=True, text=True, env=env,
                          timeout=30).stdout


@pytest.fixture
def port():
    """A port with a listener, and one where nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed = free.getsockname()[1]
    free.close()
    yield s.getsockname()[1], closed
    s.close()


def test_python3_connects_and_names_a_refusal(tmp_path, port):
    open_port, closed = port
    got = parse_reach(reach(tools(tmp_path, "python3"), "connect", "127.0.0.1", str(open_port), str(closed)))
    assert got[str(open_port)] == ("ok", "python3", "")
    assert got[str(closed)][:2] == ("fail", "python3") and "refused" in got[str(closed)][2].lower()


def test_bash_with_timeout_connects_without_nc_or_python3(tmp_path, port):
    open_port, closed = port
    got = parse_reach(reach(tools(tmp_path, "bash", "timeout", "tail"), "connect", "127.0.0.1", str(open_port),
                            str(closed)))
    assert got[str(open_port)] == ("ok", "bash", "")
    assert got[str(closed)][:2] == ("fail", "bash") and "refused" in got[str(closed)][2].lower()


def test_an_nc_that_refuses_its_options_is_a_tool_error_not_a_network_fault(tmp_path):
    usage = 'echo "nc: invalid option -- \'z\'" >&2; echo "Usage: nc [OPTIONS] HOST PORT" >&2; exit 1\n'
    refused = 'echo "nc: connect to $4 port $5 (tcp) failed: Connection refused" >&2; exit 1\n'
    got = parse_reach(reach(tools(tmp_path, "grep", "head", fake={"nc": usage}), "connect", "127.0.0.1", "1"))
    assert got["1"][:2] == ("error", "nc") and "invalid option" in got["1"][2]
    got = parse_reach(reach(tools(tmp_path / "b", "grep", "head", fake={"nc": refused}), "connect", "127.0.0.1", "1"))
    assert got["1"] == ("fail", "nc", "nc: connect to 127.0.0.1 port 1 (tcp) failed: Connection refused")


def test_no_tool_says_so(tmp_path):
    env = tools(tmp_path, "bash")  # bash without timeout could wait minutes on a dropped packet: not used
    assert reach(env, "connect", "127.0.0.1", "1").strip() == "reach=none"
    assert parse_reach(reach(env, "connect", "127.0.0.1", "1")) == {}
    assert reach(env, "listen", "5", "1").strip() == "listen=none"


def test_listen_returns_at_once_and_its_pid_ends_the_listeners(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    t0 = time.monotonic()
    out = reach(tools(tmp_path, "python3"), "listen", "60", str(p))
    assert time.monotonic() - t0 < 10, "listen must not wait for its listeners"
    tool, pid = out.strip().removeprefix("listen=").split()
    assert tool == "python3"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", p), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the listener never bound"
                time.sleep(0.05)
    finally:
        os.kill(int(pid), 15)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", p), 1).close()
        except OSError:
            break
        assert time.monotonic() < deadline, "the listener outlived its kill"
        time.sleep(0.05)


@pytest.mark.parametrize("said, killed", [("4242", [["kill", "4242"]]), ("-1", []), ("0", []), ("-9", []),
                                          ("--", []), ("12;reboot", []), ("$(id)", []), ("٤٢", [])])
def test_only_a_pid_the_host_said_for_its_listener_reaches_kill(said, killed):
    """Issue 60, item 10: doctor ended host 0's listeners with `kill <the host's word>`, unchecked: `-1` or `0`
    there signals every process the login may signal, or its group. The listener's word is a pid or nothing
    reaches kill (the listeners end by themselves after LISTEN_TTL_S)."""
    from types import SimpleNamespace

    from dockerlaunch.backends.docker.doctor.observations import HostObservation, Observations
    from dockerlaunch.backends.docker.doctor.observe import CheckContainers, _observe_reach
    from dockerlaunch.job.config import ClusterConfig
    from dockerlaunch.job.plan import make_plan

    config = ClusterConfig.model_validate({"hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:1",
                                           "ssh": {"config_file": None}, "container": {"gpus": "none"}})
    calls: list[list[str]] = []

    class Remote:
        def run(self, argv, timeout=None):
            calls.append(argv)
            if argv[:1] == ["kill"]:
                return SimpleNamespace(ok=True, stdout="", stderr="", exit_status=0)
            if "listen" in argv:  # reach.sh listen, on the host (the image's tools are unknown here)
                return SimpleNamespace(ok=True, stdout=f"listen=nc {said}\n", stderr="", exit_status=0)
            raise ConnectionResetError("the host went away")  # the wait for the listeners to bind

    hosts = [SimpleNamespace(rank=r, remote=Remote(), connected=True) for r in (0, 1)]
    cluster = SimpleNamespace(hosts=hosts, live=hosts)
    obs = [HostObservation(r, f"10.0.0.{r + 1}", docker="24.0.7", image_id="sha256:" + "a" * 64, listening={22})
           for r in (0, 1)]
    with pytest.raises(ConnectionResetError):
        _observe_reach(cluster, make_plan(config), Observations("10.0.0.1", obs), CheckContainers(), None)
    assert [c for c in calls if c[:1] == ["kill"]] == killed
