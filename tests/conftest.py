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


# ---------------------------------------------------------------- every security test must pass in CI

SECURITY_DOC = Path(__file__).resolve().parents[1] / "docs" / "SECURITY.md"
TESTS_DIR = Path(__file__).resolve().parent
NO_SECURITY_SKIPS_ENV = "DOCKERLAUNCH_NO_SECURITY_SKIPS"  # set by .ci/run, which always runs the whole suite
# scripts/test's full run is several pytest runs (the unit suite on each Python, then the integration tests): each
# leaves its outcomes in this folder, and the gate judges them all together, as one run
POOL_ENV = "DOCKERLAUNCH_SECURITY_POOL"
_outcomes: dict[str, set[str]] = {}  # test function name -> outcomes of its reports in this run


def security_tests() -> set[str]:
    """Every test docs/SECURITY.md names as the proof of a defence."""
    import re

    return set(re.findall(r"`(test_\w+)`", SECURITY_DOC.read_text())) if SECURITY_DOC.is_file() else set()


def defined_tests() -> set[str]:
    """Every test function written under tests/ (read, not collected: a module skipped at import still counts)."""
    import re

    return {name for f in TESTS_DIR.rglob("*.py")
            for name in re.findall(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(test_\w+)[ \t]*\(", f.read_text(), re.M)}


def pytest_runtest_logreport(report):
    """A test's outcome counts as passed only from its call; a skip or failure in any phase counts against it."""
    if report.when == "call" or not report.passed:
        _outcomes.setdefault(report.nodeid.split("::")[-1].split("[")[0], set()).add(report.outcome)


def pooled_outcomes(pool: Path) -> dict[str, set[str]]:
    """This run's outcomes written into the pool folder, and every outcome of every run written there."""
    import json
    import uuid

    pool.mkdir(parents=True, exist_ok=True)
    mine = pool / uuid.uuid4().hex
    mine.write_text(json.dumps({name: sorted(o) for name, o in _outcomes.items()}))
    mine.rename(mine.with_suffix(".json"))  # whole, for a run that reads the folder at the same time
    pooled: dict[str, set[str]] = {}
    for f in sorted(pool.glob("*.json")):
        for name, outcomes in json.loads(f.read_text()).items():
            pooled.setdefault(name, set()).update(outcomes)
    return pooled


def security_gate_problems(outcomes: dict[str, set[str]] | None = None) -> list[str]:
    """Why this run (with the runs pooled with it) does not show every defence docs/SECURITY.md claims: a named test
    with no function (a typo'd proof), one that was skipped (any parameter, any phase, any pooled run), one that
    never passed (deselected, skipped with its module, failed, not collected). Empty when each named test passed
    and none skipped."""
    outcomes = _outcomes if outcomes is None else outcomes
    named = security_tests()
    missing = sorted(named - defined_tests())
    skipped = sorted(n for n in named if "skipped" in outcomes.get(n, ()))
    unpassed = sorted(n for n in named if n not in missing and n not in skipped
                      and outcomes.get(n, set()) != {"passed"})
    problems = []
    if missing:
        problems.append(f"no test function has the name docs/SECURITY.md gives ({', '.join(missing)}): fix the name "
                        "there or write the test")
    if skipped:
        problems.append(f"skipped ({', '.join(skipped)}): a defence not shown is not a defence")
    if unpassed:
        problems.append(f"did not pass in this run ({', '.join(unpassed)}): failed, deselected, skipped with their "
                        f"module or not collected; {NO_SECURITY_SKIPS_ENV}=1 is for full runs (.ci/run)")
    return problems


def pytest_sessionfinish(session, exitstatus):
    """Under .ci/run, a run that did not show every security test passing fails (exit 1), whatever else passed."""
    import os

    pool = os.environ.get(POOL_ENV)
    outcomes = pooled_outcomes(Path(pool)) if pool else None
    if os.environ.get(NO_SECURITY_SKIPS_ENV) != "1":
        return
    problems = security_gate_problems(outcomes)
    session.config._dl_security_problems = problems
    if problems and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # runs after pytest_sessionfinish above (the terminal reporter prints its summary last)
    for problem in getattr(config, "_dl_security_problems", []):
        terminalreporter.write_line(f"FAILED: security tests named in docs/SECURITY.md {problem}", red=True)
