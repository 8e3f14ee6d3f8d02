#!/bin/sh
# Runs inside a short-lived probe container with the job's own flags: what the job will see there.
# $1: 1 to ask the model hubs (the Python program in $3, its wait in seconds $4), $2: 1 to look at InfiniBand.
# memlock comes last: its value runs to the end of the output.
if [ "$1" = 1 ]; then
  if command -v python3 >/dev/null 2>&1; then python3 -c "$3" "$4" 2>/dev/null; else echo hub=nopython; fi
fi
if [ "$2" = 1 ]; then
  # shellcheck disable=SC2012  # device names (uverbs0, rdma_cm) are plain words
  echo "ibdev=$(ls /dev/infiniband 2>/dev/null | tr "\n" " ")"
  libs=$( { ldconfig -p 2>/dev/null; ls /usr/lib*/libibverbs* /usr/lib*/*/libibverbs* /usr/lib*/*/libibverbs/* 2>/dev/null; } )
  echo "ibverbs=$(printf "%s\n" "$libs" | grep -c "libibverbs\.so")"
  echo "ibprovider=$(printf "%s\n" "$libs" | grep -c -E "lib(mlx[45]|efa|bnxt_re|irdma|hns|qedr)[-.]")"
fi
df -Pk /dev/shm
# shellcheck disable=SC3045  # not POSIX, but dash, bash and busybox sh all have it: the container's own limit
echo "memlock=$(ulimit -l)"
