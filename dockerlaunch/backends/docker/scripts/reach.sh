#!/bin/sh
# doctor's reachability check: the same program in a container of the job's image or on a host itself (job
# containers use --network host, so both ask the host's own network). It uses whichever tool is there, and says
# which, so a missing tool is never mistaken for a network that drops packets.
# usage: reach.sh connect ADDR PORT...    a line per port: "reach=PORT ok TOOL", "reach=PORT fail TOOL WHY" (the
#                                         connection failed) or "reach=PORT error TOOL WHY" (the tool itself
#                                         failed); "reach=none" when there is no nc, python3, or bash with timeout
#        reach.sh listen SECONDS PORT...  listeners (python3, else nc -lk) in the background for at most SECONDS:
#                                         "listen=TOOL PID" (kill PID to end them sooner), or "listen=none"
#        reach.sh serve SECONDS PORT...   the same in the foreground (a probe container; 0: until removed)
# Every value through kv (the key=value contract, dockerlaunch/keyvalue.py; python3's lines encode the same way).
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
PY_CONNECT='
import socket, sys
def kv(v):
    return "".join("%{:02X}".format(ord(c)) if c == "%" or ord(c) < 32 or ord(c) == 127 else c for c in v)
for p in sys.argv[2:]:
    try:
        socket.create_connection((sys.argv[1], int(p)), 3).close()
        print("reach=" + kv("%s ok python3" % p))
    except Exception as e:
        print("reach=" + kv("%s fail python3 %s" % (p, e)))
'
PY_SERVE='
import select, socket, sys, time


def bind(port):
    try:  # both IPv4 and IPv6 where the host has IPv6
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = ("::", port)
    except OSError:
        s, addr = socket.socket(), ("0.0.0.0", port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
    except OSError:
        if addr[0] == "0.0.0.0":
            raise
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
    s.listen(64)
    return s


ttl = float(sys.argv[1])
end = time.time() + ttl if ttl > 0 else float("inf")
socks = [bind(int(p)) for p in sys.argv[2:]]
while time.time() < end:
    for s in select.select(socks, [], [], 1)[0]:
        s.accept()[0].close()
'

has() { command -v "$1" >/dev/null 2>&1; }

connect() {
  a=$1
  shift
  if has python3; then
    python3 -c "$PY_CONNECT" "$a" "$@"
  elif has nc; then
    for p in "$@"; do
      if out=$(nc -vz -w 3 "$a" "$p" </dev/null 2>&1); then
        kv reach "$p ok nc"
      else
        why=$(printf '%s\n' "$out" | grep -v '^ *$' | head -n 1)
        case $out in
          *sage:* | *nvalid\ option* | *llegal\ option* | *nrecognized\ option*) kv reach "$p error nc ${why:-exit status}" ;;
          *) kv reach "$p fail nc ${why:-no connection in 3 s}" ;;
        esac
      fi
    done
  elif has bash && has timeout; then
    for p in "$@"; do
      # shellcheck disable=SC2016  # expanded by that bash, from its own arguments
      if out=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' bash "$a" "$p" 2>&1); then
        kv reach "$p ok bash"
      elif [ $? = 124 ]; then
        kv reach "$p fail bash no connection in 3 s"
      else
        kv reach "$p fail bash $(printf '%s\n' "$out" | tail -n 1)"
      fi
    done
  else
    echo "reach=none"
  fi
}

serve_nc() {  # $1 seconds (0: until killed), then ports
  ttl=$1
  shift
  pids=
  for p in "$@"; do
    nc -lk "$p" </dev/null >/dev/null 2>&1 &
    pids="$pids $!"
  done
  # shellcheck disable=SC2086  # a list of PIDs
  trap 'kill $pids 2>/dev/null; exit 0' TERM INT HUP
  if [ "$ttl" -gt 0 ]; then
    sleep "$ttl" &
    pids="$pids $!"
    wait $!
  else
    wait
  fi
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null
}

case $1 in
  connect) shift; connect "$@" ;;
  serve)
    shift
    if has python3; then exec python3 -c "$PY_SERVE" "$@"; fi
    if has nc; then serve_nc "$@"; else echo "listen=none"; fi
    ;;
  listen)
    shift
    if has python3; then
      python3 -c "$PY_SERVE" "$@" </dev/null >/dev/null 2>&1 &
      echo "listen=python3 $!"
    elif has nc; then
      serve_nc "$@" </dev/null >/dev/null 2>&1 &
      echo "listen=nc $!"
    else
      echo "listen=none"
    fi
    ;;
  *) echo "usage: reach.sh connect ADDR PORT... | listen SECONDS PORT... | serve SECONDS PORT..." >&2; exit 2 ;;
esac
