#!/bin/sh
# One host of a star push: SSH stdin (a `docker save <id>` tar, maybe zstd) -> docker load -> check the
# Image ID -> only then set the tag. A broken stream never moves the tag.
# With KEY, the stream is also staged (uncompressed) in $HOME/.cache/dockerlaunch/push/KEY.tar as it arrives:
# a push cut off (the link, the launcher killed) leaves its prefix there, and the next push of the same stream
# sends only the rest (OFFSET: the bytes it found staged and checked); docker load reads the staged prefix,
# then the new bytes. The staged file goes once the image is tagged; staged files older than 7 days go too.
# Whether to stage at all (disk space) is the launcher's choice (push.stage_choice).
# usage: load.sh IMAGE_ID REF|- zstd|none [KEY OFFSET]
set -u
image_id=$1 ref=$2 compress=$3 key=${4:-} offset=${5:-0}
dec() { if [ "$compress" = zstd ]; then zstd -dc; else cat; fi; }
staged=
if [ -n "$key" ]; then
  dir=$HOME/.cache/dockerlaunch/push
  (umask 077 && mkdir -p "$dir") || exit 8
  if [ -L "$dir" ] || [ "$(stat -c %u "$dir")" != "$(id -u)" ]; then echo "$dir is not this user's own folder" >&2; exit 8; fi
  chmod 700 "$dir" || exit 8
  # stages older than 7 days go (a stage being written is younger); lock files never do: one may be held
  find "$dir" -maxdepth 1 -name '*.tar' -mtime +7 -exec rm -f {} + 2>/dev/null
  # one load of a stream at a time: a cut push's host side may still be loading when the next push comes;
  # without flock there is no lock, so no staging (the launcher does not ask for it then)
  command -v flock >/dev/null 2>&1 || { echo "no flock on this host: a staged push needs it" >&2; exit 8; }
  exec 9>>"$dir/$key.lock" || exit 8
  flock -w 900 9 || { echo "another push of this image to this host is still loading" >&2; exit 8; }
  staged=$dir/$key.tar
  if [ "$offset" = 0 ]; then
    rm -f "$staged" && (umask 077 && : > "$staged") || exit 8
  elif [ -L "$staged" ] || [ "$(stat -c %s "$staged" 2>/dev/null || echo 0)" -lt "$offset" ]; then
    echo "the staged part of this push is gone: push again" >&2; exit 8
  else
    truncate -s "$offset" "$staged" || exit 8
  fi
  out=$({ cat "$staged"; dec | tee -a "$staged"; } | docker load 2>&1)
else
  out=$(dec | docker load 2>&1)
fi
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
[ "$ref" = - ] || docker tag "$image_id" "$ref" || exit 5  # -: a bundle tags once all its images are checked
[ -z "$staged" ] || rm -f "$staged"
echo "ok $got"
