import subprocess
import sys

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
