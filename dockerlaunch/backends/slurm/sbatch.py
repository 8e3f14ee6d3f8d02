"""The job for Slurm: two sbatch scripts, one for pyxis/enroot and one that runs Docker on each allocated node.

Slurm decides the nodes, so the host list only gives their number; every value a host supplies at launch
(`<resolved at launch>` in the plan) is computed by the script on the node, as `up` computes it over SSH:
NODE_RANK from SLURM_NODEID, MASTER_ADDR from the allocation's first node, the NIC from the route toward it,
InfiniBand flags where /dev/infiniband exists. The Docker variant's `docker run` line is dockerlaunch's one
argv writer (docker_run.py), so it cannot drift from what `up` runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import replace
from importlib import resources

from dockerlaunch.backends import RenderedFile, Unsupported, caught, refuse_all
from dockerlaunch.backends.refusals import common_refusals, env_file_paths, per_host_refusals, plain_labels
from dockerlaunch.container import ContainerSpec, Deferred, GpuAccess
from dockerlaunch.docker_run import argv as docker_argv
from dockerlaunch.docker_run import ib_flags
from dockerlaunch.job.plan import DEFAULT_ENV, JobPlan

TARGET = "slurm"
NAME_TOKEN = "@@CONTAINER_NAME@@"  # becomes "$name" (job, Slurm job id, node id), unquoted by design
INHERITED = ("NODE_RANK", "MASTER_ADDR", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
NPROC_FROM_NODE = ('if [ -z "${NPROC_PER_NODE:-}" ]; then NPROC_PER_NODE=$(nvidia-smi -L | grep -c "^GPU"); fi\n'
                   "export NPROC_PER_NODE")


def _template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text()


def _fill(text: str, values: dict[str, str]) -> str:
    """One pass over the template's own markers: a value is never scanned again, so a user's `@@COMMAND@@` stays
    those bytes."""
    wanted = set(re.findall(r"@@([A-Z_]+)@@", text))
    if wanted != set(values):
        raise ValueError(f"slurm template markers {sorted(wanted)} != values {sorted(values)}")  # a template bug
    return re.sub(r"@@([A-Z_]+)@@", lambda m: values[m.group(1)], text)


def enroot_image(ref: str) -> str:
    """pyxis hands --container-image to enroot, which reads `reg.example.com/team/train:1` as a Docker Hub path:
    a registry is written `registry#path` (enroot's docker:// form). Docker's rule for what is a registry: the
    first component holds a `.` or a `:`, or is `localhost`. Hub images, enroot's own forms (`#`, `docker://`,
    `dockerd://`) and squashfs files stay as they are."""
    if "#" in ref or "://" in ref or ref.startswith(("/", "./", "../")) or ref.endswith((".sqsh", ".squashfs")):
        return ref
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def refusals(plan: JobPlan) -> Iterator[Unsupported]:
    """Everything the sbatch scripts cannot express, each once (the caller raises them together)."""
    yield from common_refusals(plan, TARGET)
    yield from per_host_refusals(plan, TARGET, "Slurm picks the nodes, so every node runs the same container")
    if plan.config.container.gpu_mode == "devices":
        yield Unsupported(TARGET, "container.gpu_mode devices", "device nodes and driver libraries differ per "
                          "node; use gpu_mode gpus (the toolkit) or cdi")
    yield from caught(lambda: docker_script(plan, "x"))
    yield from caught(lambda: pyxis_script(plan, "x"))


def docker_script(plan: JobPlan, file: str) -> str:
    """The plain-Docker variant: the template, with host 0's container as every node's."""
    spec: ContainerSpec = plan.hosts[0].container
    env = dict(spec.env)
    nproc = ""
    for k, v in spec.env.items():
        if isinstance(v, Deferred) and v.key == "gpu_count":
            nproc = NPROC_FROM_NODE
            env[k] = ""  # inherited from the node script
        elif isinstance(v, Deferred) and k not in INHERITED:
            del env[k]  # e.g. NCCL_IB_HCA: NCCL takes every port it finds
    inherit = INHERITED + (("NPROC_PER_NODE",) if nproc else ())
    gpu = spec.gpu
    if isinstance(gpu, Deferred):  # gpu_mode auto: the toolkit, as compose and most sites have it
        gpu = GpuAccess("gpus", "the node's nvidia-container-toolkit", spec.gpus)  # type: ignore[arg-type]
    # container.selinux auto: label=disable, which changes nothing on a node whose Docker does not label containers
    label_disable = spec.label_disable if isinstance(spec.label_disable, bool) else True
    node = replace(
        spec, name=NAME_TOKEN, env=env, labels=plain_labels(spec, template=True), gpu=gpu,
        env_files=env_file_paths(spec, plan), label_disable=label_disable,
        detach=False, remove=False,  # in the foreground: the task's exit status is the container's
    )
    argv = docker_argv(node, inherit=inherit)
    words = []
    for i, a in enumerate(argv):
        if a == NAME_TOKEN and i and argv[i - 1] == "--name":  # only the name's own place: a value that reads
            words.append('"$name"')                             # like the token stays as it is
        elif isinstance(a, Deferred) and a.key == "infiniband":
            words.append('"$@"')  # the InfiniBand flags, where the node has /dev/infiniband
        else:
            words.append(shlex.quote(a))
    ib = ""
    if isinstance(spec.infiniband, Deferred):
        ib = f"if [ -d /dev/infiniband ]; then set -- {' '.join(ib_flags())}; fi"
    run = " ".join(words)
    if "\nNODE_SCRIPT\n" in f"\n{run}\n":  # a value's own line would end the node script's here-document early
        raise Unsupported(TARGET, "container.env", "a value has a line that reads NODE_SCRIPT; change it")
    return _fill(_template("docker.sbatch"), {
        "JOB": plan.job, "FILE": file, "NNODES": str(plan.nnodes), "NPROC": nproc, "IB": ib, "DOCKER_RUN": run,
    })


# Docker's --env-file, as `up` and the plain-Docker script get it: KEY=VALUE with the value taken literally (no
# quotes, `$`, backquotes or `;` are interpreted), KEY alone from the environment, `#` lines and blank lines skipped,
# leading blanks and a CR at the end ignored. Sourcing the file instead would run and expand what is in it.
ENV_FILE_READER = r"""dl_env_file() {
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    line=${line#"${line%%[![:space:]]*}"}
    case $line in ''|'#'*) continue ;; esac
    key=${line%%=*}
    case $key in ''|[0-9]*|*[!A-Za-z0-9_]*) echo "env file $1: '$key' is not a variable name" >&2; return 1 ;; esac
    if [ "$key" = "$line" ]; then export "${key?}"; else export "$key=${line#*=}"; fi
  done < "$1"
}"""


def pyxis_script(plan: JobPlan, file: str) -> str:
    spec = plan.hosts[0].container
    exports, names = [], []
    nproc_in = ""
    # srun gives tasks a pipe, not a terminal: a tty's empty PYTHONUNBUFFERED would hold output in 8 KB blocks
    pipe_env = DEFAULT_ENV if spec.tty and "PYTHONUNBUFFERED" not in plan.config.container.env else {}
    for k, v in {**spec.env, **pipe_env}.items():
        if k in ("NODE_RANK", "MASTER_ADDR"):
            names.append(k)
            continue
        if isinstance(v, Deferred):
            if v.key == "gpu_count":
                names.append(k)
                nproc_in = '; export NPROC_PER_NODE="${NPROC_PER_NODE:-$(nvidia-smi -L | grep -c ^GPU)}"'
            continue  # NIC, HCAs: NCCL finds them; enroot shares the host's network
        exports.append(f"export {k}={shlex.quote(v)}")
        names.append(k)
    paths = env_file_paths(spec, plan)
    if paths:
        exports.append(ENV_FILE_READER)
    for path in paths:
        exports.append(f"dl_env_file {shlex.quote(path)} || exit 1  # secrets: never on a command line")
    flags = [f"--container-image={shlex.quote(enroot_image(spec.image))}", "--no-container-mount-home"]
    if spec.mounts:
        mounts = [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in spec.mounts]
        flags.append(f"--container-mounts={shlex.quote(','.join(mounts))}")
    if spec.workdir:
        flags.append(f"--container-workdir={shlex.quote(spec.workdir)}")
    flags.append(f"--container-env={','.join(names)}")
    gpus = ""
    if isinstance(spec.gpus, int):
        gpus = f"#SBATCH --gpus-per-node={spec.gpus}"
    elif isinstance(spec.gpus, tuple):
        gpus = f"#SBATCH --gpus-per-node={len(spec.gpus)}"
    elif spec.gpus == "all":
        gpus = "# (every GPU of each node: add #SBATCH --gpus-per-node=N where the site schedules GPUs as gres)"
    command = " ".join(shlex.quote(a) for a in spec.command) if spec.command else ""
    if not command:
        raise Unsupported(TARGET, "job.command", "pyxis runs a command in the image; give it after --")
    return _fill(_template("pyxis.sbatch"), {
        "JOB": plan.job, "FILE": file, "NNODES": str(plan.nnodes), "SBATCH_GPUS": gpus,
        "EXPORTS": "\n".join(exports), "SRUN_FLAGS": " \\\n  ".join(flags), "NPROC_IN": nproc_in,
        "COMMAND": command,
    })


def render(plan: JobPlan) -> list[RenderedFile]:
    refuse_all(refusals(plan))
    docker_file, pyxis_file = f"{plan.job}.docker.sbatch", f"{plan.job}.pyxis.sbatch"
    return [RenderedFile(docker_file, docker_script(plan, docker_file), executable=True),
            RenderedFile(pyxis_file, pyxis_script(plan, pyxis_file), executable=True)]
