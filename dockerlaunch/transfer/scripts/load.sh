#!/bin/sh
# One host of a star push: SSH stdin (a `docker save <id>` tar, maybe zstd) -> docker load -> check the
# Image ID -> only then set the tag. A broken stream never moves the tag.
# usage: load.sh IMAGE_ID REF zstd|none
set -u
image_id=$1 ref=$2 compress=$3
if [ "$compress" = zstd ]; then out=$(zstd -dc | docker load 2>&1); else out=$(docker load 2>&1); fi
status=$?
if [ $status -ne 0 ]; then echo "load failed: $out" >&2; exit 3; fi
# containerd's store reports a layer it could not unpack (a thin stream whose layer it lacks) and exits 0:
# the image is there but cannot run. Remove it (it is untagged) and fail.
case $out in *"rror unpacking image"*|*"apply layer error"*)
  docker rmi "$image_id" >/dev/null 2>&1
  echo "load failed: $(printf '%s\n' "$out" | grep -i -m 1 -e 'unpacking' -e 'apply layer')" >&2; exit 3 ;;
esac
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { echo "after load, $image_id is missing: $out" >&2; exit 4; }
[ "$got" = "$image_id" ] || { echo "loaded $got, expected $image_id" >&2; exit 4; }
docker tag "$image_id" "$ref" || exit 5
echo "ok $got"
