"""What a host tells the plan at launch, typed; gathered by the docker backend (backends/docker/probe.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dockerlaunch.gpu.access import HostGpuAccess
from dockerlaunch.gpu.host import GpuHost


@dataclass(frozen=True)
class EngineSecurity:
    """What an engine says of itself in `docker info`'s SecurityOptions: the one reader of that list (the probe's
    SELinux fact, the launcher's rootless check in transfer/cache_server.py).

    Two forms: Docker 1.13 and later write `name=NAME[,KEY=VALUE...]` (`name=seccomp,profile=default`,
    `name=selinux`, `name=rootless`); daemons before it the bare name (`selinux`), which docker/cli's
    DecodeSecurityOptions still reads as a name. Real outputs of both: tests/data/docker-info/. The names are only
    ever compared, never printed or used as paths."""

    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, options: object) -> EngineSecurity | None:
        """The API's list (JSON null: an engine with none) -> its names; None for anything else (not an answer)."""
        if options is None:
            return cls()
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            return None
        names = []
        for option in options:
            if "=" not in option:
                names.append(option.strip())
                continue
            for part in option.split(","):
                key, _, value = part.partition("=")
                if key.strip() == "name":
                    names.append(value.strip())
        return cls(tuple(names))

    @property
    def selinux(self) -> bool:
        """The engine labels its containers (dockerd --selinux-enabled on a kernel running SELinux): a bind mount
        of a host folder is denied in a labelled container unless the folder is labelled for containers."""
        return "selinux" in self.names

    @property
    def rootless(self) -> bool:
        return "rootless" in self.names


@dataclass(frozen=True)
class HostFacts:
    """What the apply layer learns on a host before the plan's placeholders are filled (None = not known)."""

    interface: str | None = None  # from `ip route get MASTER_ADDR`
    gpu_count: int | None = None
    infiniband: bool | None = None  # /dev/infiniband present
    ib_hca: str | None = None  # ACTIVE ports, NCCL_IB_HCA syntax
    master_addr: str | None = None  # host 0 only: the address the others reach
    env_files: tuple[str, ...] | None = None  # remote paths of the uploaded secret env files
    access: HostGpuAccess | None = None  # how containers there reach the GPUs
    gpu_host: GpuHost | None = None  # the driver and each GPU, as nvidia-smi said (device mode: its driver decides
    # whether the image's cuda-compat goes first)
    torch: str | None = None  # the image's torch, where its labels say (dockerlaunch-built images do)
    selinux: bool | None = None  # the engine labels containers (EngineSecurity.selinux); None: not known
    # the image's (ENTRYPOINT, CMD) where host 0's probe read them: what the gang supervisor runs as its child
    image_command: tuple[tuple[str, ...], tuple[str, ...]] | None = None
