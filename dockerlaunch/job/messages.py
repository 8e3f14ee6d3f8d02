"""What a wrong config is said as: one line per wrong field, with "did you mean" for an unknown key (the closest
field the schema has at its level) and, for a value a flag put there, the flag instead of the field. Pure: it reads
pydantic's errors and the schema's field names (job/config.py), never the file; job/load.py raises what it words.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from dockerlaunch.errors import SCHEMA, _loc
from dockerlaunch.job.config import ClusterConfig


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds (through Optional, unions, lists and dict values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def model_at(loc: tuple, root: type[BaseModel] = None) -> type[BaseModel] | None:  # type: ignore[assignment]
    """The model whose fields are valid at `loc` (a pydantic error location less its last part), or None. (pure)"""
    model: type[BaseModel] | None = root or ClusterConfig
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue  # a list item: the same model as the list's
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        models = _models_in(field.annotation)
        model = models[0] if models else None
    return model


def suggest_field(loc: tuple, root: type[BaseModel] = None) -> str | None:  # type: ignore[assignment]
    """`did you mean `hosts`?` for an unknown key at `loc`: difflib over the schema's field names at that level."""
    if not loc or not isinstance(loc[-1], str):
        return None
    model = model_at(tuple(p for p in loc[:-1] if not (isinstance(p, str) and "[" in p)), root)
    if model is None:
        return None
    close = difflib.get_close_matches(loc[-1].lower(), list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


# a location in the merged mapping -> (the flag behind it, the location below the flag's value, a hint), or None
Blame = typing.Callable[[tuple], "tuple[str, tuple, str] | None"]


def describe_config_error(err: ValidationError, root: type[BaseModel] = None,  # type: ignore[assignment]
                          blame: Blame | None = None, where: str = "") -> str:
    """errors.describe_validation_error, with "did you mean" for an unknown key (the closest field at its level).
    `blame`: the flag that put the value at a location there (and the location below the flag's value), which the
    line then names instead of the field; a line it does not blame starts with `where`."""
    seen: list[str] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            close = suggest_field(loc, root)
            hint = f"did you mean `{close}`?" if close else "check the spelling;"
            msg = f"unknown field ({hint} `{SCHEMA}` lists the fields)"
        else:
            msg = e["msg"].removeprefix("Value error, ")
        flag = blame(tuple(p for p in loc if not (isinstance(p, str) and "[" in p))) if blame else None
        if flag is None:
            line = f"{where}{_loc(loc)}: {msg}"
        else:
            line = (f"{flag[0]}: {_loc(flag[1])}: {msg}" if flag[1] else f"{flag[0]}: {msg}") + flag[2]
        if line not in seen:
            seen.append(line)
    return "; ".join(seen).replace("\n", " ")


def unknown_top_level(data: dict[str, Any]) -> str | None:
    """An unknown top-level key, said before "no hosts" (a `hots:` typo leaves the host list empty)."""
    for key in data:
        if isinstance(key, str) and key not in ClusterConfig.model_fields:
            close = suggest_field((key,))
            hint = f"did you mean `{close}`?" if close else "check the spelling;"
            return f"{key}: unknown field ({hint} `{SCHEMA}` lists the fields)"
    return None
