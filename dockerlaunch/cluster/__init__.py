"""Hosts and jobs: config, plans, SSH, the Docker runner on each host, doctor and the launcher."""

from dockerlaunch import shipped


def script(name: str) -> str:
    return shipped.script(__name__, name)
