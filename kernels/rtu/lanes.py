"""The RTU's lanes path (config path / bwd_path "lanes"; the recurrence is in scan.py).

Each thread owns `vec` neighbouring channels and holds a tile of their time steps in its
registers: a [steps, block_h] tile with block_h = 32 * warps * vec puts every lane and warp on the
channel axis, so a tile's tl.associative_scan is a loop over the thread's own registers (about four
instructions a step and channel: no shuffle, no shared memory, no barrier), where the tiles path
spreads time over lanes and warps. Reverse scans flip the tile (free in registers) rather than pass
reverse=True, which Triton 3.6 lowers with shuffles even along registers. H is a constexpr: with a
runtime H the compiler kept a 64-bit pointer per element across the loop (255 registers, spills).

Time is split into segments so that few channels still fill the GPU: a first launch scans every
segment from a zero state and keeps its transition and end (ENDS_PASS; the segment whose ends no
one reads is skipped), the second starts each segment from the ends of those before it (after it,
for the adjoint), combined in order, and writes the outputs: the inputs are read twice, the
outputs written once. Within a segment the next tile's loads are issued before the current one is
scanned. The forward keeps the state every `chunk` steps (its tile `steps` a multiple or a divisor
of it); the backward, in tiles of `chunk`, recomputes each one's states from the state kept before
it, the state before each step carried in the same scan, and sums the parameters' gradients per
program; one small launch adds the sums up and maps them to nu_log, theta_log and the weights."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.scan import accumulator, first_order_complex, row_of, sigmoid, sum_dtype, sum_of_products
from .dynamics import dynamics, one_minus_exp, power, silu_grad

# segments combined per round trip when a segment gathers the ends of the others (their loads are
# independent, so one wait covers the group)
_ENDS_GROUP = tl.constexpr(4)
# the backward's parameter sums with lambda folded in (_bwd's FOLD): None, for bf16 and fp16 inputs
# in fewer than FOLD_BELOW_SEGMENTS segments; True or False forces it (lab/fold_ab.py). On an H200
# (lab/results/fold_ab_h200.txt, two runs) folded was faster at 9 of 10 bf16 shapes, all of them in
# 1 to 9 segments (B8 T8192 H1024: 0.496 -> 0.481 ms; B4 T3000 H1000 -15%; B8 T512 H128, 8 segments
# of the same 64 steps, -8%), and slower at the one in 16, B8 T1024 H64 with resets (0.0374 ->
# 0.0404 and 0.0384 -> 0.0407 ms; the whole grids at bdc1a6a and 1c60bb2 stood +6.5% there): where
# between 9 and 16 segments the fold stops paying was not measured
FOLD_SUMS: bool | None = None
FOLD_BELOW_SEGMENTS = 16


@triton.jit
def _lanes(H, BLOCK_H: tl.constexpr, VEC: tl.constexpr):
    """This program's sequence b, its channels h (`VEC` neighbours a thread) and their mask. The
    hints make the compiler vectorise the loads by VEC along the channels, with lanes and warps on
    the channel axis; for VEC 1 a contiguity of 2 without alignment keeps the channel axis first
    (at equal contiguity, 1 and 1, the compiler put the lanes on time)."""
    n_hb = tl.cdiv(H, BLOCK_H)
    if VEC == 1:
        lanes = tl.multiple_of(tl.max_contiguous(tl.arange(0, BLOCK_H), 2), 1)
    else:
        lanes = tl.max_contiguous(tl.arange(0, BLOCK_H), VEC)
    h = (tl.program_id(0) % n_hb) * BLOCK_H + lanes
    return tl.program_id(0) // n_hb, h, h < H


@triton.jit
def _carry_in(ENDS, b, h, mh, H, n_seg, first, count, STEP: tl.constexpr, BLOCK_H: tl.constexpr):
    """The state (adjoint) entering a segment: the (transition, end) pairs of segments first,
    first + STEP, ... (`count` of them) applied in that order to a zero state."""
    cr = tl.zeros([BLOCK_H], tl.float32)
    ci = tl.zeros([BLOCK_H], tl.float32)
    i = 0
    while i < count:
        for u in tl.static_range(_ENDS_GROUP):
            ok = mh & (i + u < count)
            e = ENDS + ((b * n_seg + first + (i + u) * STEP) * 4) * H + h
            ar, ai = tl.load(e, mask=ok, other=1.0), tl.load(e + H, mask=ok, other=0.0)
            er, ei = tl.load(e + 2 * H, mask=ok, other=0.0), tl.load(e + 3 * H, mask=ok, other=0.0)
            cr, ci = ar * cr - ai * ci + er, ar * ci + ai * cr + ei
        i += _ENDS_GROUP
    return cr, ci


@triton.jit
def _store_ends(ENDS, b, seg, n_seg, h, mh, H, tr, ti, er, ei):
    e = ENDS + ((b * n_seg + seg) * 4) * H + h
    tl.store(e, tr, mask=mh)
    tl.store(e + H, ti, mask=mh)
    tl.store(e + 2 * H, er, mask=mh)
    tl.store(e + 3 * H, ei, mask=mh)


@triton.jit
def _tile(ptr, rows, h, H, t, T, mh, live, EVEN: tl.constexpr):
    """The [chunk, block_h] tile at ptr (its first step t[0]; rows H apart), as stored: zero past T,
    past the channels or where not live. EVEN (whole chunks and channel blocks): live is the mask."""
    offs = rows[:, None] * H + h[None, :]
    if EVEN:
        return tl.load(ptr + offs, mask=live, other=0.0)
    return tl.load(ptr + offs, mask=((t < T) & live)[:, None] & mh[None, :], other=0.0)


@triton.jit
def _resets(R, b, t, T, live, HAS_R: tl.constexpr):
    """The reset flags [chunk] (int32, 0 or 1) at steps t; 0 outside the sequence."""
    if HAS_R:
        return tl.load(R + b * T + t, mask=(t < T) & live, other=0).to(tl.int32)
    return tl.zeros(t.shape, tl.int32)


@triton.jit
def _flip_scan(ar, ai, br, bi):
    """tl.associative_scan(..., reverse=True) of first_order_complex, as a forward scan of the
    flipped chunk (flips are register renames here; a reverse scan is lowered with shuffles):
    (transitions to the chunk's end, real and imaginary; states, real and imaginary)."""
    a1, a2, s1, s2 = tl.associative_scan((tl.flip(ar, 0), tl.flip(ai, 0), tl.flip(br, 0), tl.flip(bi, 0)), 0,
                                         first_order_complex)
    return tl.flip(a1, 0), tl.flip(a2, 0), tl.flip(s1, 0), tl.flip(s2, 0)


@triton.jit
def _exact_carry(er, ei, lr, li, cr, ci, lam_r, lam_i, hit):
    """The end (er, ei) of a tile into which the carried state (cr, ci) entered through the scan's
    transition over the tile (lr, li, fp32 products of lambda, rounded alike in every tile),
    corrected to lambda^tile rounded once (lam_r, lam_i; 0 where the tile holds a reset, `hit`):
    the error of the scan's product would otherwise add up tile after tile for long memories."""
    dr = tl.where(hit > 0, 0.0, lam_r) - lr
    di = tl.where(hit > 0, 0.0, lam_i) - li
    return er + dr * cr - di * ci, ei + dr * ci + di * cr


@triton.jit
def _with_previous(ar1, ai1, kr1, ki1, br1, bi1, qr1, qi1, ar2, ai2, kr2, ki2, br2, bi2, qr2, qi2):
    """Affine maps of the pair (state c, previous state q): c' = a c + b, q' = k c + q (complex).
    Composed, c'' = a2 a1 c + a2 b1 + b2 and q'' = k2 a1 c + k2 b1 + q2. Scanned with k_t = keep_t
    and q_t = 0 (-0.0, which adds nothing exactly), the q part of step t is keep_t * c_{t-1}."""
    ar, ai, br, bi = first_order_complex(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2)
    kr = kr2 * ar1 - ki2 * ai1
    ki = kr2 * ai1 + ki2 * ar1
    qr = kr2 * br1 - ki2 * bi1 + qr2
    qi = kr2 * bi1 + ki2 * br1 + qi2
    return ar, ai, kr, ki, br, bi, qr, qi


@triton.jit
def _fwd(X1, X2, W1, W2, NU, TH, R, Y, CK, ENDS, T, H: tl.constexpr, n_tiles, per_seg, n_seg, n_kept,
         BLOCK_H: tl.constexpr, VEC: tl.constexpr, CHUNK: tl.constexpr, KEEP: tl.constexpr, SAME_X: tl.constexpr,
         HAS_W: tl.constexpr, HAS_R: tl.constexpr, STORE_CK: tl.constexpr, ENDS_PASS: tl.constexpr,
         EVEN: tl.constexpr, ASM: tl.constexpr, PRECISE: tl.constexpr):
    """Program (sequence x channel block, segment), in tiles of CHUNK steps. ENDS_PASS: the segment
    from a zero state, keeping its transition and end; otherwise from the state the earlier
    segments' ends combine to, writing y and, with STORE_CK, the state after every KEEP steps (the
    backward's chunk: a multiple or a divisor of CHUNK). Steps past T run on (zero input, no reset):
    only the last tile has them, and neither the last state kept nor the last segment's ends is read.
    PRECISE (fp32): the state carried to the next tile through lambda^CHUNK rounded once
    (_exact_carry; a table of every row's power, as scan.py's tiles hold, would spill here)."""
    b, h, mh = _lanes(H, BLOCK_H, VEC)
    g, p, gam, w1, w2 = dynamics(NU, TH, W1, W2, h, mh, BLOCK_H, HAS_W)
    k1 = (gam * w1)[None, :]
    k2 = (gam * w2)[None, :]
    rows = tl.arange(0, CHUNK)
    head = (rows == 0)[:, None]
    if PRECISE:
        lam_r, lam_i = power(NU, TH, h, mh, CHUNK, False)
    base = b.to(tl.int64) * T * H
    seg = tl.program_id(1)
    c = seg * per_seg
    end = tl.minimum(c + per_seg, n_tiles)
    if ENDS_PASS:
        cr = tl.zeros([BLOCK_H], tl.float32)
        ci = tl.zeros([BLOCK_H], tl.float32)
    else:
        cr, ci = _carry_in(ENDS, b, h, mh, H, n_seg, 0, seg, 1, BLOCK_H)
    hit = 0  # a reset in the segment (ENDS_PASS): its transition is 0
    at = base + c.to(tl.int64) * CHUNK * H
    x1n = _tile(X1 + at, rows, h, H, c * CHUNK + rows, T, mh, True, EVEN)
    x2n = x1n if SAME_X else _tile(X2 + at, rows, h, H, c * CHUNK + rows, T, mh, True, EVEN)
    rn = _resets(R, b, c * CHUNK + rows, T, True, HAS_R)
    while c < end:
        x1, x2, r = x1n.to(tl.float32), x2n.to(tl.float32), rn
        t = c * CHUNK + rows
        # the next chunk's loads go out before this one is scanned
        live = c + 1 < end
        x1n = _tile(X1 + at + CHUNK * H, rows, h, H, t + CHUNK, T, mh, live, EVEN)
        x2n = x1n if SAME_X else _tile(X2 + at + CHUNK * H, rows, h, H, t + CHUNK, T, mh, live, EVEN)
        rn = _resets(R, b, t + CHUNK, T, live, HAS_R)
        keep = (1 - r).to(tl.float32)[:, None]
        ar = g[None, :] * keep
        ai = p[None, :] * keep
        br = k1 * x1
        bi = k2 * x2
        br = tl.where(head, br + ar * cr[None, :] - ai * ci[None, :], br)  # the carried state enters at row 0
        bi = tl.where(head, bi + ar * ci[None, :] + ai * cr[None, :], bi)
        tr_all, ti_all, c1, c2 = tl.associative_scan((ar, ai, br, bi), 0, first_order_complex)
        end_r = row_of(c1, rows[:, None], CHUNK - 1)
        end_i = row_of(c2, rows[:, None], CHUNK - 1)
        if PRECISE:  # (the first row's transition is lambda keep: the carried state's, times lambda^(CHUNK-1))
            lr = row_of(tr_all, rows[:, None], CHUNK - 1)
            li = row_of(ti_all, rows[:, None], CHUNK - 1)
            end_r, end_i = _exact_carry(end_r, end_i, lr, li, cr, ci, lam_r, lam_i, tl.max(r, axis=0))
        cr, ci = end_r, end_i
        if ENDS_PASS:
            hit = tl.maximum(hit, tl.max(r, axis=0))
        else:
            y = Y + 2 * at + rows[:, None] * (2 * H) + h[None, :]
            mask = (t < T)[:, None] & mh[None, :]
            tl.store(y, (c1 * sigmoid(c1, ASM, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            tl.store(y + H, (c2 * sigmoid(c2, ASM, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            if STORE_CK:
                if CHUNK >= KEEP:  # the states at rows KEEP - 1, 2 KEEP - 1, ... of the tile
                    for k in tl.static_range(CHUNK // KEEP):
                        j = c * (CHUNK // KEEP) + k
                        ck = CK + ((b * n_kept + j) * 2) * H + h
                        tl.store(ck, row_of(c1, rows[:, None], (k + 1) * KEEP - 1), mask=mh & (j < n_kept))
                        tl.store(ck + H, row_of(c2, rows[:, None], (k + 1) * KEEP - 1), mask=mh & (j < n_kept))
                elif (c + 1) % (KEEP // CHUNK) == 0:  # the state after every KEEP // CHUNK tiles
                    ck = CK + ((b * n_kept + (c + 1) // (KEEP // CHUNK) - 1) * 2) * H + h
                    tl.store(ck, cr, mask=mh)
                    tl.store(ck + H, ci, mask=mh)
        at += CHUNK * H
        c += 1
    if ENDS_PASS:
        tr, ti = power(NU, TH, h, mh, per_seg * CHUNK, False)
        _store_ends(ENDS, b, seg, n_seg, h, mh, H, tl.where(hit == 0, tr, 0.0), tl.where(hit == 0, ti, 0.0), cr, ci)


@triton.jit
def _bwd(X1, X2, W1, W2, NU, TH, R, DY, CK, ENDS, DX1, DX2, PART, T, H: tl.constexpr, n_chunks, per_seg, n_seg,
         BLOCK_H: tl.constexpr, VEC: tl.constexpr, CHUNK: tl.constexpr, SAME_X: tl.constexpr,
         HAS_W: tl.constexpr, HAS_R: tl.constexpr, ENDS_PASS: tl.constexpr, EVEN: tl.constexpr,
         ASM: tl.constexpr, PRECISE: tl.constexpr, ACC: tl.constexpr, FOLD: tl.constexpr):
    """Program (sequence x channel block, segment): the segment's chunks from the last. ENDS_PASS
    (segments 1 on; segment 0's are never read): the adjoint at the segment's first step from a
    zero one after it, and the segment's transition; otherwise dx (dx1, dx2 for low-rank maps) and
    PART[b, segment] = the sums of (dg, dp, dgamma, dw1, dw2) over the segment's steps, in ACC.
    FOLD: the first two sums are those of lambda folded in (_finish's), from d_t = c_t - u_t =
    lambda keep_t c_{t-1} (u_t the step's input), where the exact sums need the state before each
    step carried through the scan as well (_with_previous: twice the scan's values, and the
    registers they hold). d_t's cancellation costs an fp32 rounding of c_t, far under bf16's or
    fp16's; fp32 inputs keep the exact sums. PRECISE (fp32): the adjoint carried to the tile before
    through conj(lambda)^CHUNK rounded once (_fwd's)."""
    b, h, mh = _lanes(H, BLOCK_H, VEC)
    g, p, gam, w1, w2 = dynamics(NU, TH, W1, W2, h, mh, BLOCK_H, HAS_W)
    k1 = (gam * w1)[None, :]
    k2 = (gam * w2)[None, :]
    rows = tl.arange(0, CHUNK)
    if PRECISE:
        lam_r, lam_i = power(NU, TH, h, mh, CHUNK, True)
    head = (rows == 0)[:, None]
    tail = (rows == CHUNK - 1)[:, None]
    base = b.to(tl.int64) * T * H
    seg = tl.program_id(1)
    if ENDS_PASS:
        seg += 1
    first = seg * per_seg
    if ENDS_PASS:
        sr = tl.zeros([BLOCK_H], tl.float32)
        si = tl.zeros([BLOCK_H], tl.float32)
    else:
        sr, si = _carry_in(ENDS, b, h, mh, H, n_seg, n_seg - 1, n_seg - 1 - seg, -1, BLOCK_H)
    acc_g = tl.zeros([BLOCK_H], ACC)
    acc_p = tl.zeros([BLOCK_H], ACC)
    acc_gam = tl.zeros([BLOCK_H], ACC)
    acc_w1 = tl.zeros([BLOCK_H], ACC)
    acc_w2 = tl.zeros([BLOCK_H], ACC)
    hit = 0
    c = tl.minimum(first + per_seg, n_chunks) - 1
    at = base + c.to(tl.int64) * CHUNK * H
    t0 = c * CHUNK + rows
    x1n = _tile(X1 + at, rows, h, H, t0, T, mh, True, EVEN)
    x2n = x1n if SAME_X else _tile(X2 + at, rows, h, H, t0, T, mh, True, EVEN)
    d1n = _tile(DY + 2 * at, rows, h, 2 * H, t0, T, mh, True, EVEN)
    d2n = _tile(DY + 2 * at + H, rows, h, 2 * H, t0, T, mh, True, EVEN)
    rn = _resets(R, b, t0, T, True, HAS_R)
    ran = _resets(R, b, t0 + 1, T, True, HAS_R)
    prev = CK + ((b * n_chunks + c - 1) * 2) * H + h
    prn = tl.load(prev, mask=mh & (c > 0), other=0.0)
    pin = tl.load(prev + H, mask=mh & (c > 0), other=0.0)
    while c >= first:
        x1, x2, dy1, dy2 = x1n.to(tl.float32), x2n.to(tl.float32), d1n.to(tl.float32), d2n.to(tl.float32)
        r, r_after, pr, pi = rn, ran, prn, pin
        t = c * CHUNK + rows
        # the chunk before: its loads go out before this one is worked on
        live = c > first
        x1n = _tile(X1 + at - CHUNK * H, rows, h, H, t - CHUNK, T, mh, live, EVEN)
        x2n = x1n if SAME_X else _tile(X2 + at - CHUNK * H, rows, h, H, t - CHUNK, T, mh, live, EVEN)
        d1n = _tile(DY + 2 * (at - CHUNK * H), rows, h, 2 * H, t - CHUNK, T, mh, live, EVEN)
        d2n = _tile(DY + 2 * (at - CHUNK * H) + H, rows, h, 2 * H, t - CHUNK, T, mh, live, EVEN)
        rn = _resets(R, b, t - CHUNK, T, live, HAS_R)
        ran = _resets(R, b, t - CHUNK + 1, T, live, HAS_R)
        prev = CK + ((b * n_chunks + c - 2) * 2) * H + h
        prn = tl.load(prev, mask=mh & live & (c > 1), other=0.0)
        pin = tl.load(prev + H, mask=mh & live & (c > 1), other=0.0)
        # the states c_t and the kept states before them q_t = keep_t c_{t-1}, from the state the
        # forward kept at the end of the chunk before
        keep = (1 - r).to(tl.float32)[:, None]
        ar = g[None, :] * keep
        ai = p[None, :] * keep
        br = k1 * x1
        bi = k2 * x2
        br = tl.where(head, br + ar * pr[None, :] - ai * pi[None, :], br)
        bi = tl.where(head, bi + ar * pi[None, :] + ai * pr[None, :], bi)
        if ENDS_PASS or FOLD:
            _, _, c1, c2 = tl.associative_scan((ar, ai, br, bi), 0, first_order_complex)
        else:
            kr = tl.broadcast_to(keep, ar.shape)
            ki = tl.zeros_like(ar)
            qr = tl.where(head, kr * pr[None, :], -0.0)
            qi = tl.where(head, kr * pi[None, :], -0.0)
            _, _, _, _, c1, c2, q1, q2 = tl.associative_scan((ar, ai, kr, ki, br, bi, qr, qi), 0, _with_previous)
        e1 = silu_grad(c1, ASM, PRECISE) * dy1
        e2 = silu_grad(c2, ASM, PRECISE) * dy2
        # the adjoint s_t = e_t + keep_{t+1} conj(lambda) s_{t+1}, the carried one entering at the last row
        kn = (1 - r_after).to(tl.float32)[:, None]
        gr = g[None, :] * kn
        gi = -p[None, :] * kn
        e1 = tl.where(tail, e1 + gr * sr[None, :] - gi * si[None, :], e1)
        e2 = tl.where(tail, e2 + gr * si[None, :] + gi * sr[None, :], e2)
        tr_all, ti_all, s1, s2 = _flip_scan(gr, gi, e1, e2)
        end_r = row_of(s1, rows[:, None], 0)
        end_i = row_of(s2, rows[:, None], 0)
        if PRECISE:
            lr = row_of(tr_all, rows[:, None], 0)
            li = row_of(ti_all, rows[:, None], 0)
            end_r, end_i = _exact_carry(end_r, end_i, lr, li, sr, si, lam_r, lam_i, tl.max(r_after, axis=0))
        sr, si = end_r, end_i
        if ENDS_PASS:
            hit = tl.maximum(hit, tl.max(r_after, axis=0))
        else:
            mask = (t < T)[:, None] & mh[None, :]
            dx = at + rows[:, None] * H + h[None, :]
            if SAME_X:
                dxv = gam[None, :] * (w1[None, :] * s1 + w2[None, :] * s2)
                tl.store(DX1 + dx, dxv.to(DX1.dtype.element_ty), mask=mask)
            else:
                tl.store(DX1 + dx, (gam[None, :] * s1).to(DX1.dtype.element_ty), mask=mask)
                tl.store(DX2 + dx, (gam[None, :] * s2).to(DX2.dtype.element_ty), mask=mask)
            if FOLD:  # d = lambda q: sum(s1 d1 + s2 d2) = dg g + dp p, sum(s2 d1 - s1 d2) = dp g - dg p
                d1 = c1 - k1 * x1
                d2 = c2 - k2 * x2
                acc_g += sum_of_products(s1, d1, ACC) + sum_of_products(s2, d2, ACC)
                acc_p += sum_of_products(s2, d1, ACC) - sum_of_products(s1, d2, ACC)
            else:
                acc_g += sum_of_products(s1, q1, ACC) + sum_of_products(s2, q2, ACC)
                acc_p += sum_of_products(s2, q1, ACC) - sum_of_products(s1, q2, ACC)
            # dgamma = sum(s1 w1 x1 + s2 w2 x2), dw1 = gamma sum(s1 x1), dw2 = gamma sum(s2 x2): two sums
            u1 = sum_of_products(s1, x1, ACC)
            u2 = sum_of_products(s2, x2, ACC)
            acc_gam += w1 * u1 + w2 * u2
            acc_w1 += gam * u1
            acc_w2 += gam * u2
        at -= CHUNK * H
        c -= 1
    if ENDS_PASS:
        tr, ti = power(NU, TH, h, mh, per_seg * CHUNK, True)
        _store_ends(ENDS, b, seg, n_seg, h, mh, H, tl.where(hit == 0, tr, 0.0), tl.where(hit == 0, ti, 0.0), sr, si)
    else:
        part = PART + ((b * n_seg + seg) * 5) * H + h
        tl.store(part, acc_g, mask=mh)
        tl.store(part + H, acc_p, mask=mh)
        tl.store(part + 2 * H, acc_gam, mask=mh)
        tl.store(part + 3 * H, acc_w1, mask=mh)
        tl.store(part + 4 * H, acc_w2, mask=mh)


@triton.jit
def _finish(PART, NU, TH, DNU, DTH, DW1, DW2, n_rows, H, BLOCK: tl.constexpr, HAS_W: tl.constexpr,
            FOLD: tl.constexpr):
    """The parameters' gradients from the programs' sums (n_rows of [5, H]), added in fp64
    (FOLD: the first two are dg g + dp p and dp g - dg p, _bwd's):
    g = r cos(theta), p = r sin(theta), gamma = sqrt(1 - r^2), r = exp(-exp(nu_log)), theta =
    exp(theta_log); d gamma / d nu_log = e r^2 / gamma, gamma from expm1 (finite and exact for
    memories as long as fp32's r cannot tell from 1), as __init__._parameter_grads."""
    h = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mh = h < H
    dg = tl.zeros([BLOCK], tl.float64)
    dp = tl.zeros([BLOCK], tl.float64)
    dgam = tl.zeros([BLOCK], tl.float64)
    dw1 = tl.zeros([BLOCK], tl.float64)
    dw2 = tl.zeros([BLOCK], tl.float64)
    i = 0
    while i < n_rows:
        s = PART + i * 5 * H + h
        dg += tl.load(s, mask=mh, other=0.0).to(tl.float64)
        dp += tl.load(s + H, mask=mh, other=0.0).to(tl.float64)
        dgam += tl.load(s + 2 * H, mask=mh, other=0.0).to(tl.float64)
        if HAS_W:
            dw1 += tl.load(s + 3 * H, mask=mh, other=0.0).to(tl.float64)
            dw2 += tl.load(s + 4 * H, mask=mh, other=0.0).to(tl.float64)
        i += 1
    e = tl.exp(tl.load(NU + h, mask=mh, other=0.0).to(tl.float64))
    ang = tl.exp(tl.load(TH + h, mask=mh, other=0.0).to(tl.float64))
    r = tl.exp(-e)
    g = r * tl.cos(ang)
    p = r * tl.sin(ang)
    gam = tl.sqrt(one_minus_exp(2.0 * e))
    if FOLD:
        radial, angular = dg, dp
    else:
        radial, angular = dg * g + dp * p, dp * g - dg * p
    tl.store(DNU + h, (-e * radial + e * (r * r / gam) * dgam).to(DNU.dtype.element_ty), mask=mh)
    tl.store(DTH + h, (ang * angular).to(DTH.dtype.element_ty), mask=mh)
    if HAS_W:
        tl.store(DW1 + h, dw1.to(DW1.dtype.element_ty), mask=mh)
        tl.store(DW2 + h, dw2.to(DW2.dtype.element_ty), mask=mh)


def plan(T: int, chunk: int, segments: int) -> tuple[int, int, int]:
    """(chunks, chunks a segment, segments) with no empty segment."""
    n_chunks = triton.cdiv(T, chunk)
    per_seg = triton.cdiv(n_chunks, max(1, min(segments, n_chunks)))
    return n_chunks, per_seg, triton.cdiv(n_chunks, per_seg)


def vec_of(block_h: int, warps: int) -> int:
    """Channels a thread: block_h = 32 * warps * vec (1 where block_h is narrower, as on the CPU)."""
    return max(1, block_h // (32 * warps))


def forward(x1, x2, w1, w2, nu_log, theta_log, r, y, ck, T, H, cfg, flags: dict) -> None:
    """Fill y (and ck, where given: the states every cfg.chunk steps) from x1, x2 [B, T, H] (r: the
    reset mask as uint8, or None), in tiles of cfg.steps steps (0: cfg.chunk)."""
    B = x1.shape[0]
    tile = cfg.steps or cfg.chunk
    if tile % cfg.chunk and cfg.chunk % tile:
        raise ValueError(f"the lanes forward's tile of steps = {tile} must be a multiple or a divisor of the chunk "
                         f"= {cfg.chunk} (every chunk steps it keeps the state for the backward)")
    n_tiles, per_seg, n_seg = plan(T, tile, cfg.segments)
    ends = torch.empty(B, n_seg, 4, H, device=x1.device, dtype=torch.float32)  # (unread with one segment)
    args = [x1, x1 if x2 is None else x2, w1 if w1 is not None else nu_log, w2 if w2 is not None else nu_log,
            nu_log, theta_log, r if r is not None else nu_log, y, ck if ck is not None else y, ends,
            T, H, n_tiles, per_seg, n_seg, triton.cdiv(T, cfg.chunk)]
    chains = B * triton.cdiv(H, cfg.block_h)
    meta = dict(BLOCK_H=cfg.block_h, VEC=vec_of(cfg.block_h, cfg.warps), CHUNK=tile, KEEP=cfg.chunk,
                STORE_CK=ck is not None, EVEN=T % tile == 0 and H % cfg.block_h == 0, ASM=x1.device.type == "cuda",
                PRECISE=x1.dtype == torch.float32, num_warps=cfg.warps,
                **flags)
    if n_seg > 1:  # the last segment's ends are never read
        _fwd[(chains, n_seg - 1)](*args, ENDS_PASS=True, **meta)
    _fwd[(chains, n_seg)](*args, ENDS_PASS=False, **meta)


def backward(dy, x1, x2, w1, w2, nu_log, theta_log, r, states, dx1, dx2, T, H, cfg, flags: dict):
    """Fill dx1 (and dx2) from dy [B, T, 2H] and the forward's kept states; the gradients of
    (w1, w2, nu_log, theta_log) (None for absent weights)."""
    B = x1.shape[0]
    n_chunks, per_seg, n_seg = plan(T, cfg.chunk, cfg.bwd_segments)
    acc = accumulator(x1.dtype)
    fold = x1.dtype != torch.float32 and n_seg < FOLD_BELOW_SEGMENTS if FOLD_SUMS is None else FOLD_SUMS
    part = torch.empty(B, n_seg, 5, H, device=x1.device, dtype=sum_dtype(x1.dtype))
    ends = torch.empty(B, n_seg, 4, H, device=x1.device, dtype=torch.float32)
    args = [x1, x1 if x2 is None else x2, w1 if w1 is not None else nu_log, w2 if w2 is not None else nu_log,
            nu_log, theta_log, r if r is not None else nu_log, dy, states, ends,
            dx1, dx2 if dx2 is not None else dx1, part, T, H, n_chunks, per_seg, n_seg]
    chains = B * triton.cdiv(H, cfg.bwd_block_h)
    meta = dict(BLOCK_H=cfg.bwd_block_h, VEC=vec_of(cfg.bwd_block_h, cfg.bwd_warps), CHUNK=cfg.chunk,
                EVEN=T % cfg.chunk == 0 and H % cfg.bwd_block_h == 0, ASM=x1.device.type == "cuda",
                PRECISE=x1.dtype == torch.float32, ACC=acc, FOLD=fold, num_warps=cfg.bwd_warps, **flags)
    if n_seg > 1:  # segment 0's ends are never read
        _bwd[(chains, n_seg - 1)](*args, ENDS_PASS=True, **meta)
    _bwd[(chains, n_seg)](*args, ENDS_PASS=False, **meta)
    dnu, dth = torch.empty_like(nu_log), torch.empty_like(theta_log)
    dw1 = torch.empty_like(w1) if w1 is not None else None
    dw2 = torch.empty_like(w2) if w2 is not None else None
    block = min(256, triton.next_power_of_2(H))
    _finish[(triton.cdiv(H, block),)](part, nu_log, theta_log, dnu, dth, dw1 if dw1 is not None else dnu,
                                      dw2 if dw2 is not None else dnu, B * n_seg, H, BLOCK=block,
                                      HAS_W=w1 is not None, FOLD=fold)
    return dw1, dw2, dnu, dth
