"""The users' own workflow on the sim cluster: ms-swift fine-tuning across 2 hosts, air-gapped.

The pinned `cpu` stack (built offline by the `cpu_stack` fixture) is pushed to the nodes over SSH; a tiny Qwen2
model, tokenizer and datasets made inside that image (no hub) go on the cluster's shared storage (/shared, one volume
in every node, as NFS would be); `up` runs `swift sft` (LoRA) on both hosts as one world of 2, `swift infer` of the
checkpoint on one host, and a 2-host DPO. The sim config has `job.offline: true` and the commands carry
`--check_model false`: no rank may wait on a hub (no retry line in any log). And a torchrun job of the same image that
loses a rank mid-run is restarted by `up` and resumes from its last checkpoint on /shared.
"""

import ast
import re
import secrets
from pathlib import Path

import pytest

from tests.integration.helpers import dl, variant

pytestmark = pytest.mark.integration
MAKER = Path(__file__).parent / "data" / "swift" / "make_tiny_qwen2.py"
# a hub's retries (requests, huggingface_hub, modelscope); not torch.distributed's DistNetworkError, which a
# non-master torchrun agent may log when the master's store goes away first at the end of a job that succeeded
HUB_RETRY = re.compile(r"listing failed|retry in \d+s|(?<!Dist)NetworkError", re.I)


def swift_args(d: str, dataset: str, out: str) -> list[str]:
    return ["--model", f"{d}/model", "--model_type", "qwen2", "--template", "qwen", "--dataset", f"{d}/{dataset}",
            "--tuner_type", "lora", "--max_steps", "4", "--per_device_train_batch_size", "2", "--save_steps", "4",
            "--logging_steps", "1", "--dataloader_num_workers", "0", "--report_to", "none", "--max_length", "128",
            "--output_dir", f"{d}/{out}", "--add_version", "false", "--check_model", "false"]


def rank_logs(log_dir: Path) -> dict[int, str]:
    """rank -> its log, from `up --log-dir` (one run folder per `up`)."""
    logs = {}
    for f in log_dir.rglob("rank*.log"):
        logs[int(re.match(r"rank(\d+)-", f.name).group(1))] = f.read_text(errors="replace")
    return logs


@pytest.fixture(scope="module")
def swift_cluster(engine, sim_cluster, cpu_stack):
    """The cpu stack pushed to both nodes, and a tiny model + datasets under /shared/<folder> (removed after)."""
    name, config_path, layout = sim_cluster
    r = dl("push", cpu_stack.tag, "--config", str(config_path), timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for n in layout:  # every host holds the image now (asked over SSH, as a user would)
        code, out = engine.containers.get(n.name).exec_run(["docker", "image", "inspect", cpu_stack.tag])
        assert code == 0, out[-500:]

    folder = f"/shared/swift-{secrets.token_hex(3)}"
    volume = f"{name}-shared"
    made = engine.containers.run(
        cpu_stack.tag, ["sh", "-c", 'python /maker/make_tiny_qwen2.py "$1" && cp /maker/resume_train.py "$1/"', "-",
                        folder], remove=True, network_mode="none",
        volumes={volume: {"bind": "/shared", "mode": "rw"}, str(MAKER.parent): {"bind": "/maker", "mode": "ro"}},
    ).decode()
    assert "tiny qwen2:" in made, made
    yield config_path, layout, folder, cpu_stack.tag
    engine.containers.run(cpu_stack.tag, ["rm", "-rf", folder], remove=True, network_mode="none",
                          volumes={volume: {"bind": "/shared", "mode": "rw"}})
    for n in layout:  # the nodes' disk back as it was: a 1.2 GB image on each, beside the other tests' pushes
        engine.containers.get(n.name).exec_run(["docker", "image", "rm", "-f", cpu_stack.tag])


def test_swift_sft_on_two_hosts_then_infer_on_one(swift_cluster, tmp_path, job_containers):
    config_path, layout, d, image = swift_cluster
    job = f"sft{secrets.token_hex(3)}"
    try:
        r = dl("up", "-v", "--config", str(config_path), "--image", image, "--name", job, "--log-dir",  # -v: the table
               str(tmp_path / "sft"), "--", "swift", "sft", *swift_args(d, "train.jsonl", "out"), timeout=900)
        logs = rank_logs(tmp_path / "sft")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert sorted(logs) == [0, 1], r.stdout[-2000:]
        # ms-swift read NNODES/NODE_RANK/MASTER_ADDR/NPROC_PER_NODE and ran torchrun: one world of 2, a rank per host
        for rank, text in logs.items():
            assert re.search(rf"rank: {rank}, local_rank: 0, world_size: 2, local_world_size: 1", text), text[-3000:]
        assert f"last_model_checkpoint: {d}/out/checkpoint-4" in logs[0], logs[0][-3000:]
        assert "'global_step/max_steps': '4/4'" in logs[0]
        for rank, text in logs.items():  # offline: nothing waited on a hub
            assert not HUB_RETRY.search(text), (rank, HUB_RETRY.search(text).group(0))
        assert re.search(r"hubs\s+PASS\s+job\.offline", r.stdout), r.stdout[:3000]  # the preflight said so
        assert "--check_model false to the swift" not in r.stdout  # the command already has it: no advice
        assert job_containers(job) == []

        # the checkpoint, saved on shared storage by rank 0, loads and answers on one host
        infer = dl("up", "--config", str(config_path), "--image", image, "--hosts", layout[1].ip,
                   "--name", f"{job}-infer",
                   "--log-dir", str(tmp_path / "infer"), "--",
                   "swift", "infer", "--adapters", f"{d}/out/checkpoint-4", "--infer_backend", "transformers",
                   "--max_new_tokens", "4", "--temperature", "0", "--val_dataset", f"{d}/train.jsonl",
                   "--result_path", f"{d}/infer.jsonl", timeout=600)
        text = rank_logs(tmp_path / "infer")[0]
        assert infer.returncode == 0, infer.stdout[-3000:]
        assert f"The inference results have been saved to result_path: `{d}/infer.jsonl`" in text, text[-2000:]
        m = re.search(r"\{'num_prompt_tokens': \d+, 'num_generated_tokens': (\d+), 'num_samples': (\d+)", text)
        assert m and int(m.group(2)) == 64 and int(m.group(1)) > 0, text[-2000:]
        assert not HUB_RETRY.search(text)
    finally:
        dl("down", "--config", str(config_path), "--name", job)
        dl("down", "--config", str(config_path), "--hosts", layout[1].ip, "--name", f"{job}-infer")


def test_swift_dpo_on_two_hosts(swift_cluster, tmp_path, job_containers):
    config_path, layout, d, image = swift_cluster
    job = f"dpo{secrets.token_hex(3)}"
    try:
        r = dl("up", "--config", str(config_path), "--image", image, "--name", job, "--log-dir", str(tmp_path),
               "--skip-preflight", "--", "swift", "rlhf", "--rlhf_type", "dpo", *swift_args(d, "dpo.jsonl", "dpo"),
               timeout=900)
        logs = rank_logs(tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        for rank, text in logs.items():
            assert re.search(rf"rank: {rank}, local_rank: 0, world_size: 2", text), text[-3000:]
            assert not HUB_RETRY.search(text)
        steps = [ast.literal_eval(s) for s in re.findall(r"\{'loss': [^}]*\}", logs[0])]
        assert len(steps) == 4 and all("rewards/margins" in s for s in steps), logs[0][-3000:]
        assert f"last_model_checkpoint: {d}/dpo/checkpoint-4" in logs[0]
        assert job_containers(job) == []
    finally:
        dl("down", "--config", str(config_path), "--name", job)


def test_a_torchrun_job_that_loses_a_rank_restarts_and_resumes_from_its_checkpoint(swift_cluster, sim_cluster,
                                                                                   tmp_path, job_containers):
    """Issue 22 end to end: torch DDP (gloo) through torchrun on 2 hosts saves every 10 steps on /shared; in
    attempt 0 rank 1 dies at step 15; `up` tears both hosts down and starts attempt 1, which loads step 10 and
    ends at step 30 (not from step 1)."""
    config_path, layout, d, image = swift_cluster
    job, logs = f"resume{secrets.token_hex(3)}", tmp_path / "logs"
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 1})
    cmd = ('torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node 1 --master_addr "$MASTER_ADDR" '
           f'--master_port "$MASTER_PORT" {d}/resume_train.py {d}/ckpt-{job} 30 10 15')
    try:
        r = dl("up", "--skip-preflight", "--config", cfg, "--image", image, "--name", job, "--max-restarts", "2",
               "--log-dir", str(logs), "--", "sh", "-c", cmd, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert "attempt 0: rank failed: rank " in out and "attempt 1: succeeded" in out, out[-4000:]
        assert "attempt 2" not in out
        [run] = list(logs.iterdir())
        first, again = rank_logs(run / "attempt-0"), rank_logs(run / "attempt-1")
        assert "attempt 0 rank 1: dying at step 15" in first[1], first[1][-2000:]
        assert "attempt 0 rank 0: step 15 loss" in first[0] and "step 16 loss" not in first[0], first[0][-2000:]
        for rank, text in again.items():  # resumed from the save at step 10, ran to the end
            assert f"attempt 1 rank {rank}: starting at step 11" in text, text[-2000:]
            assert f"attempt 1 rank {rank}: step 30 loss" in text and f"rank {rank}: step 10 loss" not in text
        assert job_containers(job) == []
    finally:
        dl("down", "--config", cfg, "--name", job)
