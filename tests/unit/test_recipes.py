"""docs/RECIPES.md cannot drift from the code: every recipe's config is loaded by the real config loader and
planned for real (with the facts a 2 x 8-GPU InfiniBand host reports), and the flags that make multi-node training
work are checked in the exact `docker run` argv `up` would run."""

import re
from pathlib import Path

import pytest
import yaml

from dockerlaunch.backends.docker.doctor.judge import CACHE_ENV, _judge_caches
from dockerlaunch.backends.docker.doctor.report import PASS, Report
from dockerlaunch.docker_run import run_argv
from dockerlaunch.gpu.access import HostGpuAccess
from dockerlaunch.images.stacks import load_matrix
from dockerlaunch.job.load import validate_config
from dockerlaunch.job.plan import OFFLINE_ENV, HostFacts, make_plan

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "RECIPES.md"


def recipes() -> list[tuple[str, str]]:
    text = RECIPES.read_text()
    out = []
    for section in re.split(r"^## Recipe: ", text, flags=re.M)[1:]:
        name = section.splitlines()[0].strip()
        block = re.search(r"^```yaml\n(.*?)^```", section, flags=re.M | re.S)
        assert block, f"recipe {name}: no ```yaml block"
        out.append((name, block.group(1)))
    return out


def test_the_recipes_are_there():
    names = [n for n, _ in recipes()]
    assert len(names) >= 5, names
    assert any(yaml.safe_load(body)["job"].get("offline") for _, body in recipes())
    for wanted in ("megatron sft", "megatron rlhf", "swift sft", "pretrain_gpt.py"):
        assert any(wanted in body for _, body in recipes()), wanted


def flags(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("name,body", recipes(), ids=[n for n, _ in recipes()])
def test_recipe_plans_the_flags_multi_node_training_needs(name, body):
    config = validate_config(yaml.safe_load(body), f"RECIPES.md {name}")
    n = len(config.hosts)
    assert n >= 2
    facts = {r: HostFacts(interface="ib0", gpu_count=8, infiniband=True, ib_hca="mlx5_0:1,mlx5_1:1",
                          master_addr="10.0.0.1" if r == 0 else None,
                          access=HostGpuAccess(nvidia_runtime=True, device_nodes=("/dev/nvidiactl",)), selinux=False)
             for r in range(n)}
    plan = make_plan(config, facts=facts, run_id="abc123")
    for hp in plan.hosts:
        argv = run_argv(hp.container)  # no placeholder left: this is what `up` runs
        assert flags(argv, "--network") == ["host"] and flags(argv, "--ipc") == ["host"], name
        assert "--publish" not in argv and "-p" not in argv, name
        assert "/dev/infiniband" in flags(argv, "--device") and "IPC_LOCK" in flags(argv, "--cap-add"), name
        assert "memlock=-1:-1" in flags(argv, "--ulimit"), name
        assert flags(argv, "--gpus") == ["all"] and "SYS_PTRACE" in flags(argv, "--cap-add"), name
        env = dict(e.split("=", 1) for e in flags(argv, "--env"))
        assert env["NNODES"] == str(n) and env["NODE_RANK"] == str(hp.rank) and env["MASTER_ADDR"] == "10.0.0.1"
        assert env["NPROC_PER_NODE"] == "8" and env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"
        assert env["NCCL_SOCKET_IFNAME"] == "ib0" and "--privileged" not in argv
    command = " ".join(plan.hosts[0].container.command)
    if "torchrun" in command:
        for var in ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT"):
            assert f"${var}" in command, (name, var)
    if config.job.offline:  # air-gapped: the hubs' switches in every container, and no advice left to follow
        for hp in plan.hosts:
            env = dict(e.split("=", 1) for e in flags(run_argv(hp.container), "--env"))
            assert all(env[k] == "1" for k in OFFLINE_ENV), name
        assert plan.advice == [], plan.advice
        assert not re.search(r"--(model|dataset) [A-Za-z]", command), "air-gapped: local paths, not hub ids"
    # a download cache off shared storage would be fetched by every host
    report = Report()
    _judge_caches(report, config, "h0")
    assert any(k in config.container.env for k in CACHE_ENV), name
    assert report.checks and all(c.verdict == PASS for c in report.checks), [c.detail for c in report.checks]


@pytest.mark.parametrize("name,body", recipes(), ids=[n for n, _ in recipes()])
def test_recipe_names_a_pinned_stack_image(name, body):
    tags = {s.tag for s in load_matrix().stacks.values()}
    assert yaml.safe_load(body)["image"] in tags, name
