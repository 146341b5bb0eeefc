"""The Gluon attention forwards (kernels/attention/hopper.py, FwdConfig.gluon; `--block-m 128`:
pingpong.py's two warpgroups taking turns) on their own: the error
against float64 at small awkward shapes, its time beside attention()'s Triton kernel and SDPA's cuDNN
backend, and offline, what the compiler makes of it for sm_90. On a GPU:

    python -m lab.gluon_attention --check [--causal] [--shape B=4,H=16,S=4096,D=128,Hkv=16] [--block-n 64]

Without a GPU, `--offline` compiles it for sm_90 (registers, shared memory, wgmma count).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from kcollect.kernels.attention import hopper


def forward(q, k, v, causal: bool = False, scale: float | None = None, block_m: int = 64, block_n: int = 64,
            stages: int = 3):
    """(o, lse) of hopper.py's kernel alone (no fallback): o like q, lse [H, B * Sq] in log2 units."""
    why = hopper.refuses(q, k, v, causal, 0, False, block_m, block_n)
    if why:
        raise ValueError(f"the Gluon forward {why}")
    B, Sq, H, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(H, B * Sq, device=q.device, dtype=torch.float32)
    hopper.forward(q, k, v, o, lse, causal, scale if scale is not None else 1.0 / math.sqrt(D), block_m, block_n,
                   stages)
    return o, lse


def _offline(block_m, block_n, stages, warps, causal=False, D=128):
    """Compile for sm_90 on this machine, no GPU: what the kernel needs (block_m 128: pingpong.py's)."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.compile_report import _TARGET, _resource_usage, specialise
    from kcollect.kernels.attention import pingpong

    q = torch.empty(1, 4096, 16, D, dtype=torch.bfloat16)
    lse = torch.empty(16, 4096, dtype=torch.float32)
    if block_m == 128:
        fn, rows = pingpong._attn_fwd, pingpong.ROWS
        consts = dict(BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, CONSUMER_REGS=pingpong.CONSUMER_REGS, num_warps=4,
                      maxnreg=pingpong.MAXNREG)
    else:
        fn, rows = hopper._attn_fwd, block_m
        consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, D=D, STAGES=stages, WARPS=warps, CAUSAL=causal,
                      num_warps=warps)
    args = (*hopper.descriptors(q, q, q, q, rows, block_n), lse, 4096, 4096, 16, 1, 0.1)
    sig, const, attrs, options = specialise(fn, args, consts)
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=_TARGET, options=options)
    usage = _resource_usage(k.asm["cubin"])[0]
    ptx = k.asm["ptx"]
    print(f"sm_90: block_m={block_m} block_n={block_n} stages={stages} warps={warps} causal={causal}: "
          f"{usage.get('REG')} registers, stack {usage.get('STACK', 0)}, shared {k.metadata.shared} B, "
          f"PTX wgmma {ptx.count('wgmma.mma_async')}, waits {ptx.count('wgmma.wait_group')} "
          f"(for one left {ptx.count('wgmma.wait_group.sync.aligned 1;')}), setmaxnreg {ptx.count('setmaxnreg')}")
    return k


def reference64(q, k, v, causal: bool):
    """(scores [B, H, Sq, Sk], o like q) in float64 for [B, S, H, D] inputs (GQA, a causal mask
    aligned at the end); differentiable where the inputs ask for gradients."""
    H, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    Sq, Sk = q.shape[1], k.shape[1]
    kk, vv = (t.double().transpose(1, 2).repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    s = q.double().transpose(1, 2) @ kk.transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).triu(Sk - Sq + 1), float("-inf"))
    return s, (torch.softmax(s, -1) @ vv).transpose(1, 2)


def shape_of(text: str) -> tuple[int, int, int, int, int]:
    """(B, H, Hkv, S, D) of a --shape text: B=..,H=..,S=..,D=..[,Hkv=..] (Hkv: H by default)."""
    from lab.ab import parse_shape

    dims = parse_shape(text)
    return dims["B"], dims["H"], dims.get("Hkv", dims["H"]), dims["S"], dims["D"]


def _check(B, H, Hkv, S, D, causal, dtype, Sk, **config) -> str:
    """The kernel's o and lse against float64 on fresh random inputs: max errors over max |o|, |lse|;
    S queries over Sk keys, a causal mask aligned at the end."""
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = forward(q, k, v, causal=causal, **config)
    s, want = reference64(q, k, v, causal)
    lse64 = (torch.logsumexp(s, -1) / math.log(2)).transpose(0, 1).reshape(H, B * S)
    e_o = ((o.double() - want).abs().max() / want.abs().max()).item()
    e_l = ((lse.double() - lse64).abs().max() / lse64.abs().max()).item()
    return f"B{B} H{H}/{Hkv} S{S}/{Sk} D{D} causal={causal} {str(dtype)[6:]}: o error {e_o:.2e}, lse error {e_l:.2e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gluon_attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=16,S=4096,D=128", help="B, H, S, D, and Hkv (default H)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--warps", type=int, default=4, help="--offline only: the one-warpgroup kernel's warps")
    ap.add_argument("--check", action="store_true", help="first, the error at small awkward shapes (GQA, causal, fp16)")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    args = ap.parse_args(argv)
    config = dict(block_m=args.block_m, block_n=args.block_n, stages=args.stages)
    if args.offline:
        _offline(args.block_m, args.block_n, args.stages, args.warps, args.causal)
        return 0
    if args.check:
        cases = ((1, 2, 2, 64, 64, 128, True, torch.bfloat16), (2, 4, 1, 320, 320, 128, True, torch.float16),
                 (2, 4, 2, 192, 192, 64, False, torch.bfloat16), (1, 3, 3, 256, 256, 128, False, torch.float16),
                 (2, 2, 1, 128, 448, 128, True, torch.bfloat16), (1, 2, 2, 192, 64, 32, False, torch.float16))
        if args.block_m == 128:  # query lengths in multiples of 128
            cases = ((1, 2, 2, 128, 128, 128, True, torch.bfloat16), (2, 4, 1, 384, 384, 128, True, torch.float16),
                     (2, 4, 2, 256, 256, 64, False, torch.bfloat16), (1, 3, 3, 512, 512, 128, False, torch.float16),
                     (2, 2, 1, 256, 640, 128, True, torch.bfloat16), (1, 2, 2, 256, 64, 32, False, torch.float16))
        for B, H, Hkv, S, Sk, D, causal, dtype in cases:
            print(_check(B, H, Hkv, S, D, causal, dtype, Sk, **config), flush=True)
    B, H, Hkv, S, D = shape_of(args.shape)
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kcollect.kernels.attention import attention

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=args.causal, enable_gqa=Hkv != H)
    import triton.testing as tt
    flops = 4 * B * H * S * S * D / (2 if args.causal else 1)
    runs = {"gluon": lambda: forward(q, k, v, causal=args.causal, **config),
            "triton": lambda: attention(q, k, v, causal=args.causal), "sdpa_cudnn": cudnn}
    print(f"{args.shape} bf16 causal={args.causal}:")
    for name, fn in runs.items():
        ms = tt.do_bench(fn, warmup=50, rep=300)
        print(f"  {name:<11} {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
