"""Attention of one new query per row over a key/value cache and the row's new key, for inference
one frame at a time (decoding):

    o[b, h] = softmax_j(scale q[b, h] . K[b, j, h // G]) V[b, j, h // G]

over the keys j of k_cache [B, S, Hkv, D] that the window leaves visible (the last window - 1,
or all with window 0) and the new key k [B, Hkv, D], which is always visible. The cache and the new
key are read where they are: no concatenated copy. One program per (row, kv head) computes its G
query heads (grouped-query attention) with an online softmax over blocks of keys, in fp32. The
flash kernels of fwd.py tile queries by 16 or more for the tensor cores; with one query a row,
that tile would be almost all padding. Forward only."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode(Q, KC, VC, KN, VN, O, S, start, G, D, qk_scale, sqb, sqh, skb, sks, skh, svb, svs, svh, snb, snh,
            smb, smh, sob, soh, BG: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    g = tl.arange(0, BG)
    d = tl.arange(0, BD)
    mg, md = g < G, d < D
    heads = hk * G + g
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + d[None, :], mask=mg[:, None] & md[None, :], other=0.0)
    q = q.to(tl.float32) * qk_scale  # scores in log2 units
    # the new key opens the softmax: every query sees it
    kn = tl.load(KN + b * snb + hk * snh + d, mask=md, other=0.0).to(tl.float32)
    vn = tl.load(VN + b * smb + hk * smh + d, mask=md, other=0.0).to(tl.float32)
    m = tl.sum(q * kn[None, :], axis=1)
    l = tl.full((BG,), 1.0, tl.float32)
    acc = tl.zeros((BG, BD), tl.float32) + vn[None, :]
    lo = start + 0 * b  # a tensor from the start: start == 1 would be specialised to a constant
    while lo < S:  # (not range(): the interpreter's cannot take a runtime bound under NumPy >= 2.4)
        n = lo + tl.arange(0, BN)
        mn = n < S
        m2 = mn[:, None] & md[None, :]
        k = tl.load(KC + b * skb + n[:, None] * sks + hk * skh + d[None, :], mask=m2, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(mn[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        v = tl.load(VC + b * svb + n[:, None] * svs + hk * svh + d[None, :], mask=m2, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l = l * alpha + tl.sum(p, axis=1)
        m = m_new
        lo += BN
    o = acc / l[:, None]
    tl.store(O + b * sob + heads[:, None] * soh + d[None, :], o.to(O.dtype.element_ty), mask=mg[:, None] & md[None, :])


def attention_decode(q, k_cache, v_cache, k, v, window: int = 0, scale: float | None = None) -> torch.Tensor:
    """o [B, Hq, D] like q. q [B, Hq, D]; k_cache, v_cache [B, S, Hkv, D] (S may be 0); k, v
    [B, Hkv, D] the new frame's; Hq a multiple of Hkv; every last dim contiguous (views are fine).
    window > 0: the query sees the new key and the last window - 1 keys of the cache."""
    B, Hq, D = q.shape
    S, Hkv = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape != v_cache.shape or k_cache.shape[::3] != (B, D) or k.shape != (B, Hkv, D) \
            or v.shape != k.shape or Hq % Hkv:
        raise ValueError(f"attention_decode: q [B, Hq, D], caches [B, S, Hkv, D], k and v [B, Hkv, D], Hq a multiple "
                         f"of Hkv; got {list(q.shape)}, {list(k_cache.shape)}, {list(v_cache.shape)}, "
                         f"{list(k.shape)}, {list(v.shape)}")
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache, k, v)):
        raise ValueError("attention_decode: every input needs a contiguous last dim")
    if window < 0:
        raise ValueError(f"window={window}: 0 (every key) or a positive number of keys")
    scale = D ** -0.5 if scale is None else float(scale)
    start = max(0, S - (window - 1)) if window else 0
    if start >= S:  # the window hides the whole cache: no loop at all (S = start = 1 would be two
        S = start = 0  # constants to Triton 3.6, whose coalescing pass then fails on the dead loop)
    o = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    G = Hq // Hkv
    BG, BD = triton.next_power_of_2(G), triton.next_power_of_2(D)
    BN = max(16, min(64, 8192 // (BG * BD)))
    _decode[(B, Hkv)](q, k_cache, v_cache, k, v, o, S, start, G, D, scale * math.log2(math.e), q.stride(0), q.stride(1),
                      k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
                      v_cache.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
                      BG=BG, BN=BN, BD=BD)
    return o
