"""How the user called dockerlaunch, so that a fix it prints works when pasted: every hint that is a dockerlaunch
command is built here from the same --config, --hosts and --name the user gave (a hint that dropped --config
failed when pasted, or nudged the user to weaken host-key checking). Pure: the config loader records it
(ClusterConfig.invocation), and the layers that word hints (doctor's judge, up, down, push) read it from there.

One marker for a command the user may paste: `fix: dockerlaunch ...` (FIX). Hints that are not dockerlaunch
commands or would destroy something (`kill`, `nvidia-smi -r`, `ssh-keygen -R`) are worded as advice, never FIX."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

FIX = "fix:"
CONFIG_ENV = "DOCKERLAUNCH_CONFIG"  # read by every command that reads a config (job/config.py: find_config)


@dataclass(frozen=True)
class Invocation:
    config: str | None = None  # the config file as the user named it (--config or DOCKERLAUNCH_CONFIG); None: ./
    hosts: tuple[str, ...] | None = None  # --hosts as given
    name: str | None = None  # --name as given

    def command(self, *words: str, hosts: bool = True, name: bool = True) -> str:
        """`dockerlaunch WORDS` with the user's own --config, --hosts and --name (each where the command takes it),
        quoted for a POSIX shell."""
        argv = ["dockerlaunch", *words]
        if self.config:
            argv += ["--config", self.config]
        if hosts and self.hosts:
            argv += ["--hosts", ",".join(self.hosts)]
        if name and self.name:
            argv += ["--name", self.name]
        return shlex.join(argv)

    def fix(self, *words: str, hosts: bool = True, name: bool = True) -> str:
        """`fix: dockerlaunch ...`: the one form of a command the user may paste."""
        return f"{FIX} {self.command(*words, hosts=hosts, name=name)}"
