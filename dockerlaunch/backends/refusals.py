"""What every renderer refuses the same way: fields a target cannot express become one-line refusals, and
`--drop FIELD`, the explicit way out of one; plus the two values every rendered file writes alike (the secret
files' paths, the job's labels without the launcher's own)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from dockerlaunch.backends import RenderedFile, Unsupported
from dockerlaunch.container import ContainerSpec, Deferred
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.plan import LABEL_HOST, LABEL_RANK, LABEL_RUN, JobPlan

RESTARTS = ("jobset",)  # targets whose own controller restarts every node of a failed job (job.max_restarts)


# ---------------------------------------------------------------- --drop: the explicit way out of a refusal

@dataclass(frozen=True)
class Drop:
    """A config field a render may leave out when the user says so (`render --drop FIELD`): refused by default,
    dropped only on request, and then said in one WARN line at the top of every rendered file."""

    field: str  # what --drop takes, the config's own dotted name
    loses: str  # what the rendered job lacks, for the WARN line
    value: Callable  # config -> what the config sets (shown in the WARN line)
    cleared: Callable  # config -> the config without it


def _without(section: str, **values):
    def clear(cfg):
        return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})
    return clear


DROPS: tuple[Drop, ...] = (
    Drop("container.ulimits", "the containers get the nodes' runtime limits",
         lambda c: ", ".join(f"{k}={v}" for k, v in c.container.ulimits.items()), _without("container", ulimits={})),
    Drop("container.extra_args", "the containers run without these docker run flags",
         lambda c: " ".join(c.container.extra_args)[:60], _without("container", extra_args=[])),
    Drop("job.hang_timeout", "nothing watches the job's output for hangs",
         lambda c: f"{c.job.hang_timeout:g}s", _without("job", hang_timeout=None, progress_regex=None)),
    Drop("job.max_restarts", "a failed job is not started again",
         lambda c: str(c.job.max_restarts), _without("job", max_restarts=0)),
    Drop("spares", "no spare host replaces a failed one",
         lambda c: ", ".join(h.address for h in c.spares), lambda c: c.model_copy(update={"spares": []})),
)


def drop_named(name: str) -> Drop:
    """--drop's value: the field's dotted name or its last part (`ulimits`); anything else is one line listing
    what can be dropped."""
    for d in DROPS:
        if name in (d.field, d.field.rsplit(".", 1)[-1]):
            return d
    raise ConfigError(f"--drop {name}: not a field a render can drop; these can be: "
                      f"{', '.join(d.field for d in DROPS)}")


def droppable(target: str, field: str, why: str, drop: str) -> Unsupported:
    """A refusal with its way out: the config change, or `--drop FIELD` to render without it (said in the
    rendered file's header)."""
    e = Unsupported(target, field, f"{why}; or render without it: --drop {drop}")
    e.drop = drop  # type: ignore[attr-defined]
    return e


def refused(e: Unsupported) -> list[Unsupported]:
    """The refusals one render raised (one, or several at once)."""
    return list(getattr(e, "found", None) or [e])


def drop_fields(cfg, drops: Iterable[Drop], refusals: list[Unsupported], target: str):
    """(the config without the dropped fields, the WARN lines): only fields this render refused may be dropped;
    a field the target can express stays (one line says so)."""
    refused_here = {getattr(u, "drop", None) for u in refusals}
    warns = []
    for d in drops:
        if d.field not in refused_here:
            raise ConfigError(f"render --to {target}: --drop {d.field}: nothing to drop ({target} expresses it, or "
                              "the config does not set it); leave --drop out")
        # the value as JSON: a line break or control character in it stays escaped in the rendered comment (a raw
        # one became a live line of the sbatch script)
        warns.append(f"# WARN dropped {d.field} ({json.dumps(d.value(cfg), ensure_ascii=True)}) for {target}: "
                     f"{d.loses}")
        cfg = d.cleared(cfg)
    return cfg, warns


def with_header(files: list[RenderedFile], lines: list[str]) -> list[RenderedFile]:
    """`lines` at the top of every file's header (after a `#!` line): a dropped field is said where the file is."""
    if not lines:
        return files
    out = []
    for f in files:
        first, _, rest = f.text.partition("\n")
        text = (first + "\n" + "\n".join(lines) + "\n" + rest if first.startswith("#!")
                else "\n".join(lines) + "\n" + f.text)
        out.append(RenderedFile(f.name, text, f.executable))
    return out


def common_refusals(plan: JobPlan, target: str) -> Iterator[Unsupported]:
    """What no rendered file can carry: a `local` host (this machine through dockerlaunch) and literal docker
    flags (they would be dropped without a word)."""
    for i, h in enumerate(plan.config.hosts):
        if h.local:
            yield Unsupported(target, f"hosts[{i}] local", "`local` is this machine through dockerlaunch's own "
                              "engine; list the nodes by address")
    job = plan.config.job
    if job.hang_timeout is not None:
        yield droppable(target, "job.hang_timeout", "only dockerlaunch's own `up` watches a job's output for hangs; "
                        "remove it (and job.progress_regex) from the config for render", "job.hang_timeout")
    if plan.config.spares:
        yield droppable(target, "spares", f"only dockerlaunch's own `up` swaps hosts; {target} places the job on nodes "
                        "itself: remove spares from the config for render", "spares")
    if job.max_restarts and target not in RESTARTS:
        yield droppable(target, f"job.max_restarts {job.max_restarts}", f"{target} restarts one failed container, "
                        "not the whole job, and a lone restarted rank cannot rejoin the others: use --to jobset "
                        "(failurePolicy.maxRestarts) or dockerlaunch's own `up`, or set 0", "job.max_restarts")
    for hp in plan.hosts:
        if hp.container.docker_args:
            yield droppable(target, "container.extra_args", f"literal docker run flags "
                            f"({' '.join(hp.container.docker_args)[:60]}) have no {target} form; use the "
                            "config's own fields (mounts, env, cap_add, ulimits, ...) instead",
                            "container.extra_args")


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
