"""Seeing inside a running job: NCCL's real transport, every rank's stack, the network's real speed."""

from dockerlaunch import shipped


def script(name: str) -> str:
    return shipped.script(__name__, name)
