"""`render`: every target from the one plan, checked by the targets' own validators, kept stable by golden files,
and every field of the container spec either rendered or refused in one line."""

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dockerlaunch.backends import Unsupported
from dockerlaunch.backends.compose import render as compose
from dockerlaunch.backends.kubernetes import render as k8s
from dockerlaunch.backends.slurm import render as slurm
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import JobPlan, make_plan
from dockerlaunch.job.spec import BindMount, ContainerSpec, Deferred, GpuAccess, Ulimit

DATA = Path(__file__).resolve().parents[1] / "data" / "render"
GOLDEN = DATA / "golden"
K8S_VERSION = "1.33"  # what kubernetes-validate checks against (it bundles 1.25 .. 1.37)

JOB = {
    "hosts": ["10.0.0.1", "10.0.0.2"],
    "image": "registry.local/train:1",
    "ssh": {"config_file": None},
    "container": {"gpus": 8, "infiniband": "on", "mounts": ["/data:/data:ro", {"source": "/ckpt", "target": "/ckpt",
                                                                             "shared": True}],
                  "env": {"HF_HOME": "/ckpt/hf"}, "shm_size": "64g", "ipc": "private", "workdir": "/work"},
    "job": {"name": "sft-qwen", "command": "torchrun --nnodes $NNODES --node_rank $NODE_RANK train.py"},
}


def plan_of(**changes) -> JobPlan:
    data = json.loads(json.dumps(JOB))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value
    return make_plan(ClusterConfig.model_validate(data))


def rendered(target: str, plan: JobPlan | None = None) -> dict[str, str]:
    plan = plan or plan_of()
    if target == "compose":
        files = compose.render(plan)
    elif target == "slurm":
        files = slurm.render(plan)
    else:
        files = k8s.render(plan, target)
    return {f.name: f.text for f in files}


# ---------------------------------------------------------------- golden files


@pytest.mark.parametrize("target", ["compose", "k8s", "jobset", "slurm"])
def test_output_matches_the_golden_files(target):
    """A change of what a renderer writes shows here; DOCKERLAUNCH_UPDATE_GOLDEN=1 rewrites them (then review)."""
    files = rendered(target)
    folder = GOLDEN / target
    if os.environ.get("DOCKERLAUNCH_UPDATE_GOLDEN") == "1":
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    assert sorted(files) == sorted(p.name for p in folder.iterdir())
    for name, text in files.items():
        assert text == (folder / name).read_text(), f"{target}/{name} changed"


# ---------------------------------------------------------------- Kubernetes


def k8s_docs(target="k8s", plan=None) -> list[dict]:
    [text] = rendered(target, plan).values()
    return list(yaml.safe_load_all(text))


def strict_jobset_schema() -> dict:
    """The CRD's own schema (tests/data/render/SOURCES.md), closed: the API server prunes unknown fields, which
    would hide a misspelled one, so every object that lists its properties allows no others."""
    [path] = DATA.glob("jobset-*.schema.json")
    schema = json.loads(path.read_text())
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def test_k8s_objects_pass_the_kubernetes_schemas_and_never_restart():
    service, job = k8s_docs()
    for doc in (service, job):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # kubernetes-validate does not check enum values: the ones that matter are asserted here
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": "sft-qwen"}
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "sft-qwen"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "sft-qwen-0.sft-qwen"
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_a": 1}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]


def test_k8s_validation_really_fails_on_a_broken_object():
    _, job = k8s_docs()
    job["spec"]["completionMod"] = "Indexed"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_jobset_passes_its_crd_schema_and_never_restarts():
    [jobset] = k8s_docs("jobset")
    schema = strict_jobset_schema()
    jsonschema.validate(jobset, schema)
    spec = jobset["spec"]
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert spec["failurePolicy"] == {"maxRestarts": 0} and spec["successPolicy"] == {"operator": "All"}
    job = spec["replicatedJobs"][0]["template"]["spec"]
    # JobSet's webhook would default an empty restartPolicy to OnFailure: it must be set
    assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"
    env = {e["name"]: e for e in job["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "sft-qwen-node-0-0.sft-qwen"
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
                                  "spec": job}, K8S_VERSION, strict=True)  # the Job template is a real Job spec
    spec["network"]["enableDNSHostname"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(jobset, schema)


def test_host_network_sets_the_dns_policy_kubernetes_needs():
    opts = k8s.Options(host_network=True, rdma_resource="rdma/hca_shared_devices_a")
    [text] = [f.text for f in k8s.render(plan_of(), "k8s", opts)]
    pod = list(yaml.safe_load_all(text))[1]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "rdma/hca_shared_devices_a" in pod["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize("target", ["k8s", "jobset"])
@pytest.mark.parametrize("changes, field", [
    ({"container__gpu_mode": "devices"}, "container.gpu_mode devices"),
    ({"container__gpu_mode": "cdi", "container__gpus": "all"}, "container.gpu_mode cdi"),
    ({"hosts": ["10.0.0.1", {"address": "10.0.0.2", "gpus": [0, 1]}]}, "hosts[1].gpus"),
    ({"container__gpus": "all"}, "container.gpus all"),
    ({"container__gpus": [0, 1]}, "container.gpus"),
    ({"container__infiniband": "auto"}, "container.infiniband auto"),
    ({"container__ulimits": {"nofile": "65536"}}, "container.ulimits"),
    ({"container__user": "trainer"}, "container.user"),
    ({"container__extra_args": ["--pids-limit", "-1"]}, "container.extra_args"),
    ({"job__name": "SFT_qwen"}, "job.name"),
])
def test_k8s_refuses_what_it_cannot_express(target, changes, field):
    with pytest.raises(Unsupported) as e:
        rendered(target, plan_of(**changes))
    msg = str(e.value)
    assert msg.startswith(f"render --to {target}: {field}") and "\n" not in msg


# ---------------------------------------------------------------- compose


def compose_check(argv: list[str], path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    tool = shutil.which(argv[0])
    assert tool, f"{argv[0]} is not installed: scripts/install-docker installs it"
    return subprocess.run([tool, *argv[1:], "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          timeout=60, cwd=path.parent, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("tool", [["docker-compose"], ["docker", "compose"]], ids=["compose-1.29", "compose-v2"])
def test_compose_files_pass_both_compose_versions(tmp_path, tool):
    for name, text in rendered("compose").items():
        path = tmp_path / name
        path.write_text(text)
        r = compose_check(tool, path)
        assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(rendered("compose")["node-0.yaml"].replace("cap_add:", "cap_ad:"))
    assert compose_check(tool, bad).returncode != 0


def test_compose_leaves_host_values_to_compose_substitution(tmp_path):
    config = dict(JOB, hosts=["gpu1", "gpu2"], container={"gpus": "all", "infiniband": "off"})
    plan = make_plan(ClusterConfig.model_validate(config))
    text = compose.render(plan)[1].text
    svc = yaml.safe_load(text)["services"]["node"]
    assert svc["environment"]["MASTER_ADDR"].startswith("${MASTER_ADDR:?")
    assert svc["environment"]["NPROC_PER_NODE"].startswith("${NPROC_PER_NODE:?")
    assert "NCCL_SOCKET_IFNAME" not in svc["environment"] and "note: NCCL_SOCKET_IFNAME is not set" in text
    path = tmp_path / "node-1.yaml"
    path.write_text(text)
    r = compose_check(["docker-compose"], path)
    assert r.returncode != 0 and "set MASTER_ADDR" in r.stderr  # compose itself says what is missing
    assert compose_check(["docker-compose"], path, {"MASTER_ADDR": "10.1.1.1", "NPROC_PER_NODE": "8"}).returncode == 0


@pytest.mark.parametrize("changes, field", [
    ({"container__infiniband": "auto"}, "container.infiniband auto"),
    ({"container__gpu_mode": "cdi", "container__gpus": "all"}, "container.gpu_mode cdi"),
    ({"container__gpu_mode": "devices", "container__gpus": [0]}, "hosts[0] gpu_mode devices"),
    ({"container__extra_args": ["--pids-limit", "-1"]}, "container.extra_args"),
    ({"hosts": ["local"]}, "hosts[0] local"),
])
def test_compose_refuses_what_it_cannot_express(changes, field):
    with pytest.raises(Unsupported) as e:
        rendered("compose", plan_of(**changes))
    assert str(e.value).startswith(f"render --to compose: {field}")


# ---------------------------------------------------------------- slurm


def test_slurm_scripts_are_clean_shell():
    from tests.conftest import venv_tool

    for name, text in rendered("slurm").items():
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, name
        r = subprocess.run([venv_tool("shellcheck"), "-"], input=text, text=True, capture_output=True)
        assert r.returncode == 0, name + "\n" + r.stdout


def test_slurm_docker_line_is_the_docker_backends_argv():
    text = rendered("slurm")["sft-qwen.docker.sbatch"]
    run = next(line for line in text.splitlines() if line.startswith("docker run"))
    assert '--name "$name"' in run and "--env NODE_RANK " in run and "--env MASTER_ADDR " in run
    assert "--gpus 8" in run and "--device /dev/infiniband" in run and "--restart no" in run
    assert "--detach" not in run  # the task's exit status is the container's


@pytest.mark.parametrize("changes, field", [
    ({"container__gpu_mode": "devices"}, "container.gpu_mode devices"),
    ({"hosts": ["10.0.0.1", {"address": "10.0.0.2", "nproc_per_node": 2}]}, "hosts[1].nproc_per_node"),
    ({"hosts": ["local"]}, "hosts[0] local"),
])
def test_slurm_refuses_what_it_cannot_express(changes, field):
    with pytest.raises(Unsupported) as e:
        rendered("slurm", plan_of(**changes))
    assert str(e.value).startswith(f"render --to slurm: {field}")


# ---------------------------------------------------------------- nothing ignored silently

# a value for every field of the container spec that differs from the golden plan's
CHANGED = {
    "name": "other-0", "image": "other:2", "command": ["python", "x.py"], "env": {"EXTRA": "1"},
    "env_files": ["/secrets/env"], "labels": {"team": "a"}, "mounts": [BindMount("/x", "/y", True)],
    "devices": ["/dev/fuse"], "gpus": 4, "gpu": GpuAccess("gpus", "test", 4),
    "infiniband": Deferred("whether the host has IB", "infiniband"),
    "host_network": False, "ipc": "host", "shm_size": "1g", "cap_add": ["SYS_ADMIN"],
    "ulimits": {"nofile": Ulimit(1024, 2048)}, "workdir": "/elsewhere", "user": "1000:1000", "privileged": True,
    "init": False, "detach": False, "remove": True, "docker_args": ["--pids-limit", "-1"],
}
# fields that describe how a launcher runs a container, not the job: no rendered target has them
LAUNCHER_ONLY = {"detach", "remove"}
# where one template serves every node, the scheduler names each node's container (pod, Slurm task) itself
NAMED_BY_SCHEDULER = {("name", "k8s"), ("name", "jobset"), ("name", "slurm")}
# how a Docker engine reaches the GPUs; a pod's come from the device plugin (other modes are refused, tested above)
NAMED_BY_SCHEDULER |= {("gpu", "k8s"), ("gpu", "jobset")}


def test_every_spec_field_has_a_changed_value_here():
    assert set(CHANGED) == {f.name for f in dataclasses.fields(ContainerSpec)}


@pytest.mark.parametrize("target", ["compose", "k8s", "jobset", "slurm"])
@pytest.mark.parametrize("field", sorted(set(CHANGED) - LAUNCHER_ONLY))
def test_a_spec_field_is_rendered_or_refused(target, field):
    """Change one field of every node's spec: the output changes, or the renderer refuses in one line."""
    if (field, target) in NAMED_BY_SCHEDULER:
        pytest.skip(f"{target} names the containers itself")
    base = rendered(target)
    plan = plan_of()
    for hp in plan.hosts:
        setattr(hp.container, field, CHANGED[field])
    try:
        out = rendered(target, plan)
    except ConfigError as e:
        assert str(e).startswith(f"render --to {target}: ") and "\n" not in str(e)
        return
    assert out != base, f"{target} ignores the spec's {field}"
