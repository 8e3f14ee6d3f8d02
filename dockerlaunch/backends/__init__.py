"""One backend per target, behind one small interface (SkyPilot's `provision/<cloud>/` shape).

Every backend reads the same neutral plan (`job/plan.py`). `docker/` applies it over SSH (`up`, `down`, ...);
`compose/`, `kubernetes/` and `slurm/` render it to their own files, each named by one line in `renderers.py`.
A renderer is a pure function `render(plan, options) -> list[RenderedFile]` that refuses, with one line naming
the field and the target, whatever it cannot express, so a rendered job is never silently different from the one
`up` would run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dockerlaunch.errors import ConfigError


@dataclass(frozen=True)
class RenderedFile:
    name: str  # relative to the output folder
    text: str
    executable: bool = False


class Unsupported(ConfigError):
    """The target cannot express something the job needs (exit 2, one line)."""

    def __init__(self, target: str, field: str, why: str):
        super().__init__(f"render --to {target}: {field}: {why}")
        self.target, self.field, self.why = target, field, why


class Refused(Unsupported):
    """Several things the target cannot express, one line each, all at once: fixed in one go, not one per run."""

    def __init__(self, found: list[Unsupported]):
        ConfigError.__init__(self, "\n".join(str(e) for e in found))
        self.target, self.field, self.why = found[0].target, found[0].field, found[0].why
        self.found = found


def refuse_all(found: Iterable[Unsupported]) -> None:
    """Raise every refusal (each once, in order), or nothing: a renderer checks everything before writing."""
    unique: dict[str, Unsupported] = {}
    for e in found:
        unique.setdefault(str(e), e)
    if len(unique) == 1:
        raise next(iter(unique.values()))
    if unique:
        raise Refused(list(unique.values()))


def caught(check: Callable[[], object]) -> list[Unsupported]:
    """A check that raises Unsupported (a helper the renderer also uses while writing), as a list of refusals."""
    try:
        check()
    except Unsupported as e:
        return [e]
    return []
