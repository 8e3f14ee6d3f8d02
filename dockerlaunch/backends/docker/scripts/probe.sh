#!/bin/sh
# What a host must tell us before its container can be planned, in one round trip: the route and NIC
# toward MASTER_ADDR, InfiniBand device and port states, the GPU count, whether `ip` exists, and how a
# container can reach the GPUs (toolkit runtime, CDI specs, else device nodes + the driver's libraries).
# usage: probe.sh MASTER_ADDR [IMAGE]
m=$1
echo "route=$(ip -o route get "$m" 2>&1 | head -n1)"
echo "owner=$(ip -o addr show to "$m" 2>/dev/null | head -n1)"
if [ -e /dev/infiniband ]; then echo ib_dev=1; else echo ib_dev=0; fi
for p in /sys/class/infiniband/*/ports/*; do
  [ -r "$p/state" ] && echo "ib_port=$p $(cat "$p/state") $(cat "$p/link_layer" 2>/dev/null)"
done
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  echo "nvidia_smi=$(command -v nvidia-smi)"
else
  echo gpus=none
fi
echo "has_ip=$(command -v ip >/dev/null 2>&1 && echo 1 || echo 0)"
[ -n "${2:-}" ] && echo "image_labels=$(docker image inspect --format '{{json .Config.Labels}}' "$2" 2>/dev/null)"
for d in /dev/nvidia*; do [ -c "$d" ] && echo "gpu_dev=$d"; done
# One question to the engine (hosts may share one, and every call costs it): its version, the CDI spec
# directories it reads (none: CDI is off there; the field is missing before Docker 25) and its runtimes;
# not asked for a host that gets no GPUs (DL_PROBE_GPU=0)
[ "${DL_PROBE_GPU:-1}" = 0 ] || echo "docker_info=$(docker info --format '{{json .}}' 2>/dev/null)"
for f in /etc/cdi/* /var/run/cdi/*; do
  [ -f "$f" ] && grep -q 'nvidia.com/gpu' "$f" 2>/dev/null && echo "cdi=$f"
done
if [ -e /dev/nvidiactl ]; then
  # the driver's compute and utility libraries (nvidia-container-toolkit's and Apptainer's lists)
  ldconfig -p 2>/dev/null | grep -E 'lib(cuda|cudadebugger|nvidia-(ml|cfg|opencl|gpucomp|ptxjitcompiler|fatbinaryloader|allocator|compiler|nvvm|pkcs11|pkcs11-openssl3))\.so' \
    | sed 's/^/lib=/'
  [ -n "${2:-}" ] && echo "image_env=$(docker image inspect --format '{{json .Config.Env}}' "$2" 2>/dev/null)"
fi
exit 0
