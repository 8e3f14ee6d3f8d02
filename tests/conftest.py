import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def cli():
    """Run the real console entry point in a subprocess: exit code, stdout, stderr as a user sees them."""

    def run(*args: str, cwd=None, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "dockerlaunch", *args], capture_output=True, text=True, cwd=cwd, input=input,
            timeout=600,
        )

    return run


def venv_tool(name: str) -> str | None:
    """A tool installed by the test extras: beside this Python (the venv's bin, found with nothing activated),
    else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


# ---------------------------------------------------------------- no security test may be skipped in CI

SECURITY_DOC = Path(__file__).resolve().parents[1] / "docs" / "SECURITY.md"
NO_SECURITY_SKIPS_ENV = "DOCKERLAUNCH_NO_SECURITY_SKIPS"  # set by .ci/run


def security_tests() -> set[str]:
    """Every test docs/SECURITY.md names as the proof of a defence."""
    import re

    return set(re.findall(r"`(test_\w+)`", SECURITY_DOC.read_text())) if SECURITY_DOC.is_file() else set()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import os

    if os.environ.get(NO_SECURITY_SKIPS_ENV) != "1":
        return
    named = security_tests()
    skipped = sorted({r.nodeid for r in terminalreporter.stats.get("skipped", [])
                      if r.nodeid.split("::")[-1].split("[")[0] in named})
    if skipped:
        terminalreporter.write_line(f"FAILED: {len(skipped)} security test(s) named in docs/SECURITY.md were "
                                    f"skipped (a defence not shown is not a defence): {', '.join(skipped)}", red=True)
        config._dl_security_skipped = True


def pytest_sessionfinish(session, exitstatus):
    # the summary runs after this hook, so the skipped reports are counted here too
    import os

    if os.environ.get(NO_SECURITY_SKIPS_ENV) != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    named = security_tests()
    skipped = [r for r in (reporter.stats.get("skipped", []) if reporter else [])
               if r.nodeid.split("::")[-1].split("[")[0] in named]
    if skipped and session.exitstatus == 0:
        session.exitstatus = 1
