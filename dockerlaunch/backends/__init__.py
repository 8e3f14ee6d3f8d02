"""One backend per target, behind one small interface (SkyPilot's `provision/<cloud>/` shape).

Every backend reads the same neutral plan (`job/plan.py`). `docker/` applies it over SSH (`up`, `down`, ...);
`compose/`, `kubernetes/` and `slurm/` render it to their own files. A renderer is a pure function
`render(plan, target) -> list[RenderedFile]` that refuses, with one line naming the field and the target,
whatever it cannot express, so a rendered job is never silently different from the one `up` would run.
"""

from __future__ import annotations

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
        self.target, self.field = target, field
