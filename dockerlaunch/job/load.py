"""Where a config comes from and how it is read: the file (--config, DOCKERLAUNCH_CONFIG or ./dockerlaunch.yaml),
read with bounds on its size and depth and YAML errors said by line, then validated twice: as written, and with the
flags merged (job/flags.py), so a wrong value that only the flags brought names the flag. `load_config` is what every
command that reads a config calls; it records the user's invocation on the result (job/invocation.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.flags import Overrides, apply_overrides, blamer, plan_flags
from dockerlaunch.job.invocation import CONFIG_ENV, DEFAULT_LOG_DIR, Invocation
from dockerlaunch.job.messages import Blame, describe_config_error, unknown_top_level

DEFAULT_CONFIG_FILE = "dockerlaunch.yaml"
FILE_CHECK_HOST = "file-without-hosts"  # stands in for a file's missing host list while the file alone is checked
MAX_DEPTH = 20  # a config is a few levels deep; deeper is a mistake or an attack
MAX_VALUES = 20_000  # after YAML aliases are expanded (a 500-byte alias bomb expands to billions)


def check_shape(data: Any, where: str) -> None:
    """Bound nesting depth and expanded size before validation looks at the data (iterative: no recursion)."""
    stack = [(data, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f"{where}: more than {MAX_VALUES} values once YAML aliases are expanded; "
                              "is an anchor (&) repeated inside itself?")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep; a config is a few levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            stack.extend((k, depth + 1) for k in node if not isinstance(k, str))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def config_path(path: str | None) -> tuple[str | None, str]:
    """The config file the user named, and how: --config, else DOCKERLAUNCH_CONFIG (read by every command that reads
    a config), else None (./dockerlaunch.yaml where it exists)."""
    if path is not None:
        return path, "--config"
    env = os.environ.get(CONFIG_ENV, "").strip()
    return (env, CONFIG_ENV) if env else (None, "")


def read_config_file(path: str | None) -> tuple[dict[str, Any], str | None]:
    """Raw mapping from YAML. An explicit path (--config, DOCKERLAUNCH_CONFIG) must exist; the default is optional."""
    path, named_by = config_path(path)
    explicit = path is not None
    p = Path(path if explicit else DEFAULT_CONFIG_FILE)
    if not p.exists():
        if explicit:
            raise ConfigError(f"config file {p} does not exist ({named_by})")
        return {}, None
    try:
        data = yaml.safe_load(p.read_text())
    except RecursionError:
        raise ConfigError(f"{p}: nested too deep to read; a config is a few levels deep") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}{where}: invalid YAML: {problem}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping (hosts:, image:, ...), not {type(data).__name__}")
    check_shape(data, str(p))
    return data, str(p)


class NoHostsError(ConfigError):
    """Neither the flags nor the config file name a host; `source` is the file read, if any (render turns this
    into "pass --nodes N" for a scheduler, which wants a count, not hosts)."""

    def __init__(self, source: str | None):
        self.source = source
        if source:
            super().__init__(f"no hosts to run on: list them under `hosts:` in {source}")
        else:
            super().__init__(f"no hosts to run on: pass --hosts h1,h2 (no ./{DEFAULT_CONFIG_FILE} here to read "
                             "them from)")


def validate_config(data: dict[str, Any], source: str | None = None, blame: Blame | None = None,
                    flags: str = "") -> ClusterConfig:
    """`data` as a ClusterConfig, or a one-line ConfigError naming each wrong field (and `source`, the file). With
    `blame` (data is the file with the flags merged, the file already valid alone), an error names the flag that
    gave the value; one it cannot place names the file with `flags`, the flags given."""
    check_shape(data, source or "config")
    where = f"{source}: " if source else ""
    if not data.get("hosts"):
        typo = unknown_top_level(data)
        if typo:
            raise ConfigError(f"{where}{typo}")
        raise NoHostsError(source)
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as e:
        if blame is not None and flags:
            where = f"{source} with {flags}: " if source else f"{flags}: "
        raise ConfigError(describe_config_error(e, blame=blame, where=where)) from None


def load_config(path: str | None = None, overrides: Overrides | None = None,
                log_dir: str | None = None) -> ClusterConfig:
    """The file (--config, DOCKERLAUNCH_CONFIG or ./dockerlaunch.yaml) with the flags merged. `log_dir`: the
    command's --log-dir, which the hints it prints repeat (absolute; None: the default's)."""
    data, source = read_config_file(path)
    merged = apply_overrides(data, overrides) if overrides is not None else data
    if source is not None and overrides is not None:
        # the file as written, even where a flag replaces a value: `job: {command: 5}` is wrong with `-- cmd` too
        validate_config({**data, "hosts": data.get("hosts") or [FILE_CHECK_HOST]}, source)
    ov = overrides or Overrides()
    flags, secret_env = plan_flags(ov)
    given = [f for f, _ in flags] + (["--hosts"] if ov.hosts else []) + (["--name"] if ov.name else []) + (
        ["the command after --"] if ov.command else []) + (["--env"] if secret_env else [])
    # the file was valid as written (above): what is wrong now came with a flag, so the error names the flag
    config = validate_config(merged, source, blame=blamer(ov, data) if overrides is not None else None,
                             flags=", ".join(dict.fromkeys(given)))
    # absolute: a printed command is pasted in another folder (./dockerlaunch.yaml and dockerlaunch-logs/ are not
    # there) or another shell (without DOCKERLAUNCH_CONFIG)
    config._invocation = Invocation(config=os.path.abspath(source) if source else None,
                                    hosts=tuple(ov.hosts) if ov.hosts else None, name=ov.name,
                                    log_dir=os.path.abspath(log_dir or DEFAULT_LOG_DIR), flags=flags,
                                    secret_env=secret_env)
    return config
