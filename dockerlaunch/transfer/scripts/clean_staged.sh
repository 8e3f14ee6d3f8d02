#!/bin/sh
# `push --clean` on one host: remove the staged prefixes of cut pushes ($HOME/.cache/dockerlaunch/push), except
# one a push is loading now (its lock is held). Prints: removed FILES BYTES IN_USE
set -u
d=$HOME/.cache/dockerlaunch/push
if [ ! -d "$d" ] || [ -L "$d" ]; then echo "removed 0 0 0"; exit 0; fi
n=0 bytes=0 busy=0
for f in "$d"/*.tar; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  k=${f%.tar} s=$(stat -c %s "$f")
  # the stage goes under its lock; the lock file itself never does: a load may have it open and be waiting, and
  # a new file of the same name would let the next load in beside it
  if [ -f "$k.lock" ] && command -v flock >/dev/null 2>&1; then
    flock -n "$k.lock" rm -f "$f" || { busy=$((busy + 1)); continue; }
  else
    rm -f "$f"
  fi
  n=$((n + 1)) bytes=$((bytes + s))
done
echo "removed $n $bytes $busy"
