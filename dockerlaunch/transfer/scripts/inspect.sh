#!/bin/sh
# What a host has for a push, in one round trip: its image store, where its tag points, which of the
# image's possible IDs it has, zstd, the tools a chain link needs (OpenBSD nc -N, mkfifo), and (for thin
# pushes) every layer it has.
# usage: inspect.sh REF 1|0 IMAGE_ID...  (1: list RootFS layers of every image; the IDs: config digest,
# manifest digest -- the classic store names an image by the first, containerd's store by the second)
# Every value through kv/kvl (the key=value contract, dockerlaunch/keyvalue.py).
set -u
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
ref=$1 layers=$2
shift 2
if ! err=$(docker info --format 'store={{json .DriverStatus}}' 2>&1); then
  line "docker is not usable: $(printf '%s\n' "$err" | tail -n 1)" >&2
  exit 3
fi
case $err in *io.containerd.snapshotter*) echo store=containerd ;; *) echo store=graphdriver ;; esac
kv tag "$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)"
for id in "$@"; do
  kv has "$(docker image inspect --format '{{.Id}}' "$id" 2>/dev/null || true)"
done
if command -v zstd >/dev/null 2>&1; then echo zstd=1; else echo zstd=0; fi
if command -v mkfifo >/dev/null 2>&1 && nc -h 2>&1 | grep -qE '^[[:space:]]*-N[[:space:]]'; then
  echo relay=1
else
  echo relay=0
fi
if [ "$layers" = 1 ]; then
  ids=$(docker image ls -aq) || exit 3
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086 # one argument per image ID
    out=$(docker image inspect --format '{{json .RootFS.Layers}}' $ids) || exit 3
    kvl layers "$out"
  fi
fi
