#!/bin/sh
# A fragment, not a program: every script whose output the launcher parses as key=value lines includes it where it
# says `. ./kv.sh  # included` (shipped.script puts this text there). The contract (dockerlaunch/keyvalue.py):
# one line per value, `KEY=VALUE`, VALUE with `%`, bytes 0x01-0x1f and 0x7f written as %XX (so no value can hold a
# line break or a terminal control), decoded by dockerlaunch/keyvalue.py. Needs only sh (dash, bash, busybox).
enc() {  # TEXT: printed encoded, without a line break
  # bytes, not characters, whatever the login's locale (bash's [[:cntrl:]] in UTF-8 also holds U+0080-9F, U+2028)
  # shellcheck disable=SC3043  # dash, bash and busybox sh all have local
  local LC_ALL=C
  _kv_v=$1
  while :; do
    case $_kv_v in
      *[[:cntrl:]%]*) ;;
      *) break ;;
    esac
    _kv_h=${_kv_v%%[[:cntrl:]%]*}
    _kv_v=${_kv_v#"$_kv_h"}
    _kv_r=${_kv_v#?}
    printf '%s%%%02X' "$_kv_h" "'${_kv_v%"$_kv_r"}"
    _kv_v=$_kv_r
  done
  printf '%s' "$_kv_v"
}
kv() {  # KEY VALUE: one line
  printf '%s=' "$1"
  enc "$2"
  printf '\n'
}
line() {  # TEXT: a status line that quotes a host's words (docker's output), as one line (the same encoding)
  enc "$*"
  printf '\n'
}
# every control byte but the line break: TEXT without them (and without %) needs no escaping, line by line
_kv_ctl=$(printf '\001\002\003\004\005\006\007\010\011\013\014\015\016\017\020\021\022\023\024\025\026\027\030\031\032\033\034\035\036\037\177')
kvl() {  # KEY TEXT: one KEY= line per line of TEXT (none for an empty TEXT)
  [ -n "$2" ] || return 0
  case $2 in
    *[%"$_kv_ctl"]*)
      printf '%s\n' "$2" | while IFS= read -r _kvl_line || [ -n "$_kvl_line" ]; do kv "$1" "$_kvl_line"; done ;;
    *) printf '%s\n' "$2" | sed "s/^/$1=/" ;;
  esac
}
