#!/bin/sh
# One host of a star push: SSH stdin (a `docker save <id>` tar, maybe zstd) -> docker load -> check the
# Image ID -> only then set the tag. A broken stream never moves the tag.
# With KEY, the stream is also staged (as it travels: zstd stays zstd) in $HOME/.cache/dockerlaunch/push/KEY.tar as it arrives:
# a push cut off (the link, the launcher killed) leaves its prefix there, and the next push of the same stream
# sends only the rest (OFFSET: the bytes it found staged and checked); docker load reads the staged prefix,
# then the new bytes. The staged file goes once the image is tagged; staged files older than 7 days go too.
# Whether to stage at all (disk space) is the launcher's choice (staging.stage_choice).
# usage: load.sh IMAGE_ID REF|- zstd|none [KEY OFFSET]
set -u
image_id=$1 ref=$2 compress=$3 key=${4:-} offset=${5:-0}
dec() { if [ "$compress" = zstd ]; then zstd -dc; else cat; fi; }
staged=
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script): status lines that quote docker go out as one line each
# shellcheck source=/dev/null
. ./stage.sh  # included when shipped (shipped.script)
if [ -n "$key" ]; then
  open_stage "$key" "$offset"
  out=$({ cat "$staged"; tee -a "$staged"; } | dec | docker load 2>&1)
else
  out=$(dec | docker load 2>&1)
fi
status=$?
if [ $status -ne 0 ]; then line "load failed: $out" >&2; exit 3; fi
# containerd's store reports a layer it could not unpack (a thin stream whose layer it lacks) and exits 0:
# the image is there but cannot run. Remove it (it is untagged) and fail.
case $out in *"rror unpacking image"*|*"apply layer error"*)
  docker rmi "$image_id" >/dev/null 2>&1
  line "load failed: $(printf '%s\n' "$out" | grep -i -m 1 -e 'unpacking' -e 'apply layer')" >&2; exit 3 ;;
esac
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { line "after load, $image_id is missing: $out" >&2; exit 4; }
[ "$got" = "$image_id" ] || { line "loaded $got, expected $image_id" >&2; exit 4; }
[ "$ref" = - ] || docker tag "$image_id" "$ref" || exit 5  # -: a bundle tags once all its images are checked
[ -z "$staged" ] || rm -f "$staged"
echo "ok $got"
