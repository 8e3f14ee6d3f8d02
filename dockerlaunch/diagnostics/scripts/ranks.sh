#!/bin/sh
# Inside a job container: every process with RANK in its environment (torchrun's workers and their children),
# one line each: `proc PID PPID RANK LOCAL_RANK COMMAND...`, through kv.sh's `line` (the key=value contract,
# dockerlaunch/keyvalue.py: a command line holding a line break or `\n` never makes a line of its own).
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  env=$(tr '\0' '\n' < "$d/environ" 2>/dev/null) || continue
  rank=$(printf '%s\n' "$env" | sed -n 's/^RANK=//p' | head -n 1)
  [ -n "$rank" ] || continue
  lrank=$(printf '%s\n' "$env" | sed -n 's/^LOCAL_RANK=//p' | head -n 1)
  ppid=$(sed 's/.*) //' "$d/stat" 2>/dev/null | cut -d ' ' -f 2)
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null | cut -c 1-200)
  line "proc $pid ${ppid:-0} $rank ${lrank:--} $cmd"
done
exit 0
