"""The CI gate in tests/conftest.py, run for real on small projects laid out like this one (docs/SECURITY.md naming
tests/ functions, the repo's own conftest copied in): under DOCKERLAUNCH_NO_SECURITY_SKIPS=1 (.ci/run) every test
the doc names must have passed, or the run fails."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
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
    assert "FAILED: security tests named in docs/SECURITY.md did not pass in this run (test_proof)" in out, out


def test_a_deselected_named_test_fails_the_gate(project):
    run = project(["test_proof"], test_a=PASSING)
    assert run("-k", "not proof", gate=False)[0] == 0
    code, out = run("-k", "not proof")
    assert code == 1 and "did not pass in this run (test_proof)" in out, out


def test_a_named_test_that_is_skipped_or_has_one_skipped_case_fails_the_gate(project):
    run = project(["test_proof", "test_cases"], test_a=(
        "import pytest\n\n@pytest.mark.skip(reason='later')\ndef test_proof():\n    pass\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_cases(n):\n    if n == 2:\n        pytest.skip('two')\n"))
    assert run(gate=False)[0] == 0
    code, out = run()
    assert code == 1 and "skipped (test_cases, test_proof)" in out, out


def test_a_name_no_test_function_has_fails_the_gate(project):
    """A typo'd proof in the doc: nothing by that name exists to pass or skip."""
    run = project(["test_proof", "test_prof"], test_a=PASSING)
    assert run(gate=False)[0] == 0
    code, out = run()
    assert code == 1, out
    assert "no test function has the name docs/SECURITY.md gives (test_prof)" in out, out


def test_runs_pooled_in_one_folder_are_judged_together(project, tmp_path):
    """scripts/test's full run: the unit suite on each Python records its outcomes (gate off), then the integration
    run judges every pooled outcome: a proof that passed in an earlier run counts, one skipped in any run fails."""
    run = project(["test_proof", "test_more"], test_a=PASSING, test_b="def test_more():\n    assert True\n",
                  test_c="import pytest\n\ndef test_proof():\n    pytest.skip('not on this Python')\n")
    code, out = run(where="tests/test_b.py")
    assert code == 1 and "did not pass in this run (test_proof)" in out, out  # alone, test_a's proof is missing

    pool = tmp_path / "pool"
    assert run(where="tests/test_a.py", gate=False, pool=pool)[0] == 0
    code, out = run(where="tests/test_b.py", pool=pool)
    assert code == 0 and "security tests named" not in out, out

    assert run(where="tests/test_c.py", gate=False, pool=pool)[0] == 0  # the same proof, skipped in a third run
    code, out = run(where="tests/test_b.py", pool=pool)
    assert code == 1 and "skipped (test_proof)" in out, out
