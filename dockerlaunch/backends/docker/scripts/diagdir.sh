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
# one subfolder: emptied (or, +NAME, made where missing) and given to the container's user. Hosts whose engine
# shares this folder (`local` hosts of one job, the sim's light hosts) prepare it at once: a step another host
# undid meanwhile (its rm between our mkdir and chmod) is tried again
one() {
  case $1 in
    +*) s=${1#+}  # kept across starts (the supervisor's files, each run's records): made, never emptied
        if [ -L "$root/$job/$s" ]; then echo "$root/$job/$s is a link" >&2; return 2; fi
        if [ -d "$root/$job/$s" ]; then return 0; fi ;;
    *) s=$1
       rm -rf "${root:?}/$job/$s" || return 1 ;;
  esac
  mkdir -p "$root/$job/$s" || return 1
  if [ "$owner" != - ]; then  # the container's user gets its own folders; not root: sticky like /tmp at worst
    { chown "$owner" "$root/$job/$s" 2>/dev/null && chmod 0700 "$root/$job/$s"; } || chmod 1777 "$root/$job/$s" || return 1
  else
    chmod "$mode" "$root/$job/$s" || return 1
  fi
}
# hosts whose engine shares this folder take turns (a folder of ours: nobody else can hold its lock); a lock left
# by a killed step is taken over after 30 s
l="$root/$job/.preparing"
n=0
while ! mkdir "$l" 2>/dev/null; do
  n=$((n + 1))
  if [ "$n" -ge 300 ]; then rm -rf "$l"; n=0; continue; fi
  sleep 0.1 2>/dev/null || sleep 1
done
trap 'rmdir "$l" 2>/dev/null' EXIT
for s in "$@"; do
  n=0
  until one "$s"; do
    rc=$?
    n=$((n + 1))
    if [ "$rc" = 2 ] || [ "$n" -ge 5 ]; then exit 1; fi
  done
done
