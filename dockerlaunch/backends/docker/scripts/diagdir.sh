#!/bin/sh
# Empty a job's diagnostics folder (NCCL logs, flight-recorder dumps and pipes) before a start. The shared parent
# is kept only when it is a real folder owned by root or by us, and, if others may write into it, sticky like
# /tmp: in a parent another user owns, or one writable without the sticky bit, our job's folder could be
# swapped for a link between a check and the rm/mkdir/chmod below (run as the SSH user: often root).
# usage: diagdir.sh ROOT JOB MODE OWNER SUBDIR...  (OWNER: the uid the subfolders are given to, or -; a SUBDIR
#        written +NAME is made where missing and never emptied)
# A refusal is one line on stderr saying what is wrong, no fix: the launcher adds the one fix (diagnostics.dir).
root=$1 job=$2 mode=$3 owner=$4
shift 4
uid=$(id -u)
if [ ! -e "$root" ] && [ ! -L "$root" ]; then
  case $root in */*) mkdir -p "${root%/*}" 2>/dev/null ;; esac
  mkdir "$root" 2>/dev/null && chmod 1777 "$root" 2>/dev/null
  if [ ! -e "$root" ] && [ ! -L "$root" ]; then
    echo "$root cannot be created by uid $uid" >&2
    exit 1
  fi
fi
if [ -L "$root" ] || [ ! -d "$root" ]; then
  echo "$root is not a folder (a link or a file)" >&2
  exit 1
fi
o=$(stat -c %u "$root") || exit 1
bits=$((0$(stat -c %a "$root")))
if [ "$o" != 0 ] && [ "$o" != "$uid" ]; then
  echo "$root belongs to uid $o, another user, who could swap the job's folder in it" >&2
  exit 1
fi
if [ $((bits & 022)) -ne 0 ] && [ $((bits & 01000)) -eq 0 ]; then
  echo "$root is writable by others without the sticky bit (mode $(stat -c %a "$root")), so they could swap the job's folder in it" >&2
  exit 1
fi
mkdir "$root/$job" 2>/dev/null
# a job folder someone else made (or a link they planted) is not ours to write into
if [ -L "$root/$job" ] || [ ! -d "$root/$job" ] || [ "$(stat -c %u "$root/$job")" != "$uid" ]; then
  echo "$root/$job belongs to another user or is a link" >&2
  exit 1
fi
chmod 0755 "$root/$job" || exit 1
for s in "$@"; do
  case $s in
    +*) s=${s#+}  # kept across starts (the supervisor's files, each run's records): made, never emptied
        if [ -L "$root/$job/$s" ]; then echo "$root/$job/$s is a link" >&2; exit 1; fi
        if [ -d "$root/$job/$s" ]; then continue; fi ;;
    *) rm -rf "${root:?}/$job/$s" || exit 1 ;;
  esac
  # -p: `local` hosts of one job share this folder
  mkdir -p "$root/$job/$s" || exit 1
  if [ "$owner" != - ]; then  # the container's user gets its own folders; not root: sticky like /tmp at worst
    { chown "$owner" "$root/$job/$s" 2>/dev/null && chmod 0700 "$root/$job/$s"; } || chmod 1777 "$root/$job/$s" || exit 1
  else
    chmod "$mode" "$root/$job/$s" || exit 1
  fi
done
