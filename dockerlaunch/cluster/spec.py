"""ContainerSpec: the one typed description of a job container, rendered to `docker run` argv.

Later renderers (Kubernetes, Slurm/pyxis) read the same spec. Values that only a host can supply
(its NIC, its GPU count) are `Deferred` placeholders until the apply layer resolves them, so a
dry-run shows exactly where launch-time facts go, and `run_argv()` refuses to render a spec that
still has any.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


class Deferred(str):
    """A value resolved on the host at launch. Displays as `<resolved at launch: WHAT>`."""

    def __new__(cls, what: str) -> Deferred:
        obj = super().__new__(cls, f"<resolved at launch: {what}>")
        obj.what = what
        return obj

    def __reduce__(self):  # keep the type through copy/pickle
        return (Deferred, (self.what,))


class UnresolvedError(ValueError):
    pass


@dataclass
class ContainerSpec:
    """Built by the planner (validated there); a plain dataclass so `Deferred` values survive as they are."""

    name: str
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_files: list[str] = field(default_factory=list)  # paths on the host that runs docker
    labels: dict[str, str] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)  # docker -v values: src:dst[:ro]
    network: str = "host"
    ipc: str = "host"
    shm_size: str | None = None
    gpus: str | None = None  # docker --gpus value
    devices: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    ulimits: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    privileged: bool = False
    restart: str = "no"
    init: bool = True
    detach: bool = True
    remove: bool = False  # --rm: for short-lived probes, never for job containers (their exit code is evidence)
    extra_args: list[str] = field(default_factory=list)
    deferred_flags: list[Deferred] = field(default_factory=list)  # flag groups that depend on the host

    def argv(self) -> list[str]:
        """The full `docker run` argv; may contain Deferred placeholders (for display)."""
        a = ["docker", "run"]
        if self.detach:
            a.append("--detach")
        if self.remove:
            a.append("--rm")
        a += ["--name", self.name]
        for k, v in self.labels.items():
            a += ["--label", f"{k}={v}"]
        a += ["--network", self.network, "--ipc", self.ipc]
        if self.shm_size:
            a += ["--shm-size", self.shm_size]
        a += ["--restart", self.restart]
        if self.init:
            a.append("--init")
        if self.privileged:
            a.append("--privileged")
        if self.gpus is not None:
            a += ["--gpus", self.gpus]
        for d in self.devices:
            a += ["--device", d]
        for c in self.cap_add:
            a += ["--cap-add", c]
        for k, v in self.ulimits.items():
            a += ["--ulimit", f"{k}={v}"]
        a += list(self.deferred_flags)
        for m in self.mounts:
            a += ["--volume", m]
        for k, v in self.env.items():
            a += ["--env", f"{k}={v}"]
        for f in self.env_files:
            a += ["--env-file", f]
        if self.workdir:
            a += ["--workdir", self.workdir]
        if self.user:
            a += ["--user", self.user]
        a += list(self.extra_args)
        a.append(self.image)
        a += list(self.command)
        return a

    def unresolved(self) -> list[str]:
        """What still needs the host, by name."""
        out = [f"env {k}: {v.what}" for k, v in self.env.items() if isinstance(v, Deferred)]
        out += [f"env file: {f.what}" for f in self.env_files if isinstance(f, Deferred)]
        out += [f"label {k}: {v.what}" for k, v in self.labels.items() if isinstance(v, Deferred)]
        out += [f"flags: {d.what}" for d in self.deferred_flags]
        return out

    def run_argv(self) -> list[str]:
        """argv for execution: refuses placeholders, so a half-resolved plan can never start a container."""
        missing = self.unresolved()
        argv = self.argv()
        # belt and braces: a placeholder that lost its type on the way (formatted into a string) still shows
        missing += [f"argv {a!r}" for a in argv if "<resolved at launch:" in a and not missing]
        if missing:
            raise UnresolvedError(f"container {self.name}: unresolved values: {'; '.join(missing)}")
        return argv

    def shell_command(self) -> str:
        """The argv as one POSIX shell line, every value quoted (what reaches a remote shell)."""
        return shlex.join(self.run_argv())
