#!/bin/sh
# The lines of a job's NCCL INFO logs that say how NCCL moves data (parsed by diagnostics.transport), each
# file after a `==> PATH` line; bounded, since a big job's logs are long.
# usage: nccl_logs.sh DIAG_DIR [HOST_RANK]   (only that host's container's files: `local` hosts share a folder)
# Only files of the uid the nccl folder belongs to (the ranks'): a log another local user planted there would
# forge the transport verdict (dump's flight-recorder files are taken the same way).
rank=${2:-*}
owner=$(stat -c %u "$1/nccl" 2>/dev/null) || exit 0
# shellcheck disable=SC2086,SC2231 # $rank is digits or the glob `*`
for f in "$1"/nccl/nccl.$rank.*.log; do
  [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %u "$f")" = "$owner" ] || continue
  echo "==> $f"
  grep -E ' NCCL WARN | NCCL INFO (NET/|Using network|Channel [0-9]+(/[0-9]+)? : [0-9]|comm 0x|ncclCommInit|NCCL version|.*GPU Direct RDMA|.*libibverbs)' "$f" \
    | head -n 20000
done
exit 0
