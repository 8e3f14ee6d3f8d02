#!/bin/sh
# The lines of a job's NCCL INFO logs that say how NCCL moves data (parsed by diagnostics.transport), each
# file after a `==> PATH` line; bounded, since a big job's logs are long.
# usage: nccl_logs.sh DIAG_DIR
for f in "$1"/nccl/nccl.*.log; do
  [ -f "$f" ] || continue
  echo "==> $f"
  grep -E ' NCCL WARN | NCCL INFO (NET/|Using network|Channel [0-9]+(/[0-9]+)? : [0-9]|comm 0x|ncclCommInit|NCCL version|.*GPU Direct RDMA|.*libibverbs)' "$f" \
    | head -n 20000
done
exit 0
