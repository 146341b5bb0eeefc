"""Attention in plain maths: the visibility rule every provider follows, the float64 reference
(the tests and the collector's gate import it) and the count of visible (query, key) pairs that
the cost model uses.

Visibility, FlashAttention's convention (bottom-right aligned when the lengths differ): with
Lq queries and Lk keys in a sequence and shift = Lk - Lq, query i sees key j when
    j < Lk,  and (causal)  j <= i + shift,  and (window W > 0)  j > i + shift - W.
So the last query sees the last key; a window of W keys ends at the query's own position (W = 1
is the diagonal alone; FlashAttention's window_size=(W - 1, 0)). A query that sees no key (the
first Lq - Lk queries of a causal sequence with Lq > Lk, or a sequence without keys) gets output 0
and contributes nothing to the gradients.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Query rows per chunk of the reference: the float64 scores of one chunk are
# CHUNK_SCORES elements at most (1 GB), so 16k-token sequences fit beside their inputs.
CHUNK_SCORES = 1 << 27


def visible(lq: int, lk: int, causal: bool, window: int, device=None) -> torch.Tensor:
    """[lq, lk] bool: which keys each query sees (the rule in the module docstring)."""
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    shift = lk - lq
    keep = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i + shift
    if window:
        keep &= j > i + shift - window
    return keep


def visible_pairs(lq: int, lk: int, causal: bool, window: int) -> int:
    """How many (query, key) pairs the rule above lets through, counted row by row."""
    i = torch.arange(lq, dtype=torch.int64)
    shift = lk - lq
    hi = torch.full_like(i, lk)  # exclusive bound on j
    if causal:
        hi = torch.clamp(i + shift + 1, max=lk)
    lo = torch.zeros_like(i)
    if window:
        lo = torch.clamp(i + shift - window + 1, min=0)
    return int(torch.clamp(hi - lo, min=0).sum())


def _chunk(q, k, v, keep, scale):
    """Softmax attention of a chunk of queries [B, H, m, D] over all keys; rows with no visible key
    give 0. Such rows keep their raw (finite) scores through the softmax and are zeroed after it,
    so no -inf - -inf turns into NaN in the output or the gradient."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    any_key = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep & any_key, float("-inf"))
    p = torch.softmax(s, dim=-1) * keep
    return torch.matmul(p, v)


def dense_reference(q, k, v, causal: bool, window: int, scale: float | None = None) -> torch.Tensor:
    """q [B, Lq, Hq, D], k and v [B, Lk, Hkv, D] (Hq a multiple of Hkv) -> [B, Lq, Hq, D], in the
    inputs' dtype (float64 for the reference). Query chunks are checkpointed, so the backward
    recomputes one chunk's scores at a time instead of keeping all of them."""
    b, lq, hq, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    keep = visible(lq, lk, causal, window, q.device)
    rows = max(1, CHUNK_SCORES // max(1, b * hq * lk))
    outs = []
    for r0 in range(0, lq, rows):
        args = (qt[:, :, r0:r0 + rows], kt, vt, keep[r0:r0 + rows], scale)
        if torch.is_grad_enabled() and q.requires_grad:
            outs.append(checkpoint(_chunk, *args, use_reentrant=False))
        else:
            outs.append(_chunk(*args))
    if not outs:
        return q.new_zeros(b, lq, hq, v.shape[-1])
    return torch.cat(outs, dim=2).transpose(1, 2)


def reference(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, scale=None):
    """The float64 answer for the collector's inputs (dense [B, S, H, D], or packed [T, H, D] with
    cumulative lengths, one sequence at a time)."""
    if cu_seqlens_q is None:
        return dense_reference(q, k, v, bool(causal), int(window), scale)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs = []
    for b in range(len(cq) - 1):
        qs, ks, vs = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        outs.append(dense_reference(qs[None], ks[None], vs[None], bool(causal), int(window), scale)[0])
    return torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)
