"""The docker backend: today's `up`/`down`/`status`/`logs`/`exec`/`doctor`, one container per host over SSH."""

from dockerlaunch import shipped


def script(name: str) -> str:
    return shipped.script(__name__, name)
