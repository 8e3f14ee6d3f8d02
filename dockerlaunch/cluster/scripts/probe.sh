#!/bin/sh
# What a host must tell us before its container can be planned, in one round trip: the route and NIC
# toward MASTER_ADDR, InfiniBand device and port states, the GPU count, whether `ip` exists.
# usage: probe.sh MASTER_ADDR
m=$1
echo "route=$(ip -o route get "$m" 2>&1 | head -n1)"
echo "owner=$(ip -o addr show to "$m" 2>/dev/null | head -n1)"
if [ -e /dev/infiniband ]; then echo ib_dev=1; else echo ib_dev=0; fi
for p in /sys/class/infiniband/*/ports/*; do
  [ -r "$p/state" ] && echo "ib_port=$p $(cat "$p/state") $(cat "$p/link_layer" 2>/dev/null)"
done
if command -v nvidia-smi >/dev/null 2>&1; then echo "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"; else echo gpus=none; fi
echo "has_ip=$(command -v ip >/dev/null 2>&1 && echo 1 || echo 0)"
