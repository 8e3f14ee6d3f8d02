"""The security gate's last word on a full run made of several pytest processes (scripts/test: the unit tests on
each Python, then the integration tests in two processes at once). Each process left its outcomes in the pool with
the gate off, since none of them knows when the others end; this judges them all together, with the same rules
tests/conftest.py applies to a single run: `python -m tests.gate POOL` prints each problem and exits 1."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import pooled_outcomes, security_gate_problems


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m tests.gate POOL (the folder the pytest runs wrote their outcomes into)",
              file=sys.stderr)
        return 2
    outcomes = pooled_outcomes(Path(argv[0]))
    if not outcomes:
        print(f"FAILED: security tests named in docs/SECURITY.md: no run left its outcomes in {argv[0]}",
              file=sys.stderr)
        return 1
    problems = security_gate_problems(outcomes)
    for problem in problems:
        print(f"FAILED: security tests named in docs/SECURITY.md {problem}", file=sys.stderr)
    if not problems:
        print(f"security gate: every test docs/SECURITY.md names passed ({len(outcomes)} tests pooled)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
