"""The render targets (`render --to`), one line each in TARGETS (torchx's list of schedulers, SkyPilot's
`provision/<cloud>/`). Not hosts/targets.py, which resolves the SSH targets a job runs on.

A target is a package under backends/ whose `__init__` exports, importing nothing heavy at load:
  FLAGS                     the CLI flags it takes; `render --help` shows them, other targets refuse them
  options(target, values)   its checked options (values: every target flag by its Python name; None or False:
                            not given); a bad value is a ConfigError naming the flag
  render(plan, options)     -> list[RenderedFile], pure; refuses whatever it cannot express (backends/__init__)
Adding one is a folder and a line in TARGETS; docs/ARCHITECTURE.md ("Adding a render target") walks through it.
The CLI and the tests loop over TARGETS; nothing else names a target.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dockerlaunch.errors import ConfigError


@dataclass(frozen=True)
class Flag:
    """A target's own CLI flag: `--name` (a switch when is_flag, else a value shown as metavar)."""

    name: str
    help: str
    is_flag: bool = False
    metavar: str | None = None

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class Target:
    name: str  # what --to takes
    package: str  # the package that renders it
    summary: str  # --to's help, a few words
    per_host: bool = False  # a file per host (--hosts, --probe); else a scheduler picks the nodes (--nodes N)

    def module(self) -> ModuleType:
        return importlib.import_module(self.package)

    @property
    def flags(self) -> tuple[Flag, ...]:
        return tuple(getattr(self.module(), "FLAGS", ()))

    def options(self, values: dict[str, Any]) -> Any:
        return self.module().options(self.name, values)

    def render(self, plan, options) -> list:
        return self.module().render(plan, options)


TARGETS: tuple[Target, ...] = (
    Target("compose", "dockerlaunch.backends.compose", "a file per node", per_host=True),
    Target("k8s", "dockerlaunch.backends.kubernetes", "Indexed Job + headless Service"),
    Target("jobset", "dockerlaunch.backends.kubernetes", "a JobSet"),
    Target("slurm", "dockerlaunch.backends.slurm", "sbatch scripts (pyxis and plain Docker)"),
)


def names() -> list[str]:
    return [t.name for t in TARGETS]


def get(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    raise ConfigError(f"render --to {name}: not a target; the targets are {', '.join(names())}")


def all_flags() -> list[Flag]:
    """Every target's flags, each once, in the order of TARGETS (the CLI declares them all)."""
    seen: dict[str, Flag] = {}
    for t in TARGETS:
        for f in t.flags:
            seen.setdefault(f.name, f)
    return list(seen.values())


def foreign_flags(target: Target, values: dict[str, Any]) -> list[str]:
    """Flags given that belong to other targets only (a k8s namespace on a slurm render means a mistake)."""
    own = {f.key for f in target.flags}
    given = [f for f in all_flags() if f.key not in own and values.get(f.key) not in (None, False)]
    return [f"--{f.name} is for {', '.join(t.name for t in TARGETS if f in t.flags)}" for f in given]
