#!/bin/sh
# What a host's links should carry: the NIC's speed (Mb/s) and each InfiniBand port's rate (parsed by commtest).
# usage: linkspeed.sh NIC [HCA:PORT...]
nic=$1
shift
[ -n "$nic" ] && echo "nic=$(cat "/sys/class/net/$nic/speed" 2>/dev/null)"
for p in "$@"; do
  hca=${p%%:*}
  port=${p#*:}
  [ "$port" = "$p" ] && port=1
  echo "ib=$p $(cat "/sys/class/infiniband/$hca/ports/$port/rate" 2>/dev/null)"
done
exit 0
