"""The concurrent host map: per-host outcomes, and interrupts that are never swallowed."""

import threading
import time

import pytest

from dockerlaunch.errors import DockerlaunchError, HostError, SSHError
from dockerlaunch.hosts.fleet import Outcomes, each


def test_outcomes_keep_order_values_and_errors():
    def fn(i):
        if i == 2:
            raise HostError(f"h{i}", "boom", step="probing", exit_status=3)
        time.sleep(0.01 * (5 - i))  # finish out of order
        return i * 10

    out = each(fn, [0, 1, 2, 3])
    assert [o.item for o in out] == [0, 1, 2, 3]
    assert [o.value for o in out.ok] == [0, 10, 30]
    [bad] = out.failed
    assert bad.item == 2 and isinstance(bad.error, HostError) and bad.error.exit_status == 3
    assert str(bad.error) == "host h2: probing failed: boom" and bad.error.reason == "probing failed: boom"
    with pytest.raises(HostError, match="host h2: probing failed: boom"):
        out.raise_first()


def test_raise_first_joins_several_failures_and_returns_values_when_all_ok():
    assert each(lambda i: i + 1, [1, 2]).raise_first() == [2, 3]
    out = each(lambda i: (_ for _ in ()).throw(SSHError(f"h{i}", "down")), [1, 2])
    with pytest.raises(DockerlaunchError, match="host h1: down; host h2: down"):
        out.raise_first()
    assert len(Outcomes()) == 0 and each(lambda i: i, []).raise_first() == []


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_host_step_reaches_the_caller(exc):
    """A Ctrl-C must stop the command, not become one host's result (the job would start anyway)."""
    def fn(i):
        if i == 1:
            raise exc()
        return i

    with pytest.raises(exc):
        each(fn, [0, 1, 2])


def test_an_interrupt_does_not_wait_for_slow_hosts():
    release = threading.Event()

    def fn(i):
        if i == 0:
            raise KeyboardInterrupt()
        release.wait(30)  # a host that hangs
        return i

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        each(fn, [0, 1])
    assert time.monotonic() - t0 < 5
    release.set()


def test_host_errors_survive_pickling_for_process_pools():
    import pickle

    e = pickle.loads(pickle.dumps(SSHError("h", "gone", step="connect", exit_status=255)))
    assert isinstance(e, SSHError) and str(e) == "host h: connect failed: gone" and e.exit_status == 255


def test_open_files_are_raised_for_many_hosts_or_the_limit_is_named():
    """256 hosts need more than `ulimit -n`'s usual 1024: the soft limit is raised where the hard limit allows,
    and a hard limit too low is one line that says what to raise (run in a child: limits are per process)."""
    import subprocess
    import sys

    code = """
import resource, sys
from dockerlaunch.hosts.fleet import ensure_open_files
from dockerlaunch.errors import DockerlaunchError
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
ensure_open_files(300)
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))
try:
    ensure_open_files(300)
except DockerlaunchError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    raised, error = r.stdout.splitlines()
    assert int(raised) == 64 + 3 * 300
    assert error.startswith("300 hosts need about 964 open files, and this shell allows 512 (ulimit -Hn)"), error


def test_a_typo_among_300_hosts_or_one_host_listed_twice_is_one_line_before_any_connection():
    from dockerlaunch.hosts.fleet import check_addresses
    from dockerlaunch.hosts.targets import SSHTarget

    def t(alias, hostname=None, port=22, jumps=()):
        return SSHTarget(alias=alias, hostname=hostname or alias, user="u", port=port, jumps=jumps)

    fleet = [t(f"10.1.{i // 250}.{i % 250 + 1}") for i in range(300)]
    check_addresses(fleet)
    fleet[117] = t("gpu-17x.invalid")
    with pytest.raises(DockerlaunchError) as e:
        check_addresses(fleet)
    msg = str(e.value)
    assert msg.startswith("1 of 300 host(s) cannot be resolved: 'gpu-17x.invalid': ") and "\n" not in msg, msg
    assert msg.endswith("fix the host list or ~/.ssh/config (nothing was started)"), msg
    # an ~/.ssh/config alias and the name it stands for
    with pytest.raises(DockerlaunchError, match=r"hosts\[0\] 'gpu1' and hosts\[1\] 'g1' are the same host "
                                                r"\(10.9.0.1:22 after ~/.ssh/config\): list each host once"):
        check_addresses([t("gpu1", "10.9.0.1"), t("g1", "10.9.0.1")])
    # a name and its address, found by DNS
    with pytest.raises(DockerlaunchError, match=r"'localhost' and hosts\[1\] '127.0.0.1' are the same host"):
        check_addresses([t("localhost"), t("127.0.0.1")])
    # the same address on another port is another sshd (a sim, a container host); behind a jump host, names are
    # the jump host's to resolve
    check_addresses([t("10.9.0.1"), t("10.9.0.1b", "10.9.0.1", port=2222)])
    check_addresses([t("inner", "gpu-behind-the-bastion", jumps=(t("bastion"),))])


def _local():
    from dockerlaunch.hosts.local import LocalRemote
    from dockerlaunch.hosts.targets import SSHTarget

    return LocalRemote(SSHTarget("local", "localhost", "root", local=True))


def test_steps_keep_each_commands_status_and_output_and_stop_at_the_first_failure(tmp_path):
    """`up`'s one round trip per host before its start: every step's own result; nothing after a failed step."""
    mark = tmp_path / "ran"
    results = _local().run_steps([
        ["printf", "a\nb"],  # no final newline
        "echo err >&2; printf '%s\\n' 'x y' '@dl-step 0 9 9'",  # a script, output that looks like a frame
        ["sh", "-c", "printf '\\377\\n'; exit 3"],
        ["touch", str(mark)],
    ])
    assert [(r.exit_status, r.stdout, r.stderr) for r in results[:3]] == [
        (0, "a\nb", ""), (0, "x y\n@dl-step 0 9 9\n", "err\n"), (3, "\ufffd\n", "")]
    assert results[3] is None and not mark.exists()


def test_steps_read_no_input_and_a_batch_that_cannot_run_is_the_first_steps_failure(tmp_path, monkeypatch):
    r = _local()
    [res] = r.run_steps([["sh", "-c", "cat; echo done"]])
    assert (res.exit_status, res.stdout) == (0, "done\n")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))  # the host's shell cannot make its scratch folder
    first, second = r.run_steps([["true"], ["true"]])
    assert first.exit_status == 125 and "missing" in first.last_line() and second is None


def test_parse_steps_stops_at_a_cut_frame():
    from dockerlaunch.hosts.ssh import parse_steps

    out = b"@dl-step 0 2 1\nokE@dl-step 1 5 0\nabc"
    first, second = parse_steps(out, 2)
    assert (first.exit_status, first.stdout, first.stderr) == (0, "ok", "E") and second is None
    assert parse_steps(b"garbage\n", 1) == [None] and parse_steps(b"", 3) == [None] * 3


def test_what_a_login_file_prints_before_the_steps_is_not_a_step():
    """Debian's bash reads ~/.bashrc for an SSH command: a line it prints comes before the first frame (issue 50:
    it made `up` a traceback)."""
    from dockerlaunch.hosts.ssh import parse_steps

    [first] = parse_steps(b"gpus=8\nwelcome @dl-step\n@dl-step 0 2 0\nok", 1)
    assert (first.exit_status, first.stdout) == (0, "ok")


def test_up_says_where_its_time_went():
    from dockerlaunch.backends.docker.session import Phases

    p = Phases()
    p.last -= 3.0
    p.done("connect")
    p.last -= 0.01  # under 0.05 s: not worth a word
    p.done("plan")
    p.last -= 2.0
    p.done("start")
    text = str(p)
    assert text.startswith("5.0s (connect 3.0s, start 2.0s") and "plan" not in text, text


def test_a_command_resolves_its_hosts_once(monkeypatch):
    """`up`, `doctor` and `render --probe` resolve the hosts' SSH targets once, to plan from, and connect to those
    (Fleet.connect's `targets`); `up` keeps them for every attempt until a spare replaces a host. Without them,
    Fleet.connect resolves once itself (~/.ssh/config read once for the settings check and the targets)."""
    from dockerlaunch.backends.docker import up as uplib
    from dockerlaunch.hosts import fleet as fleetlib
    from dockerlaunch.hosts import targets as targetslib
    from dockerlaunch.hosts.fleet import Fleet, Host
    from dockerlaunch.job.config import ClusterConfig
    from dockerlaunch.reporting import Reporter

    cfg = ClusterConfig.model_validate({"hosts": ["local", "local"], "image": "img:1", "ssh": {"config_file": None}})
    given = targetslib.resolve_all(cfg)
    resolved, loaded = [], []
    resolve, load = targetslib.resolve_target, targetslib.load_ssh_config
    monkeypatch.setattr(targetslib, "resolve_target", lambda *a, **k: resolved.append(a[0]) or resolve(*a, **k))
    monkeypatch.setattr(fleetlib, "load_ssh_config", lambda *a: loaded.append(a) or load(*a))
    with Fleet.connect(cfg, targets=given) as fleet:
        assert fleet.targets == given and resolved == []
    with Fleet.connect(cfg) as fleet:
        assert fleet.targets == given and len(resolved) == 2 and len(loaded) == 2
    with pytest.raises(ValueError):
        Fleet.connect(cfg, targets=given[:1])

    asked = []

    def connect(config, *, require_all=True, targets=None):
        asked.append(targets)  # then no host answers: the attempt stops before anything starts
        return Fleet(config, [Host(i, h.address, t) for i, (h, t) in enumerate(zip(config.hosts, given))])

    monkeypatch.setattr(uplib.Fleet, "connect", connect)
    kept: list = []
    for _ in range(2):
        outcome = uplib._attempt(cfg, None, 0, Reporter(), detach=False, keep=False, preflight=False, run=None,
                                 secrets_blob=b"", monitors=(), hooks=uplib.Hooks(), fresh=set(), targets=kept)
        assert isinstance(outcome, uplib.Replace)
    assert asked == [None, given] and kept == given  # resolved by the first attempt, kept for the next
