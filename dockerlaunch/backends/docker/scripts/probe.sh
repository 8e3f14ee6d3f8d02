#!/bin/sh
# What a host must tell us before its container can be planned, in one round trip: the route and NIC
# toward MASTER_ADDR, InfiniBand device and port states, the GPU count, whether `ip` exists, and how a
# container can reach the GPUs (toolkit runtime, CDI specs, else device nodes + the driver's libraries).
# Every value goes out through kv/kvl (the key=value contract in probe.py): a host's text never becomes a line.
# usage: probe.sh MASTER_ADDR [IMAGE]
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
m=$1
SMI_GPU=index,pci.bus_id,name,compute_cap,driver_version,memory.used,memory.total,persistence_mode,mig.mode.current,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,remapped_rows.pending
SMI_APPS=gpu_bus_id,pid,used_memory,process_name
why() {  # the line of a failed command's output that says why (NVML's error comes first, its version after it)
  printf '%s\n' "$1" | grep -m 1 -iE 'fail|error|unable|not found|permission' || printf '%s\n' "$1" | tail -n 1
}
owned() {  # FILE: "file=UID MODE FILE" of what a bind mount of FILE would show the job (links followed)
  kv file "$(stat -L -c '%u %a' "$1" 2>/dev/null || echo '? ?') $1"
}
gpu_facts() {
  if out=$(nvidia-smi --query-gpu="$SMI_GPU" --format=csv,noheader,nounits 2>&1); then
    kvl smi_gpu "$out"
  else
    kv smi_error "nvidia-smi --query-gpu=$SMI_GPU --format=csv,noheader,nounits: $(why "$out")"
    d=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null) && kv smi_driver "${d%%
*}"
  fi
  # the CUDA version the driver runs and, on NVSwitch systems, each GPU's fabric state (State/Status)
  kvl smi_q "$(nvidia-smi -q 2>/dev/null | awk '/^(CUDA Version|Driver Version) /{print; next} /^GPU [0-9A-Fa-f]/{print; next}
    /^    Fabric *$/{f=1; next} f && /^        (State|Status) /{print; next} /^    [^ ]/{f=0}')"
  if out=$(nvidia-smi --query-compute-apps="$SMI_APPS" --format=csv,noheader,nounits 2>&1); then
    printf '%s\n' "$out" | grep ',' | while IFS=, read -r bus pid rest; do
      pid=$(printf '%s' "$pid" | tr -d ' ')
      case $pid in ''|*[!0-9]*) user= ;; *) user=$(ps -o user= -p "$pid" 2>/dev/null | tr -d ' ') ;; esac
      kv smi_app "$bus,$pid,$user,$rest"
    done
  else
    kv smi_error "nvidia-smi --query-compute-apps=$SMI_APPS --format=csv,noheader,nounits: $(why "$out")"
  fi
  # XID errors since boot, where the kernel log is readable (dmesg_restrict may hide it from this user)
  if log=$(dmesg 2>/dev/null); then
    echo "xid_readable=1"
    kvl xid "$(printf '%s\n' "$log" | grep -o 'Xid (PCI:[^)]*): [0-9]*' | sort | uniq -c | sed 's/^ *//')"
  fi
}
kv route "$(ip -o route get "$m" 2>&1 | head -n1)"
kv owner "$(ip -o addr show to "$m" 2>/dev/null | head -n1)"
if [ -e /dev/infiniband ]; then echo ib_dev=1; else echo ib_dev=0; fi
for p in /sys/class/infiniband/*/ports/*; do
  [ -r "$p/state" ] && kv ib_port "$p $(cat "$p/state") $(cat "$p/link_layer" 2>/dev/null)"
done
if command -v nvidia-smi >/dev/null 2>&1; then
  kv gpus "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  smi=$(command -v nvidia-smi)
  kv nvidia_smi "$smi"
  owned "$smi"
  # what doctor compares with the image and judges the GPUs' health by (backends/docker/nvsmi.py parses it);
  # a command that fails says so (smi_error=), it is never read as "nothing to report"
  [ "${DL_PROBE_GPU:-1}" = 0 ] || gpu_facts
else
  echo gpus=none
fi
echo "has_ip=$(command -v ip >/dev/null 2>&1 && echo 1 || echo 0)"
[ -n "${2:-}" ] && kv image_labels "$(docker image inspect --format '{{json .Config.Labels}}' "$2" 2>/dev/null)"
for d in /dev/nvidia*; do [ -c "$d" ] && kv gpu_dev "$d"; done
# One question to the engine (hosts may share one, and every call costs it): its version, the CDI spec
# directories it reads (none: CDI is off there; the field is missing before Docker 25) and its runtimes;
# not asked for a host that gets no GPUs (DL_PROBE_GPU=0)
[ "${DL_PROBE_GPU:-1}" = 0 ] || kv docker_info "$(docker info --format '{{json .}}' 2>/dev/null)"
for f in /etc/cdi/* /var/run/cdi/*; do
  [ -f "$f" ] && grep -q 'nvidia.com/gpu' "$f" 2>/dev/null && kv cdi "$f"
done
if [ -e /dev/nvidiactl ]; then
  # the driver's compute and utility libraries (nvidia-container-toolkit's and Apptainer's lists)
  # (each line without its leading tab; each file's owner and mode: only root's own, unwritable by others, is used)
  libs=$(ldconfig -p 2>/dev/null | grep -E 'lib(cuda|cudadebugger|nvidia-(ml|cfg|opencl|gpucomp|ptxjitcompiler|fatbinaryloader|allocator|compiler|nvvm|pkcs11|pkcs11-openssl3))\.so' \
    | sed 's/^[[:space:]]*//')
  kvl lib "$libs"
  printf '%s\n' "$libs" | sed -n 's/.* => //p' | while IFS= read -r f; do owned "$f"; done
  [ -n "${2:-}" ] && kv image_env "$(docker image inspect --format '{{json .Config.Env}}' "$2" 2>/dev/null)"
fi
exit 0
