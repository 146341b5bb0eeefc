"""Flash attention in Triton, forward and backward.

`attention(q, k, v, causal=False, window=0)` takes FlashAttention's layout: q [B, Sq, Hq, D],
k and v [B, Skv, Hkv, D] (Hq a multiple of Hkv: grouped-query attention), or packed batches
q [total_q, Hq, D], k and v [total_k, Hkv, D] with `cu_seqlens_q` / `cu_seqlens_k` (int32,
[B + 1], as flash_attn_varlen_func) and the longest lengths `max_seqlen_q` / `max_seqlen_k`
(given, no device-to-host copy: CUDA graphs can capture the call; found from cu_seqlens otherwise).
bf16 and fp16, head dims up to 128 (non-powers of two padded with masks). Which key a query sees
(causal, sliding window of `window` keys, Sq != Skv aligned at the end) is documented in naive.py.
On Hopper the forward of dense batches without a window can run a Gluon kernel (hopper.py's one
warpgroup of 64 query rows, pingpong.py's two of 128: FwdConfig.gluon), and the backward of those
with as many keys as queries Gluon dk/dv and dq kernels (hopper_bwd.py, BwdConfig.gluon), each picked
where it measured faster (config.py); elsewhere the Triton kernels run.

`attention_forward` / `attention_backward` are the raw launches, each with `config=None`
(config.pick's choice) or a FwdConfig / BwdConfig to force. A picked config that the inputs or the
device cannot take (TMA on tensors whose rows are not 16-byte aligned, as head dim 33 in fp16; tiles
past the device's shared memory) falls back by itself to one they can; a forced one raises
ValueError naming the limit. Upstream gradients of any layout are taken (an expanded or
transposed one is copied).

The accurate backward buys eager's accuracy on peaked rows (a few keys, or one holding all of a
row's probability, or keys that nearly coincide), where dq and dk were up to 3x eager's error in
bf16/fp16, and 2,000x the true gradient's size where it is below the dtype's resolution (eager's is
its exact 0): the forward keeps o's rounding for delta, dq is shifted by a key the row sees, and
rows of one key give no dS (bwd.py). `accurate=None` (the default) takes it where a query sees at
most ACCURATE_KEYS keys, `True` and `False` everywhere and nowhere. Past those short rows it is
left off by default for its cost: on an H200 at 6fed409, fwd+bwd bf16 D128 causal at S 512-4096,
1.14-1.35x the fast backward's time, of which o's rounding 1.06-1.10x (1.00x at D64 B1 S512)
and the dq shift 1-2% more, the rest the rows of one key in dk/dv
(lab/results/attention_delta_h200_6fed409.txt, attention_kernel_times_h200_6fed409.txt).
"""
from __future__ import annotations

import dataclasses

import torch

from . import bwd, fwd
from .config import AttentionConfig, BwdConfig, FwdConfig, keys_seen, pick, pick_bwd, pick_fwd

__all__ = ["ACCURATE_KEYS", "AttentionConfig", "BwdConfig", "FwdConfig", "accurate_bwd", "attention",
           "attention_backward", "attention_forward", "keys_seen", "pick", "pick_bwd", "pick_fwd"]

DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
# attention(accurate=None) takes the accurate backward where a query sees at most this many keys:
# there a row's few keys cancel in dq and dk, and its rounding is not averaged away over a long row
# (every case over the bf16/fp16 gate in the H200 sweep at bbc84b9, seed 13, saw 17 keys or fewer;
# in the interpreter's at 20bcaba, seed 29, 33 or fewer), and the call is short, so the measures'
# cost is small in time; past it the fast backward
ACCURATE_KEYS = 64


def _check(q, k, v, causal, window, cu_q, cu_k) -> None:
    packed = cu_q is not None
    if (cu_k is None) != (cu_q is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together: give both or neither")
    want = 3 if packed else 4
    if not (q.dim() == k.dim() == v.dim() == want):
        raise ValueError(f"q, k, v must be {'[tokens, H, D] with cu_seqlens' if packed else '[B, S, H, D]'}; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
        raise ValueError(f"q, k, v must share a dtype among bfloat16, float16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[-1] != k.shape[-1] or (not packed and q.shape[0] != k.shape[0]):
        raise ValueError(f"k and v must match, and q their head dim and batch: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[-1] > MAX_HEAD_DIM or q.shape[-1] < 1:
        raise ValueError(f"head dim {q.shape[-1]}: from 1 to {MAX_HEAD_DIM}")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"query heads ({q.shape[-2]}) must be a multiple of kv heads ({k.shape[-2]})")
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError("q, k, v need a contiguous head dim (stride 1)")
    if window < 0 or (window and not causal):
        raise ValueError(f"window={window}: 0 (none) or a positive number of keys, with causal=True")
    if packed and (cu_q.dtype != torch.int32 or cu_k.dtype != torch.int32 or cu_q.shape != cu_k.shape):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be int32 tensors of the same length B + 1")


def _vector(cu):
    """cu_seqlens as the kernels read it: a vector of stride 1 (a strided view is copied)."""
    return cu if cu is None else cu.contiguous()


def _lengths(q, k, cu_q, cu_k, max_q, max_k) -> tuple[int, int]:
    if cu_q is None:
        return q.shape[1], k.shape[1]
    if max_q is None:
        max_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
    if max_k is None:
        max_k = int((cu_k[1:] - cu_k[:-1]).max()) if cu_k.numel() > 1 else 0
    return int(max_q), int(max_k)


def attention_forward(q, k, v, causal=False, window=0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                      max_seqlen_k=None, scale=None, config: FwdConfig | None = None, _residual: bool = False):
    """(o, lse): o like q, lse [Hq, tokens] fp32, the rows' log-sum-exp in log2 units (+inf: no key).
    `_residual` (the autograd function's): (o, lse, o's rounding), see fwd.forward."""
    _check(q, k, v, causal, window, cu_seqlens_q, cu_seqlens_k)
    cu_seqlens_q, cu_seqlens_k = _vector(cu_seqlens_q), _vector(cu_seqlens_k)
    max_q, max_k = _lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    picked = config is None
    config = config or pick_fwd(q.shape[-1], causal, max_q, q.device, keys_seen(window, max_k))
    return fwd.forward(q, k, v, bool(causal), int(window), cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, config,
                       fallback=picked, residual=_residual)


def attention_backward(do, q, k, v, o, lse, causal=False, window=0, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, scale=None, config: BwdConfig | None = None,
                       _picked: bool = False, _residual=None):
    """(dq, dk, dv) from the upstream gradient and what attention_forward returned. A picked config
    (config=None) falls back to a smaller one where the tensors or the device cannot take it; a
    forced one raises ValueError then (`_picked`: the autograd function's config, picked at the
    forward; `_residual`: o's rounding, where the forward kept it, for delta = rowsum(do * o))."""
    cu_seqlens_q, cu_seqlens_k = _vector(cu_seqlens_q), _vector(cu_seqlens_k)
    max_q, max_k = _lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    picked = _picked or config is None
    config = config or pick_bwd(q.shape[-1], causal, max_q, q.device, q.shape[-2] // k.shape[-2],
                                keys_seen(window, max_k))
    # the gradients are allocated like q, k, v and written with their strides: contiguous ones
    q, k, v = (x.contiguous() for x in (q, k, v))
    return bwd.backward(do, q, k, v, o, lse, bool(causal), int(window), cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                        scale, config, fallback=picked, residual=_residual)


def accurate_bwd(config: BwdConfig) -> BwdConfig:
    """The backward's config under attention(accurate=True)."""
    return dataclasses.replace(config, dq_shift=True, one_key=True)


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, window, cu_q, cu_k, max_q, max_k, scale, config, residual):
        cu_q, cu_k = _vector(cu_q), _vector(cu_k)
        max_q, max_k = _lengths(q, k, cu_q, cu_k, max_q, max_k)
        if residual is None:  # attention(accurate=None): by the keys a row sees
            residual = keys_seen(window, max_k) <= ACCURATE_KEYS
        o, lse, *r = attention_forward(q, k, v, causal, window, cu_q, cu_k, max_q, max_k, scale,
                                       config.fwd if config else None, _residual=residual)
        # the backward's config is chosen with the forward's (a config forced around the call holds
        # for both)
        bwd_config = config.bwd if config else pick_bwd(q.shape[-1], causal, max_q, q.device,
                                                        q.shape[-2] // k.shape[-2], keys_seen(window, max_k))
        if residual:  # attention(accurate=True)
            bwd_config = accurate_bwd(bwd_config)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, *r)
        ctx.args = (causal, window, max_q, max_k, scale, bwd_config, config is None)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu_q, cu_k, *r = ctx.saved_tensors
        causal, window, max_q, max_k, scale, config, picked = ctx.args
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, causal, window, cu_q, cu_k, max_q, max_k, scale, config,
                                        _picked=picked, _residual=r[0] if r else None)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def attention(q, k, v, causal=False, window=0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, scale=None, config: AttentionConfig | None = None,
              accurate: bool | None = None) -> torch.Tensor:
    """softmax(scale * q k^T, masked) v, differentiable in q, k and v (see the module docstring)."""
    # accurate: the forward keeps o's rounding for the backward's delta when a gradient will be asked
    # for (not at inference, nor under no_grad): see bwd.py; None is decided in the forward, which
    # knows the lengths
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    residual = accurate if grad else False
    return AttentionFunction.apply(q, k, v, causal, window, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   scale, config, residual)
