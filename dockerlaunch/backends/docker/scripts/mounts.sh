#!/bin/sh
# Which filesystem holds each `shared: true` mount source here: the source's real path, then the mount table of
# this login's mount namespace (the kernel's own words: doctor/observations.mount_identity reads them). Every value
# through kv/kvl (the key=value contract, dockerlaunch/keyvalue.py): a path may hold any byte.
# usage: mounts.sh SOURCE...   prints one real= per SOURCE, in order ("" where it does not resolve), then mountinfo=
set -u
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
for src in "$@"; do
  kv real "$(readlink -f -- "$src" 2>/dev/null || true)"
done
kvl mountinfo "$(cat /proc/self/mountinfo 2>/dev/null || true)"
