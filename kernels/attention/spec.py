"""What the collector needs to measure attention: providers, the float64 reference, inputs, grids,
the cost model and the tolerance.

Dims: B (sequences), Hq and Hkv (query and key/value heads), Sq and Skv (lengths), D (head dim),
causal (0/1), window (keys a query sees, 0: no window; needs causal), varlen (0: a dense
[B, S, H, D] batch; 1: B sequences of random lengths packed into [B * Sq tokens, H, D] with
cu_seqlens, the lengths fixed by the dims so that the cost model counts them exactly).
"""
from __future__ import annotations

import dataclasses

import torch

from kcollect.spec import MODES, KernelSpec, Provider

from .._host.config import config_record
from .._spec.kit import grids_of
from . import ACCURATE_KEYS, accurate_bwd, attention, hopper, hopper_bwd, keys_seen, pick
from .config import runnable
from .naive import reference, visible_pairs
from .providers import cuda_only, eager, fa4, fla, flex, importable, sdpa

DIMS = ("B", "Hq", "Hkv", "Sq", "Skv", "D", "causal", "window", "varlen")


def varlen_lengths(batch: int, mean: int) -> list[int]:
    """B lengths summing to B * mean tokens: the token range cut at B - 1 random points (a fixed
    seed per shape, so a shape always packs the same sequences; empty ones can occur)."""
    total = batch * mean
    g = torch.Generator().manual_seed(batch * 1_000_003 + mean)
    cuts = torch.sort(torch.randint(0, total + 1, (batch - 1,), generator=g)).values.tolist()
    edges = [0] + cuts + [total]
    return [edges[i + 1] - edges[i] for i in range(batch)]


def cu_seqlens(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _randn(shape, g, dtype, device):
    # drawn where they are used: a case's q, k, v drawn on the CPU took 0.7 s of an H200 run's
    # 6 s a case (lab/results/attention_grid_cost_h200_93402c8.txt: inputs 27.8 s of 227.5)
    return torch.randn(shape, generator=g, dtype=torch.float32, device=device).to(dtype)


def packed_inputs(lens_q, lens_k, hq: int, hkv: int, d: int, causal: bool, window: int, dtype, device, seed: int):
    """Inputs of a packed batch with the given sequence lengths (the tests pick awkward ones)."""
    g = torch.Generator(device=device).manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    return {"q": _randn((tq, hq, d), g, dtype, device), "k": _randn((tk, hkv, d), g, dtype, device),
            "v": _randn((tk, hkv, d), g, dtype, device), "causal": bool(causal), "window": int(window),
            "cu_seqlens_q": cu_seqlens(lens_q, device), "cu_seqlens_k": cu_seqlens(lens_k, device),
            "max_seqlen_q": max(lens_q, default=0), "max_seqlen_k": max(lens_k, default=0)}


def make_inputs(dims, dtype, device, seed):
    b, hq, hkv, sq, sk, d = (dims[n] for n in DIMS[:6])
    causal, window = bool(dims["causal"]), int(dims["window"])
    if dims["varlen"]:
        lens = varlen_lengths(b, sq)
        return packed_inputs(lens, lens, hq, hkv, d, causal, window, dtype, device, seed)
    g = torch.Generator(device=device).manual_seed(seed)
    return {"q": _randn((b, sq, hq, d), g, dtype, device), "k": _randn((b, sk, hkv, d), g, dtype, device),
            "v": _randn((b, sk, hkv, d), g, dtype, device), "causal": causal, "window": window,
            "cu_seqlens_q": None, "cu_seqlens_k": None, "max_seqlen_q": None, "max_seqlen_k": None}


def triton_attention(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None):
    return attention(q, k, v, causal, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def config_of(inputs) -> dict:
    q = inputs["q"]
    packed = inputs["cu_seqlens_q"] is not None
    max_q = inputs["max_seqlen_q"] if packed else q.shape[1]
    max_k = inputs["max_seqlen_k"] if packed else inputs["k"].shape[1]
    keys = keys_seen(inputs["window"], max_k)
    c = pick(q.shape[-1], inputs["causal"], max_q, q.device, q.shape[-2] // inputs["k"].shape[-2], keys)
    # the kernel fwd.forward runs (the Triton one for packed batches and residuals): record it
    fwd = runnable(c.fwd, True, lambda f: "packed or a residual" if packed or keys <= ACCURATE_KEYS else
                   hopper.out_of_scope(tuple(q.shape), max_k, inputs["causal"], inputs["window"], f.block_m, f.block_n))
    # the backward attention() runs by default: the accurate one on short rows; the Triton kernels where
    # the Gluon ones refuse (bwd.backward)
    bwd = accurate_bwd(c.bwd) if keys <= ACCURATE_KEYS else c.bwd
    if bwd.gluon and hopper_bwd.out_of_scope(tuple(q.shape), max_k, inputs["window"], packed,
                                             bwd.one_key or bwd.dq_shift):
        bwd = dataclasses.replace(bwd, gluon=False)
    return config_record(fwd=fwd, bwd=bwd)


def tokens(dims) -> int:
    """Query tokens a call processes: B * Sq, packed or not (varlen lengths sum to it)."""
    return dims["B"] * dims["Sq"]


def check_shape(dims) -> str | None:
    missing = [n for n in DIMS if n not in dims]
    if missing:
        return f"attention needs the dims {', '.join(DIMS)}; missing {', '.join(missing)}"
    if dims["Hq"] % dims["Hkv"]:
        return f"Hq={dims['Hq']} is not a multiple of Hkv={dims['Hkv']}"
    if dims["window"] and not dims["causal"]:
        return "a window needs causal=1"
    if dims["varlen"] and dims["Sq"] != dims["Skv"]:
        return "varlen shapes pack self-attention sequences: Sq == Skv"
    return None


def visible_total(dims) -> float:
    """Visible (query, key) pairs of one head over the batch. Dense causal Sq == Skv without a
    window: B * Sq * Skv / 2, the convention of FlashAttention's benchmarks (so TFLOP/s compare
    with published ones); windows, packed batches and Sq != Skv: counted exactly."""
    b, sq, sk, causal, window = dims["B"], dims["Sq"], dims["Skv"], bool(dims["causal"]), int(dims["window"])
    if dims["varlen"]:
        return float(sum(visible_pairs(n, n, causal, window) for n in varlen_lengths(b, sq)))
    if causal and not window and sq == sk:
        return b * sq * sk / 2
    return float(b * visible_pairs(sq, sk, causal, window))


# Cost model. FLOPs: two matmuls of 2 * D per visible pair and head in the forward (q k^T, p v):
#   fwd = 4 * Hq * D * pairs; bwd = 2.5 * fwd (five matmuls: q k^T again, dp, dv, dq, dk);
#   fwd+bwd = 3.5 * fwd. Bytes: each tensor once. fwd: q, k, v read, o written, lse (fp32)
#   written; bwd: q, k, v, o, do read, lse read, dq, dk, dv written.
def flops(dims, mode) -> float:
    fwd = 4.0 * dims["Hq"] * dims["D"] * visible_total(dims)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]


def bytes_moved(dims, dtype, mode) -> int:
    b, hq, hkv, sq, sk, d = (dims[n] for n in DIMS[:6])
    qo = b * sq * hq * d * dtype.itemsize
    kv = b * sk * hkv * d * dtype.itemsize
    lse = b * sq * hq * 4
    fwd = 2 * qo + 2 * kv + lse
    bwd = 4 * qo + 4 * kv + lse
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


PROVIDERS = (
    Provider("triton", triton_attention, config=config_of, ours=True),
    Provider("sdpa_flash", sdpa("flash"), cuda_only("sdpa_flash"), builds=False),
    Provider("sdpa_cudnn", sdpa("cudnn"), cuda_only("sdpa_cudnn"), builds=False),
    Provider("sdpa_efficient", sdpa("efficient"), cuda_only("sdpa_efficient"), builds=False),
    Provider("sdpa_math", sdpa("math"), builds=False),
    Provider("flex", flex, cuda_only("flex (compiled)")),
    Provider("eager", eager, builds=False),
    Provider("fla", fla, importable("fla.ops.attn")),
    Provider("fa4", fa4, importable("flash_attn.cute")),
)

SPEC = KernelSpec(
    name="attention", modes=MODES, baseline="sdpa_flash", bound="compute",
    description="softmax(q k^T / sqrt(D)) v: causal, sliding-window, grouped-query and packed batches, fwd and bwd",
    reference=reference, make_inputs=make_inputs, grad_inputs=("q", "k", "v"), grids=grids_of(__file__),
    check_shape=check_shape, tokens=tokens, bytes_moved=bytes_moved, flops=flops,
    dtypes=(torch.bfloat16, torch.float16), bench_dtypes=(torch.bfloat16, torch.float16), providers=PROVIDERS,
    # Three times the worst error of eager attention (matmul, softmax, matmul in the dtype) against
    # float64, measured on the CPU over S 60-1024, D 64/96/128, causal, windowed and GQA shapes,
    # fwd and bwd: bf16 6.6e-3, fp16 8.2e-4 (sdpa_math, which upcasts to fp32: 2.6e-3, 3.1e-4;
    # flash kernels, which round P to the dtype before p @ v, sit in between).
    tolerance={torch.bfloat16: 2e-2, torch.float16: 2.5e-3})
