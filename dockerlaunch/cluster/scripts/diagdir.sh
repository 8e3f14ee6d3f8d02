#!/bin/sh
# Empty a job's diagnostics folder (NCCL logs, flight-recorder dumps and pipes) before a start. The shared parent
# is sticky and world-writable like /tmp, so jobs of other logins can have theirs beside it.
# usage: diagdir.sh ROOT JOB MODE SUBDIR...
root=$1 job=$2 mode=$3
shift 3
if [ ! -d "$root" ]; then
  mkdir -p "$root" && chmod 1777 "$root" 2>/dev/null
fi
mkdir -p "$root/$job" || exit 1
for s in "$@"; do
  rm -rf "${root:?}/$job/$s" || exit 1
  # -p: `local` hosts of one job share this folder; chmod: the mode applies to an existing folder too
  mkdir -p "$root/$job/$s" && chmod "$mode" "$root/$job/$s" || exit 1
done
