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

from dockerlaunch.backends import Unsupported, renderers
from dockerlaunch.backends.compose import files as compose
from dockerlaunch.backends.kubernetes import objects as k8s
from dockerlaunch.backends.slurm import sbatch as slurm
from dockerlaunch.container import BindMount, ContainerSpec, Deferred, GpuAccess, Supervisor, Ulimit
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import JobPlan, make_plan
from tests.cli import dl

DATA = Path(__file__).resolve().parents[2] / "data" / "render"
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
    """Through renderers.TARGETS, as the CLI renders: the target's options from no flags, then its render."""
    to = renderers.get(target)
    files = to.render(plan or plan_of(), to.options({}))
    return {f.name: f.text for f in files}


# ---------------------------------------------------------------- golden files


@pytest.mark.parametrize("target", renderers.names())
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
    opts = k8s.Options(target="k8s", host_network=True, rdma_resource="rdma/hca_shared_devices_a")
    [text] = [f.text for f in k8s.render(plan_of(), opts)]
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
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"render --to {target}: {field}"), lines
    assert all(ln.startswith(f"render --to {target}: ") for ln in lines) and len(set(lines)) == len(lines), lines


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


def test_compose_keeps_the_jobs_own_dollars_for_the_container(tmp_path):
    """compose substitutes $VAR everywhere in a file: the command's `$NODE_RANK` must reach the container."""
    path = tmp_path / "node-1.yaml"
    path.write_text(rendered("compose")["node-1.yaml"])
    r = subprocess.run(["docker", "compose", "-f", str(path), "config", "--format", "json"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "NNODES": "WRONG", "NODE_RANK": "WRONG"})
    assert r.returncode == 0, r.stderr
    svc = json.loads(r.stdout)["services"]["node"]
    # compose keeps `$$` in what it prints (its output is a compose file again) and substituted nothing
    assert svc["command"][-1] == JOB["job"]["command"].replace("$", "$$")
    assert svc["environment"]["NODE_RANK"] == "1" and "WRONG" not in r.stdout


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


def test_compose_refuses_an_env_file_line_compose_reads_otherwise_than_docker(tmp_path):
    """compose reads env_file by its own dotenv rules, not Docker's --env-file: a line they read apart is refused,
    each naming the file, the line and the variable, never the value; what both read alike renders. Measured
    against real composes and `docker run --env-file` in
    tests/integration/test_render_run.py::test_compose_env_file_gives_the_container_what_docker_run_env_file_does."""
    env_file = tmp_path / "secrets.env"
    env_file.write_bytes(b"# 'a' comment $HOME\nOK=a$1 `id` it's a#b k=v\\n\nFROM_ENV\nQ='s3cr3t'\nT=s3cr3t \n"
                         b"V=s3cr3t$HOME\nC=s3cr3t #x\nexport E=s3cr3t\nALONE")
    with pytest.raises(Unsupported) as e:
        rendered("compose", plan_of(container__env_files=[str(env_file)]))
    lines = str(e.value).splitlines()
    assert [line.split(f"{env_file} ")[1].split(":")[0] for line in lines] == [
        "line 4", "line 5", "line 6", "line 7", "line 8", "line 9"], lines
    assert "s3cr3t" not in str(e.value) and all(line.startswith("render --to compose: container.env_files: ")
                                                and "Q's value: it starts with a quote" in lines[0] for line in lines)
    env_file.write_bytes(b"OK=a$1 `id` it's a#b k=v\\n\nFROM_ENV\n")
    assert "env_file:" in rendered("compose", plan_of(container__env_files=[str(env_file)]))["node-0.yaml"]


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
    "init": False, "tty": False, "detach": False, "remove": True, "docker_args": ["--pids-limit", "-1"],
    "label_disable": False,  # container.selinux keep (the golden plan's auto renders label=disable)
    "supervisor": Supervisor("/bin/sh", "/run/dockerlaunch"),
}
# fields that describe how a launcher runs a container, not the job: no rendered target has them (the supervisor is
# `up`'s own: a render's plan never has one)
LAUNCHER_ONLY = {"detach", "remove", "supervisor"}
# where one template serves every node, the scheduler names each node's container (pod, Slurm task) itself
NAMED_BY_SCHEDULER = {("name", "k8s"), ("name", "jobset"), ("name", "slurm")}
# how a Docker engine reaches the GPUs; a pod's come from the device plugin (other modes are refused, tested above)
NAMED_BY_SCHEDULER |= {("gpu", "k8s"), ("gpu", "jobset")}


# the config's name for a spec field, as a refusal names it
REFUSED_AS = {"docker_args": "container.extra_args", "infiniband": "container.infiniband",
              "ulimits": "container.ulimits", "host_network": "network", "label_disable": "container.selinux"}


def test_every_spec_field_has_a_changed_value_here():
    assert set(CHANGED) == {f.name for f in dataclasses.fields(ContainerSpec)}


@pytest.mark.parametrize("target, field", [(t, f) for f in sorted(set(CHANGED) - LAUNCHER_ONLY)
                                           for t in renderers.names()
                                           if (f, t) not in NAMED_BY_SCHEDULER])
def test_a_spec_field_is_rendered_or_refused(target, field):
    """Change one field of every node's spec: the output changes, or the renderer refuses in one line."""
    base = rendered(target)
    plan = plan_of()
    for hp in plan.hosts:
        setattr(hp.container, field, CHANGED[field])
    try:
        out = rendered(target, plan)
    except ConfigError as e:
        assert str(e).startswith(f"render --to {target}: ") and "\n" not in str(e)
        # ... and the refusal is about this field: it names it as the config does (any refusal would not do)
        said = str(e).split(": ", 2)[1]
        assert said.startswith(REFUSED_AS.get(field, field)), (field, str(e))
        return
    assert out != base, f"{target} ignores the spec's {field}"


# ---------------------------------------------------------------- the command, as a user types it


def one_line_error(r, *words):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_render_writes_into_a_new_folder_and_refuses_a_full_one(cli, tmp_path):
    out = tmp_path / "out"
    args = ["render", "--to", "k8s", "--nodes", "2", "--image", "img:1", "--infiniband", "off", "--nproc-per-node",
            "1", "--out", str(out), "--", "python", "train.py"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(out / "dockerlaunch.k8s.yaml")]
    one_line_error(cli(*args), "not empty", "--force")
    assert cli(*args, "--force").returncode == 2  # --force after `--` is the command's, not ours
    r = cli(*args[:-3], "--force", "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    (tmp_path / "file").write_text("x")
    one_line_error(cli(*args[:-5], "--out", str(tmp_path / "file"), "--", "python", "t.py"), "not a folder")


def test_render_refusals_are_one_line_and_write_nothing(cli, tmp_path):
    out = tmp_path / "out"
    one_line_error(cli("render", "--to", "k8s", "--nodes", "2", "--image", "i", "--nproc-per-node", "8", "--out",
                       str(out), "--", "x"),
                   "render --to k8s: container.infiniband auto", "--infiniband on|off")
    assert not out.exists()
    one_line_error(cli("render", "--to", "compose", "--nodes", "2", "--image", "i", "--", "x"), "--hosts")
    one_line_error(cli("render", "--to", "k8s", "--probe", "--nodes", "2", "--image", "i", "--", "x"), "--probe")
    one_line_error(cli("render", "--to", "slurm", "--hosts", "local", "--image", "i", "--", "x"), "hosts[0] local")


def test_render_lists_every_refusal_at_once_one_line_each(cli, tmp_path):
    """A default config for k8s cannot say `infiniband: auto` nor `gpus: all`: both in one run, each its own
    `error:` line, nothing written (not one refusal per run)."""
    out = tmp_path / "out"
    r = cli("render", "--to", "k8s", "--nodes", "2", "--image", "i", "--out", str(out), "--", "x")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2 and not out.exists(), r.stderr
    assert lines[0].startswith("error: render --to k8s: container.infiniband auto")
    assert lines[1].startswith("error: render --to k8s: container.gpus all")
    config = tmp_path / "job.yaml"
    config.write_text("hosts: [10.0.0.1, 10.0.0.2]\nimage: i\ncontainer: {extra_args: [--pids-limit, '-1']}\n"
                      "job: {command: x, max_restarts: 2}\n")
    r = cli("render", "--to", "compose", "--config", str(config), "--out", str(out))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and not out.exists(), r.stderr
    assert [ln.split(": ")[2] for ln in lines] == ["job.max_restarts 2", "container.extra_args",
                                                    "container.infiniband auto"], r.stderr


def test_a_file_is_validated_as_written_even_where_a_flag_replaces_the_value(cli, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("hosts: [10.0.0.1]\nimage: img\njob: {command: 5}\n")
    for command in (["up", "--dry-run"], ["render", "--to", "compose"]):
        one_line_error(cli(*command, "--config", str(path), "--", "python", "train.py"), "job.command", str(path))
    path.write_text("image: img\njob: {command: [python, t.py]}\n")  # hosts from the flag: still fine
    assert cli("up", "--dry-run", "--config", str(path), "--hosts", "10.0.0.1").returncode == 0


# ---------------------------------------------------------------- compose/: the files for a start by hand

COMPOSE_DIR = Path(__file__).resolve().parents[3] / "compose"
HAND_ENV = {"IMAGE": "img:1", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
            "TRAIN_CMD": "torchrun --node_rank $NODE_RANK train.py"}


def compose_config(*files: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = ["docker", "compose"] + [x for f in files for x in ("-f", str(COMPOSE_DIR / f))]
    clean = {k: v for k, v in os.environ.items() if k not in HAND_ENV}
    return subprocess.run([*argv, "config", "--format", "json"], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})


@pytest.mark.parametrize("files", [["node.yaml"], ["node.yaml", "infiniband.yaml"], ["single-node.yaml"]])
def test_hand_files_pass_both_compose_versions_and_name_what_is_missing(files, tmp_path):
    r = compose_config(*files, env=HAND_ENV)
    assert r.returncode == 0, r.stderr
    v1 = subprocess.run(["docker-compose", *[x for f in files for x in ("-f", str(COMPOSE_DIR / f))], "config", "-q"],
                        capture_output=True, text=True, timeout=60, env={**os.environ, **HAND_ENV})
    assert v1.returncode == 0, v1.stderr
    missing = compose_config(*files, env={k: v for k, v in HAND_ENV.items() if k != "IMAGE"})
    assert missing.returncode != 0 and "set IMAGE" in missing.stderr


def test_the_node_template_keeps_the_settings_the_renderer_writes():
    """compose/node.yaml is for hosts without dockerlaunch: it must not drift from what `render --to compose`
    decides for a job with the defaults (all GPUs, no InfiniBand)."""
    plan = make_plan(ClusterConfig.model_validate({"hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:1",
                                                   "container": {"infiniband": "off"}, "job": {"nproc_per_node": 8}}))
    made = yaml.safe_load(compose.render(plan)[1].text)["services"]["node"]
    r = compose_config("node.yaml", env=HAND_ENV)
    assert r.returncode == 0, r.stderr
    hand = json.loads(r.stdout)["services"]["node"]
    for key in ("network_mode", "ipc", "init", "cap_add"):
        assert hand[key] == made[key], key
    assert hand["restart"] == made["restart"] == "no"
    [gpus] = hand["deploy"]["resources"]["reservations"]["devices"]
    assert {**gpus, "count": "all" if gpus["count"] == -1 else gpus["count"]} == \
        made["deploy"]["resources"]["reservations"]["devices"][0]  # compose v2 prints count all as -1
    rendered_env = {k for k, v in made["environment"].items()}
    assert {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "PYTHONUNBUFFERED"} <= \
        set(hand["environment"]) & rendered_env
    merged = json.loads(compose_config("node.yaml", "infiniband.yaml", env=HAND_ENV).stdout)["services"]["node"]
    ib = yaml.safe_load(compose.render(make_plan(ClusterConfig.model_validate(
        {"hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:1", "container": {"infiniband": "on"},
         "job": {"nproc_per_node": 8}})))[1].text)["services"]["node"]
    assert set(ib["cap_add"]) <= set(merged["cap_add"]) and merged["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    assert [d["source"] if isinstance(d, dict) else d.split(":")[0] for d in merged["devices"]] == ib["devices"]


def test_compose_with_probed_facts_carries_each_hosts_own_values():
    """`render --probe`: the plan resolved with what each host said, as `up` resolves it."""
    from dockerlaunch.job.facts import HostFacts
    from dockerlaunch.job.plan import resolve

    plan = plan_of(container__infiniband="auto", container__gpus="all")
    facts = {0: HostFacts(interface="ens1", gpu_count=8, infiniband=True, ib_hca="mlx5_0:1", master_addr="10.0.0.1",
                          selinux=True),
             1: HostFacts(interface="ens7", gpu_count=4, infiniband=False, ib_hca="", selinux=False)}
    files = compose.render(resolve(plan, facts, run_id="render"))
    node0, node1 = (yaml.safe_load(f.text)["services"]["node"] for f in files)
    assert node0["environment"]["NCCL_SOCKET_IFNAME"] == "ens1" and node1["environment"]["GLOO_SOCKET_IFNAME"] == "ens7"
    assert node0["environment"]["NPROC_PER_NODE"] == "8" and node1["environment"]["NPROC_PER_NODE"] == "4"
    assert node0["environment"]["NCCL_IB_HCA"] == "mlx5_0:1" and "/dev/infiniband" in node0["devices"]
    assert "devices" not in node1 and "note:" not in files[0].text + files[1].text
    # only the host whose engine labels containers (SELinux) gets its labels off
    assert node0["security_opt"] == ["label=disable"] and "security_opt" not in node1


@pytest.mark.parametrize("mode", ["auto", "disable", "keep"])
def test_container_selinux_is_carried_by_every_target(mode):
    """auto, where a render cannot ask the engines: what auto does on an engine that labels containers, which
    changes nothing on one that does not (compose and Docker's label=disable, a pod's seLinuxOptions type spc_t);
    disable the same; keep nothing. pyxis/enroot runs containers unlabelled (no --security-opt to give)."""
    plan = plan_of(container__selinux=mode)
    carried = mode != "keep"
    for text in rendered("compose", plan).values():
        service = yaml.safe_load(text)["services"]["node"]
        assert (service.get("security_opt") == ["label=disable"]) is carried
        assert ("note: security_opt label=disable (container.selinux auto)" in text) is (mode == "auto")
    for target in ("k8s", "jobset"):
        [text] = rendered(target, plan).values()
        assert ("seLinuxOptions:\n" in text and "type: spc_t" in text) is carried, target
        assert (f"# seLinuxOptions type spc_t (container.selinux {mode}" in text) is carried
    files = rendered("slurm", plan)
    assert ("--security-opt label=disable" in files["sft-qwen.docker.sbatch"]) is carried
    assert "security" not in files["sft-qwen.pyxis.sbatch"] and "label" not in files["sft-qwen.pyxis.sbatch"]


@pytest.mark.parametrize("flag, value, words", [
    ("--namespace", "Team_A", "--namespace"), ("--rdma-resource", "rdma shared", "--rdma-resource"),
])
def test_kubernetes_options_are_checked(cli, flag, value, words):
    one_line_error(cli("render", "--to", "k8s", "--nodes", "1", "--image", "i", "--infiniband", "off",
                       "--nproc-per-node", "1", flag, value, "--", "x"), words)


NASTY = "it's \"quoted\" $HOME `id` $(id) ; rm -rf / \\ back\\slash\nnew line\ttab"
# the templates' own markers as values: filled in one pass, never scanned again (they once became the command)
MARKERS = "@@COMMAND@@ @@IMAGE@@ @@JOB@@ @@DOCKER_RUN@@ @@EXPORTS@@"
HOSTILE = [NASTY, MARKERS, "@@CONTAINER_NAME@@"]


@pytest.mark.parametrize("NASTY", HOSTILE)
def test_slurm_node_script_passes_hostile_values_byte_exact(tmp_path, NASTY):
    """The node's part of the sbatch script, run by bash with a stand-in `docker` that records its argv: every
    value arrives as written (quotes, $(), backquotes, newlines, template markers), and nothing of it ran."""
    text = rendered("slurm", plan_of(container__env={"NASTY": NASTY}, container__infiniband="auto",
                                     job__command=["python", "-c", NASTY]))["sft-qwen.docker.sbatch"]
    node = text.split("<<'NODE_SCRIPT' || true\n", 1)[1].split("\nNODE_SCRIPT\n", 1)[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv"
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = run ] && printf "%s\\0" "$@" > {record}\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_NODEID": "1", "SLURM_JOB_ID": "7",
           "MASTER_ADDR": "127.0.0.1", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", "-c", node], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv[argv.index("--name") + 1] == "sft-qwen-7-1"
    assert f"NASTY={NASTY}" in argv and argv[-3:] == ["python", "-c", NASTY]
    assert "NODE_RANK" in argv and "MASTER_ADDR" in argv  # passed through from the task's environment
    assert not (tmp_path / "rf").exists() and "uid=" not in r.stdout


def test_a_value_that_would_end_the_node_script_is_refused():
    with pytest.raises(Unsupported, match="NODE_SCRIPT"):
        rendered("slurm", plan_of(container__env={"X": "a\nNODE_SCRIPT\nreboot"}))


@pytest.mark.parametrize("NASTY", HOSTILE)
def test_pyxis_script_passes_hostile_values_byte_exact(tmp_path, NASTY):
    """The whole pyxis script under bash, with stand-ins for scontrol and srun: srun gets the command and the
    environment as written."""
    text = rendered("slurm", plan_of(container__env={"NASTY": NASTY}, job__command=["python", "-c", NASTY]))[
        "sft-qwen.pyxis.sbatch"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # the first node, then (later, as a real scontrol of a large allocation) the rest: a reader that stops after
    # the first line makes that write a SIGPIPE, which `set -o pipefail` turns into the script's failure (141)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho gpu07\nsleep 0.3\nseq -f gpu%02g 8 300\n")
    (bin_dir / "srun").write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {tmp_path}/argv\n'
                                  f'printf "%s" "$NASTY" > {tmp_path}/nasty\nprintf "%s" "$MASTER_ADDR" > '
                                  f'{tmp_path}/master\n')
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    r = subprocess.run(["bash", str(script)], env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "x"},
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert argv[-3:] == ["python", "-c", NASTY] and "--container-image=registry.local#train:1" in argv
    assert (tmp_path / "nasty").read_text() == NASTY and (tmp_path / "master").read_text() == "gpu07"


# what Docker's --env-file (and so `up`) makes of each line: the value after the first `=`, byte for byte
ENV_FILE_VALUES = {"DL_DOLLAR": "$HOME and ${HOME} and $(id) and `id`", "DL_SEMI": "a; touch pwned; b",
                   "DL_QUOTES": "'single' \"double\" \\back\\slash", "DL_SPACES": "  lead and trail  ",
                   "DL_EQ": "k=v=w", "DL_EMPTY": ""}


def test_pyxis_reads_env_files_literally_as_docker_does(tmp_path):
    """A secret file's values reach srun's environment exactly as Docker's --env-file would give them to `up`'s
    containers: `$`, backquotes, `;` and quotes are data, never run or expanded (issue 42, finding 7)."""
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# a comment\n\n" + "".join(f"{k}={v}\n" for k, v in ENV_FILE_VALUES.items())
                        + "DL_FROM_ENV\n  DL_INDENTED=x\nDL_CRLF=windows\r\n")
    text = rendered("slurm", plan_of(container__env_files=[str(env_file)], job__command=["python", "x.py"]))[
        "sft-qwen.pyxis.sbatch"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho gpu07\n")
    (bin_dir / "srun").write_text(f"#!/bin/sh\nenv -0 > {tmp_path}/env\n")
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "x", "HOME": "/home/x",
                            "DL_FROM_ENV": "from the environment"})
    assert r.returncode == 0, r.stderr
    got = dict(kv.split("=", 1) for kv in (tmp_path / "env").read_text().split("\0") if "=" in kv)
    for k, v in ENV_FILE_VALUES.items():
        assert got.get(k) == v, (k, got.get(k))
    assert got["DL_FROM_ENV"] == "from the environment" and got["DL_INDENTED"] == "x" and got["DL_CRLF"] == "windows"
    assert not (tmp_path / "pwned").exists()


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' variable expansion as its documentation states it (Define Dependent Environment Variables;
    container command and args): `$(VAR)` becomes VAR's value where VAR is defined, else stays as written; `$$`
    becomes `$` (so `$$(VAR)` gives `$(VAR)`); a `$` before anything else stays with that character."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, text[i:end + 1]))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_k8s_expand_follows_the_documented_cases():
    env = {"VAR": "v"}
    assert k8s_expand("$(VAR)", env) == "v" and k8s_expand("$$(VAR)", env) == "$(VAR)"
    assert k8s_expand("$(UNDEFINED)", env) == "$(UNDEFINED)" and k8s_expand("a$$b", env) == "a$b"
    assert k8s_expand("$HOME", env) == "$HOME" and k8s_expand("$(VAR", env) == "$(VAR"


DOLLARS = ["x$$y$(HOME)z", "$(NNODES)", "$$(NODE_RANK)", "cost $5 $", NASTY]


@pytest.mark.parametrize("target", ["k8s", "jobset"])
def test_k8s_env_and_args_reach_the_pod_byte_exact(target):
    """What the pod sees after Kubernetes' expansion is what `up` passes: env values (expanded against the env
    defined before them) and args (against the whole env)."""
    plan = plan_of(container__env={f"Q{i}": v for i, v in enumerate(DOLLARS)},
                   job__command=["python", "-c", *DOLLARS])
    pod = next(d for d in k8s_docs(target, plan) if d["kind"] in ("Job", "JobSet"))
    spec = pod["spec"]["replicatedJobs"][0]["template"]["spec"] if target == "jobset" else pod["spec"]
    container = spec["template"]["spec"]["containers"][0]
    seen: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            seen[e["name"]] = k8s_expand(e["value"], seen)
    assert [seen[f"Q{i}"] for i in range(len(DOLLARS))] == DOLLARS
    assert [k8s_expand(a, seen) for a in container["args"]] == ["python", "-c", *DOLLARS]


@pytest.mark.parametrize("ref, enroot", [
    ("reg.example.com/team/train:1", "reg.example.com#team/train:1"),
    ("reg.example.com:5000/team/train:1", "reg.example.com:5000#team/train:1"),
    ("localhost:5000/train", "localhost:5000#train"),
    ("localhost/train:1", "localhost#train:1"),
    ("nvcr.io/nvidia/pytorch@sha256:" + "a" * 64, "nvcr.io#nvidia/pytorch@sha256:" + "a" * 64),
    ("ubuntu:22.04", "ubuntu:22.04"),  # Docker Hub: enroot's default registry
    ("library/ubuntu", "library/ubuntu"),
    ("modelscope/ms-swift:v4", "modelscope/ms-swift:v4"),
    ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3"),  # already enroot's form
    ("dockerd://train:1", "dockerd://train:1"),
    ("/shared/images/train.sqsh", "/shared/images/train.sqsh"),
])
def test_pyxis_gets_registry_images_in_enroots_form(ref, enroot):
    assert slurm.enroot_image(ref) == enroot
    text = rendered("slurm", plan_of(image=ref))["sft-qwen.pyxis.sbatch"]
    assert f"--container-image={enroot} " in text or f"--container-image='{enroot}' " in text


# ---------------------------------------------------------------- a new target: a folder and one line in TARGETS

TOY = '''"""A toy target: a plain shell script per host that runs the container (a test adds it, then it is gone)."""

import shlex

from dockerlaunch.backends.renderers import Flag

FLAGS = (Flag("shell", "script: the shell the scripts start with.", metavar="PATH"),)


def options(target, values):
    return values.get("shell") or "/bin/sh"


def render(plan, options=None):
    from dockerlaunch.backends import RenderedFile
    from dockerlaunch.backends.refusals import common_refusals
    from dockerlaunch.backends import refuse_all

    refuse_all(common_refusals(plan, "script"))
    return [RenderedFile(f"node-{hp.rank}.sh", f"#!{options}\\n# {hp.address}\\nexec docker run --rm "
                         f"{shlex.quote(plan.image)} {shlex.join(hp.container.command)}\\n", executable=True)
            for hp in plan.hosts]
'''


def test_a_target_is_a_folder_and_one_line_in_targets(tmp_path):
    """Added as a real package beside the others plus one line in TARGETS (in a copy of the code), the toy target
    is listed by `render --help`, renders through the CLI with its own flag, and its flag is refused elsewhere."""

    src = Path(__file__).resolve().parents[3] / "dockerlaunch"
    copy = tmp_path / "code"
    shutil.copytree(src, copy / "dockerlaunch", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "dockerlaunch" / "backends" / "script").mkdir()
    (copy / "dockerlaunch" / "backends" / "script" / "__init__.py").write_text(TOY)
    listing = copy / "dockerlaunch" / "backends" / "renderers.py"
    last = [line for line in listing.read_text().splitlines() if line.startswith("    Target(")][-1]
    listing.write_text(listing.read_text().replace(
        last + "\n", last + '\n    Target("script", "dockerlaunch.backends.script", "a shell script per host", '
        'per_host=True),\n'))
    env = {**os.environ, "PYTHONPATH": str(copy)}

    def cli(*args):
        return dl(*args, env=env, cwd=tmp_path, timeout=120)

    helped = cli("render", "--help")
    words = " ".join(helped.stdout.split())  # the targets' line is wrapped at the terminal's width
    assert helped.returncode == 0 and "script: a shell script per host" in words, helped.stdout
    assert "--shell PATH" in helped.stdout
    job = ["--hosts", "a,b", "--image", "registry.local/t:1", "--infiniband", "off"]
    r = cli("render", "--to", "script", *job, "--shell", "/bin/bash", "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    assert "# ---- node-1.sh" in r.stdout and "#!/bin/bash" in r.stdout
    assert "exec docker run --rm registry.local/t:1 python train.py" in r.stdout
    wrong = cli("render", "--to", "slurm", *job, "--shell", "/bin/bash", "--", "python", "train.py")
    assert wrong.returncode == 2 and wrong.stderr.strip() == "error: render --to slurm: --shell is for script"
    # the real package knows nothing of it
    assert "script" not in renderers.names()
    assert not (src / "backends" / "script").exists()
