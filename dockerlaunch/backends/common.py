"""What every renderer checks the same way: fields a target cannot express become one-line refusals."""

from __future__ import annotations

from collections.abc import Iterator

from dockerlaunch.backends import Unsupported
from dockerlaunch.job.plan import LABEL_HOST, LABEL_RANK, LABEL_RUN, JobPlan
from dockerlaunch.job.spec import ContainerSpec, Deferred

RESTARTS = ("jobset",)  # targets whose own controller restarts every node of a failed job (job.max_restarts)


def common_refusals(plan: JobPlan, target: str) -> Iterator[Unsupported]:
    """What no rendered file can carry: a `local` host (this machine through dockerlaunch) and literal docker
    flags (they would be dropped without a word)."""
    for i, h in enumerate(plan.config.hosts):
        if h.local:
            yield Unsupported(target, f"hosts[{i}] local", "`local` is this machine through dockerlaunch's own "
                              "engine; list the nodes by address")
    job = plan.config.job
    if job.hang_timeout is not None:
        yield Unsupported(target, "job.hang_timeout", "only `dockerlaunch up` watches a job's output for hangs; "
                          "drop it (and job.progress_regex) for render")
    if plan.config.spares:
        yield Unsupported(target, "spares", f"only `dockerlaunch up` swaps hosts; {target} places the job on nodes "
                          "itself: drop spares for render")
    if job.max_restarts and target not in RESTARTS:
        yield Unsupported(target, f"job.max_restarts {job.max_restarts}", f"{target} restarts one failed container, "
                          "not the whole job, and a lone restarted rank cannot rejoin the others: use --to jobset "
                          "(failurePolicy.maxRestarts) or `dockerlaunch up`, or set 0")
    for hp in plan.hosts:
        if hp.container.docker_args:
            yield Unsupported(target, "container.extra_args", f"literal docker run flags "
                              f"({' '.join(hp.container.docker_args)[:60]}) have no {target} form; use the "
                              "config's own fields (mounts, env, cap_add, ulimits, ...) or drop them")


def per_host_refusals(plan: JobPlan, target: str, why: str) -> Iterator[Unsupported]:
    """Where one template serves every node (a pod template, an sbatch script), per-host GPU settings cannot be."""
    for i, h in enumerate(plan.config.hosts):
        for field in ("gpus", "nproc_per_node"):
            if getattr(h, field) is not None:
                yield Unsupported(target, f"hosts[{i}].{field}", f"{why}; set it for all nodes (container.gpus / "
                                  "job.nproc_per_node)")


def env_file_paths(spec: ContainerSpec, plan: JobPlan) -> list[str]:
    """The secret files as the user named them: where the file is read on the node (compose, sbatch), in place of
    `up`'s 0600 copies made at launch. Their contents are never rendered."""
    sources = plan.config.container.env_files
    return [sources[i] if isinstance(f, Deferred) else f for i, f in enumerate(spec.env_files)]


def plain_labels(spec: ContainerSpec, template: bool = False) -> dict[str, str]:
    """The job's labels without the launcher's own (the per-launch run id a host's watchdog removes, the host that
    started the container), and without the rank where one template serves every node."""
    drop = (LABEL_RUN, LABEL_HOST, LABEL_RANK) if template else (LABEL_RUN, LABEL_HOST)
    return {k: v for k, v in spec.labels.items() if k not in drop and not isinstance(v, Deferred)}
