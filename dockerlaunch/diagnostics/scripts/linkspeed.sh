#!/bin/sh
# What a host's links should carry: the NIC's speed (Mb/s) and each InfiniBand port's rate (parsed by commtest).
# Every value through kv (the key=value contract, dockerlaunch/keyvalue.py).
# usage: linkspeed.sh NIC [HCA:PORT...]
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
nic=$1
shift
[ -n "$nic" ] && kv nic "$(cat "/sys/class/net/$nic/speed" 2>/dev/null)"
for p in "$@"; do
  hca=${p%%:*}
  port=${p#*:}
  [ "$port" = "$p" ] && port=1
  kv ib "$p $(cat "/sys/class/infiniband/$hca/ports/$port/rate" 2>/dev/null)"
done
exit 0
