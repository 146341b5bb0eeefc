"""The mLSTM's backward: the gradients of the chunk-start states (a reverse scan over chunks), then
every chunk's input and gate gradients in parallel. The stabiliser m is held constant: the outputs
depend on it only through the 1e-6 of the normaliser (h = q C~ / (max(|q n~|, 1) + 1e-6 exp(m)) in
the unstabilised state), as in TFLA's kernels; the final state is returned without gradient.

With dnum = dh / N and dden = -(dh . h) / N * sign(den) where |den| > exp(-m) (N the normaliser),
the output of step t is the linear map of (v_s, 1) by weights P_ts (q_t . k'_s) plus the start
state's w_t q_t [C | n]; the gate gradients are those of its log-weights (A the running sum of log
forget gates: logP_ts = i_s + A_t - A_s, log w_t = m_c + A_t, and the chunk's state update)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._lib.recurrent import dot
from .chunk import NEG, chunk_gates, load_state, load_tile, scan_program, store_state


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_dstates(q_ptr, dh_ptr, qinv_ptr, dden_ptr, i_ptr, f_ptr, rs_ptr, ms_ptr, mo_ptr, dcs_ptr, dns_ptr, NH, T,
                   DH, NC, has_resets, L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr,
                   DOT_F32: tl.constexpr):
    """dcs[c] = the gradient of the state at the start of chunk c: its own chunk's outputs' plus the
    next chunk start's through the chunk's decay (the state after the last chunk has none)."""
    bh, b, d, e, first_block = scan_program(NH, DP, BV)
    dC = tl.zeros((DP, BV), tl.float32)
    dn = tl.zeros((DP,), tl.float32)
    c = NC
    while c >= 0:
        if c < NC:
            ig, it, A, seg, _, tm = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L)
            A_end, seg_end = tl.max(tl.where(tl.arange(0, L) == L - 1, A, NEG), 0), tl.max(seg, 0)
            row = bh * (NC + 1) + c
            m_c, m_next = tl.load(ms_ptr + row), tl.load(ms_ptr + row + 1)
            kappa = tl.where(seg_end == 0, tl.exp(m_c + A_end - m_next), 0.0)
            t = c * L + tl.arange(0, L)
            mj = tl.load(mo_ptr + bh * T + t, mask=tm, other=0.0)
            w = tl.where((seg == 0) & tm, tl.exp(m_c + A - mj), 0.0)
            qw = load_tile(q_ptr, bh, c * L, T, DH, d, L).to(tl.float32) * w[:, None]
            dnum = load_tile(dh_ptr, bh, c * L, T, DH, e, L).to(tl.float32) \
                * tl.load(qinv_ptr + bh * T + t, mask=tm, other=0.0)[:, None]
            dC = dot(tl.trans(qw.to(dh_ptr.dtype.element_ty)), dnum.to(dh_ptr.dtype.element_ty), dC * kappa, DOT_F32)
            dn = dn * kappa + tl.sum(qw * tl.load(dden_ptr + bh * T + t, mask=tm, other=0.0)[:, None], 0)
        row = bh * (NC + 1) + c
        store_state(dcs_ptr, dns_ptr, row, dC, dn, DH, d, e, first_block)
        c -= 1


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_dchunk(q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, dh_ptr, qinv_ptr, dden_ptr, cs_ptr, ns_ptr, ms_ptr, mo_ptr,
                  dcs_ptr, dns_ptr, dq_ptr, dk_ptr, dv_ptr, di_ptr, df_ptr, NH, T, DH, NC, scale, has_resets,
                  L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr, DOT_F32: tl.constexpr):
    c, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    b = bh // NH
    j = tl.arange(0, L)
    d = tl.arange(0, DP)
    t = c * L + j
    ig, it, A, seg, f, tm = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L)
    A_end, seg_end = tl.max(tl.where(j == L - 1, A, NEG), 0), tl.max(seg, 0)
    row = bh * (NC + 1) + c
    m_c, m_next = tl.load(ms_ptr + row), tl.load(ms_ptr + row + 1)
    mj = tl.load(mo_ptr + bh * T + t, mask=tm, other=0.0)
    n_c = tl.load(ns_ptr + row * DH + d, mask=d < DH, other=0.0)
    dn_next = tl.load(dns_ptr + (row + 1) * DH + d, mask=d < DH, other=0.0)
    qinv = tl.load(qinv_ptr + bh * T + t, mask=tm, other=0.0)
    dden = tl.load(dden_ptr + bh * T + t, mask=tm, other=0.0)
    q = load_tile(q_ptr, bh, c * L, T, DH, d, L)
    k = load_tile(k_ptr, bh, c * L, T, DH, d, L)
    ty = q.dtype
    S = dot(q, tl.trans(k), tl.zeros((L, L), tl.float32), DOT_F32) * scale
    valid = (j[None, :] <= j[:, None]) & (seg[None, :] == seg[:, None])
    P = tl.where(valid, tl.exp(ig[None, :] + A[:, None] - A[None, :] - mj[:, None]), 0.0)
    w = tl.where((seg == 0) & tm, tl.exp(m_c + A - mj), 0.0)
    beta = tl.where((seg == seg_end) & tm, tl.exp(ig + A_end - A - m_next), 0.0)
    kappa = tl.where(seg_end == 0, tl.exp(m_c + A_end - m_next), 0.0)
    PS = (P * S).to(ty)
    G = tl.zeros((L, L), tl.float32)
    dq_state = tl.zeros((L, DP), tl.float32)  # dnum C^T, over the value blocks
    dk_state = tl.zeros((L, DP), tl.float32)  # v dC_next^T
    dlogw = tl.zeros((L,), tl.float32)
    dlogb = tl.zeros((L,), tl.float32)
    kap = tl.sum(n_c * dn_next, 0)
    for vb in tl.static_range(DP // BV):
        e = vb * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, bh, c * L, T, DH, e, L)
        dnum = (load_tile(dh_ptr, bh, c * L, T, DH, e, L).to(tl.float32) * qinv[:, None]).to(ty)
        C = load_state(cs_ptr, row, DH, d, e)
        dC = load_state(dcs_ptr, row + 1, DH, d, e)
        G = dot(dnum, tl.trans(v), G, DOT_F32)
        dq_state = dot(dnum, tl.trans(C.to(ty)), dq_state, DOT_F32)
        dlogw += tl.sum(dot(q, C.to(ty), tl.zeros((L, BV), tl.float32), DOT_F32) * dnum.to(tl.float32), 1)
        kdC = dot(k, dC.to(ty), tl.zeros((L, BV), tl.float32), DOT_F32) * scale
        dlogb += tl.sum(kdC * v.to(tl.float32), 1)
        dk_state = dot(v, tl.trans(dC.to(ty)), dk_state, DOT_F32)
        kap += tl.sum(tl.sum(C * dC, 1), 0)
        dv = dot(tl.trans(PS), dnum, beta[:, None] * kdC, DOT_F32)
        tl.store(dv_ptr + (bh * T + t)[:, None] * DH + e[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=tm[:, None] & (e < DH)[None, :])
    PG = P * (G + dden[:, None])
    dq = dot(PG.to(ty), k, tl.zeros((L, DP), tl.float32), DOT_F32) * scale \
        + w[:, None] * (dq_state + dden[:, None] * n_c[None, :])
    dk = (dot(tl.trans(PG.to(ty)), q, tl.zeros((L, DP), tl.float32), DOT_F32)
          + beta[:, None] * (dk_state + dn_next[None, :])) * scale
    dlogw = w * (dlogw + dden * tl.sum(q.to(tl.float32) * n_c[None, :], 1))
    dlogb = beta * (dlogb + tl.sum(k.to(tl.float32) * dn_next[None, :], 1) * scale)
    Z = PG * S
    col = tl.sum(Z, 0)
    dA = tl.sum(Z, 1) - col + dlogw - dlogb
    dA += tl.where(j == L - 1, tl.sum(dlogb, 0) + kappa * kap, 0.0)  # A_end: the chunk's state update
    da = tl.sum(dA, 0) - tl.cumsum(dA, 0) + dA  # a_l enters every A_t with t >= l
    m2 = tm[:, None] & (d < DH)[None, :]
    tl.store(dq_ptr + (bh * T + t)[:, None] * DH + d[None, :], dq.to(dq_ptr.dtype.element_ty), mask=m2)
    tl.store(dk_ptr + (bh * T + t)[:, None] * DH + d[None, :], dk.to(dk_ptr.dtype.element_ty), mask=m2)
    tl.store(di_ptr + bh * T + t, (col + dlogb).to(di_ptr.dtype.element_ty), mask=tm)
    tl.store(df_ptr + bh * T + t, (da * tl.sigmoid(-f)).to(df_ptr.dtype.element_ty), mask=tm)


def mlstm_bwd(dh, q, k, v, i, f, resets, NH: int, h, saved, config, dot_f32: bool, eps: float):
    """(dq, dk, dv, di, df) for the saved forward (cs, ns, ms, mo, den)."""
    cs, ns, ms, mo, den = saved
    BH, T, DH = q.shape
    L = config.chunk
    NC = triton.cdiv(T, L)
    dp = max(16, triton.next_power_of_2(DH))
    bv = min(config.bv, dp)
    floor = torch.exp(-mo)
    qinv = 1.0 / (torch.maximum(den.abs(), floor) + eps)
    dden = -(dh.float() * h.float()).sum(-1) * qinv * torch.sign(den) * (den.abs() >= floor)
    dh = dh.contiguous()
    dcs, dns = torch.empty_like(cs), torch.empty_like(ns)
    rs = resets.view(torch.uint8) if resets is not None else mo
    meta = dict(L=L, DP=dp, BV=bv, DOT_F32=dot_f32)
    has_resets = int(resets is not None)
    _mlstm_dstates[(BH, dp // bv)](q, dh, qinv, dden, i, f, rs, ms, mo, dcs, dns, NH, T, DH, NC, has_resets,
                                   num_warps=config.state_warps, **meta)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    di, df = torch.empty_like(i), torch.empty_like(f)
    _mlstm_dchunk[(NC, BH)](q, k, v, i, f, rs, dh, qinv, dden, cs, ns, ms, mo, dcs, dns, dq, dk, dv, di, df, NH, T,
                            DH, NC, DH ** -0.5, has_resets, num_warps=config.warps, **meta)
    return dq, dk, dv, di, df
