"""all_reduce sweep, run by `dockerlaunch commtest` in the job's own image under torchrun (one process a GPU, or
one a host on CPU). Rank 0 prints one `DLCOMMTEST {json}` line per size; the launcher turns them into the table.
usage: commtest.py MIN_BYTES MAX_BYTES [ITERS]   (ITERS 0: chosen by size and backend)
"""

import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist


def emit(record: dict) -> None:
    os.write(1, ("DLCOMMTEST " + json.dumps(record) + "\n").encode())  # one write: no interleaving


def main() -> None:
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    iters_arg = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        emit({"kind": "header", "backend": backend, "world": world, "hosts": len(set(hosts)),
              "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None})

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    size = lo
    while size <= hi:
        count = max(size // 4, 1)
        buf = torch.ones(count, dtype=torch.float32, device=device)
        iters = iters_arg or (20 if cuda else max(2, min(20, (64 << 20) // max(size, 1))))
        for _ in range(2):  # warm-up: connections, algorithm choice
            dist.all_reduce(buf)
        # GPUs: the median of 5 timed batches, so one stall of the machine does not decide the figure
        batches = []
        for _ in range(5 if cuda else 1):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)  # values grow (inf at worst, same speed): correctness is checked below
            sync()
            batches.append((time.perf_counter() - t0) / iters)
        took = torch.tensor([statistics.median(batches)], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank is the collective's time
        check = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(check)
        wrong = torch.tensor([int((check != world).sum().item())], device=device)
        dist.all_reduce(wrong)
        if rank == 0:
            seconds = float(took.item())
            algbw = count * 4 / seconds / 1e9
            emit({"kind": "size", "bytes": count * 4, "count": count, "type": "float", "iters": iters,
                  "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world,
                  "wrong": int(wrong.item())})
        size *= 2
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
