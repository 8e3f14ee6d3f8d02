#!/bin/sh
# One host of a chain push: its input (SSH stdin for the first host, a TCP listener for the others) goes on to
# the next host over TCP, unless it is the last, and into its own docker load. The tag is set only after the
# Image ID checks out, as in a star push.
# SSH stdin starts with two lines, never on a command line: the token this host's link must start with ("-" for
# the first host, whose stream is SSH stdin itself) and the token of the next link ("-" for the last). Each link
# has its own token, and a token crosses its link in plain TCP, so it proves little: a host fed over TCP keeps
# the stream in a file and loads it only once it has the sha256 the launcher sends over SSH stdin after the last
# byte (a third line: `sha256 HEX SIZE`, or `cut` when the launcher's own stream broke) and the file matches it.
# A stranger or a man in the middle costs a retry, never a load or a tag.
# With KEY the stream (as it travels, maybe zstd) is kept in the host's stage (stage.sh) instead of a temporary
# file: a chain cut anywhere leaves each host the prefix it received, and the next chain sends each host only the
# rest. OFFSET: the prefix this host keeps (the launcher checked its sha256), so its input starts there; NEXT_OFFSET
# (<= OFFSET): the next host's, which gets this host's staged bytes from there to OFFSET before the live ones.
# usage: relay.sh IMAGE_ID REF zstd|none LISTEN_ADDR|- PORT NEXT_ADDR|- [KEY|- OFFSET NEXT_OFFSET]
set -u
image_id=$1 ref=$2 compress=$3 listen=$4 port=$5 next=$6 key=${7:--} offset=${8:-0} next_offset=${9:-0}
case "$offset$next_offset" in *[!0-9]*) echo "bad offsets" >&2; exit 6;; esac
if [ "$key" = - ]; then offset=0; fi
[ "$next_offset" -le "$offset" ] || { echo "the next host's offset is past this host's" >&2; exit 6; }
IFS= read -r token || exit 6
IFS= read -r next_token || exit 6
[ -n "$token" ] && [ -n "$next_token" ] || exit 6
exec 3>&1  # the launcher reads "listening" and "receiving" here
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/dockerlaunch-relay.XXXXXX") || exit 6
trap 'rm -rf "$dir"' EXIT
staged=
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script): status lines that quote docker go out as one line each
# shellcheck source=/dev/null
. ./stage.sh  # included when shipped (shipped.script)
if [ "$key" != - ]; then open_stage "$key" "$offset"; fi
load() {  # docker load of stdin (decompressed), its log and exit status kept
  if [ "$compress" = zstd ]; then zstd -dc | docker load; else docker load; fi > "$dir/log" 2>&1
  echo $? > "$dir/rc"
}
# the live bytes go (tee -a) into: the kept stream (the stage, or a temporary file for a host fed over TCP), the
# first host's load (a fifo: loaded as they arrive), a TCP-fed host's hasher (a fifo)
set --
if [ -n "$staged" ]; then keep=$staged; elif [ "$listen" != - ]; then keep=$dir/stream; else keep=; fi
if [ -n "$keep" ]; then
  [ -n "$staged" ] || (umask 077 && : > "$keep") || exit 6
  set -- "$keep"
fi
if [ "$listen" = - ]; then  # the first host: its bytes came over SSH, loaded as they arrive (after its prefix)
  mkfifo "$dir/fifo" || exit 6
  { [ "$offset" = 0 ] || head -c "$offset" "$keep"; cat "$dir/fifo"; } | load &
  loader=$!
  set -- "$@" "$dir/fifo"
else  # a host fed over TCP: kept whole (hashed as it arrives), loaded only once it is proven the launcher's
  mkfifo "$dir/hash" || exit 6
  { [ "$offset" = 0 ] || head -c "$offset" "$keep"; cat "$dir/hash"; } | sha256sum > "$dir/sum" &
  hasher=$!
  loader=
  set -- "$@" "$dir/hash"
fi
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
  # the next host lacks this host's staged bytes from NEXT_OFFSET on: those first, then the live ones
  { printf '%s\n' "$next_token"
    [ "$next_offset" = "$offset" ] || tail -c +"$((next_offset + 1))" "$keep" | head -c "$((offset - next_offset))"
    cat; } | nc -N -w 120 "$next" "$port"
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
if [ "$next" = - ]; then recv | tee -a "$@" > /dev/null; else recv | tee -a "$@" | { send; cat > /dev/null; }; fi
if [ -e "$dir/refused" ]; then
  [ -z "$loader" ] || wait "$loader"
  echo "refused a connection on port $port without this link's token (a stranger?); nothing of it was loaded" >&2
  exit 7
fi
if [ -z "$loader" ]; then
  # the launcher's sha256 of the stream and its size, over SSH, after its last byte: only a file that matches
  # them is loaded. Fewer bytes than that: the stream was cut on its way here, and what came stays staged.
  IFS= read -r want || want=
  wait "$hasher"
  got=$(cut -c1-64 "$dir/sum") have=$(stat -c %s "$keep")
  set -f  # its words: sha256 HEX SIZE, or cut
  # shellcheck disable=SC2086
  set -- $want
  why=
  case ${1:-} in
    sha256) if [ "${3:-0}" -gt "$have" ] 2>/dev/null; then why="of $3"; fi ;;
    cut) why="the launcher's own stream broke" ;;
    "") why="the launcher went away before the stream's end" ;;
  esac
  if [ -n "$why" ]; then
    if [ -n "$staged" ]; then kept="$have bytes stay staged for the next push"; else kept="nothing was kept"; fi
    echo "cut: the stream stopped after $have bytes on its way here ($why); $kept" >&2
    exit 9
  fi
  if [ "$want" != "sha256 $got $have" ] && [ "$want" != "sha256 $got" ]; then
    [ -z "$staged" ] || rm -f "$staged"
    echo "refused what arrived on port $port: it is not this push's stream (sha256 $got, the launcher's: ${2:-none}); nothing of it was loaded" >&2
    exit 7
  fi
  load < "$keep"
  if [ "$(cat "$dir/rc")" != 0 ] && [ -n "$staged" ]; then rm -f "$staged"; fi  # whole and checked: resuming would not help
  [ -n "$staged" ] || rm -f "$keep"
else
  wait "$loader"
fi
if [ "$(cat "$dir/rc")" != 0 ]; then line "load failed: $(tail -n 3 "$dir/log")" >&2; exit 3; fi
if grep -q -i -e 'error unpacking image' -e 'apply layer error' "$dir/log"; then  # see load.sh
  docker rmi "$image_id" >/dev/null 2>&1
  line "load failed: $(grep -i -m 1 -e 'unpacking' -e 'apply layer' "$dir/log")" >&2; exit 3
fi
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { echo "after load, $image_id is missing" >&2; exit 4; }
[ "$got" = "$image_id" ] || { line "loaded $got, expected $image_id" >&2; exit 4; }
docker tag "$image_id" "$ref" || exit 5
[ -z "$staged" ] || rm -f "$staged"
echo "ok $got"
