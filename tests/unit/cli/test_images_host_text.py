"""Terminal control from images and indexes (issue 60, finding 9): what `verify`, `build`, `stacks check --binaries`
and `stacks lock` print of an image's scan, a build's log, a wheel's tables or an index's answer reaches the
terminal as visible text (console.host_text), through the real commands (click's runner) with the library calls
behind them standing in. click strips CSI sequences on a pipe but not OSC 52, which a terminal obeys; `build`
writes its log past click."""

import json

import pytest
from click.testing import CliRunner

from dockerlaunch.images.verify_judges import FAIL, PASS, VerifyReport

# an OSC 52 clipboard write ended by BEL, a CSI that erases the line and moves up (forging the row above), and a
# C1 CSI (one byte) that clears the screen on some terminals
HOSTILE = "libx.so\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2K\x1b[1Averify: PASS\x9b2J"
SHOWN = "libx.so^[]52;c;Y3VybCBldmlsfHNo\\x07^[[2K^[[1Averify: PASS\\x9b2J"


def invoke(*args: str):
    from dockerlaunch.cli import images as _registers_images  # noqa: F401
    from dockerlaunch.cli.main import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def assert_shown_as_text(text: str) -> None:
    raw = sorted({f"{ord(c):#x}" for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f})
    assert raw == [], repr(text)
    assert SHOWN in text, text


def hostile_report(image: str = "app:1") -> VerifyReport:
    report = VerifyReport(image)
    report.add(f"symbols {HOSTILE}", FAIL, f"{HOSTILE} needs cublasLt_13, which libcublasLt.so.13 does not define")
    report.add("imports", PASS, f"torch {HOSTILE}")
    return report


def test_verify_shows_what_an_image_reported_as_text(monkeypatch):
    from dockerlaunch.images import verify as verifylib

    monkeypatch.setattr(verifylib, "verify", lambda image, **kw: hostile_report(image))
    r = invoke("verify", "app:1")
    assert r.exit_code == 1
    assert_shown_as_text(r.output)
    # JSON keeps the raw value (JSON itself escapes every control character)
    r = invoke("verify", "app:1", "--output", "json")
    assert "\x1b" not in r.output and json.loads(r.output)["checks"][0]["detail"].startswith(HOSTILE)


def test_builds_log_and_its_verify_table_show_as_text(monkeypatch):
    from dockerlaunch.images import build as buildlib

    def build(stack, opts, out=None, stage="train", where=None, **kw):
        out.write(f"#7 [train 3/9] RUN pip install {HOSTILE}\n")
        out.write(hostile_report().render() + "\n")
        out.flush()
        return 1, ""

    monkeypatch.setattr(buildlib, "build", build)
    r = invoke("build", "--stack", "cpu")
    assert r.exit_code == 1
    assert_shown_as_text(r.output)


def test_stacks_check_binaries_shows_a_wheels_words_as_text(monkeypatch):
    from types import SimpleNamespace

    from dockerlaunch.images import binaries, constraints
    from dockerlaunch.images import lock as locks

    def check(stack, lock, dockerfiles, *, log=None, **kw):
        log(f"{HOSTILE} 2.11.0: downloading {HOSTILE}.whl")
        report = binaries.BinaryReport(stack.name)
        report.add(f"symbols {HOSTILE}", FAIL, f"needs {HOSTILE}")
        report.costs = {"downloaded_gb": 0, "wheels_read": 1, "minutes": 0, "tables_mb": 1}
        return report

    monkeypatch.setattr(locks, "check", lambda s, d: [])
    monkeypatch.setattr(locks, "read", lambda s, d: SimpleNamespace(entries=[]))
    monkeypatch.setattr(constraints, "check_stack", lambda s, lock=None: [])
    monkeypatch.setattr(binaries, "check", check)
    r = invoke("stacks", "check", "--stack", "swift4.6-mcore0.19-cu13", "--binaries")
    assert r.exit_code == 1
    assert_shown_as_text(r.output)
    assert r.output.count("^[]52") == 4, r.output  # the log line (twice), the row's name and its detail


def test_stacks_check_shows_a_locks_problem_as_text(monkeypatch):
    from dockerlaunch.images import lock as locks

    monkeypatch.setattr(locks, "check", lambda s, d: [f"Dockerfiles/locks/cpu.lock: {HOSTILE} is not pinned"])
    r = invoke("stacks", "check", "--stack", "cpu")
    assert r.exit_code == 1
    assert_shown_as_text(r.output)


@pytest.mark.parametrize("fails", ["both", "one"])
def test_stacks_lock_shows_an_indexs_answer_as_text(monkeypatch, tmp_path, fails):
    """uv's error quotes the index (a package name, a version, a page it served): each stack's FAIL line."""
    import shutil

    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.stacks import default_dockerfiles_dir

    shutil.copy(default_dockerfiles_dir() / "stacks.yaml", tmp_path)  # a lock that resolves is written here
    monkeypatch.setenv("DOCKERLAUNCH_DOCKERFILES", str(tmp_path))

    def resolve(stack, **kw):
        if fails == "both" or stack.name == "cpu":
            raise locks.LockError(f"stack {stack.name}: uv could not resolve: {HOSTILE}==1.0 has no wheel")
        return "# a lock\n"

    monkeypatch.setattr(locks, "resolve", resolve)
    monkeypatch.setattr(locks, "parse", lambda text, path: type("L", (), {"entries": [HOSTILE]})())
    r = invoke("stacks", "lock", "--stack", "cpu", "--stack", "swift4.6-mcore0.19-cu13")
    assert r.exit_code == 1
    assert_shown_as_text(r.output)
