#!/usr/bin/env bash
# GPUs for real, through dockerlaunch itself, on any machine with >= 2 NVIDIA GPUs and a Docker engine
# (no registry, no SSH: every "host" is `local`). Prints what benchmarks/RESULTS.md records:
#   - NCCL all_reduce busbw (256 MiB, commtest.py): bare torchrun vs `dockerlaunch commtest` with one container x
#     all GPUs, two "hosts" x 1 GPU, and two "hosts" with private IPC namespaces (the silent NET/Socket fallback);
#   - `dockerlaunch doctor` (which GPU access mode `auto` picked), the transport lines and warnings;
#   - a megatron-core tiny GPT trained with tensor parallelism over two "hosts" x 1 GPU (`dockerlaunch up`);
#   - `dockerlaunch dump` of an NCCL job where one rank sleeps (py-spy, flight recorder, fr_trace, nvidia-smi).
# usage: benchmarks/gpu_e2e.sh OUT_DIR [IMAGE]
#   IMAGE: a job image with torch (+ megatron-core for the GPT run). Without one, an almost empty root is
#   `docker import`ed and the host's /usr, /opt and /etc are mounted read-only into it (the machine's own torch);
#   set PY_PREFIX to the host's Python environment (default: the folder of `python3`).
set -u
out=$(mkdir -p "${1:?usage: gpu_e2e.sh OUT_DIR [IMAGE]}" && cd "$1" && pwd)
image=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
dl() { python3 -m dockerlaunch "$@"; }
size=268435456
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
echo "GPUs: $ngpu; $(python3 -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version())')"

echo "== bare: torchrun, $ngpu processes"
torchrun --standalone --nproc-per-node "$ngpu" dockerlaunch/diagnostics/scripts/commtest.py $size $size 20 \
  > "$out/bare.txt" 2>&1
grep DLCOMMTEST "$out/bare.txt" | tail -1

extra=()
if [ -z "$image" ]; then
  py=$(command -v python3)
  bindir=${PY_PREFIX:-$(dirname "$py")}
  root=$(mktemp -d)
  mkdir -p "$root"/{sbin,tmp,proc,sys,dev,etc,usr,opt,run,root,var/tmp,home}
  ln -s usr/bin "$root/bin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
  chmod 1777 "$root/tmp" "$root/var/tmp"
  tar -C "$root" -c . | docker import - dockerlaunch/gpu-e2e:host >/dev/null
  image=dockerlaunch/gpu-e2e:host
  extra=(--mount /usr:/usr:ro --mount /opt:/opt:ro --mount /etc:/etc:ro --env "PATH=$bindir:/usr/bin:/bin")
  if [ -n "${PYTHONPATH:-}" ]; then
    for p in ${PYTHONPATH//:/ }; do extra+=(--mount "$p:$p:ro"); done
    extra+=(--env "PYTHONPATH=$PYTHONPATH")
  fi
fi
cfg() {  # NAME HOSTS_YAML [CONTAINER_YAML]
  printf 'hosts: %s\nimage: %s\ncontainer: {infiniband: "off"%s}\njob: {name: %s}\n' "$2" "$image" "${3:+, $3}" "$1" \
    > "$out/$1.yaml"
  echo "$out/$1.yaml"
}
one=$(cfg e2e-one '[local]')
two=$(cfg e2e-two '[{address: local, gpus: ["0"]}, {address: local, gpus: ["1"]}]')
cfg e2e-private '[{address: local, gpus: ["0"]}, {address: local, gpus: ["1"]}]' 'shm_size: 1g' >/dev/null

echo "== doctor (gpu_mode auto)"
dl doctor --config "$one" "${extra[@]}" 2>&1 | tee "$out/doctor.txt" | grep -E "gpus|route|doctor:"

for name in one two private; do
  c=$out/e2e-$name.yaml
  echo "== commtest: $name"
  dl commtest --config "$c" "${extra[@]}" --sizes 256M --iters 20 > "$out/commtest-$name.txt" 2>&1
  echo "exit $?"
  grep -E "commtest:|^ *256M|transport|WARN|FAIL|PASS|INFO" "$out/commtest-$name.txt"
done

echo "== megatron-core tiny GPT, tensor parallel 2 over two \"hosts\" x 1 GPU"
# shellcheck disable=SC2016 # expanded by the container's shell
dl up --config "$two" "${extra[@]}" --mount "$here/benchmarks:/e2e:ro" --skip-preflight --log-dir "$out/logs" -- \
  sh -c 'torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node 1 --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" /e2e/megatron_tiny_gpt.py' \
  > "$out/megatron.txt" 2>&1
echo "exit $?"
grep -E "iteration (1|2|30) loss|transport|WARN|succeeded|exited" "$out/megatron.txt"

echo "== dump of an NCCL job where rank 1 sleeps"
cat > "$out/hang.py" <<'PY'
import os, time
import torch
import torch.distributed as dist

def step(x):
    dist.all_reduce(x)
    torch.cuda.synchronize()

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    step(x)
print(f"ready {dist.get_rank()}", flush=True)
if dist.get_rank() == 1:
    time.sleep(600)
step(x)
PY
# shellcheck disable=SC2016 # expanded by the container's shell
dl up --config "$one" "${extra[@]}" --mount "$out:/hang:ro" --skip-preflight --detach -- \
  sh -c 'torchrun --nnodes 1 --nproc_per_node "$NPROC_PER_NODE" /hang/hang.py' > "$out/hang-up.txt" 2>&1
for _ in $(seq 60); do dl logs --config "$one" 2>/dev/null | grep -q "ready 0" && break; sleep 2; done
sleep 5
dl dump --config "$one" --out "$out/dump" > "$out/dump.txt" 2>&1
echo "exit $?"
cat "$out/dump.txt"
head -20 "$out/dump/fr_trace.txt" 2>/dev/null
dl transport --config "$one" 2>&1 | tee "$out/transport-hang.txt"
dl down --config "$one" >/dev/null 2>&1
echo "all done"
