"""The RTU's Triton kernels: the complex diagonal recurrence with resets, forward and backward.

Per channel h of a sequence, with lambda = g + i p = r e^{i theta} and u1, u2 the two input
injections (x * w1, x * w2 for diagonal maps; given for low-rank maps, where w1 = w2 = 1):

    c_t = lambda * keep_t * c_{t-1} + gamma * (u1_t + i u2_t),   keep_t = 0 at a reset, else 1
    y_t = [silu(Re c_t), silu(Im c_t)]

The backward is the reverse scan of the adjoint s_t = eta_t + keep_{t+1} conj(lambda) s_{t+1},
eta_t = silu'(c_t) dy_t, with c recomputed chunk by chunk from the states the forward kept at
chunk ends. Each chunk is a tl.associative_scan over time of (transition, input) pairs; see
config.py for the tiling and the split of long sequences into segments."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.scan import accumulator, first_order_complex, row_of, sigmoid, sum_dtype, sum_of_products
from . import lanes
from .config import RTUConfig, pick
from .dynamics import dynamics, exact_transitions, power, silu_grad


@triton.jit
def _keep(R, b, t, T, HAS_R: tl.constexpr):
    """1.0 where step t carries the state over, 0.0 at a reset (1.0 outside the sequence)."""
    if HAS_R:
        m = tl.load(R + b * T + t, mask=(t >= 0) & (t < T), other=0)
        return 1.0 - m.to(tl.float32)
    return tl.full(t.shape, 1.0, tl.float32)


@triton.jit
def _inputs(X1, X2, base, t, h, T, H, mh, SAME_X: tl.constexpr):
    """The [chunk, block_h] tiles of u1 and u2 at steps t (zero outside the sequence)."""
    mask = ((t >= 0) & (t < T))[:, None] & mh[None, :]
    offs = base + t[:, None] * H + h[None, :]
    x1 = tl.load(X1 + offs, mask=mask, other=0.0).to(tl.float32)
    if SAME_X:
        x2 = x1
    else:
        x2 = tl.load(X2 + offs, mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _program(NU, TH, W1, W2, H, BLOCK_H: tl.constexpr, HAS_W: tl.constexpr):
    """This program's sequence b, channels h (and their mask), and their dynamics."""
    n_hb = tl.cdiv(H, BLOCK_H)
    h = (tl.program_id(0) % n_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
    mh = h < H
    g, p, gam, w1, w2 = dynamics(NU, TH, W1, W2, h, mh, BLOCK_H, HAS_W)
    return tl.program_id(0) // n_hb, h, mh, g, p, gam, w1, w2


@triton.jit
def _entering(ENDS, b, h, mh, H, BLOCK_H: tl.constexpr, REVERSE: tl.constexpr):
    """The state entering this program's segment (REVERSE: the adjoint entering it from the end):
    the (transition, end from a zero state) pairs of the segments before it (after it, last first)
    combined in order."""
    seg, n_seg = tl.program_id(1), tl.num_programs(1)
    cr = tl.zeros([BLOCK_H], tl.float32)
    ci = tl.zeros([BLOCK_H], tl.float32)
    if REVERSE:
        count = n_seg - 1 - seg
    else:
        count = seg
    i = 0
    while i < count:
        if REVERSE:
            j = n_seg - 1 - i
        else:
            j = i
        e = ENDS + ((b * n_seg + j) * 4) * H + h
        ar, ai = tl.load(e, mask=mh, other=0.0), tl.load(e + H, mask=mh, other=0.0)
        er, ei = tl.load(e + 2 * H, mask=mh, other=0.0), tl.load(e + 3 * H, mask=mh, other=0.0)
        cr, ci = ar * cr - ai * ci + er, ar * ci + ai * cr + ei
        i += 1
    return cr, ci


@triton.jit
def _store_ends(ENDS, b, h, mh, H, tr, ti, cr, ci):
    """This program's segment's transition and end state (or adjoint) from a zero one."""
    e = ENDS + ((b * tl.num_programs(1) + tl.program_id(1)) * 4) * H + h
    tl.store(e, tr, mask=mh)
    tl.store(e + H, ti, mask=mh)
    tl.store(e + 2 * H, cr, mask=mh)
    tl.store(e + 3 * H, ci, mask=mh)


@triton.jit
def _rtu_fwd(X1, X2, W1, W2, NU, TH, R, Y, CK, ENDS, T, H, n_chunks, per_seg,
             BLOCK_H: tl.constexpr, CHUNK: tl.constexpr, SAME_X: tl.constexpr, HAS_W: tl.constexpr,
             HAS_R: tl.constexpr, STORE_CK: tl.constexpr, ENDS_PASS: tl.constexpr, SPLIT: tl.constexpr,
             PRECISE: tl.constexpr):
    """Program (sequence b x channel block, segment): scans the segment's chunks. ENDS_PASS: from a
    zero state, storing only the segment's transition and end state; otherwise from the state the
    earlier segments' ends combine to (SPLIT), writing y and, with STORE_CK, each chunk's end.
    PRECISE (fp32): the carried state enters each row through lambda^(row+1) rounded once from fp64
    (`powers`), not through the scan's products of fp32 lambdas, whose rounding is the same in every
    chunk: for a memory of thousands of steps that error adds up chunk after chunk (dtheta_log 15x
    eager's error at T 600, r 0.9997)."""
    b, h, mh, g, p, gam, w1, w2 = _program(NU, TH, W1, W2, H, BLOCK_H, HAS_W)
    k1 = gam * w1
    k2 = gam * w2
    rows = tl.arange(0, CHUNK)
    if PRECISE:
        pow_r, pow_i = power(NU, TH, h, mh, (rows + 1).to(tl.float64)[:, None], False)
    base = b.to(tl.int64) * T * H
    cr = tl.zeros([BLOCK_H], tl.float32)
    ci = tl.zeros([BLOCK_H], tl.float32)
    if SPLIT and not ENDS_PASS:
        cr, ci = _entering(ENDS, b, h, mh, H, BLOCK_H, False)
    tr = tl.full([BLOCK_H], 1.0, tl.float32)  # the segment's transition (ENDS_PASS)
    ti = tl.zeros([BLOCK_H], tl.float32)
    hit = 0.0  # a reset in the segment (ENDS_PASS, PRECISE)
    c = tl.program_id(1) * per_seg
    end = tl.minimum(c + per_seg, n_chunks)  # the last segment may be short
    while c < end:
        t = c * CHUNK + rows
        x1, x2 = _inputs(X1, X2, base, t, h, T, H, mh, SAME_X)
        keep = _keep(R, b, t, T, HAS_R)[:, None]
        inside = (t < T)[:, None]
        ar = tl.where(inside, g[None, :] * keep, 1.0)
        ai = tl.where(inside, p[None, :] * keep, 0.0)
        Ar, Ai, Br, Bi = tl.associative_scan((ar, ai, k1[None, :] * x1, k2[None, :] * x2), 0, first_order_complex)
        if PRECISE:
            Ar, Ai = exact_transitions(pow_r, pow_i, keep, False)
        c1 = Br + Ar * cr[None, :] - Ai * ci[None, :]
        c2 = Bi + Ar * ci[None, :] + Ai * cr[None, :]
        cr = row_of(c1, rows[:, None], CHUNK - 1)
        ci = row_of(c2, rows[:, None], CHUNK - 1)
        if ENDS_PASS:
            if PRECISE:
                hit = tl.maximum(hit, tl.max(1.0 - keep))
            else:
                lr = row_of(Ar, rows[:, None], CHUNK - 1)
                li = row_of(Ai, rows[:, None], CHUNK - 1)
                tr, ti = lr * tr - li * ti, lr * ti + li * tr
        else:
            mask = inside & mh[None, :]
            y = Y + 2 * base + t[:, None] * (2 * H) + h[None, :]
            tl.store(y, (c1 * sigmoid(c1, False, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            tl.store(y + H, (c2 * sigmoid(c2, False, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            if STORE_CK:
                ck = CK + ((b * n_chunks + c) * 2) * H + h
                tl.store(ck, cr, mask=mh)
                tl.store(ck + H, ci, mask=mh)
        c += 1
    if ENDS_PASS:
        if PRECISE:
            tr, ti = _segment_transition(NU, TH, h, mh, (end - tl.program_id(1) * per_seg) * CHUNK, hit, False)
        _store_ends(ENDS, b, h, mh, H, tr, ti, cr, ci)


@triton.jit
def _segment_transition(NU, TH, h, mh, steps, hit, CONJ: tl.constexpr):
    """lambda^steps (CONJ: its conjugate) rounded once from fp64, or 0 where the segment holds a
    reset (hit > 0): the transition over a segment, as the product of its chunks' transitions
    without their roundings."""
    tr, ti = power(NU, TH, h, mh, steps.to(tl.float64), CONJ)
    return tl.where(hit > 0.0, 0.0, tr), tl.where(hit > 0.0, 0.0, ti)


@triton.jit
def _states(X1, X2, CK, R, b, c, base, rows, h, mh, T, H, n_chunks, g, p, k1, k2, x1, x2, keep,
            CHUNK: tl.constexpr, SAME_X: tl.constexpr, HAS_R: tl.constexpr):
    """The chunk's kept previous states keep_t * c_{t-1} and states c_t, recomputed from the state
    the forward kept at the end of the chunk before: a scan of the steps shifted by one, whose
    first row is that state."""
    t = c * CHUNK + rows
    prev = CK + ((b * n_chunks + c - 1) * 2) * H + h
    has_prev = mh & (c > 0)
    pr = tl.load(prev, mask=has_prev, other=0.0)
    pi = tl.load(prev + H, mask=has_prev, other=0.0)
    s1, s2 = _inputs(X1, X2, base, t - 1, h, T, H, mh, SAME_X)
    ks = _keep(R, b, t - 1, T, HAS_R)[:, None]
    head = (rows == 0)[:, None]
    ar = tl.where(head, 0.0, g[None, :] * ks)
    ai = tl.where(head, 0.0, p[None, :] * ks)
    br = tl.where(head, pr[None, :], k1[None, :] * s1)
    bi = tl.where(head, pi[None, :], k2[None, :] * s2)
    _, _, q1, q2 = tl.associative_scan((ar, ai, br, bi), 0, first_order_complex)
    q1 = q1 * keep
    q2 = q2 * keep
    c1 = g[None, :] * q1 - p[None, :] * q2 + k1[None, :] * x1
    c2 = g[None, :] * q2 + p[None, :] * q1 + k2[None, :] * x2
    return q1, q2, c1, c2


@triton.jit
def _rtu_bwd(X1, X2, W1, W2, NU, TH, R, DY, CK, ENDS, DX1, DX2, PART, T, H, n_chunks, per_seg,
             BLOCK_H: tl.constexpr, CHUNK: tl.constexpr, SAME_X: tl.constexpr, HAS_W: tl.constexpr,
             HAS_R: tl.constexpr, ENDS_PASS: tl.constexpr, SPLIT: tl.constexpr, PRECISE: tl.constexpr,
             ACC: tl.constexpr):
    """Program (sequence b x channel block, segment): the segment's chunks from last to first.
    ENDS_PASS: the adjoint at the segment's first step from a zero adjoint after it, and the
    segment's transition; otherwise dx (dx1, dx2 for low-rank maps) and the program's sums for
    the parameters' gradients: PART[program] = (dg, dp, dgamma, dw1, dw2) over its steps, summed in
    ACC (fp64 for fp32 inputs: see accumulator). PRECISE: the adjoint carried in through powers of
    conj(lambda) rounded once, as _rtu_fwd's state."""
    b, h, mh, g, p, gam, w1, w2 = _program(NU, TH, W1, W2, H, BLOCK_H, HAS_W)
    k1 = gam * w1
    k2 = gam * w2
    rows = tl.arange(0, CHUNK)
    if PRECISE:
        pow_r, pow_i = power(NU, TH, h, mh, (CHUNK - rows).to(tl.float64)[:, None], True)
    base = b.to(tl.int64) * T * H
    sr = tl.zeros([BLOCK_H], tl.float32)
    si = tl.zeros([BLOCK_H], tl.float32)
    if SPLIT and not ENDS_PASS:
        sr, si = _entering(ENDS, b, h, mh, H, BLOCK_H, True)
    tr = tl.full([BLOCK_H], 1.0, tl.float32)
    ti = tl.zeros([BLOCK_H], tl.float32)
    acc_g = tl.zeros([BLOCK_H], ACC)
    acc_p = tl.zeros([BLOCK_H], ACC)
    acc_gam = tl.zeros([BLOCK_H], ACC)
    acc_w1 = tl.zeros([BLOCK_H], ACC)
    acc_w2 = tl.zeros([BLOCK_H], ACC)
    first = tl.program_id(1) * per_seg
    c = tl.minimum(first + per_seg, n_chunks) - 1  # the last segment may be short
    steps = (c + 1 - first) * CHUNK
    hit = 0.0  # a reset in the segment (ENDS_PASS, PRECISE)
    while c >= first:
        t = c * CHUNK + rows
        x1, x2 = _inputs(X1, X2, base, t, h, T, H, mh, SAME_X)
        keep = _keep(R, b, t, T, HAS_R)[:, None]
        q1, q2, c1, c2 = _states(X1, X2, CK, R, b, c, base, rows, h, mh, T, H, n_chunks, g, p, k1, k2,
                                 x1, x2, keep, CHUNK, SAME_X, HAS_R)
        mask = (t < T)[:, None] & mh[None, :]
        dy = DY + 2 * base + t[:, None] * (2 * H) + h[None, :]
        e1 = silu_grad(c1, False, PRECISE) * tl.load(dy, mask=mask, other=0.0).to(tl.float32)
        e2 = silu_grad(c2, False, PRECISE) * tl.load(dy + H, mask=mask, other=0.0).to(tl.float32)
        kn = _keep(R, b, t + 1, T, HAS_R)[:, None]
        Ar, Ai, Sr, Si = tl.associative_scan((g[None, :] * kn, -p[None, :] * kn, e1, e2), 0, first_order_complex,
                                             reverse=True)
        if PRECISE:
            Ar, Ai = exact_transitions(pow_r, pow_i, kn, True)
        s1 = Sr + Ar * sr[None, :] - Ai * si[None, :]
        s2 = Si + Ar * si[None, :] + Ai * sr[None, :]
        sr = row_of(s1, rows[:, None], 0)
        si = row_of(s2, rows[:, None], 0)
        if ENDS_PASS:
            if PRECISE:
                hit = tl.maximum(hit, tl.max(1.0 - kn))
            else:
                lr = row_of(Ar, rows[:, None], 0)
                li = row_of(Ai, rows[:, None], 0)
                tr, ti = lr * tr - li * ti, lr * ti + li * tr
        else:
            d1 = gam[None, :] * s1
            d2 = gam[None, :] * s2
            dx = DX1 + base + t[:, None] * H + h[None, :]
            if SAME_X:
                tl.store(dx, (w1[None, :] * d1 + w2[None, :] * d2).to(DX1.dtype.element_ty), mask=mask)
            else:
                tl.store(dx, d1.to(DX1.dtype.element_ty), mask=mask)
                tl.store(DX2 + base + t[:, None] * H + h[None, :], d2.to(DX2.dtype.element_ty), mask=mask)
            acc_g += sum_of_products(s1, q1, ACC) + sum_of_products(s2, q2, ACC)
            acc_p += sum_of_products(s2, q1, ACC) - sum_of_products(s1, q2, ACC)
            acc_gam += sum_of_products(s1 * w1[None, :], x1, ACC) + sum_of_products(s2 * w2[None, :], x2, ACC)
            acc_w1 += sum_of_products(d1, x1, ACC)
            acc_w2 += sum_of_products(d2, x2, ACC)
        c -= 1
    if ENDS_PASS:
        if PRECISE:
            tr, ti = _segment_transition(NU, TH, h, mh, steps, hit, True)
        _store_ends(ENDS, b, h, mh, H, tr, ti, sr, si)
    else:
        part = PART + ((b * tl.num_programs(1) + tl.program_id(1)) * 5) * H + h
        tl.store(part, acc_g, mask=mh)
        tl.store(part + H, acc_p, mask=mh)
        tl.store(part + 2 * H, acc_gam, mask=mh)
        tl.store(part + 3 * H, acc_w1, mask=mh)
        tl.store(part + 4 * H, acc_w2, mask=mh)


def _plan(T: int, chunk: int, segments: int) -> tuple[int, int, int]:
    """(chunks, chunks a segment, segments) with no empty segment."""
    n_chunks = triton.cdiv(T, chunk)
    per_seg = triton.cdiv(n_chunks, max(1, min(segments, n_chunks)))
    return n_chunks, per_seg, triton.cdiv(n_chunks, per_seg)


def _flags(x2, w1, resets) -> dict:
    return dict(SAME_X=x2 is None, HAS_W=w1 is not None, HAS_R=resets is not None)


def rtu_scan_forward(x1, x2, w1, w2, nu_log, theta_log, resets, config: RTUConfig | None = None,
                     keep_states: bool = False):
    """(y [B, T, 2H], the states at chunk ends [B, chunks, 2, H] fp32 or None). x2 None: the same
    input drives both parts (diagonal maps, gains w1 and w2); w1/w2 None: gains of 1 (low-rank
    maps, whose projections are x1 and x2). resets: [B, T] bool or None."""
    B, T, H = x1.shape
    cfg = config or pick(B, T, H, x1.device, resets is not None)
    n_chunks = triton.cdiv(T, cfg.chunk)
    y = torch.empty(B, T, 2 * H, device=x1.device, dtype=x1.dtype)
    ck = torch.empty(B, n_chunks, 2, H, device=x1.device, dtype=torch.float32) if keep_states else None
    if y.numel() == 0:  # no step, row or channel: nothing to scan
        return y, ck
    if cfg.path == "lanes":
        r = resets.view(torch.uint8) if resets is not None else None
        lanes.forward(x1, x2, w1, w2, nu_log, theta_log, r, y, ck, T, H, cfg, _flags(x2, w1, resets))
        return y, ck
    n_chunks, per_seg, n_seg = _plan(T, cfg.chunk, cfg.segments)
    ends = torch.empty(B, n_seg, 4, H, device=x1.device, dtype=torch.float32) if n_seg > 1 else None
    r = resets.view(torch.uint8) if resets is not None else None
    args = [x1, x1 if x2 is None else x2, w1 if w1 is not None else nu_log, w2 if w2 is not None else nu_log,
            nu_log, theta_log, r if r is not None else nu_log, y, ck if ck is not None else y,
            ends if ends is not None else y, T, H, n_chunks, per_seg]
    grid = (B * triton.cdiv(H, cfg.block_h), n_seg)
    meta = dict(BLOCK_H=cfg.block_h, CHUNK=cfg.chunk, STORE_CK=keep_states, SPLIT=n_seg > 1,
                PRECISE=x1.dtype == torch.float32, num_warps=cfg.warps, **_flags(x2, w1, resets))
    if n_seg > 1:
        _rtu_fwd[grid](*args, ENDS_PASS=True, **meta)
    _rtu_fwd[grid](*args, ENDS_PASS=False, **meta)
    return y, ck


def rtu_scan_backward(dy, x1, x2, w1, w2, nu_log, theta_log, resets, states, config: RTUConfig | None = None):
    """(dx1, dx2 or None, sums [5, H] (fp64 for fp32 x) of dg, dp, dgamma, dw1, dw2 over batch and time) from
    the upstream gradient and the states rtu_scan_forward kept (with the same config's chunk)."""
    B, T, H = x1.shape
    cfg = config or pick(B, T, H, x1.device, resets is not None)
    if states.shape[1] != triton.cdiv(T, cfg.chunk):
        raise ValueError(f"states kept every {triton.cdiv(T, states.shape[1])} steps, the backward's chunk is {cfg.chunk}")
    dy = dy.contiguous()
    dx1 = torch.empty_like(x1)
    dx2 = torch.empty_like(x2) if x2 is not None else None
    if x1.numel() == 0:  # no step, row or channel: nothing to scan
        return dx1, dx2, torch.zeros(5, H, device=x1.device, dtype=torch.float32)
    n_chunks, per_seg, n_seg = _plan(T, cfg.chunk, cfg.bwd_segments)
    part = torch.empty(B, n_seg, 5, H, device=x1.device, dtype=sum_dtype(x1.dtype))
    ends = torch.empty(B, n_seg, 4, H, device=x1.device, dtype=torch.float32) if n_seg > 1 else None
    r = resets.view(torch.uint8) if resets is not None else None
    args = [x1, x1 if x2 is None else x2, w1 if w1 is not None else nu_log, w2 if w2 is not None else nu_log,
            nu_log, theta_log, r if r is not None else nu_log, dy, states, ends if ends is not None else part,
            dx1, dx2 if dx2 is not None else dx1, part, T, H, n_chunks, per_seg]
    grid = (B * triton.cdiv(H, cfg.bwd_block_h), n_seg)
    meta = dict(BLOCK_H=cfg.bwd_block_h, CHUNK=cfg.chunk, SPLIT=n_seg > 1, PRECISE=x1.dtype == torch.float32,
                ACC=accumulator(x1.dtype), num_warps=cfg.bwd_warps, **_flags(x2, w1, resets))
    if n_seg > 1:
        _rtu_bwd[grid](*args, ENDS_PASS=True, **meta)
    _rtu_bwd[grid](*args, ENDS_PASS=False, **meta)
    return dx1, dx2, part.sum(dim=(0, 1))


def rtu_lanes_backward(dy, x1, x2, w1, w2, nu_log, theta_log, resets, states, config: RTUConfig):
    """The lanes path's backward (config.bwd_path "lanes"): (dx1, dx2 or None, dw1, dw2 (None
    without weights), dnu_log, dtheta_log), the parameters' sums added up and mapped on the GPU."""
    B, T, H = x1.shape
    if states.shape[1] != triton.cdiv(T, config.chunk):
        raise ValueError(f"states kept every {triton.cdiv(T, states.shape[1])} steps, the backward's chunk is {config.chunk}")
    dx1 = torch.empty_like(x1)
    dx2 = torch.empty_like(x2) if x2 is not None else None
    if x1.numel() == 0:  # no step, row or channel: nothing to scan
        zero = lambda t: torch.zeros_like(t) if t is not None else None  # noqa: E731
        return dx1, dx2, zero(w1), zero(w2), zero(nu_log), zero(theta_log)
    r = resets.view(torch.uint8) if resets is not None else None
    dw1, dw2, dnu, dth = lanes.backward(dy.contiguous(), x1, x2, w1, w2, nu_log, theta_log, r, states, dx1, dx2,
                                        T, H, config, _flags(x2, w1, resets))
    return dx1, dx2, dw1, dw2, dnu, dth
