#!/bin/sh
# Runs inside a short-lived probe container with the job's own flags: what the job will see there.
# $1: 1 to ask the model hubs (the Python program in $3, its wait in seconds $4), $2: 1 to look at InfiniBand.
# Every value through kv (the key=value contract, dockerlaunch/keyvalue.py). Needs only sh (dash, bash, busybox) and df.
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
if [ "$1" = 1 ]; then
  if command -v python3 >/dev/null 2>&1; then python3 -c "$3" "$4" 2>/dev/null; else echo hub=nopython; fi
fi
if [ "$2" = 1 ]; then
  # shellcheck disable=SC2012  # device names (uverbs0, rdma_cm) are plain words
  kv ibdev "$(ls /dev/infiniband 2>/dev/null | tr "\n" " ")"
  libs=$( { ldconfig -p 2>/dev/null; ls /usr/lib*/libibverbs* /usr/lib*/*/libibverbs* /usr/lib*/*/libibverbs/* 2>/dev/null; } )
  kv ibverbs "$(printf "%s\n" "$libs" | grep -c "libibverbs\.so")"
  kv ibprovider "$(printf "%s\n" "$libs" | grep -c -E "lib(mlx[45]|efa|bnxt_re|irdma|hns|qedr)[-.]")"
fi
# the tools doctor's reachability check can use here (reach.sh); without them it asks from the host instead
tools=
for t in nc python3 bash timeout; do command -v "$t" >/dev/null 2>&1 && tools="$tools $t"; done
kv tools "${tools# }"
kvl shm "$(df -Pk /dev/shm 2>&1)"
# shellcheck disable=SC3045  # not POSIX, but dash, bash and busybox sh all have them: the container's own limits
kv nofile "$(ulimit -n)"
# shellcheck disable=SC3045
kv memlock "$(ulimit -l)"
