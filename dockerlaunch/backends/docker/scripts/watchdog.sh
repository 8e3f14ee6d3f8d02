#!/bin/sh
# Keeps one run's containers on this host only while the launcher is there (not started for --detach).
# stdin: heartbeats from the launcher -- 'h' every few seconds, answered with 'h' on stdout (so the launcher
# sees a frozen host); 'q' means the launcher is done here: stand down. When the launcher's session drops
# (end of input) this waits GRACE seconds, and when it goes silent for GRACE seconds (launcher machine gone,
# network cut) it acts at once: every container labelled with this run is stopped and removed.
# usage: watchdog.sh GRACE RUN_ID HOST   (HOST: the container label of this host; hosts may share an engine)
trap '' HUP PIPE
grace=$1 run=$2 host=$3
for tool in timeout dd docker; do
  command -v "$tool" >/dev/null 2>&1 || { echo "the watchdog needs $tool on the host" >&2; exit 2; }
done
while :; do
  c=$(timeout "$grace" dd bs=1 count=1 2>/dev/null)
  rc=$?
  case "$c" in
    h) printf h 2>/dev/null ;;
    q) exit 0 ;;
    *) if [ "$rc" -ne 124 ]; then sleep "$grace"; fi; break ;;
  esac
done
ids=$(docker ps -aq --filter "label=dockerlaunch.run=$run" --filter "label=dockerlaunch.host=$host")
if [ -n "$ids" ]; then
  # shellcheck disable=SC2086 # one argument per container ID
  docker stop -t 10 $ids >/dev/null 2>&1
  # shellcheck disable=SC2086
  docker rm -f $ids >/dev/null 2>&1
fi
