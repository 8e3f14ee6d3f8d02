"""Pre-flight checks: every failure users lose days to, caught before a container starts.

Observe, then judge. `observe` gathers each host's raw facts (one round trip per host for what the
host itself can say, then the few steps that need a container or two hosts: shm/memlock and GPUs in
a container with the job's flags, shared storage, reachability); `judge` is pure and turns those facts
into PASS/WARN/FAIL/SKIP rows, so every verdict is unit-tested on recorded facts. A step that raises
or times out is recorded as such, and judged FAIL: doctor never passes what it could not check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where they run: `doctor.report`, which every command's output uses, must not pull in
    # observe's SSH and engine code (paramiko: a third of a CLI call's start)
    from dockerlaunch.backends.docker.doctor.observations import Observations
    from dockerlaunch.backends.docker.doctor.observe import Progress
    from dockerlaunch.backends.docker.doctor.report import Report
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.hosts.targets import SSHTarget
    from dockerlaunch.job.config import ClusterConfig
    from dockerlaunch.job.plan import JobPlan


def check(fleet: Fleet, plan: JobPlan, progress: Progress | None = None) -> Report:
    """Observe and judge a connected (maybe partly connected) fleet, for the job's one plan; `progress` is told
    how many hosts answered each step (observe)."""
    return check_observed(fleet, plan, progress)[0]


def check_observed(fleet: Fleet, plan: JobPlan, progress: Progress | None = None) -> tuple[Report, Observations]:
    """`check`, and what it observed: `up` plans from each host's probe answer read here (`Observations.probes`)
    instead of running probe.sh again."""
    from dockerlaunch.backends.docker.doctor.judge import judge
    from dockerlaunch.backends.docker.doctor.observe import observe

    observed = observe(fleet, plan, progress)
    return judge(plan.config, plan, fleet.targets, observed), observed


def doctor(config: ClusterConfig, plan: JobPlan, progress: Progress | None = None,
           targets: list[SSHTarget] | None = None) -> Report:
    """`targets`: the hosts' SSH targets `plan` was made from (resolved again when not given)."""
    from dockerlaunch.hosts.fleet import Fleet

    with Fleet.connect(config, require_all=False, targets=targets) as fleet:
        return check(fleet, plan, progress)
