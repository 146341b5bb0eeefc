"""Attention's backward kernels in Gluon for Hopper (kernels/attention/hopper_bwd.py: dk/dv and dq,
BwdConfig.gluon) on their own, with their blocks and stages free, against float64 and beside
kernels/attention/bwd.py's Triton `_bwd_dkdv` and `_bwd_dq` (delta stays). See hopper_bwd.py's
docstring for how they work; here the scope is the kernels' own: one length S a multiple of the
blocks, causal with square blocks in dk/dv.

    python -m lab.gluon_attention_bwd --check [--causal] [--shape B=4,H=16,S=4096,D=128,Hkv=16]
    python -m lab.gluon_attention_bwd --offline [--causal]     # compile for sm_90 without a GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch

from kcollect.kernels.attention.hopper import LOG2E, descriptors
from kcollect.kernels.attention.hopper_bwd import _dkdv, _dq
from lab.gluon_attention import reference64, shape_of


def dq(q, k, v, do, lse, delta, causal: bool = False, scale: float | None = None, block_m: int = 64,
       block_n: int = 64, stages: int = 2):
    """dq like q (see dkdv for lse and delta)."""
    B, S, H, D = q.shape
    if S % block_n or S % block_m or (causal and block_m % block_n) or H % k.shape[2] or not all(
            t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("the prototype takes contiguous tensors, S a multiple of the blocks, causal with query "
                         "blocks a multiple of the key blocks")
    out = torch.empty_like(q)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    q_desc, k_desc, v_desc, dq_desc = descriptors(q, k, v, out, block_m, block_n)
    do_desc = descriptors(do, k, v, do, block_m, block_n)[0]
    _dq[(S // block_m, B * H)](q_desc, k_desc, v_desc, do_desc, dq_desc, lse, delta, S, H, H // k.shape[2], scale,
                               scale * LOG2E, block_m, block_n, stages, causal, num_warps=4)
    return out


def dkdv(q, k, v, do, lse, delta, causal: bool = False, scale: float | None = None, block_n: int = 64,
         block_m: int = 64, stages: int = 2):
    """(dk, dv) like k, v, from lse and delta ([H, B * S] fp32: kcollect's forward's lse in log2
    units, and rowsum(o * do))."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    if S % block_n or S % block_m or (causal and block_m != block_n) or H % Hkv or not all(
            t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("the prototype takes contiguous tensors, S a multiple of the blocks, causal with square "
                         "blocks")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    q_desc, k_desc, v_desc, _ = descriptors(q, k, v, q, block_m, block_n)
    do_desc, dk_desc, dv_desc, _ = descriptors(do, dk, dv, do, block_m, block_n)
    _dkdv[(S // block_n, B * Hkv)](q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse, delta, S, Hkv, H // Hkv,
                                   scale, scale * LOG2E, block_n, block_m, stages, causal, num_warps=4)
    return dk, dv


def _offline(block_n, block_m, stages, causal, D=128):
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.compile_report import _TARGET, _resource_usage, specialise

    q = torch.empty(1, 4096, 16, D, dtype=torch.bfloat16)
    lse = torch.empty(16, 4096, dtype=torch.float32)
    q_desc, k_desc, v_desc, _ = descriptors(q, q, q, q, block_m, block_n)
    launches = {"dk/dv": (_dkdv, (q_desc, k_desc, v_desc, q_desc, k_desc, v_desc, lse, lse, 4096, 16, 1, 0.1, 0.1),
                          dict(BLOCK_N=block_n, BLOCK_M=block_m)),
                "dq": (_dq, (q_desc, k_desc, v_desc, q_desc, q_desc, lse, lse, 4096, 16, 1, 0.1, 0.1),
                       dict(BLOCK_M=block_m, BLOCK_N=block_n))}
    for name, (fn, args, blocks) in launches.items():
        sig, const, attrs, options = specialise(fn, args, dict(**blocks, STAGES=stages, CAUSAL=causal, num_warps=4))
        kern = triton.compile(GluonASTSource(fn, sig, const, attrs), target=_TARGET, options=options)
        usage = _resource_usage(kern.asm["cubin"])[0]
        ptx = kern.asm["ptx"]
        print(f"sm_90 {name}: block_n={block_n} block_m={block_m} stages={stages} causal={causal}: "
              f"{usage.get('REG')} registers, stack {usage.get('STACK', 0)}, shared {kern.metadata.shared} B, wgmma "
              f"{ptx.count('wgmma.mma_async')}, waits {ptx.count('wgmma.wait_group')}")


def _inputs(B, H, Hkv, S, D, causal, dtype):
    from kcollect.kernels.attention import attention_forward

    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = attention_forward(q, k, v, causal=causal)
    delta = (o.float() * do.float()).sum(-1).permute(2, 0, 1).reshape(H, B * S).contiguous()
    return q, k, v, do, lse, delta


def _check(B, H, Hkv, S, D, causal, dtype, **config) -> str:
    """dq, dk, dv against float64 autograd of softmax(q k^T / sqrt(D)) v: max error over max |grad|."""
    q, k, v, do, lse, delta = _inputs(B, H, Hkv, S, D, causal, dtype)
    dk, dv = dkdv(q, k, v, do, lse, delta, causal=causal, **config)
    dq_ = dq(q, k, v, do, lse, delta, causal=causal, **config)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    o = reference64(q64, k64, v64, causal)[1]
    grads = torch.autograd.grad(o, (q64, k64, v64), do.double())
    errs = [((g.double() - want).abs().max() / want.abs().max()).item() for g, want in zip((dq_, dk, dv), grads)]
    return (f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {str(dtype)[6:]}: dq error {errs[0]:.2e}, dk error "
            f"{errs[1]:.2e}, dv error {errs[2]:.2e}")


def _triton_kernel_ms(q, k, v, do, causal) -> dict:
    """The Triton backward's kernels, ms a call each (torch.profiler over 20 backward calls)."""
    from torch.profiler import ProfilerActivity, profile

    from kcollect.kernels.attention import attention_backward, attention_forward, pick_bwd

    o, lse = attention_forward(q, k, v, causal=causal)
    # the pick's Triton kernels (where it picks the Gluon ones, their tiles on the Triton kernels)
    config = dataclasses.replace(pick_bwd(q.shape[-1], causal, q.shape[1], q.device, q.shape[2] // k.shape[2],
                                          k.shape[1]), gluon=False)
    for _ in range(3):
        attention_backward(do, q, k, v, o, lse, causal=causal, config=config)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            attention_backward(do, q, k, v, o, lse, causal=causal, config=config)
        torch.cuda.synchronize()
    return {name: sum(e.device_time_total for e in prof.key_averages() if name in e.key) / 20 / 1000
            for name in ("_bwd_dkdv", "_bwd_dq", "_bwd_delta")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gluon_attention_bwd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=16,S=4096,D=128", help="B, H, S, D, and Hkv (default H)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="first, the error at small shapes against float64")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    args = ap.parse_args(argv)
    config = dict(block_n=args.block_n, block_m=args.block_m, stages=args.stages)
    if args.offline:
        _offline(args.block_n, args.block_m, args.stages, args.causal)
        return 0
    if args.check:
        for B, H, Hkv, S, D, causal, dtype in ((1, 2, 2, 128, 128, True, torch.bfloat16),
                                               (2, 4, 1, 320, 128, True, torch.float16),
                                               (2, 4, 2, 192, 64, False, torch.bfloat16),
                                               (1, 3, 3, 256, 128, False, torch.float16)):
            print(_check(B, H, Hkv, S, D, causal, dtype, **config), flush=True)
    B, H, Hkv, S, D = shape_of(args.shape)
    q, k, v, do, lse, delta = _inputs(B, H, Hkv, S, D, args.causal, torch.bfloat16)
    import triton.testing as tt

    flops = 4 * B * H * S * S * D / (2 if args.causal else 1)  # two matmuls (causal: half): dk/dv has 4, dq 3
    run = dict(causal=args.causal, **config)
    ms_kv = tt.do_bench(lambda: dkdv(q, k, v, do, lse, delta, **run), warmup=50, rep=300)
    ms_q = tt.do_bench(lambda: dq(q, k, v, do, lse, delta, **run), warmup=50, rep=300)
    ref = _triton_kernel_ms(q, k, v, do, args.causal)
    print(f"{args.shape} bf16 causal={args.causal} {config}: gluon dk/dv {ms_kv:.4f} ms ({2 * flops / ms_kv / 1e9:.1f} "
          f"TFLOP/s), dq {ms_q:.4f} ms ({1.5 * flops / ms_q / 1e9:.1f}); the Triton backward's kernels (profiler): "
          + ", ".join(f"{name} {ms:.4f} ms" for name, ms in ref.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
