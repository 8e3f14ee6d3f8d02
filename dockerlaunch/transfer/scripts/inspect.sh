#!/bin/sh
# What a host has for a push, in one round trip: its image store, where its tag points, which of the
# image's possible IDs it has, zstd, the tools a chain link needs (OpenBSD nc -N, mkfifo), and (for thin
# pushes) every layer it has.
# usage: inspect.sh REF 1|0 1|0 IMAGE_ID...  (first 1: list RootFS layers of every image; second 1: on
# containerd's store, list every image ID -- the launcher cannot name the image's ID there yet, and tells from
# the list once it can, without asking again; the IDs: config digest, manifest digest -- the classic store names
# an image by the first, containerd's store by the second)
# Every value through kv/kvl (the key=value contract, dockerlaunch/keyvalue.py).
set -u
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
ref=$1 layers=$2 all_ids=$3
shift 3
if ! err=$(docker info --format 'store={{json .DriverStatus}}' 2>&1); then
  line "docker is not usable: $(printf '%s\n' "$err" | tail -n 1)" >&2
  exit 3
fi
case $err in *io.containerd.snapshotter*) store=containerd ;; *) store=graphdriver ;; esac
echo "store=$store"
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
[ "$store" = containerd ] || all_ids=0
if [ "$layers" = 1 ] || [ "$all_ids" = 1 ]; then
  ids=$(docker image ls -aq) || exit 3
  if [ -n "$ids" ] && [ "$all_ids" = 1 ]; then
    # shellcheck disable=SC2086 # one argument per image ID
    out=$(docker image inspect --format '{{.Id}}' $ids) || exit 3
    kvl id "$out"
  fi
  if [ -n "$ids" ] && [ "$layers" = 1 ]; then
    # shellcheck disable=SC2086 # one argument per image ID
    out=$(docker image inspect --format '{{json .RootFS.Layers}}' $ids) || exit 3
    kvl layers "$out"
  fi
fi
