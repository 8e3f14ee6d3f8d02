"""A signal that comes twice (coreutils' `timeout` signals the command, then its process group; a double Ctrl-C):
the first stops the command, a later one is only noted. Raised again mid-cleanup it cut the cleanup short, and
inside main()'s own `terminated (SIGTERM)` line it ended in a traceback (issue 60, item 11). The commands on a
sim cluster: tests/integration/test_signals.py."""

import importlib
import os
import signal
import time

import pytest

from tests.silent_ssh import up_mid_connect

cli_main = importlib.import_module("dockerlaunch.cli.main")  # the module (the package exports its main())
HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@pytest.fixture
def handlers(monkeypatch):
    """main() installs its handlers in this process: put the runner's back after the test."""
    saved = {s: signal.getsignal(s) for s in HANDLED}
    monkeypatch.setattr(cli_main, "_SIGNALLED", [])
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal gives it: main() installs its own
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("sig, code, line", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_second_signal_mid_cleanup_is_noted_and_the_cleanup_runs_to_its_end(handlers, monkeypatch, capsys, sig,
                                                                               code, line):
    """The second signal arrives in the cleanup the first one started (a teardown on every host): the cleanup
    still runs whole, the exit code is the first signal's, one line says so."""
    cleaned = []

    def command(**kw):
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the signal lands here: never slept out
        finally:
            os.kill(os.getpid(), sig)  # the second, mid-cleanup
            time.sleep(0.05)  # ... whose handler runs here
            cleaned.append("every host")

    monkeypatch.setattr(cli_main.cli, "main", command)
    with pytest.raises(SystemExit) as ended:
        cli_main.main(["status"])
    assert ended.value.code == code
    assert cleaned == ["every host"]
    err = capsys.readouterr().err
    assert [x for x in err.splitlines() if x.strip()] == [line], err
    assert cli_main._SIGNALLED == [sig, sig]


def test_a_second_sigterm_inside_the_terminated_line_is_no_traceback(handlers, monkeypatch, capsys):
    """The case of the issue: `timeout 60 dockerlaunch logs --follow` ended in `Traceback ...
    dockerlaunch.errors.Terminated: 15` raised inside the handler's own `terminated (SIGTERM)` line."""
    import click

    echo = click.echo

    def command(**kw):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    def late_echo(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the process group's copy, while the line is being written
        time.sleep(0.05)
        echo(*args, **kwargs)

    monkeypatch.setattr(cli_main.cli, "main", command)
    monkeypatch.setattr(cli_main.click, "echo", late_echo)
    with pytest.raises(SystemExit) as ended:
        cli_main.main(["status"])
    assert ended.value.code == 143
    assert capsys.readouterr().err.strip() == "terminated (SIGTERM)"


def test_two_sigterms_10_ms_apart_stop_up_mid_connect_in_one_line(tmp_path):
    """A real process: `up` waits on an SSH server that accepts and never answers; two SIGTERMs 10 ms apart, as
    `timeout` sends them. Exit 143, one line, no traceback."""
    def child() -> None:  # the runner may have started with some signals ignored
        for s in HANDLED:
            signal.signal(s, signal.SIG_DFL)

    with up_mid_connect(tmp_path, child) as p:
        p.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 143, (out, err)
        assert "Traceback" not in err and err.count("terminated") == 1, err
