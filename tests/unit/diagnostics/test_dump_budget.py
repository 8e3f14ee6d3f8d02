"""dump's budget (issue 50, finding 6): the pure parts. The real dump over SSH with files past the budget, and the
launcher's peak memory, are in tests/integration/test_diagnose.py."""

import threading

from dockerlaunch.diagnostics.dump import DUMP_BUDGET, Budget, Capped, dump_budget


def test_the_budget_is_shared_and_never_overspent_by_threads_at_once():
    budget = Budget(1000)
    took: list[int] = []

    def host() -> None:
        took.extend(7 for _ in range(100) if budget.take(7))

    threads = [threading.Thread(target=host) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(took) == 994 and budget.left == 6
    budget.give_back(70)
    assert budget.take(76) and not budget.take(1)


def test_the_budget_comes_from_the_environment_in_sizes(monkeypatch):
    monkeypatch.delenv("DOCKERLAUNCH_DUMP_BUDGET", raising=False)
    assert dump_budget() == DUMP_BUDGET == 4 * 2**30
    monkeypatch.setenv("DOCKERLAUNCH_DUMP_BUDGET", "64M")
    assert dump_budget() == 64 * 2**20


def test_a_bad_budget_is_one_line_naming_the_variable_before_any_host_is_contacted(tmp_path):
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "dump", "--hosts", "10.255.255.1",
                        "--name", "j", "--out", str(tmp_path / "d")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DOCKERLAUNCH_DUMP_BUDGET": "lots"})
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "error: DOCKERLAUNCH_DUMP_BUDGET='lots': give a size like 512M or 8G (the most `dump` fetches from all "
        "hosts together)"], r.stderr


def test_capped_keeps_the_first_bytes_and_counts_the_rest():
    c = Capped(10)
    for chunk in (b"0123", b"456789ab", b"cdef"):
        c.add(chunk)
    assert c.text() == "0123456789" and c.dropped == 6
