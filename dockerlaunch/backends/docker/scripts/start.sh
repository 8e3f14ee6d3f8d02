#!/bin/sh
# Starts one job container in one round trip: the secret env file for `docker run --env-file` (written in a fresh
# 0700 folder, removed when this ends, also when cut off) and, for a supervised job, the gang's secret handed to
# the container on `docker exec`'s stdin (into its tmpfs: never in argv, env, labels, mounts or a log).
# stdin: with GANG 1, its first line is the gang's secret; then the env file's bytes when ENVFILE is not -.
# usage: start.sh ENVFILE NAME GANG docker run ARGS...
# Exit status: docker run's; 125 when the env file could not be made. stdout: the container's ID, then
# "gang=ok", "gang=unsupervised" (the image has no Python >= 3.8) or "gang=failed STATUS".
envfile=$1 name=$2 gang=$3
shift 3
secret=
if [ "$gang" = 1 ]; then
  IFS= read -r secret || exit 125
fi
if [ "$envfile" != - ]; then
  d=${envfile%/*}
  (umask 077 && mkdir "$d") || exit 125
  trap 'rm -rf "$d"' EXIT
  trap 'exit 129' HUP INT TERM
  (umask 077 && set -C && cat >"$envfile") || exit 125
fi
"$@" || exit
[ "$gang" = 1 ] || exit 0
# printf is the shell's own: the secret is in no process's argv
said=$(printf '%s\n' "$secret" | docker exec -i "$name" /bin/sh /.dockerlaunch/gang-entry.sh take-secret 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "gang=failed $rc"
elif [ "$said" = unsupervised ]; then
  echo "gang=unsupervised"
else
  echo "gang=ok"
fi
