"""The mLSTM's forward: the states at chunk starts (a scan over chunks), then every chunk's outputs
in parallel (naive.chunkwise is the same maths in PyTorch).

Layouts: q, k, v, h [B*NH, T, DH]; i, f [B*NH, T]; resets [B, T] uint8; cs [B*NH, NC+1, DH, DH],
ns [B*NH, NC+1, DH], ms [B*NH, NC+1] fp32 the stabilised state at each chunk start (and after the
last chunk); mo, den [B*NH, T] fp32 each step's stabiliser and normaliser (the backward's)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.cells import precise
from .._jit.recurrent import div_f32, dot, exp_f32
from .._host.cells import shared_bytes_for_types
from .chunk import (NEG, chunk_gates, dot_state, gaps, load_state, load_tile, padded, scan_program, scores64,
                    split_dot, store_state, to_end, weight)


@triton.jit
def _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, c, T, DH, d, e, has_resets, L: tl.constexpr,
                  PRECISE: tl.constexpr):
    """What the scan's chunk c reads, none of it depending on the carried state: chunk_gates' (i, i~,
    A, seg), its keys [L, DP] and values [L, BV] in their own type. A chunk from NC on starts at or
    past T: every load is masked, nothing is read."""
    ig, it, A, seg, _, _ = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L, PRECISE)
    return ig, it, A, seg, load_tile(k_ptr, bh, c * L, T, DH, d, L), load_tile(v_ptr, bh, c * L, T, DH, e, L)


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_states(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, cs_ptr, ns_ptr, ms_ptr, NH, T, DH, NC, scale,
                  has_resets, L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr,
                  DOT_F32: tl.constexpr, PRECISE: tl.constexpr, PREFETCH: tl.constexpr):
    """One (row, head) and BV value columns: C [DP, BV], n and m carried over the chunks. A chunk
    adds its keys that no later reset cuts off, exp(i_s + A_end - A_s - m') k'_s v_s^T, to the carried
    state decayed by exp(m + A_end - m') (zero when the chunk holds a reset).
    PREFETCH: chunk c+1's inputs are loaded before chunk c's product, so that their latency overlaps
    this chunk's maths (Triton does not pipeline a `while` loop); the arithmetic is the same."""
    bh, b, d, e, first_block = scan_program(NH, DP, BV)
    C = tl.zeros((DP, BV), tl.float32)
    n = tl.zeros((DP,), tl.float32)
    m = tl.sum(tl.zeros((L,), tl.float32), 0)
    if PREFETCH:
        ahead = _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, 0, T, DH, d, e, has_resets, L, PRECISE)
    c = 0
    while c <= NC:
        row = bh * (NC + 1) + c
        store_state(cs_ptr, ns_ptr, row, C, n, DH, d, e, first_block)
        tl.store(ms_ptr + row, m, mask=first_block)
        if c < NC:
            if PREFETCH:
                ig, it, A, seg, k, v = ahead
                ahead = _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, c + 1, T, DH, d, e, has_resets, L,
                                      PRECISE)
            else:
                ig, it, A, seg, k, v = _chunk_inputs(k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, bh, b, c, T, DH, d, e,
                                                     has_resets, L, PRECISE)
            A_end, rest = to_end(A, L)
            seg_end = tl.max(seg, 0)
            survive = seg == seg_end
            carry = tl.where(seg_end == 0, m + A_end, NEG)
            m_next = tl.maximum(carry, tl.max(tl.where(survive, it + rest, NEG), 0))
            beta = tl.where(survive, exp_f32((ig + rest) - m_next, PRECISE), 0.0) * scale
            kappa = tl.where(seg_end == 0, exp_f32((m + A_end) - m_next, PRECISE), 0.0)
            kb = k.to(tl.float32) * beta[:, None]
            C = split_dot(tl.trans(kb), v, C * kappa, v.dtype, DOT_F32)
            n = n * kappa + tl.sum(kb, 0)
            m = m_next
        c += 1


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_out(q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, cs_ptr, ns_ptr, ms_ptr, h_ptr, mo_ptr, den_ptr, NH, T, DH,
               NC, scale, has_resets, L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr,
               DOT_F32: tl.constexpr, EPS: tl.constexpr, PRECISE: tl.constexpr):
    """One chunk of one (row, head): h = (intra-chunk pairs + the chunk-start state) / normaliser."""
    c, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    b = bh // NH
    j = tl.arange(0, L)
    d = tl.arange(0, DP)
    ig, it, A, seg, _, tm = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L, PRECISE)
    row = bh * (NC + 1) + c
    m_c = tl.load(ms_ptr + row)
    n_c = tl.load(ns_ptr + row * DH + d, mask=d < DH, other=0.0)
    q = load_tile(q_ptr, bh, c * L, T, DH, d, L)
    if PRECISE:
        S = scores64(q_ptr, k_ptr, bh, c * L, T, DH, scale, L)
    else:
        S = dot(q, tl.trans(load_tile(k_ptr, bh, c * L, T, DH, d, L)), tl.zeros((L, L), tl.float32), DOT_F32) * scale
    valid = (j[None, :] <= j[:, None]) & (seg[None, :] == seg[:, None])
    gap = gaps(A)
    base = tl.where(seg == 0, m_c + A.to(tl.float32), NEG)
    mj = tl.maximum(base, tl.max(tl.where(valid, it[None, :] + gap, NEG), 1))
    E = tl.where(valid, weight(ig[None, :], A[:, None] - A[None, :], mj[:, None], PRECISE), 0.0) * S
    w = tl.where(seg == 0, weight(m_c, A, mj, PRECISE), 0.0)
    den = tl.sum(E, 1) + w * tl.sum(q.to(tl.float32) * n_c[None, :], 1)
    norm = tl.maximum(tl.abs(den), exp_f32(-mj, PRECISE)) + EPS
    t = c * L + j
    tl.store(mo_ptr + bh * T + t, mj, mask=tm)
    tl.store(den_ptr + bh * T + t, den, mask=tm)
    for vb in tl.static_range(DP // BV):
        e = vb * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, bh, c * L, T, DH, e, L)
        num = dot(E.to(v.dtype), v, tl.zeros((L, BV), tl.float32), DOT_F32)
        state = load_state(cs_ptr, row, DH, d, e)
        num += w[:, None] * dot_state(q, state, tl.zeros((L, BV), tl.float32), DOT_F32)
        h = div_f32(num, norm[:, None], PRECISE)
        tl.store(h_ptr + (bh * T + t)[:, None] * DH + e[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=tm[:, None] & (e < DH)[None, :])


def meta_of(config, DH: int, dtype, dot_f32: bool) -> dict:
    """The chunk kernels' constexprs (forward and backward)."""
    dp = padded(DH)
    return dict(L=config.chunk, DP=dp, BV=min(config.bv, dp), DOT_F32=dot_f32, PRECISE=precise(dtype))


def shared_fwd(config, dtype, DH: int, dot_f32: bool, device) -> int:
    """The forward kernels' shared memory, the larger (arguments as mlstm_fwd passes them)."""
    f32, u8, meta = torch.float32, torch.uint8, meta_of(config, DH, dtype, dot_f32)
    states = (dtype, dtype, dtype, dtype, u8, f32, f32, f32, 1, 1, DH, 1, 1.0, 1)
    out = (dtype, dtype, dtype, dtype, dtype, u8, f32, f32, f32, dtype, f32, f32, 1, 1, DH, 1, 1.0, 1)
    return max(shared_bytes_for_types(_mlstm_states, states,
                                      dict(meta, PREFETCH=config.prefetch, num_warps=config.state_warps), device),
               shared_bytes_for_types(_mlstm_out, out, dict(meta, EPS=1e-6, num_warps=config.warps), device))


def mlstm_fwd(q, k, v, i, f, resets, NH: int, config, dot_f32: bool, eps: float):
    """(h, cs, ns, ms, mo, den) for q, k, v [B*NH, T, DH], i, f [B*NH, T] (NH heads a row)."""
    BH, T, DH = q.shape
    L = config.chunk
    NC = triton.cdiv(T, L)
    dev = q.device
    dp = padded(DH)
    bv = min(config.bv, dp)
    cs = torch.empty(BH, NC + 1, DH, DH, device=dev, dtype=torch.float32)
    ns = torch.empty(BH, NC + 1, DH, device=dev, dtype=torch.float32)
    ms = torch.empty(BH, NC + 1, device=dev, dtype=torch.float32)
    h = torch.empty_like(q)
    mo = torch.empty(BH, T, device=dev, dtype=torch.float32)
    den = torch.empty(BH, T, device=dev, dtype=torch.float32)
    rs = resets.view(torch.uint8) if resets is not None else mo
    meta = meta_of(config, DH, q.dtype, dot_f32)
    scale = DH ** -0.5
    has_resets = int(resets is not None)
    _mlstm_states[(BH, dp // bv)](k, v, i, f, rs, cs, ns, ms, NH, T, DH, NC, scale, has_resets,
                                  PREFETCH=config.prefetch, num_warps=config.state_warps, **meta)
    _mlstm_out[(NC, BH)](q, k, v, i, f, rs, cs, ns, ms, h, mo, den, NH, T, DH, NC, scale, has_resets, EPS=eps,
                         num_warps=config.warps, **meta)
    return h, cs, ns, ms, mo, den
