"""A tiny data-parallel model (torch DDP over gloo) that saves every SAVE_EVERY steps on shared storage and, when
started again, resumes from the newest save -- the shape of a real trainer's --save/--load, without GPUs.
Rank 1 dies at step FAIL_AT in the first attempt only (DL_RESTART_COUNT=0), as a lost rank would.
usage: torchrun ... resume_train.py CKPT_DIR STEPS SAVE_EVERY FAIL_AT"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    ckpt, steps, every, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), os.environ.get("DL_RESTART_COUNT", "?")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    latest = os.path.join(ckpt, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            start = int(f.read())
        state = torch.load(os.path.join(ckpt, f"step{start}.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    print(f"attempt {attempt} rank {rank}: starting at step {start + 1}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(32, 8, generator=g)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"attempt {attempt} rank {rank}: step {step} loss {loss.item():.4f}", flush=True)
        if step % every == 0:
            if rank == 0:  # the write is whole or absent: a rename, then the pointer
                os.makedirs(ckpt, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{ckpt}/step{step}.tmp")
                os.replace(f"{ckpt}/step{step}.tmp", f"{ckpt}/step{step}.pt")
                with open(f"{ckpt}/latest.tmp", "w") as f:
                    f.write(str(step))
                os.replace(f"{ckpt}/latest.tmp", latest)
            dist.barrier()
        if step == fail_at and rank == 1 and attempt == "0":
            print(f"attempt {attempt} rank {rank}: dying at step {step}", flush=True)
            os._exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
