#!/usr/bin/env bash
# Proves that a built CUDA training image computes right on this host's GPUs. Each check runs against a reference
# and prints one line: PASS/FAIL/SKIP, its largest error against its tolerance, timings (benchmarks/gpu_stack.py
# holds the checks and says how errors and tolerances are defined):
#   versions  nvidia-smi (name, compute capability, driver), then torch/CUDA/NCCL, TransformerEngine, flash-attn,
#             apex, megatron-core as the image has them
#   te        te.Linear bf16 fwd+bwd vs torch F.linear; the same under FP8 (DelayedScaling; SKIP below sm 8.9)
#   flash     flash_attn_func fwd+bwd, bf16, head dim 128, causal and not, vs attention in fp32
#   apex      apex FusedLayerNorm / FusedRMSNorm fwd+bwd vs torch.nn.LayerNorm / RMSNorm in fp32
#   tp        megatron-core tensor parallel 2 (torchrun, 2 processes): Column+RowParallelLinear forward, backward
#             and an optimizer step vs the same unsharded on one GPU (SKIP with fewer than 2 GPUs)
# Each step is its own `docker run --rm --gpus all --network host --ipc host` (a CUDA error poisons the rest of
# a process), with benchmarks/gpu_stack.py mounted read-only. `--gpus all` needs the NVIDIA Container Toolkit on
# the host; without it, start the image another way (e.g. `dockerlaunch up`) and run this script with --local
# inside. --ipc host and no --shm-size: with the host's IPC namespace a shm size has no effect.
#
# usage: benchmarks/gpu_stack.sh [--dry-run] [--local] [--image IMAGE] [--gpus N]
#   --image IMAGE  the image to check; default: the recommended stack's tag, what
#                  `dockerlaunch build --stack swift4.6-mcore0.19-cu13-py313` makes
#   --gpus N       GPUs to count on (TP=2 needs 2); default: as many as torch sees in the image
#   --local        run the checks here (in a container that has the stack), not through docker run
#   --dry-run      print the commands it would run and compile the Python part; needs neither docker nor a GPU
# env: GPU_STACK_TIMEOUT, seconds per step (default 900). Exit: 0 all PASS or SKIP, 1 a FAIL, 2 bad usage.
set -euo pipefail

usage="usage: benchmarks/gpu_stack.sh [--dry-run] [--local] [--image IMAGE] [--gpus N]"
bad_usage() {
  printf 'gpu_stack.sh: %s; %s\n' "$1" "$usage" >&2
  exit 2
}

image=dockerlaunch/train:cu130-py313-torch2.11.0-te2.16.1-mcore0.19.2-swift4.6.0
dry=0
local_run=0
gpus=
while [ "$#" -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --local) local_run=1 ;;
    --image | --gpus)
      if [ "$#" -lt 2 ] || [ -z "$2" ]; then bad_usage "$1 needs a value"; fi
      if [ "$1" = --image ]; then image=$2; else gpus=$2; fi
      shift ;;
    --image=*) image=${1#--image=} ;;
    --gpus=*) gpus=${1#--gpus=} ;;
    -h | --help) echo "$usage"; exit 0 ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
  shift
done
[ -n "$image" ] || bad_usage "--image needs a value"
case $gpus in
  '') ;;
  *[!0-9]*) bad_usage "--gpus needs a number, got '$gpus'" ;;
esac

here=$(cd "$(dirname "$0")/.." && pwd)
py=$here/benchmarks/gpu_stack.py
timeout_s=${GPU_STACK_TIMEOUT:-900}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "$local_run" = 1 ]; then
  script=$py
  prefix=()
else
  script=/gpu_stack/gpu_stack.py
  prefix=(docker run --rm --gpus all --network host --ipc host --ulimit memlock=-1 --ulimit stack=67108864
          --env PYTHONUNBUFFERED=1 --volume "$py:$script:ro" "$image")
fi
limit=(timeout --kill-after 30 "$timeout_s")

show() {  # a command as it can be pasted into a shell: plain words bare, the rest in single quotes
  local a line=+
  for a in "$@"; do
    case $a in
      '' | *[!A-Za-z0-9_./:=,+@%-]*) a="'${a//\'/\'\\\'\'}'" ;;
    esac
    line+=" $a"
  done
  printf '%s\n' "$line"
}

failed=0
step() {  # NAME COMMAND...: runs it, keeps its stdout in $tmp/NAME.out; a non-zero exit counts as failed
  local name=$1 rc=0
  shift
  show "$@"
  [ "$dry" = 0 ] || return 0
  "$@" | tee "$tmp/$name.out" || rc=$?
  if [ "$rc" != 0 ]; then
    failed=1
    if ! grep -q '^FAIL ' "$tmp/$name.out"; then
      echo "FAIL step $name: exited with status $rc$([ "$rc" != 124 ] || echo " (timed out: GPU_STACK_TIMEOUT=$timeout_s)")" \
        "(its stderr is above)" | tee -a "$tmp/$name.out"
    fi
  fi
}

if [ "$local_run" = 1 ]; then where="--local: this environment"; else where="image $image"; fi
echo "== gpu_stack: $where"
smi=(nvidia-smi "--query-gpu=name,compute_cap,driver_version" --format=csv)
show "${smi[@]}"
if [ "$dry" = 0 ]; then
  if command -v nvidia-smi >/dev/null; then "${smi[@]}" || failed=1; else echo "nvidia-smi: not found here"; fi
  if [ "$local_run" = 0 ] && ! command -v docker >/dev/null; then
    echo "gpu_stack.sh: docker not found (use --local inside a container that has the stack)" >&2
    exit 1
  fi
fi

for name in versions te flash apex; do
  step "$name" "${limit[@]}" ${prefix[@]+"${prefix[@]}"} python3 "$script" "$name"
done

tp=("${limit[@]}" ${prefix[@]+"${prefix[@]}"} torchrun --standalone --nproc_per_node 2 "$script" tp)
if [ "$dry" = 1 ]; then
  if [ -n "$gpus" ] && [ "$gpus" -lt 2 ]; then
    echo "# megatron-core TP=2 would be a SKIP line (--gpus $gpus); with 2 GPUs it runs:"
  else
    echo "# megatron-core TP=2 (runs when the versions step sees >= 2 GPUs or --gpus N >= 2, else a SKIP line):"
  fi
  show "${tp[@]}"
  PYTHONPYCACHEPREFIX=$tmp/pycache python3 -m py_compile "$py"
  echo "# dry run: python3 -m py_compile benchmarks/gpu_stack.py ok; nothing run"
  exit 0
fi
seen=$(sed -n 's/^gpu_stack: cuda devices \([0-9][0-9]*\)$/\1/p' "$tmp/versions.out" | tail -n 1)
n=${gpus:-${seen:-0}}
if [ "$n" -ge 2 ]; then
  step tp "${tp[@]}"
else
  echo "SKIP megatron-core TP=2: $n GPU(s) here, tensor parallelism 2 needs 2" | tee "$tmp/tp.out"
fi

cat "$tmp"/*.out > "$tmp/all"
count() { grep -c "^$1 " "$tmp/all" || true; }
fails=$(count FAIL)
echo "== gpu_stack: $(count PASS) PASS, $fails FAIL, $(count SKIP) SKIP; $where"
if [ "$failed" != 0 ] || [ "$fails" != 0 ]; then exit 1; fi
