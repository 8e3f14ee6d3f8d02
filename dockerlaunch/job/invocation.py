"""How the user called dockerlaunch, so that a command it prints works when pasted, in any folder: every hint that is
a dockerlaunch command is built here from the user's own invocation (a hint that dropped --config failed when
pasted, or nudged the user to weaken host-key checking). Pure: the config loader records it (ClusterConfig.invocation,
with the config file and --log-dir made absolute there), and the layers that word hints (doctor's judge, up, down,
push) read it from there.

What a printed command carries:
- the config file as an absolute path whenever one was read (./dockerlaunch.yaml, a relative --config,
  DOCKERLAUNCH_CONFIG): the hint is pasted in another folder or shell;
- --hosts and --name as given;
- to `logs`, `status`, `down`, `ps` and `exec`: an absolute --log-dir (its default, dockerlaunch-logs, is relative);
- every flag that changes the plan (--image, --mount, ...) that the pasted command takes (TAKES): a doctor that
  dropped --image checked another image and printed a false all-clear. The ones it cannot take are named
  (`left_out`), and an --env value whose name looks secret (the config's secret-name rule) is never repeated.

One label per line: a command the user may paste follows exactly one label, with nothing between them: `fix:`
(FIX) for a fix, or a line of its own such as `follow with: dockerlaunch logs ...` (`follow with: fix: ...` was
pasted as `fix: dockerlaunch ...`). Hints that are not dockerlaunch commands or would destroy something (`kill`,
`nvidia-smi -r`, `ssh-keygen -R`) are worded as advice, never FIX."""

from __future__ import annotations

from dataclasses import dataclass

from dockerlaunch import hints

FIX = "fix:"
CONFIG_ENV = "DOCKERLAUNCH_CONFIG"  # read by every command that reads a config (job/load.py: config_path)
DEFAULT_LOG_DIR = "dockerlaunch-logs"  # `up --log-dir`'s default, relative to the folder `up` ran in

# the flags that change the job's plan, in the order a printed command repeats them
SHAPE = ("--image", "--nproc-per-node", "--master-port", "--mount", "--env")
UP_ONLY = ("--push", "--no-diagnostics", "--max-restarts", "--spares", "--hang-timeout")
PLAN_FLAGS = (*SHAPE, "--offline", "--infiniband", *UP_ONLY)
# which of them each command takes (tests/unit/cli/test_help.py checks this against the commands' options); a
# command not listed takes none and needs none (it finds the job by --config, --hosts and --name)
TAKES: dict[str, frozenset[str]] = {
    "up": frozenset(PLAN_FLAGS) - {"--infiniband"},
    "doctor": frozenset((*SHAPE, "--offline")),
    "commtest": frozenset(SHAPE),
    "render": frozenset((*SHAPE, "--offline", "--infiniband", "--no-diagnostics")),
    "config show": frozenset(SHAPE),
}
LOG_DIR_TAKERS = frozenset(("logs", "status", "down", "ps", "exec"))


@dataclass(frozen=True)
class Invocation:
    config: str | None = None  # the config file read, absolute (None: none was read)
    hosts: tuple[str, ...] | None = None  # --hosts as given
    name: str | None = None  # --name as given
    log_dir: str | None = None  # --log-dir, absolute (None: the default's, made absolute where it is used)
    flags: tuple[tuple[str, str | None], ...] = ()  # plan flags as given: ("--image", "x"), ("--offline", None)
    secret_env: tuple[str, ...] = ()  # --env names whose value is never repeated (they look like secrets)

    @staticmethod
    def _takes(words: tuple[str, ...]) -> frozenset[str]:
        key = " ".join(words[:2]) if words[:2] == ("config", "show") else (words[0] if words else "")
        return TAKES.get(key, frozenset())

    def command(self, *words: str, hint: str, hosts: bool = True, name: bool = True) -> str:
        """`dockerlaunch WORDS` with the user's own --config, --hosts and --name (each where the command takes it),
        --log-dir where it takes one, and the plan flags it takes, quoted for a POSIX shell (hints.command; `hint`:
        the printing site's id)."""
        argv = ["dockerlaunch", *words]
        if self.config:
            argv += ["--config", self.config]
        if hosts and self.hosts:
            argv += ["--hosts", ",".join(self.hosts)]
        if name and self.name:
            argv += ["--name", self.name]
        if words and words[0] in LOG_DIR_TAKERS and self.log_dir:
            argv += ["--log-dir", self.log_dir]
        takes = self._takes(words)
        for flag, value in self.flags:
            if flag in takes:
                argv += [flag] if value is None else [flag, value]
        return hints.command(*argv, hint=hint)

    def fix(self, *words: str, hint: str, hosts: bool = True, name: bool = True) -> str:
        """`fix: dockerlaunch ...`: the one form of a fix the user may paste."""
        return f"{FIX} {self.command(*words, hint=hint, hosts=hosts, name=name)}"

    def left_out(self, *words: str) -> list[str]:
        """What `command(*words)` could not repeat of the plan the user asked for: flags the command does not take
        (`up`'s own: --push, --max-restarts, ...) and --env names that look secret. Empty for a command that takes
        no plan flags (it finds the job, whatever its plan)."""
        takes = self._takes(words)
        if not takes:
            return []
        out = [flag for flag in dict.fromkeys(f for f, _ in self.flags) if flag not in takes]
        if "--env" in takes:
            out += [f"--env {n}" for n in self.secret_env]
        return out

    def left_out_note(self, *words: str) -> str:
        """`left_out` said in words for the line after the command ("" when nothing was left out): `leaves out
        --push, --max-restarts (doctor does not take them); --env HF_TOKEN (looks secret: add it yourself)`."""
        gone = self.left_out(*words)
        flags = [f for f in gone if not f.startswith("--env ")]
        secrets = [f for f in gone if f.startswith("--env ")]
        said = ([f"{', '.join(flags)} ({words[0]} does not take {'them' if len(flags) > 1 else 'it'})"] if flags
                else []) + ([f"{', '.join(secrets)} (looks secret: add it yourself)"] if secrets else [])
        return f"leaves out {'; '.join(said)}" if said else ""
