"""Files shipped inside the package (shell programs, Dockerfiles), read the same way from a checkout,
an editable install or a wheel."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def script(package: str, name: str) -> str:
    """`<package>/scripts/<name>`: a shell program kept as a file so shellcheck sees it."""
    return resources.files(package).joinpath("scripts", name).read_text()
