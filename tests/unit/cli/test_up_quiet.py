"""`up` prints its pre-flight quietly: only the rows that did not pass and one count line; `-v` the whole table.
Every cell and line goes through host_text."""

import io

from rich.console import Console

from dockerlaunch.backends.docker.doctor.report import FAIL, PASS, SKIP, WARN, Report
from dockerlaunch.cli.jobs import UpReporter, _states


def _printed(report: Report, verbose: bool = False) -> list[str]:
    buf = io.StringIO()
    rep = UpReporter(verbose)
    rep.out = Console(file=buf, width=100, color_system=None, highlight=False)
    rep.preflight(report, 2, 1.8)
    return buf.getvalue().splitlines()


def _healthy() -> Report:
    r = Report()
    for host in ("10.0.0.1", "10.0.0.2"):
        for name in ("ssh", "docker", "image", "route", "shm", "nofile", "mounts", "hubs", "disk", "clock", "x", "y"):
            r.add(host, name, PASS, "fine")
        r.add(host, "gpus", SKIP, "the job asks for no GPUs")
    return r


def test_a_healthy_preflight_is_one_line():
    assert _printed(_healthy()) == ["[dockerlaunch] doctor: 24 PASS, 2 SKIP on 2 hosts in 1.8 s (-v: every check)"]


def test_verbose_prints_every_row():
    out = _printed(_healthy(), verbose=True)
    assert len(out) == 2 * 13 + 2 and out[-1].startswith("doctor: 24 PASS"), out  # header, rows, summary


def test_only_rows_that_did_not_pass_are_shown_and_host_text_is_escaped():
    r = _healthy()
    r.add("10.0.0.2", "disk", WARN, "12 GB free\x1b[2J")
    r.add("10.0.0.2", "image", FAIL, "x:1 is missing")
    out = _printed(r)
    assert len(out) == 4, out  # header, the WARN, the FAIL, the count
    assert out[0].split() == ["host", "check", "verdict", "reason"]
    assert "WARN" in out[1] and "12 GB free^[[2J" in out[1] and "\x1b" not in "".join(out)
    assert "FAIL" in out[2] and "x:1 is missing" in out[2]
    assert out[3] == "[dockerlaunch] doctor: 24 PASS, 1 WARN, 1 FAIL, 2 SKIP on 2 hosts in 1.8 s (-v: every check)"


def test_a_long_status_line_is_not_wrapped():
    buf = io.StringIO()
    rep = UpReporter()
    rep.out = Console(file=buf, width=80, color_system=None)
    rep.say("started 2 container(s) in 2.0s (" + "x" * 150 + "); logs: dockerlaunch-logs/a-20261126-154334/")
    assert len(buf.getvalue().splitlines()) == 1


def test_ps_state_column():
    from types import SimpleNamespace

    def job(*states):
        return SimpleNamespace(containers=[(f"h{i}", SimpleNamespace(state=s)) for i, s in enumerate(states)])

    assert _states(job("running")) == "running"
    assert _states(job("running", "running")) == "running (all 2)"
    assert _states(job("running", "exited 3")) == "running, exited 3"
    assert _states(job(*["running"] * 6, "exited 1")) == "6 running, 1 exited 1"


def test_a_rows_command_is_printed_whole_under_the_table():
    """Quoted: commands inside table cells wrapped (`ssh-keyscan -H` / `172.30.10.12 >> KNOWN_HOSTS_FILE`)."""
    from dockerlaunch.hosts.targets import known_hosts_fix

    r = _healthy()
    kh = "/home/someone/with a long path/.ssh/known_hosts"
    r.add("172.30.10.12", "ssh", FAIL, "host key unknown; " + known_hosts_fix(kh, [("172.30.10.12", 22, "root")]))
    fix = "fix: dockerlaunch push myteam/train:v3 --config /home/someone/train/dockerlaunch.yaml"
    r.add("10.0.0.1", "image", FAIL, f"myteam/train:v3 is missing here; {fix}")
    r.add("10.0.0.2", "image", FAIL, f"myteam/train:v3 is missing here; {fix}")
    buf = io.StringIO()
    rep = UpReporter()
    rep.out = Console(file=buf, width=80, color_system=None, highlight=False)
    rep.preflight(r, 2, 1.8)
    out = buf.getvalue().splitlines()
    keyscan = f"ssh-keyscan -H 172.30.10.12 >> '{kh}'"
    below = [line for line in out if line.startswith("[")][:-1]
    assert below == ["[1] ssh-keyscan -H 172.30.10.12 | ssh-keygen -lf -",
                     "[2] ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub", f"[3] {keyscan}",
                     f"[4] ssh -o UserKnownHostsFile='{kh}' root@172.30.10.12", f"[5] {fix.removeprefix('fix: ')}"], out
    table = "\n".join(out[:out.index(below[0])])
    assert "ssh-keyscan" not in table and "fix: [5]" in table and table.count("[5]") == 2, table  # one number each


def test_pull_commands_takes_fixes_and_backticked_commands_and_leaves_words():
    from dockerlaunch.cli.console import pull_commands

    found: dict[str, int] = {}
    text = ("lower it (`ulimit -Hn` where dockerd runs) under `hosts:`; fix: dockerlaunch down --name 'a;b)' "
            "--config /c.yaml")
    assert pull_commands(text, found) == "lower it ([1] where dockerd runs) under `hosts:`; fix: [2]"
    assert found == {"ulimit -Hn": 1, "dockerlaunch down --name 'a;b)' --config /c.yaml": 2}
    assert pull_commands("(fix: dockerlaunch logs --rank 1) then", found) == "(fix: [3]) then"


def test_a_command_to_paste_has_one_label_and_is_never_wrapped():
    """Quoted: `follow with: fix: dockerlaunch logs --follow --name train` had two labels; pasted whole,
    `fix:: command not found`."""
    from dockerlaunch.cli.console import RichReporter

    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, width=40, color_system=None, highlight=False))
    command = "dockerlaunch logs --follow --name train --config /a/long/path/to/dockerlaunch.yaml"
    rep.command("follow with:", command)
    assert buf.getvalue() == f"follow with: {command}\n"


def test_a_long_step_shows_one_progress_line_on_a_terminal_only(monkeypatch):
    """Quoted: pre-flight printed nothing for its whole length (8 s; minutes at 64 hosts)."""
    import time

    from dockerlaunch.cli import console as consolelib
    from dockerlaunch.cli.console import RichReporter

    monkeypatch.setattr(consolelib, "PENDING_AFTER_S", 0.1)
    monkeypatch.setattr(consolelib, "PENDING_REDRAW_S", 0.05)
    for terminal in (True, False):
        buf = io.StringIO()
        rep = RichReporter(Console(file=buf, width=100, color_system=None, force_terminal=terminal))
        with rep.pending("pre-flight") as tell:
            tell("probe containers", 41, 64)
            time.sleep(0.5)
        drawn = buf.getvalue()
        if terminal:
            assert "\r\x1b[K[dockerlaunch] pre-flight: 41 of 64 host(s) answered (probe containers), 0 s" in drawn
            assert drawn.endswith("\r\x1b[K"), repr(drawn)  # erased when the step ends
        else:
            assert drawn == ""
