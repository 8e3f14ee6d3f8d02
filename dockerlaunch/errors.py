"""User-facing errors: one line that names the thing and the fix, never a traceback."""

from __future__ import annotations

from pydantic import ValidationError


class DockerlaunchError(Exception):
    """A problem the user can act on. The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 1


class ConfigError(DockerlaunchError):
    """Bad input (config file or flags): exit code 2, like a usage error."""

    exit_code = 2


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic puts validator names (e.g. "function-after[...]") into union locations; skip them.
            if "[" in str(part) and "]" in str(part):
                continue
            out += ("." if out else "") + str(part)
    return out or "config"


def describe_validation_error(err: ValidationError) -> str:
    """Flatten pydantic's multi-line report into one line: `field: problem; field: problem`."""
    seen: list[str] = []
    for e in err.errors(include_url=False):
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `dockerlaunch schema` lists the fields)"
        line = f"{_loc(tuple(e['loc']))}: {msg}"
        if line not in seen:
            seen.append(line)
    return "; ".join(seen).replace("\n", " ")
