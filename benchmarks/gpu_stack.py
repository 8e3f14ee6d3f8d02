"""The checks behind `benchmarks/gpu_stack.sh`: does a built CUDA training image compute right on its GPUs?

Each step runs in its own process (a CUDA error poisons the rest of a process), prints one line per check --
PASS/FAIL/SKIP, the largest error against a reference and its tolerance, timings -- and exits 1 if a check
failed:

  versions  torch, CUDA, cuDNN, NCCL, TransformerEngine, flash-attn, apex, megatron-core; the GPUs torch sees
            (`gpu_stack: cuda devices N` is read by gpu_stack.sh)
  te        te.Linear bf16 fwd+bwd vs torch.nn.functional.linear on the same weights; the same under te.autocast
            with the DelayedScaling FP8 recipe (SKIP below compute capability 8.9)
  flash     flash_attn_func fwd+bwd (bf16, head dim 128, causal and not) vs softmax(QK^T/sqrt(d))V in fp32
  apex      apex.normalization.FusedLayerNorm (and FusedRMSNorm) vs torch.nn.LayerNorm (RMSNorm) in fp32
  tp        megatron-core tensor parallelism 2 (under `torchrun --nproc_per_node 2`): ColumnParallelLinear ->
            GELU -> RowParallelLinear, forward, backward and one SGD step vs the same computation unsharded
            on one device with the gathered weights

Error: max|x - ref| / max|ref| for each compared tensor (output, input grad, weight grads); a line names the
worst. Tolerances, set from CPU emulations (not yet from a GPU run): bf16 results 2e-2 (bf16 keeps 8 significant
bits; emulating flash-attn's bf16 roundings and bf16 GEMM outputs gives 2e-3..6e-3, a broken kernel ~1), FP8 0.125
(E4M3 forward, E5M2 gradients, per-tensor amax scales: emulated 0.04..0.06), fp32 tensor parallel 1e-4 (only the
summation order differs: 1e-6 on CPU). Timings: mean ms of fwd+bwd over 20 runs after two warm-up runs, by CUDA
events (the fp32 attention reference: 3 runs).

`--device cpu` runs the torch references and the megatron-core TP step (gloo) on CPU, at small sizes, to try this
file's own logic on a machine without a GPU; te, flash and apex need CUDA there.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata

import torch
import torch.nn.functional as F

TOL_BF16 = 2e-2
TOL_FP8 = 0.125
TOL_FP32 = 1e-4
ITERS = 20
DEV = "cuda"  # --device


def small() -> bool:
    return DEV == "cpu"


# ------------------------------------------------------------------ reporting


class Report:
    def __init__(self) -> None:
        self.failed = False
        self.emit = True  # only rank 0 prints in the tp step

    def line(self, text: str) -> None:
        if self.emit:
            print(text, flush=True)

    def check(self, name: str, errs: dict[str, float], tol: float, timing: str = "") -> bool:
        """PASS when every error is finite and <= tol; the line shows the worst."""
        worst = max(errs, key=lambda k: errs[k] if math.isfinite(errs[k]) else math.inf)
        ok = all(math.isfinite(e) and e <= tol for e in errs.values())
        self.failed |= not ok
        self.line(f"{'PASS' if ok else 'FAIL'} {name}: max_err {errs[worst]:.2e} ({worst}) "
                  f"{'<=' if ok else '>'} tol {tol:.0e}" + (f" | {timing}" if timing else ""))
        return ok

    def skip(self, name: str, why: str) -> None:
        self.line(f"SKIP {name}: {why}")

    def fail(self, name: str, why: str) -> None:
        self.failed = True
        self.line(f"FAIL {name}: {why}")

    @contextlib.contextmanager
    def guard(self, name: str):
        """A check that raises is a FAIL line (the traceback goes to stderr); the step goes on."""
        try:
            yield
        except Exception as e:  # every failure of a check is its verdict
            traceback.print_exc(file=sys.stderr)
            msg = str(e).strip().splitlines()
            self.fail(name, f"{type(e).__name__}: {msg[0] if msg else ''}"[:300])


def err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|; inf for a NaN, a missing tensor or a shape mismatch."""
    if out is None or ref is None or out.shape != ref.shape:
        return math.inf
    o, r = out.detach().float(), ref.detach().float()
    d = (o - r).abs().max().item()
    if not math.isfinite(d):
        return math.inf
    return d / max(r.abs().max().item(), 1e-30)


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], iters: int | None = None) -> float:
    """Mean milliseconds of fn over `iters` runs after two warm-up runs."""
    iters = iters or (2 if small() else ITERS)
    for _ in range(2):
        fn()
    sync()
    if DEV == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1000 / iters


def randn(*shape: int, gen: torch.Generator, dtype=torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """The same numbers on every device and every rank: drawn on the CPU from a seeded generator."""
    return (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)


def leaf(t: torch.Tensor, dtype=None) -> torch.Tensor:
    return t.detach().to(dtype or t.dtype).clone().requires_grad_()


def capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if DEV == "cuda" else None


# ------------------------------------------------------------------ versions


def dist_version(*names: str) -> str:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def step_versions(rep: Report) -> None:
    cuda = torch.version.cuda or "none (CPU build)"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    rep.line(f"python {sys.version.split()[0]}; torch {torch.__version__} (CUDA {cuda}, cuDNN {cudnn}, NCCL {nccl})")
    rep.line(f"transformer-engine {dist_version('transformer_engine')} "
             f"(transformer-engine-torch {dist_version('transformer_engine_torch')}); "
             f"flash-attn {dist_version('flash_attn', 'flash-attn')}; apex {dist_version('apex')}; "
             f"megatron-core {dist_version('megatron_core', 'megatron-core')}")
    n = torch.cuda.device_count() if DEV == "cuda" else 0
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        rep.line(f"cuda:{i} {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    rep.line(f"gpu_stack: cuda devices {n}")
    if DEV == "cuda" and n == 0:
        rep.fail("torch.cuda", "no CUDA device visible to torch (driver, --gpus, CUDA_VISIBLE_DEVICES?)")


# ------------------------------------------------------------------ TransformerEngine


def step_te(rep: Report) -> None:
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    m, k, n = (256, 256, 256) if small() else (8192, 4096, 4096)
    shape = f"M={m} K={k} N={n}"
    gen = torch.Generator().manual_seed(0)
    x = randn(m, k, gen=gen)
    w = randn(n, k, gen=gen, scale=k ** -0.5)  # y ~ N(0, 1)
    b = randn(n, gen=gen, scale=0.1)
    dy = randn(m, n, gen=gen)

    # the reference: torch.nn.functional.linear in bf16 on the same tensors
    xr, wr, br = leaf(x), leaf(w), leaf(b)
    yr = F.linear(xr, wr, br)
    yr.backward(dy)
    ref = {"y": yr, "dx": xr.grad, "dW": wr.grad, "db": br.grad}
    ref = {key: t.detach().clone() for key, t in ref.items()}  # torch_step below accumulates into wr.grad

    lin = te.Linear(k, n, bias=True, params_dtype=torch.bfloat16, device=DEV)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)

    def run(ctx: Callable[[], contextlib.AbstractContextManager]) -> dict[str, torch.Tensor]:
        xt = leaf(x)
        lin.zero_grad(set_to_none=True)
        with ctx():
            y = lin(xt)
        y.backward(dy)
        return {"y": y, "dx": xt.grad, "dW": lin.weight.grad, "db": lin.bias.grad}

    def torch_step() -> None:
        xt = leaf(x)
        F.linear(xt, wr, br).backward(dy)

    flops = 6 * m * k * n
    t_ref = timed(torch_step)

    name = "transformer_engine te.Linear bf16 fwd+bwd vs torch F.linear bf16"
    with rep.guard(name):
        got = run(contextlib.nullcontext)
        t = timed(lambda: run(contextlib.nullcontext))
        rep.check(name, {key: err(got[key], ref[key]) for key in ref}, TOL_BF16,
                  f"te {t:.3f} ms ({flops / t / 1e9:.0f} TFLOPS), torch {t_ref:.3f} ms, {shape}")

    name = "transformer_engine te.Linear fp8 (DelayedScaling, HYBRID) fwd+bwd vs torch F.linear bf16"
    cc = capability()
    if cc is None or cc < (8, 9):
        why = "no GPU" if cc is None else f"compute capability {cc[0]}.{cc[1]} < 8.9"
        rep.skip(name, f"{why}: FP8 needs Ada (8.9) or Hopper (9.0) and newer")
        return
    with rep.guard(name):
        ok, reason = te.is_fp8_available(return_reason=True)
        if not ok:
            rep.fail(name, f"TransformerEngine says FP8 is not available on compute capability "
                           f"{cc[0]}.{cc[1]}: {reason}")
            return
        recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")

        def fp8() -> contextlib.AbstractContextManager:
            if hasattr(te, "autocast"):  # TE >= 2.9; te.fp8_autocast is its deprecated alias there
                return te.autocast(enabled=True, recipe=recipe)
            return te.fp8_autocast(enabled=True, fp8_recipe=recipe)

        for _ in range(3):  # delayed scaling: the scales come from the amax of earlier steps
            run(fp8)
        got = run(fp8)
        t = timed(lambda: run(fp8))
        rep.check(name, {key: err(got[key], ref[key]) for key in ref}, TOL_FP8,
                  f"te fp8 {t:.3f} ms ({flops / t / 1e9:.0f} TFLOPS), torch bf16 {t_ref:.3f} ms, {shape}")


# ------------------------------------------------------------------ flash-attn


def attention_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V in fp32; (batch, seq, heads, dim) like flash_attn_func; causal: key j <= query i."""
    q, k, v = q.float(), k.float(), v.float()
    scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)


def step_flash(rep: Report) -> None:
    from flash_attn import flash_attn_func

    cc = capability()
    if cc is not None and cc < (8, 0):
        rep.skip("flash-attn", f"compute capability {cc[0]}.{cc[1]} < 8.0: FlashAttention-2 needs Ampere and newer")
        return
    for causal in (False, True):
        name = f"flash-attn flash_attn_func bf16 {'causal' if causal else 'full'} fwd+bwd vs fp32 attention"
        with rep.guard(name):
            flash_one(rep, name, flash_attn_func, causal)


def flash_one(rep: Report, name: str, flash_attn_func: Callable, causal: bool) -> None:
    b, s, h, d = (1, 256, 2, 128) if small() else (2, 2048, 16, 128)
    gen = torch.Generator().manual_seed(1)
    q, k, v, do = (randn(b, s, h, d, gen=gen) for _ in range(4))
    qr, kr, vr = (leaf(t, torch.float32) for t in (q, k, v))
    out_r = attention_fp32(qr, kr, vr, causal)
    out_r.backward(do.float())
    ref = {"out": out_r, "dq": qr.grad, "dk": kr.grad, "dv": vr.grad}

    def run() -> dict[str, torch.Tensor]:
        qt, kt, vt = leaf(q), leaf(k), leaf(v)
        out = flash_attn_func(qt, kt, vt, causal=causal)
        out.backward(do)
        return {"out": out, "dq": qt.grad, "dk": kt.grad, "dv": vt.grad}

    def run_ref() -> None:
        qt, kt, vt = (leaf(t, torch.float32) for t in (q, k, v))
        attention_fp32(qt, kt, vt, causal).backward(do.float())

    got = run()
    t, t_ref = timed(run), timed(run_ref, iters=3)
    flops = 4 * b * s * s * h * d * 3.5 / (2 if causal else 1)  # forward 4 b s^2 h d, backward 2.5x that
    rep.check(name, {key: err(got[key], ref[key]) for key in ref}, TOL_BF16,
              f"flash {t:.3f} ms ({flops / t / 1e9:.0f} TFLOPS), fp32 reference {t_ref:.3f} ms, "
              f"batch {b} seq {s} heads {h} dim {d}")


# ------------------------------------------------------------------ apex


def step_apex(rep: Report) -> None:
    import apex.normalization as an

    for cls_name, torch_name, has_bias in (("FusedLayerNorm", "LayerNorm", True), ("FusedRMSNorm", "RMSNorm", False)):
        name = f"apex.normalization.{cls_name} bf16 fwd+bwd vs torch.nn.{torch_name} fp32"
        if not hasattr(an, cls_name):
            rep.skip(name, f"this apex has no {cls_name}")
        elif not hasattr(torch.nn, torch_name):
            rep.skip(name, f"this torch has no torch.nn.{torch_name}")
        else:
            with rep.guard(name):
                norm_one(rep, name, getattr(an, cls_name), getattr(torch.nn, torch_name), has_bias)


def norm_one(rep: Report, name: str, fused_cls: type, torch_cls: type, has_bias: bool) -> None:
    rows, hidden = (256, 512) if small() else (8192, 4096)
    gen = torch.Generator().manual_seed(2)
    x, dy = randn(rows, hidden, gen=gen), randn(rows, hidden, gen=gen)
    gamma = 1 + randn(hidden, gen=gen, scale=0.1)
    beta = randn(hidden, gen=gen, scale=0.1)

    def build(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        module = module.to(DEV, dtype)
        with torch.no_grad():
            module.weight.copy_(gamma)
            if has_bias:
                module.bias.copy_(beta)
        return module

    def run(module: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        module.zero_grad(set_to_none=True)
        xt = leaf(x, dtype)
        y = module(xt)
        y.backward(dy.to(dtype))
        got = {"y": y, "dx": xt.grad, "dgamma": module.weight.grad}
        if has_bias:
            got["dbeta"] = module.bias.grad
        return got

    ref = run(build(torch_cls(hidden, eps=1e-5), torch.float32), torch.float32)
    fused, torch_bf16 = build(fused_cls(hidden, eps=1e-5), torch.bfloat16), build(torch_cls(hidden, eps=1e-5),
                                                                                    torch.bfloat16)
    got = run(fused)
    t, t_ref = timed(lambda: run(fused)), timed(lambda: run(torch_bf16))
    rep.check(name, {key: err(got[key], ref[key]) for key in ref}, TOL_BF16,
              f"apex {t:.3f} ms, torch bf16 {t_ref:.3f} ms, {rows} x {hidden}")


# ------------------------------------------------------------------ megatron-core tensor parallel


def step_tp(rep: Report) -> None:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what megatron-core asks for with TP overlap
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, model_parallel_cuda_manual_seed
    from megatron.core.utils import init_method_normal

    tp = 2
    cuda = DEV == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rep.emit = rank == 0
    name = "megatron-core TP=2 ColumnParallelLinear+GELU+RowParallelLinear fp32 vs unsharded"
    try:
        if world != tp:
            rep.fail(name, f"needs exactly {tp} processes (torchrun --nproc_per_node {tp}), got {world}")
            return
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        group = parallel_state.get_tensor_model_parallel_group()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        if cuda:
            model_parallel_cuda_manual_seed(1234)  # a different stream per TP rank: each initializes its own shard
        else:
            torch.manual_seed(1234)  # CPU initialization draws the full matrix and keeps this rank's part
        seq, batch, hidden, ffn = (16, 2, 64, 256) if small() else (512, 8, 4096, 16384)
        shape = f"seq {seq} batch {batch} hidden {hidden} ffn {ffn}"
        config = ModelParallelConfig(tensor_model_parallel_size=tp, params_dtype=torch.float32,
                                     use_cpu_initialization=not cuda)
        init = init_method_normal(0.02)
        col = ColumnParallelLinear(hidden, ffn, config=config, init_method=init, bias=True, gather_output=False)
        row = RowParallelLinear(ffn, hidden, config=config, init_method=init, bias=True, input_is_parallel=True,
                                skip_bias_add=False)
        if not cuda:
            col, row = col.to(DEV), row.to(DEV)
        part = slice(tp_rank * ffn // tp, (tp_rank + 1) * ffn // tp)
        gen = torch.Generator().manual_seed(3)
        b1, b2 = randn(ffn, gen=gen, dtype=torch.float32, scale=0.1), randn(hidden, gen=gen, dtype=torch.float32,
                                                                              scale=0.1)
        with torch.no_grad():  # megatron zeroes biases; give them values so their path is checked too
            col.bias.copy_(b1[part])
            row.bias.copy_(b2)
        x = randn(seq, batch, hidden, gen=gen, dtype=torch.float32)
        target = randn(seq, batch, hidden, gen=gen, dtype=torch.float32)

        def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t.detach().contiguous(), group=group)
            return torch.cat(parts, dim)

        # the unsharded reference, on this rank's device, from the gathered shards
        w1, w2 = gather(col.weight, 0), gather(row.weight, 1)
        ref_params = [leaf(w1), leaf(b1), leaf(w2), leaf(b2)]
        tp_params = [col.weight, col.bias, row.weight, row.bias]
        shard_of = [lambda t: t[part], lambda t: t[part], lambda t: t[:, part], lambda t: t]

        def tp_forward(inp: torch.Tensor) -> torch.Tensor:
            h, _ = col(inp)
            return row(F.gelu(h))[0]

        def ref_forward(inp: torch.Tensor) -> torch.Tensor:
            w1r, b1r, w2r, b2r = ref_params
            return F.linear(F.gelu(F.linear(inp, w1r, b1r)), w2r, b2r)

        def loss_of(y: torch.Tensor) -> torch.Tensor:
            return ((y - target) ** 2).sum() / (seq * batch)

        xt, xr = leaf(x), leaf(x)
        y, yr = tp_forward(xt), ref_forward(xr)
        loss, loss_r = loss_of(y), loss_of(yr)
        loss.backward()
        loss_r.backward()
        fwd = {"y": err(y, yr), "loss": err(loss, loss_r)}
        bwd = {"dx": err(xt.grad, xr.grad)}
        for key, p, r, sh in zip(("dW1", "db1", "dW2", "db2"), tp_params, ref_params, shard_of):
            bwd[key] = err(p.grad, sh(r.grad))

        before = [p.detach().clone() for p in tp_params]
        before_r = [p.detach().clone() for p in ref_params]
        # SGD: the update is linear in the gradient. (Adam's first step, lr * g / (|g| + eps), turns the 1e-9 noise
        # of a gradient near eps into a 1e-3 difference of the update: it compares nothing but that noise.)
        torch.optim.SGD(tp_params, lr=0.1, momentum=0.9).step()
        torch.optim.SGD(ref_params, lr=0.1, momentum=0.9).step()
        step = {}
        for key, p, p0, r, r0, sh in zip(("W1", "b1", "W2", "b2"), tp_params, before, ref_params, before_r,
                                         shard_of):
            step["update " + key] = err(p.detach() - p0, sh(r.detach() - r0))
        with torch.no_grad():
            step["y after"] = err(tp_forward(x), ref_forward(x))

        # every rank compared its own shards: the verdict is the worst of both
        results = [fwd, bwd, step]
        flat = torch.tensor([v if math.isfinite(v) else math.inf for r in results for v in r.values()],
                            dtype=torch.float64, device=DEV)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX)
        worst = iter(flat.tolist())
        results = [{key: next(worst) for key in r} for r in results]

        def tp_step() -> None:
            tp_forward(leaf(x)).sum().backward()

        def ref_step() -> None:
            ref_forward(leaf(x)).sum().backward()

        t_tp, t_ref = timed(tp_step), timed(ref_step)
        rep.check(f"{name}: forward", results[0], TOL_FP32, shape)
        rep.check(f"{name}: backward", results[1], TOL_FP32,
                  f"fwd+bwd TP=2 {t_tp:.3f} ms, unsharded on 1 device {t_ref:.3f} ms")
        rep.check(f"{name}: SGD step", results[2], TOL_FP32)
        failed = torch.tensor([1.0 if rep.failed else 0.0], device=DEV)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        rep.failed = bool(failed.item())
    finally:
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


# ------------------------------------------------------------------ main

STEPS: dict[str, Callable[[Report], None]] = {
    "versions": step_versions, "te": step_te, "flash": step_flash, "apex": step_apex, "tp": step_tp,
}


def main(argv: list[str] | None = None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=list(STEPS))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: try the references and the TP step on CPU (small sizes, gloo)")
    args = ap.parse_args(argv)
    DEV = args.device
    torch.set_float32_matmul_precision("highest")  # fp32 references and the fp32 TP check: no TF32
    rep = Report()
    with rep.guard(args.step):
        STEPS[args.step](rep)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
