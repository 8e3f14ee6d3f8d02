#!/bin/sh
# What doctor needs to know about one host, in one round trip (parsed by doctor.parse_observation); the
# launcher appends probe.sh (route, InfiniBand, GPUs). `clock=` comes first so its arrival can be timed.
# Every value through kv/kvl (the key=value contract, dockerlaunch/keyvalue.py).
# usage: observe.sh MASTER_ADDR IMAGE [MOUNT_SOURCE...]
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
echo "clock=$(date +%s.%N)"
image=$2
if out=$(docker version --format '{{.Server.Version}}' 2>&1); then
  kv docker "$out"
  kv image "$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
  # what the image is in any store (its ID is the config digest in the classic store, the manifest's in
  # containerd's): its layers' content digests and the instant it was made
  kv image_content "$(docker image inspect --format '{{.Created}} {{json .RootFS.Layers}}' "$image" 2>/dev/null || true)"
  root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)
  kvl disk "$(df -Pk "${root:-/var/lib/docker}" 2>&1)"
else
  kv docker_error "$(printf '%s\n' "$out" | tail -n 1)"
fi
i=0
for m in "$@"; do
  i=$((i + 1))
  [ $i -le 2 ] && continue
  if [ -e "$m" ]; then kv mount_ok "$m"; else kv mount_missing "$m"; fi
done
kvl tcp "$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)"
