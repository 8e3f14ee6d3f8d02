import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def cli():
    """Run the real console entry point in a subprocess: exit code, stdout, stderr as a user sees them."""

    from tests.cli import dl

    def run(*args: str, cwd=None, input: str | None = None) -> subprocess.CompletedProcess:
        return dl(*args, cwd=cwd, input=input, timeout=600)

    return run


def venv_tool(name: str) -> str | None:
    """A tool installed by the test extras: beside this Python (the venv's bin, found with nothing activated),
    else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


# ---------------------------------------------------------------- every security test must pass in CI

REPO = Path(__file__).resolve().parents[1]  # the folder holding docs/ and tests/: pytest's rootdir here
SECURITY_DOC = REPO / "docs" / "SECURITY.md"
TESTS_DIR = Path(__file__).resolve().parent
NO_SECURITY_SKIPS_ENV = "DOCKERLAUNCH_NO_SECURITY_SKIPS"  # set by .ci/run, which always runs the whole suite
# scripts/test's full run is several pytest runs (the unit suite on each Python, then the integration tests): each
# leaves its outcomes in this folder, and the gate judges them all together, as one run
POOL_ENV = "DOCKERLAUNCH_SECURITY_POOL"
# a test's node id with its parameters folded (`tests/unit/test_x.py::test_y`, `tests/unit/test_x.py::TestZ::test_y`)
# -> outcomes of its reports in this run: every parameter's, every phase's
_outcomes: dict[str, set[str]] = {}
_rootpath: list[Path] = []  # this run's rootdir, which pytest's node ids are relative to


def _is_test_file(path: str) -> bool:
    """A file pytest collects tests from (its default python_files, which pyproject.toml keeps)."""
    import fnmatch

    name = path.rsplit("/", 1)[-1]
    return fnmatch.fnmatch(name, "test_*.py") or fnmatch.fnmatch(name, "*_test.py")


def security_tests() -> set[str]:
    """Every test docs/SECURITY.md names as the proof of a defence, as written there: a function's name (`test_x`),
    one function of one file (`tests/path/test_file.py::test_x`, `...::TestClass::test_x`), or a whole test file
    (`tests/path/test_file.py`; `tests/conftest.py`, which holds no tests, is named as the gate's home, no proof)."""
    import re

    if not SECURITY_DOC.is_file():
        return set()
    names = re.findall(r"`(test_\w+|tests/[\w./-]+\.py(?:::\w+)*)`", SECURITY_DOC.read_text())
    return {n for n in names if "::" in n or not n.startswith("tests/") or _is_test_file(n)}


def defined_tests() -> set[str]:
    """The node id of every test function written under tests/, parameters folded (read, not collected: a module
    skipped at import still counts): a module's `test*` functions and the `test*` methods of its `Test*` classes,
    nested ones too, as pytest collects them."""
    import ast
    import re

    def in_body(body, prefix: str):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                yield f"{prefix}::{node.name}"
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from in_body(node.body, f"{prefix}::{node.name}")

    found = set()
    for f in TESTS_DIR.rglob("*.py"):
        path = f.relative_to(REPO).as_posix()
        if not _is_test_file(path):
            continue
        text = f.read_text()
        try:
            found.update(in_body(ast.parse(text).body, path))
        except SyntaxError:  # pytest reports the file itself; its names still count as written
            found.update(f"{path}::{name}" for name in
                         re.findall(r"^(?:async[ \t]+)?def[ \t]+(test\w*)[ \t]*\(", text, re.M))
    return found


def resolve_security_test(name: str, defined: set[str]) -> list[str]:
    """The node ids a name in docs/SECURITY.md stands for, every one of which must pass: a bare `test_x`, every
    function of that name under tests/ (a same-named test elsewhere that passed cannot hide a deselected one); a
    `FILE::...` name, that one test; a whole file, every test in it. Empty: nothing by that name is written."""
    if "::" in name:
        return [name] if name in defined else []
    if name.startswith("tests/"):
        return sorted(n for n in defined if n.split("::", 1)[0] == name)
    return sorted(n for n in defined if n.rsplit("::", 1)[-1] == name)


def node_key(nodeid: str, rootpath: Path | None = None) -> str:
    """A report's node id as the gate keys it: its file relative to the folder holding tests/ (pytest's rootdir in
    this repo, so unchanged there), then `::Class::function` with any `[parameters]` dropped."""
    import re

    path, _, rest = nodeid.partition("::")
    if rootpath is not None:
        try:
            path = (rootpath / path).resolve().relative_to(REPO).as_posix()
        except ValueError:  # a test outside this project: kept as pytest names it
            pass
    m = re.match(r"(?:\w+::)*\w+", rest)
    return f"{path}::{m.group(0)}" if m else path


def pytest_sessionstart(session):
    _rootpath[:] = [session.config.rootpath]


def pytest_runtest_logreport(report):
    """A test's outcome counts as passed only from its call; a skip or failure in any phase counts against it."""
    if report.when == "call" or not report.passed:
        _outcomes.setdefault(node_key(report.nodeid, _rootpath[0] if _rootpath else None), set()).add(report.outcome)


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
    """Why this run (with the runs pooled with it) does not show every defence docs/SECURITY.md claims, judged per
    node id (resolve_security_test): a name with no test written (a typo'd proof, a file that is not there), a test
    that was skipped (any parameter, any phase, any pooled run), one that never passed (deselected, skipped with its
    module, failed, not collected). Empty when each named test passed and none skipped."""
    outcomes = _outcomes if outcomes is None else outcomes
    defined = defined_tests()
    resolved = {name: resolve_security_test(name, defined) for name in security_tests()}
    missing = sorted(name for name, ids in resolved.items() if not ids)
    nodes = {node for ids in resolved.values() for node in ids}
    skipped = sorted(n for n in nodes if "skipped" in outcomes.get(n, ()))
    unpassed = sorted(n for n in nodes if n not in skipped and outcomes.get(n, set()) != {"passed"})
    problems = []
    if missing:
        problems.append(f"no test function has the name docs/SECURITY.md gives, or is in the file it gives "
                        f"({', '.join(missing)}): fix the name there (test_x, tests/FILE.py::test_x or a test file "
                        "tests/FILE.py) or write the test")
    if skipped:
        problems.append(f"skipped ({', '.join(skipped)}): a defence not shown is not a defence; make each run where "
                        "it can pass, or name in docs/SECURITY.md only the node ids that prove the defence")
    if unpassed:
        problems.append(f"did not pass in this run ({', '.join(unpassed)}): failed, deselected, skipped with their "
                        f"module or not collected; {NO_SECURITY_SKIPS_ENV}=1 is for full runs (.ci/run); a bare "
                        "name stands for every test of that name: name tests/FILE.py::FUNCTION for just one")
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
