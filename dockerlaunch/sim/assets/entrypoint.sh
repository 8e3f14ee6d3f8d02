#!/bin/sh
# PID 1 (under docker-init) of a simulated host: sshd in the background, dockerd in the foreground.
set -e
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
# Job containers use --network host, so the inner engine needs no bridge, NAT or iptables.
# shellcheck disable=SC2086
exec dockerd --iptables=false --ip-masq=false --bridge=none ${DOCKERD_EXTRA_ARGS:-} >>/var/log/dockerd.log 2>&1
