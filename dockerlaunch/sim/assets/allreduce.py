"""Demo job: each rank contributes rank+1; all_reduce(SUM) over gloo must give W(W+1)/2 on every rank."""

import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = world * (world + 1) // 2
    got = int(value.item())
    line = (
        f"rank {rank}/{world} on {socket.gethostname()} (NODE_RANK={os.environ.get('NODE_RANK')}, "
        f"local rank {os.environ.get('LOCAL_RANK')}): all_reduce sum={got} expected={expected} "
        f"{'OK' if got == expected else 'WRONG'}\n"
    )
    os.write(1, line.encode())  # one write: local ranks share stdout and must not interleave
    dist.barrier()
    dist.destroy_process_group()
    if got != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
