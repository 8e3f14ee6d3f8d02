#!/bin/sh
# One host of a chain push: its input (SSH stdin for the first host, a TCP listener for the others) goes
# through tee into its own docker load and, unless it is the last, on to the next host over TCP. The tag
# is set only after the Image ID checks out, as in a star push.
# The first line of SSH stdin is the push's random token (never on a command line). Every chain connection
# must start with it: a stranger who connects to the port first is refused, and nothing of theirs reaches
# docker load.
# usage: relay.sh IMAGE_ID REF zstd|none LISTEN_ADDR|- PORT NEXT_ADDR|-
set -u
image_id=$1 ref=$2 compress=$3 listen=$4 port=$5 next=$6
IFS= read -r token || exit 6
[ -n "$token" ] || exit 6
exec 3>&1  # the launcher reads "listening" and "receiving" here
dir=$(mktemp -d) || exit 6
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/fifo" || exit 6
( if [ "$compress" = zstd ]; then zstd -dc < "$dir/fifo" | docker load; else docker load < "$dir/fifo"; fi \
    > "$dir/log" 2>&1; echo $? > "$dir/rc" ) &
loader=$!
auth() {  # pass the stream on only if it starts with the token
  if ! IFS= read -r got; then  # the input ended before a whole first line
    if [ -n "$got" ]; then : > "$dir/refused"; else : > "$dir/nothing"; fi
    return 0
  fi
  if [ "$got" != "$token" ]; then : > "$dir/refused"; return 0; fi
  : > "$dir/receiving"
  echo receiving >&3
  cat
}
recv() {  # the listener's pid goes to the launcher, which ends it by that pid (a closed SSH channel does not)
  if [ "$listen" = - ]; then : > "$dir/receiving"; cat; return; fi
  mkfifo "$dir/in" || exit 6
  nc -l "$listen" "$port" > "$dir/in" &
  echo "listener $!" >&3
  auth < "$dir/in"
}
send() {  # connect onward only once this host receives: a relay that got nothing passes nothing on
  until [ -e "$dir/receiving" ]; do
    if [ -e "$dir/nothing" ] || [ -e "$dir/refused" ]; then cat > /dev/null; return 0; fi
    sleep 0.05
  done
  { printf '%s\n' "$token"; cat; } | nc -N -w 120 "$next" "$port"
}
if [ "$listen" != - ]; then  # tell the launcher as soon as our listener is up, so the sender can start
  ( hex=$(printf '%04X' "$port"); i=0
    while [ $i -lt 300 ]; do
      if awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p {f = 1} END {exit !f}' \
          /proc/net/tcp /proc/net/tcp6 2>/dev/null; then echo listening >&3; exit 0; fi
      sleep 0.05; i=$((i + 1))
    done ) &
fi
# if the next link breaks, drain its share so that tee (and our own load) goes on; that host reports its failure
if [ "$next" = - ]; then recv > "$dir/fifo"; else recv | tee "$dir/fifo" | { send; cat > /dev/null; }; fi
wait $loader
if [ -e "$dir/refused" ]; then
  echo "refused a connection on port $port without this push's token (a stranger?); nothing of it was loaded" >&2
  exit 7
fi
if [ "$(cat "$dir/rc")" != 0 ]; then echo "load failed: $(tail -n 3 "$dir/log")" >&2; exit 3; fi
if grep -q -i -e 'error unpacking image' -e 'apply layer error' "$dir/log"; then  # see load.sh
  docker rmi "$image_id" >/dev/null 2>&1
  echo "load failed: $(grep -i -m 1 -e 'unpacking' -e 'apply layer' "$dir/log")" >&2; exit 3
fi
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { echo "after load, $image_id is missing" >&2; exit 4; }
[ "$got" = "$image_id" ] || { echo "loaded $got, expected $image_id" >&2; exit 4; }
docker tag "$image_id" "$ref" || exit 5
echo "ok $got"
