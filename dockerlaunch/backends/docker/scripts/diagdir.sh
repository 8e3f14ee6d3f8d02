#!/bin/sh
# Empty a job's diagnostics folder (NCCL logs, flight-recorder dumps and pipes) before a start. The shared parent
# is sticky and world-writable like /tmp, so jobs of other logins can have theirs beside it.
# usage: diagdir.sh ROOT JOB MODE SUBDIR...
root=$1 job=$2 mode=$3
shift 3
# POSIX sh has no `test -O`; the name is ours (no odd characters), so ls is safe here
# shellcheck disable=SC2012
owned() { [ "$(ls -ldn "$1" 2>/dev/null | awk '{print $3}')" = "$(id -u)" ]; }
if [ ! -d "$root" ]; then
  mkdir -p "$root" && chmod 1777 "$root" 2>/dev/null
fi
mkdir -p "$root/$job" || exit 1
# the parent is shared: a job folder someone else made (or a link they planted) is not ours to write into
if [ -L "$root/$job" ] || ! owned "$root/$job"; then
  echo "$root/$job belongs to another user" >&2
  exit 1
fi
for s in "$@"; do
  rm -rf "${root:?}/$job/$s" || exit 1
  # -p: `local` hosts of one job share this folder; chmod: the mode applies to an existing folder too
  mkdir -p "$root/$job/$s" && chmod "$mode" "$root/$job/$s" || exit 1
done
