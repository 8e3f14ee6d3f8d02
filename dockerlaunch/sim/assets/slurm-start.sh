#!/bin/sh
# Starts a sim node's Slurm daemons once `sim up --slurm` has written slurm.conf and the munge key:
# munged always, then slurmctld with `ctld` (waiting until it answers), slurmd with `slurmd`.
# Each daemonizes; docker-init (PID 1) reaps them.
set -e

# wait_for WHAT COMMAND...: run COMMAND every 0.1 s until it succeeds, at most 10 s
wait_for() {
  what=$1
  shift
  i=0
  until "$@" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -ge 100 ]; then
      echo "sim-slurm-start: $what not ready after 10s" >&2
      exit 1
    fi
    sleep 0.1
  done
}

install -d -o munge -g munge -m 0755 /run/munge
if [ ! -S /run/munge/munge.socket.2 ]; then
  runuser -u munge -- /usr/sbin/munged
  wait_for munged test -S /run/munge/munge.socket.2
fi
for role in "$@"; do
  case "$role" in
    ctld)
      /usr/sbin/slurmctld
      wait_for slurmctld scontrol ping
      ;;
    slurmd) /usr/sbin/slurmd ;;
    *) echo "sim-slurm-start: unknown role $role (ctld, slurmd)" >&2; exit 2 ;;
  esac
done
