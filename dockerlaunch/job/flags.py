"""The command-line flags that change the config (`--hosts`, `--image`, `--mount`, `--env`, ...): merged into the
file's raw mapping before validation, so errors name the same fields either way; the flag to blame for a wrong merged
value (job/messages.py words it); and the plan flags as the user gave them, which printed commands repeat
(job/invocation.py). Pure: job/load.py reads the file and calls these.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import SECRET_NAME, check_env_key, parse_host_string
from dockerlaunch.job.messages import Blame


class Overrides(BaseModel):
    """Command-line flags; each one set replaces (hosts, image, ...) or extends (mounts, env) the file."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)  # as the schema's models (config._Model)

    hosts: list[str] | None = None
    image: str | None = None
    nproc_per_node: int | None = None
    master_port: int | None = None
    mounts: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    name: str | None = None
    command: list[str] | None = None
    diagnostics: bool | None = None  # --no-diagnostics: all of `diagnostics:` off
    offline: bool | None = None  # --offline: job.offline
    push: bool | None = None  # up --push: job.push
    infiniband: Literal["on", "off"] | None = None  # render --infiniband: container.infiniband
    max_restarts: int | None = None  # up --max-restarts: job.max_restarts
    hang_timeout: str | None = None  # up --hang-timeout: job.hang_timeout
    spares: list[str] | None = None  # up --spares: spares (replaces the file's list)


def parse_env_assignment(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"--env {text!r}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        check_env_key(key)
    except ValueError as e:
        raise ConfigError(f"--env: {e}") from None
    return key, value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    """A section a flag merges into: a copy of it, or {} when absent; anything else is the user's error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping of settings, not {type(value).__name__} ({value!r:.40})")
    return dict(value)


def _entry_settings(entry: Any) -> dict[str, Any] | None:
    """A hosts:/spares: entry as one mapping, the `[user@]host[:port]` of a string or of a mapping's address spread
    into its keys; None where it has no address the validator would accept (the validator names that entry)."""
    mapping = entry if isinstance(entry, dict) else {}
    text = entry if isinstance(entry, str) else mapping.get("address")
    if not isinstance(text, str):
        return None
    try:
        parsed = parse_host_string(text)
    except ValueError:
        return None
    if any(k in mapping and mapping[k] != v for k, v in parsed.items() if k != "address"):
        return {**mapping, "address": parsed["address"]}  # contradicts itself: the mapping's own keys stand
    return {**mapping, **parsed}


def _entry_address(entry: Any) -> Any:
    """The address of a hosts:/spares: entry as the file has it (a string or a mapping); None where it has none."""
    settings = _entry_settings(entry)
    return settings["address"] if settings else None


def _flag_hosts(texts: list[str], entries: Any, flag: str) -> list[Any]:
    """A host list given as a flag; an address the file also lists (as a string or a mapping) keeps the file's
    other settings, and what the flag says of it wins."""
    by_address = {s["address"]: s for s in map(_entry_settings, entries if isinstance(entries, list) else []) if s}
    out: list[Any] = []
    for text in texts:
        try:
            parsed = parse_host_string(text)
        except ValueError as e:
            raise ConfigError(f"{flag} {text!r}: {e}") from None
        out.append({**by_address.get(parsed["address"], {}), **parsed})
    return out


def apply_overrides(data: dict[str, Any], ov: Overrides) -> dict[str, Any]:
    """Merge flags into the raw mapping before validation, so errors name the same fields either way."""
    data = dict(data)
    if ov.hosts is not None:
        spares = data.get("spares") if ov.spares is None and isinstance(data.get("spares"), list) else []
        data["hosts"] = _flag_hosts(ov.hosts, [*(data.get("hosts") or []), *spares], "--hosts")
        if spares:  # a spare named in --hosts is a host of this run (`push IMAGE --hosts SPARE`, printed by `up`)
            named = {h["address"] for h in data["hosts"]}
            data["spares"] = [s for s in spares if _entry_address(s) not in named]
    if ov.image is not None:
        data["image"] = ov.image
    if ov.spares is not None:
        data["spares"] = _flag_hosts(ov.spares, data.get("spares"), "--spares")
    touches_job = (ov.nproc_per_node, ov.master_port, ov.name, ov.command or None, ov.offline or None,
                   ov.push or None, ov.max_restarts, ov.hang_timeout)
    job = _mapping(data.get("job"), "job") if any(x is not None for x in touches_job) else {}
    if ov.nproc_per_node is not None:
        job["nproc_per_node"] = ov.nproc_per_node
    if ov.master_port is not None:
        job["master_port"] = ov.master_port
    if ov.name is not None:
        job["name"] = ov.name
    if ov.command:
        job["command"] = list(ov.command)
    if ov.offline:
        job["offline"] = True
    if ov.push:
        job["push"] = True
    if ov.max_restarts is not None:
        job["max_restarts"] = ov.max_restarts
    if ov.hang_timeout is not None:
        job["hang_timeout"] = ov.hang_timeout
    if job:
        data["job"] = job
    if ov.diagnostics is False:
        diag = _mapping(data.get("diagnostics"), "diagnostics")
        diag.update(ptrace=False, flight_recorder=False, nccl_log=False)
        data["diagnostics"] = diag
    if ov.mounts or ov.env or ov.infiniband:
        container = _mapping(data.get("container"), "container")
        if ov.infiniband:
            container["infiniband"] = ov.infiniband
        if ov.mounts:
            container["mounts"] = list(container.get("mounts") or []) + list(ov.mounts)
        if ov.env:
            env = _mapping(container.get("env"), "container.env")
            for text in ov.env:
                key, value = parse_env_assignment(text)
                env[key] = value
            container["env"] = env
        data["container"] = container
    return data


def blamer(ov: Overrides, file: dict[str, Any]) -> Blame:
    """For the merged pass: the flag behind the value at a location (pure). The file was valid alone, so a wrong
    value that a flag set is the flag's: `--hosts '1.2.3.4;5.6.7.8'` said `dockerlaunch.yaml: hosts[0].address`."""

    def listed(flag: str, given: list[str], rest: tuple, first: int = 0) -> tuple[str, tuple, str] | None:
        if rest and isinstance(rest[0], int) and first <= rest[0] < first + len(given):
            text = given[rest[0] - first]
            if rest[1:] in ((), ("address",)):  # the value itself (its message quotes it)
                hint = f"; separate hosts with ',' ({flag} h1,h2)" if flag in ("--hosts", "--spares") and (
                    ";" in text or any(c.isspace() for c in text.strip())) else ""
                return flag, (), hint
            return f"{flag} {shlex.quote(text)}", rest[1:], ""
        return (flag, rest, "") if not first else None

    job = {"name": ("--name", ov.name), "nproc_per_node": ("--nproc-per-node", ov.nproc_per_node),
           "master_port": ("--master-port", ov.master_port), "command": ("the command after --", ov.command),
           "hang_timeout": ("--hang-timeout", ov.hang_timeout), "max_restarts": ("--max-restarts", ov.max_restarts),
           "offline": ("--offline", ov.offline), "push": ("--push", ov.push)}
    container = file.get("container") if isinstance(file.get("container"), dict) else {}
    file_mounts = len(container.get("mounts") or []) if isinstance(container.get("mounts"), list) else 0
    env_flags = {t.partition("=")[0] for t in ov.env}

    def blame(loc: tuple) -> tuple[str, tuple, str] | None:
        if not loc:  # the whole config's checks are of its host lists (a host listed twice)
            lists = [f for f, given in (("--hosts", ov.hosts), ("--spares", ov.spares)) if given is not None]
            return (" and ".join(lists), (), "") if lists else None
        head, rest = loc[0], loc[1:]
        if head == "hosts" and ov.hosts is not None:
            return listed("--hosts", ov.hosts, rest)
        if head == "spares" and ov.spares is not None:
            return listed("--spares", ov.spares, rest)
        if head == "image" and ov.image is not None:
            return "--image", rest, ""
        if head == "job" and rest and rest[0] in job and job[rest[0]][1] is not None:
            return job[rest[0]][0], rest[1:], ""
        if head == "container" and rest:
            if rest[0] == "mounts" and ov.mounts:
                return listed("--mount", ov.mounts, rest[1:], first=file_mounts)
            if rest[0] == "env" and len(rest) > 1 and rest[1] in env_flags:
                return f"--env {rest[1]}", rest[2:], ""
            if rest[0] == "infiniband" and ov.infiniband:
                return "--infiniband", rest[1:], ""
        if head == "diagnostics" and ov.diagnostics is False:
            return "--no-diagnostics", rest, ""
        return None

    return blame


def plan_flags(ov: Overrides) -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]:
    """The flags of `ov` that change the plan, as the user gave them (job/invocation.py repeats them in printed
    commands), and the --env names whose values are never repeated (they look like secrets: SECRET_NAME)."""
    out: list[tuple[str, str | None]] = []
    secret: list[str] = []
    for flag, value in (("--image", ov.image), ("--nproc-per-node", ov.nproc_per_node),
                        ("--master-port", ov.master_port)):
        if value is not None:
            out.append((flag, str(value)))
    out += [("--mount", m) for m in ov.mounts]
    for text in ov.env:
        key = text.partition("=")[0]
        if SECRET_NAME.search(key):
            secret.append(key)
        else:
            out.append(("--env", text))
    if ov.offline:
        out.append(("--offline", None))
    if ov.infiniband:
        out.append(("--infiniband", ov.infiniband))
    if ov.push:
        out.append(("--push", None))
    if ov.diagnostics is False:
        out.append(("--no-diagnostics", None))
    if ov.max_restarts is not None:
        out.append(("--max-restarts", str(ov.max_restarts)))
    if ov.spares is not None:
        out.append(("--spares", ",".join(ov.spares)))
    if ov.hang_timeout is not None:
        out.append(("--hang-timeout", ov.hang_timeout))
    return tuple(out), tuple(dict.fromkeys(secret))
