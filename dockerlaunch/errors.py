"""User-facing errors: one line that names the thing and the fix, never a traceback.

One hierarchy, so the CLI has one place that turns any of them into `error: ...` and an exit code.
Errors about a host carry the host, the step and the exit status as data (doctor and push report
them per host without parsing text back out of a message); `str()` is the one-line message.
"""

from __future__ import annotations

from pydantic import ValidationError

from dockerlaunch import hints

SCHEMA = hints.dockerlaunch("schema", hint="config.schema")  # where every config field is listed


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread like KeyboardInterrupt (the CLI installs the handlers). Only
    the first signal of a run raises: a later one is noted, never raised into the cleanup the first started."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum


class DockerlaunchError(Exception):
    """A problem the user can act on. The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 1


class ConfigError(DockerlaunchError):
    """Bad input (config file or flags): exit code 2, like a usage error."""

    exit_code = 2


class HostError(DockerlaunchError):
    """Something failed on one host. `str()` is `host H: STEP failed: DETAIL` (or `host H: DETAIL`)."""

    def __init__(self, host: str, detail: str, *, step: str | None = None, exit_status: int | None = None):
        self.host, self.detail, self.step, self.exit_status = host, detail, step, exit_status
        super().__init__(str(self))

    @property
    def reason(self) -> str:
        """The message without the host prefix (for tables that already have a host column)."""
        return f"{self.step} failed: {self.detail}" if self.step else self.detail

    def __str__(self) -> str:
        return f"host {self.host}: {self.reason}"

    def __reduce__(self):  # picklable despite keyword-only arguments
        return (_rebuild_host_error, (type(self), self.host, self.detail, self.step, self.exit_status))


def _rebuild_host_error(cls, host, detail, step, exit_status):
    return cls(host, detail, step=step, exit_status=exit_status)


class SSHError(HostError):
    """Cannot reach, authenticate to, or keep talking to a host."""


class DockerError(HostError):
    """A docker command on a host failed (the host itself answered)."""


class EngineError(DockerlaunchError):
    """The local Docker engine is missing or unusable."""


class TransferError(DockerlaunchError):
    """Moving an image (push, save, load) failed."""


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
            msg = f"unknown field (check the spelling; `{SCHEMA}` lists the fields)"
        line = f"{_loc(tuple(e['loc']))}: {msg}"
        if line not in seen:
            seen.append(line)
    return "; ".join(seen).replace("\n", " ")


class BuildError(DockerlaunchError):
    """An image build, fetch or compile that failed (exit 1, one line)."""
