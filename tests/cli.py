"""The one way the tests run dockerlaunch's command line: `python -m dockerlaunch` in a subprocess of this
interpreter, as a user runs it (its exit code, stdout and stderr as they see them)."""

import os
import shlex
import subprocess
import sys


def dl(*args: str, timeout: float = 300, cwd=None, env: dict[str, str] | None = None, input: str | None = None,
       drop_env: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`env`: variables added to this process's environment; `drop_env`: names removed from it."""
    full = {k: v for k, v in os.environ.items() if k not in drop_env}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "dockerlaunch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=full, input=input)


def paste(command: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """A printed `dockerlaunch ...` command as a user pastes it: its shell words, run by this dockerlaunch in `cwd`
    (another folder than the one it was printed in), without DOCKERLAUNCH_CONFIG."""
    words = shlex.split(command)
    assert words[0] == "dockerlaunch", command
    return dl(*words[1:], timeout=timeout, cwd=cwd, drop_env=("DOCKERLAUNCH_CONFIG",))
