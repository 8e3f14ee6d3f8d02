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
