#!/bin/sh
# What a host has for a push, in one round trip: where its tag points, whether it has the Image ID,
# zstd, the tools a chain link needs (OpenBSD nc -N, mkfifo), and (for thin pushes) every layer it has.
# usage: inspect.sh REF IMAGE_ID 1|0   (1: list RootFS layers of every image)
set -u
ref=$1 image_id=$2 layers=$3
if ! err=$(docker version --format '{{.Server.Version}}' 2>&1); then
  echo "docker is not usable: $(printf '%s\n' "$err" | tail -n 1)" >&2
  exit 3
fi
echo "tag=$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)"
echo "has=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null || true)"
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
    docker image inspect --format 'layers={{json .RootFS.Layers}}' $ids || exit 3
  fi
fi
