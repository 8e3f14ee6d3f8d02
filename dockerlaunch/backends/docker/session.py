"""The docker backend's session: the connected hosts and the job's one plan, the facts asked of them, the
master address, and the plan resolved with them (`up`, and `render --probe`), plus which job containers are there."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from dockerlaunch.backends.docker import probe as probelib
from dockerlaunch.backends.docker.dockerhost import ContainerState, DockerHost
from dockerlaunch.container import Deferred
from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.hosts.fleet import Fleet
from dockerlaunch.hosts.targets import SSHTarget
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.facts import HostFacts
from dockerlaunch.job.plan import JobPlan, command_refusal, plan_job, resolve


class Phases:
    """Where `up`'s time went before the job ran (shown with the start: at 256 hosts, which step to look at)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.spent: dict[str, float] = {}

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.spent[name] = self.spent.get(name, 0.0) + now - self.last
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in self.spent.items() if v >= 0.05)
        return f"{sum(self.spent.values()):.1f}s" + (f" ({parts})" if parts else "")


@dataclass
class Session:
    """The connected hosts (a Fleet) and the job's plan (made once, before any host was asked); `resolve` fills its
    placeholders from `gather_facts`."""

    fleet: Fleet
    plan: JobPlan

    @property
    def config(self) -> ClusterConfig:
        return self.fleet.config

    def close(self) -> None:
        self.fleet.close()


def open_session(config: ClusterConfig, plan: JobPlan | None = None,
                 targets: Sequence[SSHTarget] | None = None) -> Session:
    """Connect to every host (at `targets` where the caller resolved them to make `plan`) with the job's plan."""
    fleet = Fleet.connect(config, targets=targets)
    try:
        return Session(fleet, plan or plan_job(config, fleet.targets, require_image=False))
    except BaseException:
        fleet.close()
        raise


def probed_plan(config: ClusterConfig, plan: JobPlan, targets: Sequence[SSHTarget] | None = None) -> JobPlan:
    """The plan with every host value asked of the hosts, as `up` asks them; nothing is started (render --probe).
    `targets`: the ones `plan` was made from."""
    session = open_session(config, plan, targets)
    try:
        return resolve(plan, gather_facts(session), run_id="render")
    finally:
        session.close()


def master_addr_of(session: Session) -> str:
    addr = session.plan.master_addr
    if isinstance(addr, Deferred):
        peer = session.fleet.peer_ip(0)
        if not peer:
            raise DockerlaunchError(
                f"host {session.plan.hosts[0].address}: cannot tell its IP; set hosts[0].advertise_addr"
            )
        return peer
    return addr


def gather_facts(session: Session, env_files: dict[int, tuple[str, ...]] | None = None,
                 probes: Sequence[probelib.Probe | Exception] | None = None) -> dict[int, HostFacts]:
    """Every host's probe (asked here, concurrently, unless the caller brought them: `up` reads them in the
    pre-flight's round trip or in prepare's) turned into HostFacts, or one line naming every host that cannot be
    planned. Whoever reads the probes decides `check_command`, once: here only for the probes asked here."""
    master = master_addr_of(session)
    if probes is None:
        image = session.plan.known_image
        probes = [o.value if o.ok else o.error  # type: ignore[misc]
                  for o in session.fleet.each(lambda h: probelib.probe(h.remote, master, image))]
        check_command(session.plan, probes)
    user_env = session.config.container.env
    one_machine = session.config.one_machine
    out: dict[int, HostFacts] = {}
    errors = []
    # the image's labels where a host was asked them (`prepare` asks host 0 only: one image for every host)
    labels = next((p.image_labels for p in probes if not isinstance(p, Exception) and p.image_labels), None)
    said = next((p.image_command for p in probes if not isinstance(p, Exception) and p.image_command), None)
    image_command = (said.entrypoint, said.cmd) if said is not None else None
    for hp, p in zip(session.plan.hosts, probes):
        if isinstance(p, Exception):
            errors.append(str(p))
            continue
        if p.problem and "NCCL_SOCKET_IFNAME" not in user_env and not one_machine:
            errors.append(
                f"host {hp.address}: NIC toward MASTER_ADDR {master}: {p.problem}; fix the route or set "
                "container.env NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME"
            )
            continue
        if p.selinux is None and session.config.container.selinux == "auto":
            mode = f" ({p.selinux_mode})" if p.selinux_mode else ""
            errors.append(
                f"host {hp.address}: could not tell whether its engine labels containers: the kernel runs "
                f"SELinux{mode} and `docker info` gave no SecurityOptions; set container.selinux: disable "
                "(--security-opt label=disable) or keep (the engine's labels)"
            )
            continue
        if isinstance(hp.nproc_per_node, Deferred) and not p.gpu_count:
            errors.append(
                f"host {hp.address}: no GPUs found (nvidia-smi -L) to set NPROC_PER_NODE; "
                "set job.nproc_per_node, or gpus: none for CPU jobs"
            )
            continue
        out[hp.rank] = HostFacts(
            interface=p.interface or ("lo" if one_machine else None),  # one machine: loopback carries it all
            gpu_count=p.gpu_count,
            infiniband=p.ib_device,
            ib_hca=",".join(p.ib_active),
            master_addr=master if hp.rank == 0 else None,
            env_files=(env_files or {}).get(hp.rank),
            access=p.access,
            gpu_host=p.gpu_host,
            torch=(p.image_labels or labels or {}).get(labels_.TORCH),
            selinux=p.selinux,
            image_command=image_command,
        )
    if session.plan.supervised and image_command is None and not errors:
        errors.append(f"host {session.plan.hosts[0].address}: could not read the image's ENTRYPOINT and CMD, which "
                      "the gang supervisor runs (is the image there? `"
                      + session.config.invocation.command("doctor", hint="up.doctor") + "` checks it)")
    if errors:
        raise DockerlaunchError("; ".join(errors))
    return out


def check_command(plan: JobPlan, probes: Sequence[probelib.Probe | Exception]) -> None:
    """No command given and an image that runs nothing (no CMD, no ENTRYPOINT, as the probe read it where it asked
    for the image: host 0): one line, before any container starts (Docker would say `No command specified`)."""
    said = next((p.image_command for p in probes if not isinstance(p, Exception) and p.image_command), None)
    why = command_refusal(plan.config, plan.known_image or "?", said.runs_something if said is not None else None)
    if why:
        raise ConfigError(why)


def existing_job_containers(session: Session, job: str) -> list[tuple[str, ContainerState]]:
    found = session.fleet.each(lambda h: DockerHost.on(h).job_containers(job)).raise_first()
    return own_containers([h.name for h in session.fleet.live], found)  # what each answered, in the same order


def own_containers(hosts: list[str], found: list[list[ContainerState]]) -> list[tuple[str, ContainerState]]:
    """(host, state) of each container once, rank order. Hosts that share an engine (several `local` entries, the
    sim's light hosts) each see all of its containers: one goes to the host its label names, or, when no host of
    this config does (an older dockerlaunch, a host since dropped from the list), to the first that saw it."""
    names = set(hosts)
    owner: dict[str, tuple[str, ContainerState]] = {}
    for host, states in zip(hosts, found):
        for s in states:
            key = s.id or f"{host}/{s.name}"
            if s.host == host or (key not in owner and s.host not in names):
                owner[key] = (host, s)
    return sorted(owner.values(), key=lambda hs: (hs[1].rank is None, hs[1].rank, hs[0], hs[1].name))
