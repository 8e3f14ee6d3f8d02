"""Files shipped inside the package (shell programs, Dockerfiles), read the same way from a checkout,
an editable install or a wheel."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

# `. ./NAME.sh  # included ...` in a shipped script: the fragment's text goes there (a script runs as `sh -c TEXT`).
# A fragment is looked for beside the script, then in dockerlaunch/scripts (kv.sh: the key=value contract).
_INCLUDE = re.compile(r"^\. \./([a-z_]+\.sh)  # included.*$", re.M)


@cache
def script(package: str, name: str) -> str:
    """`<package>/scripts/<name>` with its fragments included: a shell program kept as a file so shellcheck
    sees it."""
    text = resources.files(package).joinpath("scripts", name).read_text()
    return _INCLUDE.sub(lambda m: _fragment(package, m.group(1)), text)


def _fragment(package: str, name: str) -> str:
    here = resources.files(package).joinpath("scripts", name)
    return script(package if here.is_file() else "dockerlaunch", name)
