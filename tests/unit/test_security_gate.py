"""The CI gate in tests/conftest.py, run for real on small projects laid out like this one (docs/SECURITY.md naming
tests/ functions, the repo's own conftest copied in): under DOCKERLAUNCH_NO_SECURITY_SKIPS=1 (.ci/run) every test
the doc names must have passed, or the run fails."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
GATE = Path(__file__).resolve().parents[1] / "gate.py"
ROW = "| a threat | a defence | {} |\n"


@pytest.fixture
def project(pytester, monkeypatch):
    """make(names, **modules): docs/SECURITY.md naming `names`, tests/<module>.py with each text; returns a runner
    that gives (exit code, output) of pytest over tests/ with the gate on, or off with gate=False."""
    monkeypatch.delenv("DOCKERLAUNCH_NO_SECURITY_SKIPS", raising=False)
    monkeypatch.delenv("DOCKERLAUNCH_SECURITY_POOL", raising=False)  # scripts/test's own pool stays out of these

    def make(names: list[str], **modules: str):
        (pytester.path / "docs").mkdir()
        (pytester.path / "docs" / "SECURITY.md").write_text(
            "| threat | defence | test |\n|---|---|---|\n" + ROW.format(", ".join(f"`{n}`" for n in names)))
        (pytester.path / "tests").mkdir()
        (pytester.path / "tests" / "conftest.py").write_text(CONFTEST.read_text())
        (pytester.path / "tests" / "gate.py").write_text(GATE.read_text())
        for name, text in modules.items():
            (pytester.path / "tests" / f"{name}.py").write_text(text)

        def run(*args: str, gate: bool = True, pool: Path | None = None, where: str = "tests"):
            with monkeypatch.context() as m:
                if gate:
                    m.setenv("DOCKERLAUNCH_NO_SECURITY_SKIPS", "1")
                if pool:
                    m.setenv("DOCKERLAUNCH_SECURITY_POOL", str(pool))
                r = pytester.runpytest_inprocess("-p", "no:cacheprovider", where, *args)
            return r.ret, r.stdout.str() + r.stderr.str()

        return run

    return make


PASSING = "def test_proof():\n    assert True\n\ndef test_other():\n    assert True\n"


def test_the_gate_passes_a_run_where_every_named_test_passed(project):
    run = project(["test_proof"], test_a=PASSING)
    code, out = run()
    assert code == 0 and "security tests named" not in out, out


def test_a_named_test_skipped_at_module_level_fails_the_gate(project):
    run = project(["test_proof"], test_a="import pytest\npytest.skip('no engine', allow_module_level=True)\n\n"
                  + PASSING, test_b="def test_more():\n    assert True\n")
    assert run(gate=False)[0] == 0  # the control: pytest alone calls this run a success
    code, out = run()
    assert code == 1, out
    assert ("FAILED: security tests named in docs/SECURITY.md did not pass in this run (tests/test_a.py::test_proof)"
            in out), out


def test_a_deselected_named_test_fails_the_gate(project):
    run = project(["test_proof"], test_a=PASSING)
    assert run("-k", "not proof", gate=False)[0] == 0
    code, out = run("-k", "not proof")
    assert code == 1 and "did not pass in this run (tests/test_a.py::test_proof)" in out, out


def test_a_named_test_that_is_skipped_or_has_one_skipped_case_fails_the_gate(project):
    run = project(["test_proof", "test_cases"], test_a=(
        "import pytest\n\n@pytest.mark.skip(reason='later')\ndef test_proof():\n    pass\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_cases(n):\n    if n == 2:\n        pytest.skip('two')\n"))
    assert run(gate=False)[0] == 0
    code, out = run()
    assert code == 1 and "skipped (tests/test_a.py::test_cases, tests/test_a.py::test_proof)" in out, out


def test_a_name_no_test_function_has_fails_the_gate(project):
    """A typo'd proof in the doc: nothing by that name exists to pass or skip."""
    run = project(["test_proof", "test_prof"], test_a=PASSING)
    assert run(gate=False)[0] == 0
    code, out = run()
    assert code == 1, out
    assert "no test function has the name docs/SECURITY.md gives, or is in the file it gives (test_prof)" in out, out


def test_runs_pooled_in_one_folder_are_judged_together(project, tmp_path, monkeypatch):
    """scripts/test's full run: the unit suite on each Python records its outcomes (gate off), then the integration
    run judges every pooled outcome: a proof that passed in an earlier run counts, one skipped in any run fails."""
    run = project(["test_proof", "test_more"], test_a="import os\nimport pytest\n\ndef test_proof():\n"
                  "    if os.environ.get('NOT_ON_THIS_PYTHON'):\n        pytest.skip('not on this Python')\n",
                  test_b="def test_more():\n    assert True\n")
    code, out = run(where="tests/test_b.py")
    assert code == 1 and "did not pass in this run (tests/test_a.py::test_proof)" in out, out  # test_a's, alone

    pool = tmp_path / "pool"
    assert run(where="tests/test_a.py", gate=False, pool=pool)[0] == 0
    code, out = run(where="tests/test_b.py", pool=pool)
    assert code == 0 and "security tests named" not in out, out

    monkeypatch.setenv("NOT_ON_THIS_PYTHON", "1")  # the same proof, skipped in a third run
    assert run(where="tests/test_a.py", gate=False, pool=pool)[0] == 0
    code, out = run(where="tests/test_b.py", pool=pool)
    assert code == 1 and "skipped (tests/test_a.py::test_proof)" in out, out


def test_processes_run_at_once_are_judged_by_tests_gate_once_all_have_ended(project, pytester, tmp_path,
                                                                            monkeypatch):
    """scripts/test's integration tests: two pytest processes at once, each with the gate off (neither knows when the
    other ends), then `python -m tests.gate POOL` judges the pool: a proof neither ran fails, one skipped fails."""
    run = project(["test_proof", "test_more"], test_a="import os\nimport pytest\n\ndef test_proof():\n"
                  "    if os.environ.get('SKIP_IT'):\n        pytest.skip('not here')\n",
                  test_b="def test_more():\n    assert True\n")

    def gate(pool: Path) -> tuple[int, str]:
        r = subprocess.run([sys.executable, "-m", "tests.gate", str(pool)], cwd=pytester.path, capture_output=True,
                           text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    pool = tmp_path / "pool"
    assert gate(tmp_path)[0] == 1  # no run left anything: not a pass
    assert run(where="tests/test_a.py", gate=False, pool=pool)[0] == 0
    code, out = gate(pool)
    assert code == 1 and "did not pass in this run (tests/test_b.py::test_more)" in out, out
    assert run(where="tests/test_b.py", gate=False, pool=pool)[0] == 0
    code, out = gate(pool)
    assert code == 0 and "every test docs/SECURITY.md names passed" in out, out
    monkeypatch.setenv("SKIP_IT", "1")
    assert run(where="tests/test_a.py", gate=False, pool=pool)[0] == 0
    code, out = gate(pool)
    assert code == 1 and "skipped (tests/test_a.py::test_proof)" in out, out


SAME = "import pytest\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_same(n):\n    assert n\n"


@pytest.mark.parametrize("deselect", [["-k", "not test_b"], ["--deselect", "tests/test_b.py::test_same"]])
def test_a_deselected_test_is_not_hidden_by_a_passing_one_of_the_same_name(project, deselect):
    """A bare name stands for every test function of that name: each node id must pass, so the one in test_a passing
    does not cover the one in test_b that was deselected (the gate matched bare names before: it passed this run)."""
    run = project(["test_same"], test_a=SAME, test_b=SAME)
    assert run(*deselect, gate=False)[0] == 0  # the control: pytest alone calls this run a success
    code, out = run(*deselect)
    assert code == 1, out
    problem = next(line for line in out.splitlines() if "security tests named" in line)
    assert problem.startswith("FAILED: security tests named in docs/SECURITY.md did not pass in this run "
                              "(tests/test_b.py::test_same): "), out  # one line, the deselected node id alone
    assert run()[0] == 0  # both run: the gate passes


def test_a_name_with_its_file_stands_for_that_test_alone_and_a_class_method_is_named_through_its_class(project):
    run = project(["tests/test_a.py::test_same", "tests/test_c.py::TestSuite::test_same"], test_a=SAME, test_b=SAME,
                  test_c="class TestSuite:\n    def test_same(self):\n        assert True\n\n"
                         "    def test_other(self):\n        assert True\n")
    assert run("--deselect", "tests/test_b.py::test_same", "-k", "not test_other")[0] == 0
    code, out = run("-k", "not TestSuite")
    assert code == 1 and "did not pass in this run (tests/test_c.py::TestSuite::test_same)" in out, out


def test_a_whole_file_named_must_pass_every_test_in_it(project):
    run = project(["tests/test_a.py"], test_a=PASSING, test_b="def test_more():\n    assert True\n")
    code, out = run("--deselect", "tests/test_b.py::test_more")
    assert code == 0 and "security tests named" not in out, out  # every test of the file passed
    assert run("--deselect", "tests/test_a.py::test_other", gate=False)[0] == 0
    code, out = run("--deselect", "tests/test_a.py::test_other")
    assert code == 1 and "did not pass in this run (tests/test_a.py::test_other)" in out, out


def test_a_file_or_a_test_of_a_file_that_is_not_there_fails_the_gate_as_a_missing_name(project):
    run = project(["test_proof", "tests/test_nope.py", "tests/test_a.py::test_nope"], test_a=PASSING)
    assert run(gate=False)[0] == 0
    code, out = run()
    assert code == 1, out
    assert ("no test function has the name docs/SECURITY.md gives, or is in the file it gives "
            "(tests/test_a.py::test_nope, tests/test_nope.py)") in out, out


def test_the_real_security_doc_names_only_tests_that_are_written():
    """Every name in docs/SECURITY.md stands for at least one test function under tests/ (the gate's own reading)."""
    from tests.conftest import defined_tests, resolve_security_test, security_tests

    defined = defined_tests()
    names = security_tests()
    assert "tests/unit/cli/test_bad_input.py" in names and "tests/conftest.py" not in names
    assert [n for n in sorted(names) if not resolve_security_test(n, defined)] == []
