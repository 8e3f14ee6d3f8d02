#!/bin/sh
# The lines of a job's NCCL INFO logs that say how NCCL moves data (parsed by diagnostics.transport), each
# file after a `==> PATH` line; bounded, since a big job's logs are long.
# usage: nccl_logs.sh DIAG_DIR [HOST_RANK]   (only that host's container's files: `local` hosts share a folder)
rank=${2:-*}
# shellcheck disable=SC2086,SC2231 # $rank is digits or the glob `*`
for f in "$1"/nccl/nccl.$rank.*.log; do
  [ -f "$f" ] || continue
  echo "==> $f"
  grep -E ' NCCL WARN | NCCL INFO (NET/|Using network|Channel [0-9]+(/[0-9]+)? : [0-9]|comm 0x|ncclCommInit|NCCL version|.*GPU Direct RDMA|.*libibverbs)' "$f" \
    | head -n 20000
done
exit 0
