"""The command line: parse flags, call the planning and apply layers, print. No logic of its own."""

from dockerlaunch.cli.main import cli, main

__all__ = ["cli", "main"]
