"""Images to hosts without a registry: streams, the push planner, star and chain pushes, bundles."""

from dockerlaunch import shipped


def script(name: str) -> str:
    return shipped.script(__name__, name)
