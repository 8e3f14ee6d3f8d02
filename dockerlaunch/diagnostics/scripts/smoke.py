"""The smoke run of `doctor --smoke` / `up --smoke`: the job's image on every host's GPUs, for real, in about a
minute (run by torchrun, one rank per GPU; standard library + torch, the rest where the image has it).

Each rank prints one `DLSMOKE {json}` line per step: a bf16 matmul (TFLOP/s; fp32 GFLOP/s on CPU), TE's Linear
forward and backward, flash-attn's forward, apex's fused LayerNorm -- each against a torch reference computed in
fp32 -- and an all_reduce within its host and across all hosts (correct sums, bus bandwidth). On a machine without
GPUs the same script runs its CPU path (gloo); `--dry-run` prints what it would run on GPUs, without torch.

The launcher (diagnostics/smoke.py) judges the lines: a wrong result or an error is a FAIL naming the rank, host
and GPU; a GPU or host slower than the median of its peers by more than 20% is named as a straggler.
"""

import json
import os
import socket
import sys
import time
import traceback

MARK = "DLSMOKE "
TOL_BF16 = 2e-2  # bf16 keeps 8 significant bits: a right kernel is ~1e-3..6e-3 off an fp32 reference, a broken ~1
TOL_FP32 = 1e-4
MIN_SECONDS = 1.0  # each rank's own timed step runs at least this long (and at least 3 times): one number per rank
ALLREDUCE_ITERS = 20

GPU_STEPS = [
    ("matmul", "bf16 8192x8192 @ 8192x8192, timed for 1 s; a 256x256 block against fp32", "TFLOP/s"),
    ("te linear", "transformer_engine.pytorch.Linear 4096->4096 bf16, forward + backward vs F.linear on the same "
                  "weights (output and input grad)", "ms"),
    ("flash-attn", "flash_attn_func b=2 s=2048 h=16 d=128 bf16 causal vs softmax(QK^T/sqrt(d))V in fp32", "ms"),
    ("apex norm", "apex.normalization.FusedLayerNorm(8192) bf16 vs F.layer_norm in fp32", "ms"),
    ("all_reduce host", "NCCL all_reduce of 256 MiB among the GPUs of each host, sums checked", "GB/s"),
    ("all_reduce world", "NCCL all_reduce of 256 MiB among all GPUs, sums checked", "GB/s"),
]


def emit(**kw):
    print(MARK + json.dumps(kw), flush=True)


def err(out, ref):
    """max|out - ref| / max|ref| (both as fp32)."""
    out, ref = out.float(), ref.float()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


class Ctx:
    def __init__(self, torch, dist, device):
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.host = socket.gethostname()
        self.gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def timed(self, fn):
        """(seconds per call, calls): at least 3 calls and MIN_SECONDS after one warm-up."""
        fn()
        self.sync()
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if n >= 3:
                self.sync()
                if time.perf_counter() - t0 >= MIN_SECONDS:
                    break
        return (time.perf_counter() - t0) / n, n

    def step(self, name, fn):
        base = {"kind": "step", "step": name, "rank": self.rank, "local_rank": self.local, "host": self.host,
                "gpu": self.gpu}
        try:
            out = fn()
        except ImportError as e:
            emit(**base, ok=True, skip=f"not in the image ({e.name or e})")
            return
        except Exception as e:  # noqa: BLE001 - every failure is a row, and the next step still runs
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            emit(**base, ok=False, error=last[:400])
            return
        emit(**base, **out)


def matmul(c):
    torch = c.torch
    gpu = c.device.type == "cuda"
    n = 8192 if gpu else 384
    dtype = torch.bfloat16 if gpu else torch.float32
    g = torch.Generator(device=c.device).manual_seed(c.rank)
    a = torch.randn(n, n, device=c.device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=c.device, dtype=dtype, generator=g)
    per, _ = c.timed(lambda: a @ b)
    ref = a[:256].double() @ b[:, :256].double()
    e = err((a @ b)[:256, :256], ref)
    tol = TOL_BF16 if gpu else TOL_FP32
    flops = 2 * n ** 3 / per
    return {"ok": e <= tol, "value": round(flops / (1e12 if gpu else 1e9), 3), "unit": "TFLOP/s" if gpu else "GFLOP/s",
            "err": e, "tol": tol}


def needs_gpu(c, module):
    __import__(module)  # ImportError: not in the image (a SKIP)
    if c.device.type != "cuda":
        raise RuntimeError("needs a GPU")


def te_linear(c):
    torch = c.torch
    needs_gpu(c, "transformer_engine.pytorch")
    import torch.nn.functional as F
    import transformer_engine.pytorch as te

    layer = te.Linear(4096, 4096, bias=True, params_dtype=torch.bfloat16).to(c.device)
    x = torch.randn(2048, 4096, device=c.device, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().sum().backward()
    xr = x.detach().float().requires_grad_()
    yr = F.linear(xr, layer.weight.detach().float(), layer.bias.detach().float())
    yr.sum().backward()
    e = max(err(y, yr), err(x.grad, xr.grad))
    per, _ = c.timed(lambda: layer(x).sum().backward())
    return {"ok": e <= TOL_BF16, "value": round(per * 1e3, 3), "unit": "ms", "err": e, "tol": TOL_BF16}


def flash(c):
    torch = c.torch
    needs_gpu(c, "flash_attn")
    from flash_attn import flash_attn_func

    q, k, v = (torch.randn(2, 2048, 16, 128, device=c.device, dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) / 128 ** 0.5
    s = s.masked_fill(torch.ones(2048, 2048, device=c.device, dtype=torch.bool).triu(1), float("-inf"))
    ref = (s.softmax(-1) @ vf).transpose(1, 2)
    e = err(out, ref)
    per, _ = c.timed(lambda: flash_attn_func(q, k, v, causal=True))
    return {"ok": e <= TOL_BF16, "value": round(per * 1e3, 3), "unit": "ms", "err": e, "tol": TOL_BF16}


def apex_norm(c):
    torch = c.torch
    needs_gpu(c, "apex.normalization")
    import torch.nn.functional as F
    from apex.normalization import FusedLayerNorm

    norm = FusedLayerNorm(8192).to(c.device, torch.bfloat16)
    x = torch.randn(4096, 8192, device=c.device, dtype=torch.bfloat16)
    out = norm(x)
    ref = F.layer_norm(x.float(), (8192,), norm.weight.float(), norm.bias.float(), norm.eps)
    e = err(out, ref)
    per, _ = c.timed(lambda: norm(x))
    return {"ok": e <= TOL_BF16, "value": round(per * 1e3, 3), "unit": "ms", "err": e, "tol": TOL_BF16}


def all_reduce(c, group, size, members):
    torch, dist = c.torch, c.dist
    n = size // 4
    x = torch.empty(n, device=c.device, dtype=torch.float32)

    def once():
        x.fill_(c.rank + 1)
        dist.all_reduce(x, group=group)

    once()
    c.sync()
    want = float(sum(r + 1 for r in members))
    got = float(x[0]), float(x[-1])
    ok = all(abs(v - want) <= 1e-3 * want for v in got)
    # a collective runs the same number of times on every rank (a rank that stopped on its own clock would leave
    # the others waiting in the next call)
    iters = ALLREDUCE_ITERS if c.device.type == "cuda" else 5
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    c.sync()
    per = (time.perf_counter() - t0) / iters
    k = len(members)
    busbw = size / per * (2 * (k - 1) / k) / 1e9 if k > 1 else 0.0
    return {"ok": ok, "value": round(busbw, 3), "unit": "GB/s", "members": k,
            **({} if ok else {"error": f"all_reduce sums {got}, expected {want} on every element"})}


def dry_run():
    print("smoke: on each GPU (one rank per GPU, under torchrun), against fp32 references:")
    for name, what, unit in GPU_STEPS:
        print(f"  {name:<16} {what} [{unit}]")
    print(f"  a wrong result (error above {TOL_BF16} relative) or an exception: FAIL; slower than the median of "
          "its peers by more than 20%: straggler")


def main():
    if "--dry-run" in sys.argv:
        dry_run()
        return 0
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and os.environ.get("DL_SMOKE_DEVICE", "") != "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    c = Ctx(torch, dist, device)
    if c.rank == 0:
        emit(kind="header", world=c.world, backend=dist.get_backend(), torch=torch.__version__,
             cuda=torch.version.cuda, device="cuda" if cuda else "cpu")
    c.step("matmul", lambda: matmul(c))
    c.step("te linear", lambda: te_linear(c))
    c.step("flash-attn", lambda: flash(c))
    c.step("apex norm", lambda: apex_norm(c))
    hosts = [None] * c.world
    dist.all_gather_object(hosts, c.host)
    size = (256 << 20) if cuda else (8 << 20)
    groups = {}
    for h in dict.fromkeys(hosts):  # every rank makes every group, in the same order
        members = [r for r, x in enumerate(hosts) if x == h]
        groups[h] = (dist.new_group(members), members)
    group, members = groups[c.host]
    if len(members) > 1:
        c.step("all_reduce host", lambda: all_reduce(c, group, size, members))
    c.step("all_reduce world", lambda: all_reduce(c, None, size, list(range(c.world))))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
