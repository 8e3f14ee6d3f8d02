#!/bin/sh
# What a staged push needs to know of the host, one value each (the key=value contract,
# dockerlaunch/keyvalue.py): flock, the file system of $HOME/.cache, the staged prefix (size, sha256) once any load
# of the same stream still running has finished (its lock), the Image ID the host has now, and the filesystems of
# the staging folder and of docker's root (device, total KiB, free KiB).
# usage: stage_facts.sh KEY IMAGE_ID
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
d=$HOME/.cache/dockerlaunch/push f=$HOME/.cache/dockerlaunch/push/$1.tar
if command -v flock >/dev/null 2>&1; then echo flock=1; else echo flock=0; fi
mkdir -p "$HOME/.cache" 2>/dev/null; kv fs "$(stat -f -c %T "$HOME/.cache" 2>/dev/null)"
if [ -f "$d/$1.lock" ] && command -v flock >/dev/null 2>&1; then flock -w 900 "$d/$1.lock" true; fi
if [ -f "$f" ] && [ ! -L "$f" ]; then kv staged "$(stat -c %s "$f") $(sha256sum < "$f" | cut -c1-64)"; fi
kv id "$(docker image inspect --format '{{.Id}}' "$2" 2>/dev/null | head -n 1)"
fs() { kv "$1" "$(stat -c %d "$2" 2>/dev/null) $(df -Pk "$2" 2>/dev/null | awk 'NR == 2 {print $2, $4}')"; }
fs cache "$HOME/.cache"
root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)
if [ -n "$root" ]; then fs docker "$root"; kv root "$root"; fi
