#!/bin/sh
# A fragment, not a program: load.sh and relay.sh include it where they say `. ./stage.sh` (transfer.script puts
# this text there). One stream's stage on this host: $HOME/.cache/dockerlaunch/push/KEY.tar, in this user's own
# 0700 folder, locked (fd 9) for as long as the including script runs, cut to OFFSET (the prefix the launcher
# checked against its own stream) or made empty. Sets $staged and $stage_dir (never $dir: the including
# script's own). Exits 8 when it cannot.
open_stage() {  # KEY OFFSET
  stage_dir=$HOME/.cache/dockerlaunch/push
  (umask 077 && mkdir -p "$stage_dir") || exit 8
  if [ -L "$stage_dir" ] || [ "$(stat -c %u "$stage_dir")" != "$(id -u)" ]; then echo "$stage_dir is not this user's own folder" >&2; exit 8; fi
  chmod 700 "$stage_dir" || exit 8
  # one load of a stream at a time: a cut push's host side may still be loading when the next push comes;
  # without flock there is no lock, so no staging (the launcher does not ask for it then)
  command -v flock >/dev/null 2>&1 || { echo "no flock on this host: a staged push needs it" >&2; exit 8; }
  # stages older than 7 days go, each only under its own lock (a load of it may still be reading it: then it
  # stays); lock files never do: one may be held
  find "$stage_dir" -maxdepth 1 -name '*.tar' -mtime +7 2>/dev/null | while IFS= read -r old; do
    flock -n "${old%.tar}.lock" rm -f "$old" 2>/dev/null
  done
  exec 9>>"$stage_dir/$1.lock" || exit 8
  flock -w 900 9 || { echo "another push of this image to this host is still loading" >&2; exit 8; }
  staged=$stage_dir/$1.tar
  if [ "$2" = 0 ]; then
    rm -f "$staged" && (umask 077 && : > "$staged") || exit 8
  elif [ -L "$staged" ] || [ "$(stat -c %s "$staged" 2>/dev/null || echo 0)" -lt "$2" ]; then
    echo "the staged part of this push is gone: push again" >&2; exit 8
  else
    truncate -s "$2" "$staged" || exit 8
  fi
}
