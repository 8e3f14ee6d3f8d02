#!/bin/sh
# What a host must tell us before its container can be planned, in one round trip: the route and NIC
# toward MASTER_ADDR, InfiniBand device and port states, the GPU count, whether `ip` exists, and how a
# container can reach the GPUs (toolkit runtime, CDI specs, else device nodes + the driver's libraries).
# Every value goes out through kv/kvl (the key=value contract, dockerlaunch/keyvalue.py): a host's text never becomes a line.
# usage: probe.sh MASTER_ADDR [IMAGE]   (IMAGE: its labels and command are asked too)
# shellcheck source=/dev/null
. ./kv.sh  # included when shipped (shipped.script)
m=$1
# the --query-gpu fields doctor reads (gpu/smi.py's QUERY): each asked only where this driver's --help-query-gpu
# lists it, and a field it still rejects is dropped and the rest asked again: one unknown field costs only itself
SMI_GPU="index pci.bus_id name memory.used memory.total persistence_mode ecc.errors.uncorrected.volatile.total ecc.errors.uncorrected.aggregate.total compute_cap mig.mode.current remapped_rows.pending remapped_rows.failure remapped_rows.histogram.none clocks_event_reasons.active clocks_throttle_reasons.active pcie.link.gen.current pcie.link.width.current pcie.link.gen.max pcie.link.width.max"
# (never process_name: that is the process's command line, which its owner writes, raw in the CSV: a line feed in it
# adds a row naming any bus, pid and memory. Each process's name is the kernel's, /proc/PID/comm, read below.)
SMI_APPS=gpu_bus_id,pid,used_memory
P=${DL_PROBE_PROC:-/proc}  # (DL_PROBE_PROC: another /proc, for tests)
why() {  # the line of a failed command's output that says why (NVML's error comes first, its version after it)
  printf '%s\n' "$1" | grep -v '^index, ' | grep -m 1 -iE 'fail|error|unable|not found|permission|not a valid' ||
    printf '%s\n' "$1" | tail -n 1
}
pstatus() {  # PID KEY: the values after `KEY:` in /proc/PID/status (Uid: real, effective, saved, filesystem uid)
  awk -v k="$2:" '$1 == k { $1 = ""; print substr($0, 2); exit }' "$P/$1/status" 2>/dev/null
}
roots() {  # NAME: whether a process of this kernel name (15 characters at most) runs as root (real and effective uid)
  for p in $(pgrep -x "$1" 2>/dev/null); do
    case $(pstatus "$p" Uid) in "0 0 "*) return 0 ;; esac
  done
  return 1
}
owned() {  # FILE: "file=UID MODE FILE" of what a bind mount of FILE would show the job (links followed)
  kv file "$(stat -L -c '%u %a' "$1" 2>/dev/null || echo '? ?') $1"
}
gpu_query() {
  help=$(nvidia-smi --help-query-gpu 2>/dev/null)
  fields=
  for f in $SMI_GPU; do
    # R535 renamed clocks_throttle_reasons to clocks_event_reasons: the old name only where the new one is unknown
    case $f,$fields, in clocks_throttle_reasons.active,*clocks_event_reasons.active,*) continue ;; esac
    case $help in
      *\"index\"*) case $help in *\"$f\"*) fields="$fields${fields:+,}$f" ;; *) kv smi_unknown "$f" ;; esac ;;
      *) fields="$fields${fields:+,}$f" ;;  # no help to go by: ask, and let a rejection name the field
    esac
  done
  tries=0
  while :; do
    if out=$(nvidia-smi --query-gpu="$fields" --format=csv,nounits 2>&1); then
      kvl smi_gpu "$out"
      return
    fi
    bad=$(printf '%s\n' "$out" | sed -n 's/^Field "\([a-z_.]*\)" is not a valid field to query.*/\1/p' | head -n 1)
    tries=$((tries + 1))
    case ",$fields," in *",$bad,"*) ;; *) bad= ;; esac
    if [ -z "$bad" ] || [ "$tries" -gt 20 ]; then
      kv smi_error "nvidia-smi --query-gpu=$fields --format=csv,nounits: $(why "$out")"
      return
    fi
    kv smi_unknown "$bad"
    left=
    for f in $(printf '%s' "$fields" | tr ',' ' '); do [ "$f" = "$bad" ] || left="$left${left:+,}$f"; done
    fields=$left
  done
}
gpu_facts() {
  gpu_query
  # the driver's version and the CUDA version it runs (their one source: gpu/smi.py's parse_q) and, per GPU, its
  # NVSwitch fabric (State/Status, Health's Summary)
  kvl smi_q "$(nvidia-smi -q 2>/dev/null | awk '/^(CUDA Version|Driver Version|KMD Version|CUDA UMD Version) /{print; next}
    /^GPU [0-9A-Fa-f]/{print; next} /^    Fabric *$/{f=1; next} f && /^        (State|Status) /{print; next}
    f && /^            Summary /{print; next} /^    [^ ]/{f=0}')"
  if out=$(nvidia-smi --query-compute-apps="$SMI_APPS" --format=csv,noheader,nounits 2>&1); then
    # each process's owner (ps), its name as the kernel keeps it, and its parent's uids and name: an MPS server
    # runs as its client's uid, started by root's nvidia-cuda-mps-control (gpu/health.py's rule)
    printf '%s\n' "$out" | grep ',' | while IFS=, read -r bus pid used rest; do
      pid=$(printf '%s' "$pid" | tr -d ' ')
      user='' name=''
      case $pid in
        ''|*[!0-9]*) ;;
        *) user=$(ps -o user= -p "$pid" 2>/dev/null | tr -d ' ')
           name=$(cat "$P/$pid/comm" 2>/dev/null)
           ppid=$(pstatus "$pid" PPid)
           case $ppid in
             ''|0|*[!0-9]*) ;;
             *) uids=$(pstatus "$ppid" Uid | cut -d ' ' -f 1,2)
                [ -n "$uids" ] && kv smi_parent "$pid $uids $(cat "$P/$ppid/comm" 2>/dev/null)" ;;
           esac ;;
      esac
      kv smi_app "$bus,$pid,$user,$used,$name"
    done
  else
    kv smi_error "nvidia-smi --query-compute-apps=$SMI_APPS --format=csv,noheader,nounits: $(why "$out")"
  fi
  # XID errors (seconds since boot, bus, code) and when the driver loaded, where the kernel log is readable
  # (dmesg_restrict may hide it from this user); doctor fails a fatal one only when it is newer than the load.
  # Only what the NVIDIA module printed: `NVRM: ` opening the message, right after the kernel's own prefix (the
  # time, `[ 1234.567890]`; a caller, `[    T123]` or `[ C2]`, under CONFIG_PRINTK_CALLER; both; or neither), never
  # anywhere in a line: a segfault line opens with the process's name (any user's, 15 characters: too short for
  # `NVRM: Xid (PCI:` and a bus) and ends with a file's name (any length). A bus is hex digits, colons and dots.
  # A file's name may hold a line feed: util-linux's dmesg, reading /dev/kmsg, indents a record's further lines, but
  # through syslog(2) (busybox's dmesg; util-linux's where /dev/kmsg cannot be opened, as in a container) each gets
  # the record's own prefix: there a line with the prefix of the line before it is not read (a record of the module
  # printed in the same microsecond as the one before it is missed there; without a prefix none can be told).
  if log=$(dmesg 2>/dev/null); then
    echo "xid_readable=1"
    case $(dmesg --version 2>/dev/null) in *util-linux*) [ -r /dev/kmsg ] && syslog=0 || syslog=1 ;; *) syslog=1 ;; esac
    found=$(printf '%s\n' "$log" | awk -v syslog="$syslog" '
      { p = "" }
      match($0, /^(\[ *[0-9]+\.[0-9]+\]( ?\[ *[TC][0-9]+\])? |\[ *[TC][0-9]+\] )/) { p = substr($0, 1, RLENGTH) }
      { seen = last; last = p; if (syslog == 1 && p != "" && p == seen) next
        m = substr($0, length(p) + 1); t = "-"
        if (p ~ /^\[ *[0-9]/) { t = p; sub(/^\[ */, "", t); sub(/\].*/, "", t) } }
      m ~ /^NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): [0-9]/ {
        bus = m; sub(/^NVRM: Xid \(PCI:/, "", bus); code = bus; sub(/\).*/, "", bus)
        sub(/^[^)]*\): /, "", code); sub(/[^0-9].*/, "", code); print "xid " t " " bus " " code }
      m ~ /^NVRM: loading NVIDIA UNIX/ && t != "-" { print "load " t }')
    kvl xid "$(printf '%s\n' "$found" | sed -n 's/^xid //p' | tail -n 200)"
    kv driver_loaded "$(printf '%s\n' "$found" | sed -n 's/^load //p' | tail -n 1)"
  fi
  kv uptime "$(cut -d ' ' -f 1 /proc/uptime 2>/dev/null)"
  # NVSwitch systems: the fabric manager must run, and NVML tells its result only on Hopper and later (an HGX
  # A100 says N/A): the switches the driver lists, and whether the manager runs: systemd's word, else its process
  # (a manager outside systemd, as NVIDIA's GPU Operator runs it in its driver container, is `inactive` to systemd)
  n=0
  for s in "$P"/driver/nvidia-nvswitch/devices/*; do [ -e "$s" ] && n=$((n + 1)); done
  if [ "$n" = 0 ]; then for s in /dev/nvidia-nvswitch[0-9]*; do [ -e "$s" ] && n=$((n + 1)); done; fi
  kv nvswitches "$n"
  if [ "$n" -gt 0 ]; then
    fm=$(systemctl is-active nvidia-fabricmanager 2>/dev/null)
    case $fm in
      active|activating) ;;
      # (pgrep matches the kernel's process name, cut to 15 characters: nv-fabricmanager's is nv-fabricmanage;
      # -x nv-fabricmanager never matches, and -f would match this script's own shell; any user can name a process
      # so: only root's counts)
      *) if command -v pgrep >/dev/null 2>&1 && roots nv-fabricmanage; then fm=running
         else case $fm in
           inactive|failed|deactivating) ;;
           *) if command -v pgrep >/dev/null 2>&1; then fm=stopped; else fm=; fi ;;
         esac; fi ;;
    esac
    kv fabric_manager "$fm"
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
  # what doctor compares with the image and judges the GPUs' health by (gpu/smi.py reads it);
  # a command that fails says so (smi_error=), it is never read as "nothing to report"
  [ "${DL_PROBE_GPU:-1}" = 0 ] || gpu_facts
else
  echo gpus=none
fi
echo "has_ip=$(command -v ip >/dev/null 2>&1 && echo 1 || echo 0)"
if [ -n "${2:-}" ]; then
  # one question for the image: its labels (line 1) and [Entrypoint, Cmd] (line 2: `up` refuses an empty command
  # with neither); JSON escapes every control character, so each is one line
  img=$(docker image inspect --format '{{json .Config.Labels}}{{"\n"}}[{{json .Config.Entrypoint}},{{json .Config.Cmd}}]' "$2" 2>/dev/null)
  kv image_labels "$(printf '%s\n' "$img" | sed -n 1p)"
  kv image_cmd "$(printf '%s\n' "$img" | sed -n 2p)"
fi
for d in /dev/nvidia*; do [ -c "$d" ] && kv gpu_dev "$d"; done
# One question to the engine (hosts may share one, and every call costs it): its version, the CDI spec
# directories it reads (none: CDI is off there; the field is missing before Docker 25) and its runtimes;
# not asked for a host that gets no GPUs (DL_PROBE_GPU=0)
[ "${DL_PROBE_GPU:-1}" = 0 ] || kv docker_info "$(docker info --format '{{json .}}' 2>/dev/null)"
# SELinux: an engine labels containers only on a kernel running SELinux (moby asks go-selinux, which needs
# selinuxfs mounted), and then says so in its SecurityOptions (name=selinux; a bare `selinux` before Docker 1.13).
# The mount point and the kernel's mode (enforce: 1 enforcing, 0 permissive); a host without selinuxfs asks its
# engine nothing more, and a host that gets no GPUs asks only for that list where selinuxfs is mounted.
# (DL_PROBE_MOUNTS: another mounts table, for tests)
sefs=$(awk '$3 == "selinuxfs" { print $2; exit }' "${DL_PROBE_MOUNTS:-/proc/mounts}" 2>/dev/null)
kv selinuxfs "$sefs"
if [ -n "$sefs" ]; then
  kv selinux_enforce "$(cat "$sefs/enforce" 2>/dev/null)"
  if [ "${DL_PROBE_GPU:-1}" = 0 ]; then
    kv security_options "$(docker info --format '{{json .SecurityOptions}}' 2>/dev/null)"
  fi
fi
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
