"""The mLSTM's backward: the gradients of the chunk-start states (each chunk's own share in parallel,
then a reverse scan over chunks that adds the next start's, element by element), then every chunk's
input and gate gradients in parallel.

The outputs depend on the stabiliser m only through the 1e-6 of the normaliser: in the unstabilised
state, h = q C~ / (max(|q n~|, 1) + 1e-6 exp(m)). The bulk of the backward holds m constant (as
TFLA's kernels do); the stabiliser's own gradient, dm_t = -1e-6 (dh_t . h_t) / N_t (N the
normaliser), then goes where m_t came from: m_t is a running max, the input gate of one step s
plus the log forget gates since (i~_s + A_t - A_s), or the chunk-start stabiliser plus those of the
chunk (m_c + A_t). It is small where the input gates are (exp(m) << 1e6) and all of the gradient
where they are large or where every step resets (then f enters h only through m).

With dnum = dh / N and dden = -(dh . h) / N * sign(den) where |den| > exp(-m),
the output of step t is the linear map of (v_s, 1) by weights P_ts (q_t . k'_s) plus the start
state's w_t q_t [C | n]; the gate gradients are those of its log-weights (A the running sum of log
forget gates: logP_ts = i_s + A_t - A_s, log w_t = m_c + A_t, and the chunk's state update).

Where one weight is all of a row's h (a large input gate, a reset at every step), the gradients
that reach it cancel to the other weights' share, and summed as they come keep the rounding of
the whole: they are taken in closed form instead, from the others': the entry of PG
(_dominant_entry: bf16's, summed as it came, left dq and dk of a one-step sequence wholly off) and
the log-weight of the input gate that set m_t, in every dtype; in fp32 that of the chunk start
that set it too. Every dtype takes the chunk's whole decay A_end so, by a last reverse scan over
chunks (_mlstm_dlinks): where one key is all of the next chunk's start state, bf16's did not
survive the sum either."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.recurrent import div_f32, dot, exp_f32, sigmoid_f32
from .._jit.scan import first_order
from .._host.cells import shared_bytes_for_types
from .chunk import NEG, chunk_gates, dot_state, load_state, load_tile, padded, scores64, to_end, weight
from .dstates import _mlstm_dlocal, _mlstm_dscan, _next_start_grad, scan_block, suffix_sum
from .fwd import meta_of


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_dchunk(q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, rs_ptr, dh_ptr, qinv_ptr, den_ptr, cs_ptr, ns_ptr, ms_ptr, mo_ptr,
                  dcs_ptr, dns_ptr, dms_ptr, last_ptr, dim_ptr, dam_ptr, src_ptr, links_ptr, dq_ptr, dk_ptr, dv_ptr,
                  di_ptr, df_ptr, NH, T, DH, NC,
                  scale, eps, has_resets, L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr, DOT_F32: tl.constexpr,
                  PRECISE: tl.constexpr, NEXT: tl.constexpr):
    c, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    b = bh // NH
    j = tl.arange(0, L)
    d = tl.arange(0, DP)
    t = c * L + j
    ig, it, A, seg, f, tm = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L, PRECISE)
    A_end, rest = to_end(A, L)
    seg_end = tl.max(seg, 0)
    row = bh * (NC + 1) + c
    m_c = tl.load(ms_ptr + row)
    mj = tl.load(mo_ptr + bh * T + t, mask=tm, other=0.0)
    n_c = tl.load(ns_ptr + row * DH + d, mask=d < DH, other=0.0)
    qinv = tl.load(qinv_ptr + bh * T + t, mask=tm, other=0.0)
    q = load_tile(q_ptr, bh, c * L, T, DH, d, L)
    k = load_tile(k_ptr, bh, c * L, T, DH, d, L)
    ty = q.dtype
    if PRECISE:
        S = scores64(q_ptr, k_ptr, bh, c * L, T, DH, scale, L)  # the forward's
    else:
        S = dot(q, tl.trans(k), tl.zeros((L, L), tl.float32), DOT_F32) * scale
    # rows past T too: their m_t is not stored (read as 0), so a large input gate of a real step
    # would overflow their weights to inf, and inf times their zero gradients is NaN in every sum
    # over rows (dk, dv, di, df; seen on the GPU, whose chunks of 64 pad a sequence of 17)
    valid = (j[None, :] <= j[:, None]) & (seg[None, :] == seg[:, None]) & tm[:, None]
    P = tl.where(valid, weight(ig[None, :], A[:, None] - A[None, :], mj[:, None], PRECISE), 0.0)  # as the forward's
    w = tl.where((seg == 0) & tm, weight(m_c, A, mj, PRECISE), 0.0)
    if NEXT:  # else the sequence is one chunk: the final state, returned without gradient, is the next
        m_next = tl.load(ms_ptr + row + 1)
        dn_next = tl.load(dns_ptr + (row + 1) * DH + d, mask=d < DH, other=0.0)
        beta = tl.where((seg == seg_end) & tm, exp_f32((ig + rest) - m_next, PRECISE), 0.0)
        kappa = tl.where(seg_end == 0, exp_f32((m_c + A_end) - m_next, PRECISE), 0.0)
        kap = tl.sum(n_c * dn_next, 0)
    # dnum = dh / N enters the products as dh, as stored, and the rows' 1 / N after them (G, dq_state)
    # or with the weights they meet (dv): rounded to bf16 for the dot, dnum was most of bf16's error
    # in the gradients where the normaliser cancels them (issue 40's CPU rechecks of the H200 sweeps of
    # seeds 64 and 65: 9 cases over the gate, 3 so). The products with the start state C and its
    # gradient dC take them split (chunk.dot_state), and dlogw takes dnum unrounded: its chunk's sum
    # cancels in the link scan against the next start state's <C, dC>, which the state scan's split
    # product keeps to fp32's precision (dnum rounded in dlogw alone matched dC's rounding there)
    PS = (P * S * qinv[:, None]).to(ty)
    G = tl.zeros((L, L), tl.float32)
    dq_state = tl.zeros((L, DP), tl.float32)  # dh C^T, over the value blocks
    dk_state = tl.zeros((L, DP), tl.float32)  # v dC_next^T
    dlogb = tl.zeros((L,), tl.float32)
    for vb in tl.static_range(DP // BV):
        e = vb * BV + tl.arange(0, BV)
        v = load_tile(v_ptr, bh, c * L, T, DH, e, L)
        dh = load_tile(dh_ptr, bh, c * L, T, DH, e, L)
        C = load_state(cs_ptr, row, DH, d, e)
        G = dot(dh, tl.trans(v), G, DOT_F32)
        dq_state = dot_state(dh, tl.trans(C), dq_state, DOT_F32)
        if NEXT:
            dC = load_state(dcs_ptr, row + 1, DH, d, e)
            kdC = dot_state(k, dC, tl.zeros((L, BV), tl.float32), DOT_F32) * scale
            dlogb += tl.sum(kdC * v.to(tl.float32), 1)
            dk_state = dot_state(v, tl.trans(dC), dk_state, DOT_F32)
            kap += tl.sum(tl.sum(C * dC, 1), 0)
            dv = dot(tl.trans(PS), dh, beta[:, None] * kdC, DOT_F32)
        else:
            dv = dot(tl.trans(PS), dh, tl.zeros((L, BV), tl.float32), DOT_F32)
        tl.store(dv_ptr + (bh * T + t)[:, None] * DH + e[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=tm[:, None] & (e < DH)[None, :])
    G, dq_state = G * qinv[:, None], dq_state * qinv[:, None]  # dnum's
    # q C . dnum (the start state's part of the numerator, against dnum) as q . (dnum C^T): the
    # product dq takes, in the same split, rather than two more products with C a value block
    dlogw = tl.sum(q.to(tl.float32) * dq_state, 1)
    # dh . h from the very sums h was made of (not from h, rounded to bf16 on its way out): where one
    # weight is all of h, dden cancels G to a part in 1e6, and rounded h would leave its rounding
    dh_h = tl.sum(P * S * G, 1) + w * dlogw
    den = tl.load(den_ptr + bh * T + t, mask=tm, other=0.0)
    floor = exp_f32(-mj, PRECISE)
    dden = tl.where(tl.abs(den) >= floor, tl.where(den < 0.0, dh_h, -dh_h) * qinv, 0.0)
    fl = tl.where(tl.abs(den) >= floor, 0.0, dh_h * qinv * floor)  # the stabiliser's through the floor
    PG = P * (G + dden[:, None])
    qn = tl.sum(q.to(tl.float32) * n_c[None, :], 1)
    PG = _dominant_entry(PG, P, S, G, w, dlogw, qn, qinv, den, floor, eps)
    dq = dot(PG.to(ty), k, tl.zeros((L, DP), tl.float32), DOT_F32) * scale \
        + w[:, None] * (dq_state + dden[:, None] * n_c[None, :])
    dk = dot(tl.trans(PG.to(ty)), q, tl.zeros((L, DP), tl.float32), DOT_F32)
    if NEXT:
        dk += beta[:, None] * (dk_state + dn_next[None, :])
    dk *= scale
    # h_t is invariant to the scale of q_t but for the normaliser's eps (and its floor), so
    # q_t . dq_t = (dh_t . h_t) eps / N_t exactly (dh_t . h_t where the floor wins), while the terms
    # of dq_t along q_t cancel: to fp32's rounding of them, and to bf16's where PG is rounded for the
    # dot (at DH = 1 that is all of dq). Set dq's part along q to its closed form.
    qf = q.to(tl.float32)
    qq = tl.sum(qf * qf, 1)
    R = tl.where(tl.abs(den) >= floor, dh_h * qinv * eps, dh_h)  # the sum of the row's log-weights' gradients
    along = R - tl.sum(qf * dq, 1)
    dq += qf * tl.where(qq > 0.0, along / tl.where(qq > 0.0, qq, 1.0), 0.0)[:, None]
    dlogw = w * (dlogw + dden * qn)
    if NEXT:
        dlogb = beta * (dlogb + tl.sum(k.to(tl.float32) * dn_next[None, :], 1) * scale)
    Z = PG * S
    # where the input gate of step s set m_t: the stabiliser's gradient on that weight (see _stabiliser_grad)
    # (set to the row's closed form, fl - dlogw - the row's other entries, rather than adding
    # fl - dlogw - the row's sum to it: that subtracts the entry from itself, exact only where both
    # copies are rounded alike, which a multiply-add the compiler contracts on the GPU need not keep)
    src = tl.load(src_ptr + bh * T + t, mask=tm, other=-1)
    if PRECISE:
        # where the chunk start's weight set m_t (w_t = 1), its gradient the same way: the row's closed
        # form R less its other entries. Summed as it comes, q C_c . dnum + dden q . n_c cancels to the
        # other weights' share of h (1e-6 on issue 40's fp16 wild-gates case), leaving fp32's rounding
        # of dh . h: df 1% off where eager's was 1e-5. Only where the start's share of the normaliser
        # (den = the steps' P S summed + w q . n_c) outweighs the steps': where they are all of h (an
        # empty start state), R less the others is R's rounding, while summed as it comes the start's
        # gradient is 0 (df 2.6% off at T 1)
        lead = tl.abs(w * qn) > tl.abs(den - w * qn)
        dlogw = tl.where((src == -2) & lead, R - tl.sum(Z, 1), dlogw)
    is_src = src[:, None] == j[None, :]
    others = tl.sum(tl.where(is_src, 0.0, Z), 1)
    Z = tl.where(is_src, (fl - others - dlogw)[:, None], Z)
    col = tl.sum(Z, 0)
    # A_t enters every weight of row t (+) and of column t (-): the diagonal's weights, A_t - A_t, not
    # at all, and left out here rather than added and taken away again (where one step's weight is
    # all of h, its entry dwarfs the others of its column, whose sum it would round away: df 2.6e3
    # times its norm off in bf16, issue 40)
    off = tl.where(j[:, None] == j[None, :], 0.0, Z)
    dA = tl.sum(off, 1) - tl.sum(off, 0) + dlogw - dlogb
    da = suffix_sum(dA, PRECISE)  # a_l enters every A_t with t >= l
    # the stabiliser's parts: the chunk's own, and the next chunk start's through the last step
    dim = tl.load(dim_ptr + bh * T + t, mask=tm, other=0.0)
    dam = tl.load(dam_ptr + bh * T + t, mask=tm, other=0.0)
    if NEXT:
        # A_end: the chunk's state update, added by _mlstm_dlinks
        _store_link(links_ptr, bh, c, NC, ig, it, rest, seg, seg_end, tm, m_c + A_end, dlogw, dlogb, kappa * kap, L)
        dim_next, dam_next = _next_start_grad(tl.load(dms_ptr + row + 1), tl.load(last_ptr + bh * NC + c), ig, it, L)
        dim, dam = dim + dim_next, dam + dam_next
    da += dam
    di = col + dlogb + dim
    m2 = tm[:, None] & (d < DH)[None, :]
    tl.store(dq_ptr + (bh * T + t)[:, None] * DH + d[None, :], dq.to(dq_ptr.dtype.element_ty), mask=m2)
    tl.store(dk_ptr + (bh * T + t)[:, None] * DH + d[None, :], dk.to(dk_ptr.dtype.element_ty), mask=m2)
    tl.store(di_ptr + bh * T + t, di.to(di_ptr.dtype.element_ty), mask=tm)
    tl.store(df_ptr + bh * T + t, (da * sigmoid_f32(-f, PRECISE)).to(df_ptr.dtype.element_ty), mask=tm)


@triton.jit
def _dominant_entry(PG, P, S, G, w, qCdnum, qn, qinv, den, floor, eps):
    """PG with each row's largest |P S| entry s (fp32) in closed form. G_ts + dden_t = qinv dh_t . (v_s -
    h_t N_t / den_t) cancels where that entry is all of h_t (to eps / N_t with a reset at every step:
    dk 4x eager's error at DH 1); the same in the terms of the others, without the cancellation:
    G_ts eps qinv + sign(den) qinv (sum_{s' != s} P S_ts' (G_ts - G_ts') + w (q n G_ts - q C . dnum)).
    Where the floor wins (dden = 0) there is nothing to cancel."""
    j = tl.arange(0, PG.shape[1])
    PS = P * S
    top = tl.argmax(tl.abs(PS), 1, tie_break_left=True)
    is_top = j[None, :] == top[:, None]
    G_top = tl.sum(tl.where(is_top, G, 0.0), 1)
    others = tl.sum(tl.where(is_top, 0.0, PS * (G_top[:, None] - G)), 1)
    rest = G_top * eps * qinv + tl.where(den < 0.0, -qinv, qinv) * (others + w * (qn * G_top - qCdnum))
    return tl.where(is_top & (tl.abs(den) >= floor)[:, None], P * rest[:, None], PG)


@triton.jit
def _store_link(links_ptr, bh, c, NC, ig, it, rest, seg, seg_end, tm, carry, dlogw, dlogb, dlogk, L: tl.constexpr):
    """What _mlstm_dlinks needs of chunk c: X, the gradient of the log-scale of its start
    state through its own outputs; Y, its keys' log-weights' into the next state (sum dlogb); K,
    the carried state's (log kappa); and what set the next start's stabiliser: -1 the carried state,
    s the input gate of step s, L a reset's zeroed stabiliser (as the forward's _mlstm_states)."""
    top = tl.where((seg == seg_end) & tm, it + rest, NEG)
    s = tl.argmax(top, 0, tie_break_left=True)
    by_reset = tl.sum(tl.where((tl.arange(0, L) == s) & (it > ig), 1, 0), 0) > 0
    kind = tl.where((seg_end == 0) & (carry >= tl.max(top, 0)), -1, tl.where(by_reset, L, s))
    p = links_ptr + (bh * NC + c) * 4
    tl.store(p, tl.sum(dlogw, 0))
    tl.store(p + 1, tl.sum(dlogb, 0))
    tl.store(p + 2, dlogk)
    tl.store(p + 3, kind.to(tl.float32))


@triton.jit(do_not_specialize=["T", "NC", "G"])
def _mlstm_dlinks(links_ptr, f_ptr, di_ptr, df_ptr, di_out, df_out, T, NC, G, L: tl.constexpr, NCP: tl.constexpr,
                  CB: tl.constexpr, PRECISE: tl.constexpr):
    """The gradient of each chunk's whole log decay A_end (it scales the next start
    state: the gradient of that state's log-scale, D), by a reverse scan over chunks of one (row,
    head): D_c = X_c + (D_{c+1} - Y_c where the carried state set the next stabiliser (kappa = 1),
    else K_c). Summed as it comes, <C, dC> + <n, dn> cancels as the rows' dlogw do (see
    _mlstm_dchunk), where the state is all of the next chunk's outputs. Where step s's key set it
    (beta_s = 1), s's share takes the difference, as is_src rows do (di_s, and A_s's part); after a
    reset's zeroed one the chunk keeps the sum as it comes. a_l enters A_end for every l of the chunk.
    di, df: the chunk kernel's parts in fp32 (bf16's rounded there would be rounded again here, after
    the link's share cancels them); di_out, df_out: the gradients, in the inputs' dtype.
    D_c = a_c D_{c+1} + b_c is one associative scan over the chunks (what the chunk c needs is
    D_{c+1}: the scan of the terms shifted by one). The row's steps are spread over programs of G
    chunks, CB a turn; each turn scans all of the row's chunks (a few loads a chunk) and takes its
    own by tl.gather, so that nothing is written between programs. One program a row (the scan's
    results written back for the turns) left most SMs idle and each lane a long chain of work: 22.2 µs
    where this takes 2.9 (H200, bf16, B8 NH8 T1024; lab/results/mlstm_tail_h200_b383559.txt)."""
    bh = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, L)
    c = tl.arange(0, NCP)
    p = links_ptr + (bh * NC + c) * 4
    nxt = c + 1 < NC  # chunk c+1's terms: a = 1 where its carried state set the stabiliser after it
    start = tl.program_id(1) * G
    for c0 in range(start, tl.minimum(start + G, NC), CB):
        # the turn's loads first, then the scan (again each turn, a few loads a chunk): one wait for
        # memory a turn rather than two, where most programs take one turn
        cc = c0 + tl.arange(0, CB)
        cm = cc < NC
        q = links_ptr + (bh * NC + cc) * 4
        XK = tl.load(q + 1, mask=cm, other=0.0) + tl.load(q + 2, mask=cm, other=0.0)
        kind = tl.load(q + 3, mask=cm, other=0.0).to(tl.int32)[:, None]
        step = cc[:, None] * L + j[None, :]
        tm = cm[:, None] & (step < T)
        t = bh * T + step
        f = tl.load(f_ptr + t, mask=tm, other=0.0).to(tl.float32)
        df = tl.load(df_ptr + t, mask=tm, other=0.0)
        di = tl.load(di_ptr + t, mask=tm, other=0.0)
        kind1 = tl.load(p + 7, mask=nxt, other=0.0)
        a = tl.where(nxt & (kind1 < 0), 1.0, 0.0)
        b = tl.load(p + 4, mask=nxt, other=0.0) + tl.where(kind1 < 0, -tl.load(p + 5, mask=nxt, other=0.0),
                                                            tl.load(p + 6, mask=nxt, other=0.0))
        _, E = tl.associative_scan((a, b), 0, first_order, reverse=True)  # E_c = D_{c+1}
        D = tl.gather(E, tl.minimum(cc, NCP - 1), 0)
        dl = (D - XK)[:, None]
        df += (D[:, None] - tl.where(j[None, :] <= kind, dl, 0.0)) * sigmoid_f32(-f, PRECISE)
        tl.store(df_out + t, df.to(df_out.dtype.element_ty), mask=tm)
        di += tl.where(j[None, :] == kind, dl, 0.0)
        tl.store(di_out + t, di.to(di_out.dtype.element_ty), mask=tm)


@triton.jit
def _mlstm_dprep(dh_ptr, h_ptr, mo_ptr, den_ptr, qinv_ptr, dden_ptr, dmj_ptr, R, DH, eps, BR: tl.constexpr,
                 DP: tl.constexpr, PRECISE: tl.constexpr):
    """Per step (a row of the BH * T): the normaliser's inverse qinv = 1 / (max(|den|, exp(-m)) + eps),
    dden = -(dh . h) qinv sign(den) where |den| >= exp(-m) (else 0), and the stabiliser's
    dmj = -eps (dh . h) qinv; one launch where a dozen element-wise PyTorch ops each took one (at
    small shapes their launches were most of the backward)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    d = tl.arange(0, DP)
    mr = r < R
    m2 = mr[:, None] & (d < DH)[None, :]
    offs = r.to(tl.int64)[:, None] * DH + d[None, :]
    dh = tl.load(dh_ptr + offs, mask=m2, other=0.0).to(tl.float32)
    dh_h = tl.sum(dh * tl.load(h_ptr + offs, mask=m2, other=0.0).to(tl.float32), 1)
    den = tl.load(den_ptr + r, mask=mr, other=1.0)
    floor = exp_f32(-tl.load(mo_ptr + r, mask=mr, other=0.0), PRECISE)
    qinv = div_f32(1.0, tl.maximum(tl.abs(den), floor) + eps, PRECISE)
    sign = tl.where(den > 0.0, 1.0, tl.where(den < 0.0, -1.0, 0.0))
    tl.store(qinv_ptr + r, qinv, mask=mr)
    tl.store(dden_ptr + r, tl.where(tl.abs(den) >= floor, -dh_h * qinv * sign, 0.0), mask=mr)
    tl.store(dmj_ptr + r, -eps * dh_h * qinv, mask=mr)


def links_meta(L: int, NC: int, steps: int = 512, warps: int = 0, most: int = 8) -> tuple[int, dict]:
    """(G, _mlstm_dlinks' constexprs): a row's chunks over cdiv(NC, G) programs; the chunks
    padded to a power of two, about `steps` steps a program (G chunks; no more than `most` programs
    a row, as each scans all of the row's chunks), CB chunks a turn (a tile of at most 4096 steps),
    in 4 warps unless `warps` (at 512 steps a program, faster than 1 or 2 at every shape timed)."""
    ncp = triton.next_power_of_2(NC)
    cb = triton.next_power_of_2(max(1, min(steps // L, NC)))
    cb = min(cb, max(1, 4096 // L))
    g = max(cb, triton.cdiv(triton.cdiv(NC, most), cb) * cb)
    return g, dict(L=L, NCP=ncp, CB=cb, num_warps=warps or 4)


def dlinks(links, f, di_part, df_part, di, df, L: int, PRECISE: bool, **tile):
    """_mlstm_dlinks over links (BH, NC, 4) and the (BH, T) gates: di, df written (tile: links_meta's)."""
    BH, NC, _ = links.shape
    G, meta = links_meta(L, NC, **tile)
    _mlstm_dlinks[(BH, triton.cdiv(NC, G))](links, f, di_part, df_part, di, df, f.shape[-1], NC, G, PRECISE=PRECISE,
                                            **meta)


def warps(config) -> tuple[int, int]:
    """The backward's (chunk-local state gradient, chunk kernel) warps: its own where set, else the
    forward's."""
    return config.state_warps_bwd or config.state_warps, config.warps_bwd or config.warps


def shared_bwd(config, dtype, DH: int, dot_f32: bool, device) -> int:
    """The backward kernels' shared memory, the larger (arguments as mlstm_bwd passes them)."""
    f32, u8, i32, meta = torch.float32, torch.uint8, torch.int32, meta_of(config, DH, dtype, dot_f32)
    dlocal = (dtype, dtype, f32, f32, f32, dtype, dtype, u8, f32, f32, f32, f32, f32, f32, i32, f32, f32, i32, 1, 1, DH,
              1, 1)
    dchunk = (dtype, dtype, dtype, dtype, dtype, u8, dtype, f32, f32, f32, f32, f32, f32, f32, f32, f32, i32, f32, f32,
              i32, f32, dtype, dtype, dtype, f32, f32, 1, 1, DH, 1, 1.0, 1e-6, 1)
    local_warps, chunk_warps = warps(config)
    # (the kernels as a sequence of more than one chunk takes them: the larger)
    need = max(shared_bytes_for_types(_mlstm_dlocal, dlocal, dict(meta, BY_CHUNK=config.dstates_by_chunk, STATES=True,
                                                                   num_warps=local_warps), device),
               shared_bytes_for_types(_mlstm_dchunk, dchunk, dict(meta, NEXT=True, num_warps=chunk_warps), device),
               shared_bytes_for_types(_mlstm_dscan, (f32, f32, f32, f32, i32, DH, 1, 1),
                                      dict(BLOCK=scan_block(DH), num_warps=4), device))
    links = (f32, dtype, f32, f32, dtype, dtype, 1, 1, 1)
    links_meta1 = dict(links_meta(meta["L"], 1)[1], PRECISE=meta["PRECISE"])
    return max(need, shared_bytes_for_types(_mlstm_dlinks, links, links_meta1, device))


def mlstm_bwd(dh, q, k, v, i, f, resets, NH: int, h, saved, config, dot_f32: bool, eps: float):
    """(dq, dk, dv, di, df) for the saved forward (cs, ns, ms, mo, den)."""
    cs, ns, ms, mo, den = saved
    BH, T, DH = q.shape
    L = config.chunk
    NC = triton.cdiv(T, L)
    dp = padded(DH)
    bv = min(config.bv, dp)
    dh = dh.contiguous()
    meta = meta_of(config, DH, q.dtype, dot_f32)
    local_warps, chunk_warps = warps(config)
    # the stabiliser's dmj: h = q C~ / (max(|q n~|, 1) + eps exp(m))
    qinv, dden, dmj = torch.empty_like(mo), torch.empty_like(mo), torch.empty_like(mo)
    rows = max(1, 2048 // dp)  # 2048 elements in 8 warps: 5-10% faster than 4096 in 4 (mlstm_tail_h200_b383559)
    _mlstm_dprep[(triton.cdiv(BH * T, rows),)](dh, h, mo, den, qinv, dden, dmj, BH * T, DH, eps, BR=rows, DP=dp,
                                                 PRECISE=meta["PRECISE"], num_warps=8)
    dcs, dns, dms = torch.empty_like(cs), torch.empty_like(ns), torch.empty_like(ms)
    kap = torch.empty(BH, NC, device=q.device, dtype=torch.float32)  # each chunk's decay of the carried state
    last = torch.empty(BH, NC, device=q.device, dtype=torch.int32)  # the source of its last step's stabiliser
    rs = resets.view(torch.uint8) if resets is not None else mo
    dim, dam = torch.empty_like(mo), torch.empty_like(mo)  # the stabiliser's parts of di and of d logsigmoid(f)
    src = torch.empty(BH, T, device=q.device, dtype=torch.int32)
    has_resets = int(resets is not None)
    # One chunk: straight, no scan, and of the state gradients only the stabiliser's (no gradient
    # comes back into the final state, returned detached, and the first start state is zero); the
    # chunk kernel then writes di and df itself, with nothing for the link scan to add
    after = NC > 1
    by_chunk = config.dstates_by_chunk or not after
    _mlstm_dlocal[(NC if by_chunk else 1, BH, dp // bv if after else 1)](
        q, dh, qinv, dden, dmj, i, f, rs, ms, mo, dcs, dns, dms, kap, last, dim, dam, src, NH, T, DH, NC, has_resets,
        BY_CHUNK=by_chunk, STATES=after, num_warps=local_warps, **meta)
    if by_chunk and after:
        block = scan_block(DH)
        W = triton.cdiv(DH * DH, block)
        _mlstm_dscan[(BH, W + 1)](dcs, dns, dms, kap, last, DH, NC, W, BLOCK=block, num_warps=4)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    di, df = torch.empty_like(i), torch.empty_like(f)
    di_part, df_part = (di, df) if meta["PRECISE"] or not after else (torch.empty_like(mo), torch.empty_like(mo))
    links = torch.empty(BH, NC, 4, device=q.device, dtype=torch.float32)
    _mlstm_dchunk[(NC, BH)](q, k, v, i, f, rs, dh, qinv, den, cs, ns, ms, mo, dcs, dns, dms, last, dim, dam, src,
                            links, dq, dk, dv, di_part, df_part, NH, T, DH, NC, DH ** -0.5, eps, has_resets,
                            NEXT=after, num_warps=chunk_warps, **meta)
    if after:
        dlinks(links, f, di_part, df_part, di, df, L, meta["PRECISE"])
    return dq, dk, dv, di, df
