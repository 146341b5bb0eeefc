"""The selective scan's lanes backward (config bwd_path "lanes"; the recurrence is in scan.py).

Each thread owns `vec` neighbouring channels with all their N states, and holds a tile of
`bwd_steps` time steps of them in registers ([steps, block_d, N] tiles, block_d = 32 * warps *
vec: lanes and warps on the channel axis, as the lanes forward's), so a tile's scans and the sums
over the states are loops over the thread's own registers. A program walks its tiles from the
last. For each it needs the states before and after each step: it reloads the state the forward
kept at the end of the chunk before (every `chunk` steps) and, where the tile is not the chunk's
first, advances it over the chunk's earlier tiles (the forward's scan, only the end state kept:
(chunk / steps - 1) / 2 tiles' more work on average, none where the tile is the chunk). Then:

    h_t, and h_{t-1} in the same scan (the affine map of the state before the last step rides
        along: _with_before), from the tile's first state
    g_t = gy_t C_t + exp(dt_{t+1} A) g_{t+1}        (gy = dy * silu(z), the adjoint of h_t)

the adjoint as a forward scan of the flipped tile (flips are register renames; a reverse scan is
lowered with shuffles) of u_t = exp(dt_t A) g_t = exp(dt_t A) (gy_t C_t + u_{t+1}), whose
"before" part is u_{t+1}: g_t = gy_t C_t + u_{t+1}, and u at the tile's first step is the carry
into the tile before. dA and dD are summed in registers per channel; dB_t and dC_t sum over the
channels (one tl.sum over the tile's channel axis for all its steps and states: shuffles within a
warp, shared memory across warps), added atomically into fp32 buffers (fp64 for fp32 inputs).

Time is split into segments so that few channels still fill the GPU: a first launch runs every
segment but the first from a zero adjoint and keeps its end (the carry u at its first step) and
its sum of steps softplus(delta) (the carry's transition over the segment is exp(A * that sum));
it needs only the decays, C, z and dy, not the states. The second starts each segment from the
ends of those after it, combined from the last, and writes the gradients."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import widen_asm
from .._jit.lse import LOG2E
from .._jit.scan import accumulator, first_order, sigmoid, sum_dtype, sum_of_products
from .lanes import _carry_in, _lanes, _per_step, _rows, _widened, plan
from .softplus import decay as decay_of, softplus


@triton.jit
def _with_before(a1, b1, p1, q1, a2, b2, p2, q2):
    """Affine maps of the state h and of the state before the last step: h' = a h + b, before =
    p h + q. Composed: h'' = a2 a1 h + a2 b1 + b2, before'' = p2 a1 h + p2 b1 + q2. Scanned from a
    zero state with p_t = 1 and q_t = 0 (the first step: p 0, q the state entering the tile, which
    its b also carries in), the q part of step t is the state before it."""
    a, b = first_order(a1, b1, a2, b2)
    return a, b, p2 * a1, p2 * b1 + q2


@triton.jit
def _xor_lanes(v, m: tl.constexpr, ASM: tl.constexpr):
    """v [lanes, K] (lanes 32 a warp, one channel each) from the lane `m` away (lane ^ m): one
    shfl.sync.bfly a value on the GPU; on the interpreter the same permutation of the lane axis."""
    if ASM:
        w = tl.inline_asm_elementwise(f"shfl.sync.bfly.b32 $0, $1, {m}, 0x1f, -1;", "=r,r",
                                      [v.to(tl.int32, bitcast=True)], dtype=tl.int32, is_pure=True, pack=1)
        return w.to(tl.float32, bitcast=True)
    else:
        return tl.reshape(tl.flip(tl.reshape(v, [v.shape[0] // (2 * m), 2, m, v.shape[1]]), 1), v.shape)


@triton.jit
def _halved(w, idx, lane, m: tl.constexpr, ASM: tl.constexpr):
    """A round of _warp_sums: of w [lanes, K] (and its indices idx) a lane keeps one half, sends
    the other to the lane m away and adds what that one sent: [lanes, K / 2]. The two lanes agree
    on every earlier round's choice (those lanes were 2m, 4m, ... away), so they hold the same
    indices and keep opposite halves."""
    lo, hi = tl.split(tl.reshape(w, [w.shape[0], w.shape[1] // 2, 2]))
    ilo, ihi = tl.split(tl.reshape(idx, [w.shape[0], w.shape[1] // 2, 2]))
    upper = ((lane // m) % 2 == 1)[:, None]
    return tl.where(upper, hi, lo) + _xor_lanes(tl.where(upper, lo, hi), m, ASM), tl.where(upper, ihi, ilo)


@triton.jit
def _warp_sums(v, lane, ASM: tl.constexpr):
    """The sums over each warp's 32 lanes of v [steps, lanes, N_p2] (fp32, steps * N_p2 >= 32) as
    (sums, their flat step * N_p2 + state indices), both [lanes, steps * N_p2 / 32]: a reduce-scatter
    by halves (_halved at m = 16, 8, 4, 2, 1), steps * N_p2 * 31 / 32 shuffles a lane where a tl.sum
    per value takes 5 each."""
    L: tl.constexpr = v.shape[1]
    M: tl.constexpr = v.shape[0] * v.shape[2]
    w = tl.reshape(tl.permute(v, (1, 0, 2)), [L, M])
    idx = tl.broadcast_to(tl.arange(0, M)[None, :], [L, M])
    w, idx = _halved(w, idx, lane, 16, ASM)
    w, idx = _halved(w, idx, lane, 8, ASM)
    w, idx = _halved(w, idx, lane, 4, ASM)
    w, idx = _halved(w, idx, lane, 2, ASM)
    return _halved(w, idx, lane, 1, ASM)


@triton.jit
def _add_sums(P, v, b, t0, k, lane, T, N, N_P2: tl.constexpr, ACC: tl.constexpr, SCATTER: tl.constexpr,
              ASM: tl.constexpr):
    """P[b, t0 + s, n] += v[s, :, n] summed over the program's channels (atomically: other programs
    add theirs). SCATTER: by _warp_sums, each lane adding its share of each warp's sums; otherwise
    one tl.sum (in ACC) over the channels."""
    if SCATTER:
        w, idx = _warp_sums(v, lane, ASM)
        t = t0 + idx // N_P2
        n = idx % N_P2
        tl.atomic_add(P + (b * T + t) * N + n, w, mask=(t < T) & (n < N))
    else:
        t = t0 + tl.arange(0, v.shape[0])
        tl.atomic_add(P + (b * T + t[:, None]) * N + k[None, :], tl.sum(v.to(ACC), axis=1),
                      mask=(t < T)[:, None] & (k < N)[None, :])


@triton.jit
def _inputs(X, DL, Bm, at, offs, b, t, k, n3, T, N, md, EVEN: tl.constexpr, EVEN_N: tl.constexpr,
            WIDEN: tl.constexpr, FAST_SOFTPLUS: tl.constexpr, PRECISE: tl.constexpr):
    """x, delta, softplus(delta) [steps, lanes] and B_t [steps, 1, N_p2] of the tile at `at`
    (steps t). Past T all are zero but softplus(delta) (log 2): those steps come after the
    sequence's in the forward scans, and the adjoint (dy zero there) and every sum stay zero
    through them; their decays reach only the last segment's transition, which multiplies the
    zero adjoint entering it."""
    x = _rows(X + at, offs, t, T, md, True, EVEN).to(tl.float32)
    dl = _rows(DL + at, offs, t, T, md, True, EVEN).to(tl.float32)
    dt = softplus(dl, FAST_SOFTPLUS, PRECISE)
    bt = _widened(_per_step(Bm, b, t, k, n3, T, N, True, EVEN_N, 1), WIDEN, False)
    return x, dl, dt, bt[:, None, :]


@triton.jit
def _advance(h, X, DL, Bm, at, offs, b, t, k, n3, a, a2, T, N, md, head, rows3, STEPS: tl.constexpr,
             EVEN: tl.constexpr, EVEN_N: tl.constexpr, WIDEN: tl.constexpr, FAST_SOFTPLUS: tl.constexpr,
             PRECISE: tl.constexpr):
    """The state h [1, lanes, N_p2] after the tile at `at` (steps t)."""
    x, _, dt, bt = _inputs(X, DL, Bm, at, offs, b, t, k, n3, T, N, md, EVEN, EVEN_N, WIDEN, FAST_SOFTPLUS, PRECISE)
    decay = decay_of(dt[:, :, None], a, a2, PRECISE)
    inj = (dt * x)[:, :, None] * bt
    inj = tl.where(head, inj + decay * h, inj)
    _, hs = tl.associative_scan((decay, inj), 0, first_order)
    return tl.sum(tl.where(rows3 == STEPS - 1, hs, 0.0), axis=0)[None, :, :]


@triton.jit
def prefetch_each(ptrs, mask, LEVEL: tl.constexpr):
    """Each thread's own addresses in `ptrs` where `mask`, into L1 (LEVEL 1) or L2 (LEVEL 2), by
    PTX prefetch: no destination register and nothing waits for it, so that a loop can ask for a
    later tile's scattered rows (a warp's prefetches of one row coalesce, as its loads do) while
    the registers the current tile fills stay as they are. GPU only."""
    if LEVEL == 1:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.u32 p, $2, 0; @p prefetch.global.L1 [$1]; mov.u32 $0, 0; }",
                                  "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.u32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                                  "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch(X, DL, Bm, Cm, Z, DY, CK, base, offs, rows, b, i, d, md, K: tl.constexpr, n_chunks, T, D, N,
              N_P2: tl.constexpr, STEPS: tl.constexpr, ENDS_PASS: tl.constexpr, LEVEL: tl.constexpr):
    """Ask for tile i's inputs, and the state kept before its chunk, ahead of their loads (prefetch_each
    into L1 or L2): what the tile loads is then found in a cache, not waited for from memory."""
    t = i * STEPS + rows
    live = (t < T) & (i >= 0)
    at = base + (i * STEPS).to(tl.int64) * D
    m = live[:, None] & md[None, :]
    prefetch_each(DL + at + offs, m, LEVEL)
    prefetch_each(Z + at + offs, m, LEVEL)
    prefetch_each(DY + at + offs, m, LEVEL)
    prefetch_each(Cm + (b * T + t) * N, live, LEVEL)  # (a step's N states: one line)
    if not ENDS_PASS:
        prefetch_each(X + at + offs, m, LEVEL)
        prefetch_each(Bm + (b * T + t) * N, live, LEVEL)
        c = i // K
        prefetch_each(CK + ((b * n_chunks + c - 1) * D + d) * N_P2, md & (c > 0) & (i >= 0), LEVEL)


@triton.jit
def _ss_bwd_lanes(X, DL, A, Bm, Cm, Dk, Z, DY, CK, QE, QDT, DX, DDL, DZ, DA, DD, DB, DC, T, D: tl.constexpr, N,
                  n_chunks, n_tiles, per_seg, n_seg, BLOCK_D: tl.constexpr, VEC: tl.constexpr, WARPS: tl.constexpr,
                  N_P2: tl.constexpr, STEPS: tl.constexpr, CHUNK: tl.constexpr, ENDS_PASS: tl.constexpr,
                  EVEN: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr, WIDEN: tl.constexpr,
                  FAST_SOFTPLUS: tl.constexpr, PRECISE: tl.constexpr, ACC: tl.constexpr, SCATTER: tl.constexpr,
                  AHEAD: tl.constexpr = 0, LEVEL: tl.constexpr = 2):
    """Program (sequence x channel block, segment of per_seg chunks). AHEAD > 0: each tile asks for
    the inputs of the tile AHEAD tiles on (prefetch_each into LEVEL's cache; GPU only). ENDS_PASS: segment
    program_id(1) + 1 from a zero adjoint, keeping its carry out (QE) and sum of steps (QDT);
    otherwise from the ends of the segments after it, writing dx, ddelta, dz, the program's dA
    and dD sums, and adding its channels' dB and dC."""
    K: tl.constexpr = CHUNK // STEPS  # tiles a kept state
    b, d, _d, _g = _lanes(D, BLOCK_D, VEC, 1, WARPS)  # (SPLIT 1: its two channel vectors are one)
    md = d < D
    lane = tl.arange(0, BLOCK_D) % 32
    d3 = d[None, :, None]
    k = tl.max_contiguous(tl.arange(0, N_P2), 1)
    n3 = k[None, None, :]
    md3 = (d3 < D) & (n3 < N)
    a = tl.load(A + d3 * N + n3, mask=md3, other=0.0).to(tl.float32)
    a2 = a * LOG2E
    rows = tl.arange(0, STEPS)
    rows3 = rows[:, None, None]
    head = rows3 == 0
    tail = rows3 == STEPS - 1
    base = b.to(tl.int64) * T * D
    offs = rows[:, None] * D + d[None, :]
    seg = tl.program_id(1)
    if ENDS_PASS:
        seg += 1
        q = tl.zeros([1, BLOCK_D, N_P2], tl.float32)
        if PRECISE:
            dsum = tl.zeros([BLOCK_D], tl.float64)
        else:
            dsum = tl.zeros([BLOCK_D], tl.float32)
    else:
        q = _carry_in(QE, QDT, a, a2, b, d3, n3, d, md3, md, D, N_P2, n_seg, n_seg - 1, n_seg - 1 - seg, -1,
                      BLOCK_D, N_P2, PRECISE)
        dk = tl.load(Dk + d, mask=md, other=0.0).to(tl.float32)
        acc_a = tl.zeros([BLOCK_D, N_P2], ACC)
        acc_d = tl.zeros([BLOCK_D], ACC)
    first = seg * per_seg * K
    i = tl.minimum((seg + 1) * per_seg * K, n_tiles) - 1
    while i >= first:
        t = i * STEPS + rows
        at = base + (i * STEPS).to(tl.int64) * D
        if AHEAD > 0:
            _prefetch(X, DL, Bm, Cm, Z, DY, CK, base, offs, rows, b, tl.where(i - AHEAD >= first, i - AHEAD, -1), d,
                      md, K, n_chunks, T, D, N, N_P2, STEPS, ENDS_PASS, LEVEL)
        x, dl, dt, bt = _inputs(X, DL, Bm, at, offs, b, t, k, n3, T, N, md, EVEN, EVEN_N, WIDEN, FAST_SOFTPLUS,
                                PRECISE)
        ct = _widened(_per_step(Cm, b, t, k, n3, T, N, True, EVEN_N, 1), WIDEN, False)[:, None, :]
        z = _rows(Z + at, offs, t, T, md, True, EVEN).to(tl.float32)
        dy = _rows(DY + at, offs, t, T, md, True, EVEN).to(tl.float32)
        sz = sigmoid(z, ASM, PRECISE)
        gy = dy * z * sz
        decay = decay_of(dt[:, :, None], a, a2, PRECISE)
        # the adjoint: u_t = decay_t (e_t + u_{t+1}) scanned over the flipped tile, the carry u_{t+1}
        # entering at its last step; the "before" part of step t is u_{t+1}
        e = gy[:, :, None] * ct
        one = tl.full(decay.shape, 1.0, tl.float32)
        ub = tl.where(tail, decay * (e + q), decay * e)
        p_in, q_in = tl.where(tail, 0.0, one), tl.where(tail, q, 0.0)
        flipped = (tl.flip(decay, 0), tl.flip(ub, 0), tl.flip(p_in, 0), tl.flip(q_in, 0))
        _ua, u, _up, u_after = tl.associative_scan(flipped, 0, _with_before)
        g = e + tl.flip(u_after, 0)
        q = tl.sum(tl.where(tail, u, 0.0), axis=0)[None, :, :]  # u at the tile's first step
        if ENDS_PASS:
            dsum += tl.sum(dt.to(dsum.dtype), axis=0)
        else:
            # the tile's first state: kept at the chunk's start, advanced over the chunk's tiles before it
            c = i // K
            h = tl.load(CK + ((b * n_chunks + c - 1) * D + d3) * N_P2 + n3, mask=(d3 < D) & (c > 0), other=0.0)
            j = c * K
            while j < i:
                h = _advance(h, X, DL, Bm, base + (j * STEPS).to(tl.int64) * D, offs, b, j * STEPS + rows, k, n3, a,
                             a2, T, N, md, head, rows3, STEPS, EVEN, EVEN_N, WIDEN, FAST_SOFTPLUS, PRECISE)
                j += 1
            # the states h_t and before them h_{t-1}
            inj = (dt * x)[:, :, None] * bt
            inj = tl.where(head, inj + decay * h, inj)
            _ha, hs, _hp, hp = tl.associative_scan((decay, inj, tl.where(head, 0.0, one), tl.where(head, h, 0.0)), 0,
                                                   _with_before)
            mask = (t < T)[:, None] & md[None, :]
            yv = tl.sum(hs * ct, axis=2) + dk[None, :] * x
            tl.store(DZ + at + offs, (dy * yv * sz * (1.0 + z * (1.0 - sz))).to(DZ.dtype.element_ty), mask=mask)
            gb = tl.sum(g * bt, axis=2)
            tl.store(DX + at + offs, (dt * gb + dk[None, :] * gy).to(DX.dtype.element_ty), mask=mask)
            gdh = g * decay * hp
            ddt = x * gb + tl.sum(gdh * a, axis=2)
            tl.store(DDL + at + offs, (ddt * sigmoid(dl, ASM, PRECISE)).to(DDL.dtype.element_ty), mask=mask)
            acc_a += sum_of_products(gdh, dt[:, :, None], ACC)
            acc_d += sum_of_products(gy, x, ACC)
            # dB_t and dC_t: the program's channels summed, every step and state of the tile at once
            _add_sums(DB, g * (dt * x)[:, :, None], b, i * STEPS, k, lane, T, N, N_P2, ACC, SCATTER, ASM)
            _add_sums(DC, gy[:, :, None] * hs, b, i * STEPS, k, lane, T, N, N_P2, ACC, SCATTER, ASM)
        i -= 1
    if ENDS_PASS:
        j = b * n_seg + seg
        tl.store(QE + (j * D + d3) * N_P2 + n3, q, mask=(d3 < D) & (n3 < N_P2))
        tl.store(QDT + j * D + d, dsum.to(tl.float32), mask=md)
    else:
        j = b * n_seg + seg
        tl.store(DA + (j * D + d[:, None]) * N + k[None, :], acc_a, mask=md[:, None] & (k < N)[None, :])
        tl.store(DD + j * D + d, acc_d, mask=md)


def scatter(cfg, n_p2: int, dtype) -> bool:
    """Whether dB and dC are summed by _warp_sums: asked for (cfg.bwd_scatter), one channel a
    lane on every lane of the program's warps, 32 values a tile at least, fp32 sums (fp32 inputs
    sum in fp64: one tl.sum)."""
    return (cfg.bwd_scatter and cfg.bwd_block_d == 32 * cfg.bwd_warps and cfg.bwd_steps * n_p2 >= 32
            and sum_dtype(dtype) == torch.float32)


def backward(dy, x, delta, A, B, C, D, z, states, dx, ddl, dz, cfg, n_p2: int):
    """Fill dx, ddelta, dz from the contiguous inputs and the states the forward kept every
    cfg.chunk steps; (dA, dB, dC, dD) in A's, B's, C's and D's dtypes."""
    Bsz, T, Dm = x.shape
    N = A.shape[1]
    if cfg.chunk % cfg.bwd_steps:
        raise ValueError(f"the lanes backward's tile of bwd_steps = {cfg.bwd_steps} must divide the chunk = "
                         f"{cfg.chunk} (the steps between the states the forward keeps)")
    sums = sum_dtype(x.dtype)
    if x.numel() == 0:
        zeros = [torch.zeros(t.shape, device=x.device, dtype=t.dtype) for t in (A, B, C, D)]
        dx.zero_(), ddl.zero_(), dz.zero_()
        return tuple(zeros)
    n_chunks, per_seg, n_seg = plan(T, cfg.chunk, cfg.bwd_segments)
    dA = torch.empty(Bsz, n_seg, Dm, N, device=x.device, dtype=sums)
    dD = torch.empty(Bsz, n_seg, Dm, device=x.device, dtype=sums)
    dB = torch.zeros(Bsz, T, N, device=x.device, dtype=sums)
    dC = torch.zeros(Bsz, T, N, device=x.device, dtype=sums)
    qe = torch.empty(Bsz, n_seg, Dm, n_p2, device=x.device, dtype=torch.float32)  # (unread with one segment)
    qdt = torch.empty(Bsz, n_seg, Dm, device=x.device, dtype=torch.float32)
    args = [x, delta, A, B, C, D, z, dy, states, qe, qdt, dx, ddl, dz, dA, dD, dB, dC, T, Dm, N, n_chunks,
            triton.cdiv(T, cfg.bwd_steps), per_seg, n_seg]
    meta = dict(BLOCK_D=cfg.bwd_block_d, VEC=max(1, cfg.bwd_block_d // (32 * cfg.bwd_warps)), WARPS=cfg.bwd_warps,
                N_P2=n_p2, STEPS=cfg.bwd_steps, CHUNK=cfg.chunk,
                EVEN=T % cfg.bwd_steps == 0 and Dm % cfg.bwd_block_d == 0,
                EVEN_N=N == n_p2, ASM=x.device.type == "cuda", WIDEN=widen_asm(B) and widen_asm(C),
                FAST_SOFTPLUS=widen_asm(delta), PRECISE=x.dtype == torch.float32, ACC=accumulator(x.dtype),
                SCATTER=scatter(cfg, n_p2, x.dtype), AHEAD=cfg.bwd_ahead if x.device.type == "cuda" else 0,
                LEVEL=cfg.bwd_level, num_warps=cfg.bwd_warps)
    chains = Bsz * triton.cdiv(Dm, cfg.bwd_block_d)
    if n_seg > 1:  # segment 0's ends are never read
        _ss_bwd_lanes[(chains, n_seg - 1)](*args, ENDS_PASS=True, **meta)
    _ss_bwd_lanes[(chains, n_seg)](*args, ENDS_PASS=False, **meta)
    return dA.sum((0, 1)).to(A.dtype), dB.to(B.dtype), dC.to(C.dtype), dD.sum((0, 1)).to(D.dtype)
