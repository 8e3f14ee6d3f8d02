#!/bin/sh
# PID 1 (under docker-init) of a simulated host: sshd in the background, dockerd in the foreground.
# SIM_LIGHT=1 (a light host of `sim up --light`): sshd only, in the foreground; no dockerd. Its docker CLI talks
# to the engine container that serves it, whose dockerd socket is on a volume mounted at /run/dlengine.
set -e
mkdir -p /run/sshd
if [ "${SIM_LIGHT:-}" = 1 ]; then
  ln -sfn /run/dlengine/docker.sock /var/run/docker.sock
  exec /usr/sbin/sshd -D -E /var/log/sshd.log
fi
/usr/sbin/sshd -E /var/log/sshd.log
# Job containers use --network host, so the inner engine needs no bridge, NAT or iptables.
# shellcheck disable=SC2086
exec dockerd --iptables=false --ip-masq=false --bridge=none ${DOCKERD_EXTRA_ARGS:-} >>/var/log/dockerd.log 2>&1
