"""Row softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))), forward and backward
(dx = y * (dy - sum(dy * y)))."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import (LINES_NARROW_ROW_BYTES, LOG2E, coop_plan, coop_program, lines_launch, lse_update, on_sm90,
                     prefetch_ahead, prefetch_chunk, prefetch_segment, publish, publish2, sm_count, wait_slots2,
                     wait_total, widen, widen_asm)


# ---------------------------------------------------------------------------------------------
# Triton kernels.
#
# Rows that fit in registers (next_pow2(N) <= 32768 in 2-byte types, 16384 in fp32): one program
# holds a tile of ROWS whole rows (~8 KB per input tensor, so narrow rows still give each program
# enough loads in flight) and does max, exp, sum and the write in one read of x. The backward is
# the same with y and dy.
#
# Wider rows stream: each program owns whole rows and reads each row twice in chunks, with the
# row's statistics (running max and sum of exp -- bwd: sum(dy * y)) from pass 1 and the write in
# pass 2 (the forward: the lines path by default, _softmax_fwd_lines below; the backward: the coop
# path on the GPU). One program per SM (32 warps, 32 KB chunks) keeps the rows in flight (SMs x row bytes:
# 33 MB at 128256 bf16) mostly within the 50 MB L2 for the second read. An earlier design split
# rows into segments shared out through an atomic work queue; it measured slower at every wide
# shape on the H200 (docs/evidence/softmax_ab_h200_run1.txt) and was removed.
#
# A few rows over 16384 wide (M <= _SPLIT_MAX_ROWS) take the split path instead: each row cut into segments
# over a 2-D grid of (row, segment) programs, in two launches (see the kernels below).
#
# Row starts and column masks go through _row_start/_col_mask with N_ALIGN, the largest power of
# two dividing N, so that rows of e.g. 5000 elements still get 16-byte loads (the JIT only marks
# ints divisible by 16). Loops with runtime bounds are `while` loops: under NumPy 2.4 the
# interpreter cannot use its 1-element scalars as `range` bounds.


@triton.jit
def _row_start(row, N, N_ALIGN: tl.constexpr):
    # row * N in int64, written so that the compiler sees it is a multiple of N_ALIGN
    return row.to(tl.int64) * (N // N_ALIGN) * N_ALIGN


@triton.jit
def _col_mask(cols, N, N_ALIGN: tl.constexpr):
    # cols < N, written so that the compiler sees it is constant over runs of N_ALIGN columns
    return cols // N_ALIGN < N // N_ALIGN


@triton.jit
def _softmax_fwd(x_ptr, y_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr,
                 POLICY: tl.constexpr = "evict_first", ASM: tl.constexpr = False):
    # POLICY: the cache hint of the loads (an A/B option of the launcher: `policy`). ASM: x stays
    # packed bf16 across the reductions, widened (and exponentiated) again at each use
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & _col_mask(cols, N, N_ALIGN)[None, :]
    offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy=POLICY)
    rmask = rows < M
    m = tl.where(rmask, tl.max(widen(x, ASM), axis=1), 0.0)  # padding rows: no -inf - -inf (per-row ops: free)
    e = tl.exp(widen(x, ASM) - m[:, None])  # 0 where masked
    inv = 1.0 / tl.where(rmask, tl.sum(e, axis=1), 1.0)
    if ASM:
        e = tl.exp(widen(x, ASM) - m[:, None])
    y = e * inv[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["iters"])  # one binary whatever the trip count
def _softmax_fwd_persist(x_ptr, y_ptr, M, N, iters, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                         N_ALIGN: tl.constexpr, POLICY: tl.constexpr = "evict_first"):
    # _softmax_fwd on a persistent grid (the default for rows over 16384 elements): programs stride
    # over the row tiles and load the next tile (kept in the input dtype) before reducing the
    # current one, so that an SM holding a single 32-warp program still has loads in flight while
    # it reduces and stores.
    step = tl.num_programs(0) * ROWS
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = _col_mask(cols, N, N_ALIGN)[None, :]
    x = tl.load(x_ptr + _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :],
                mask=(rows < M)[:, None] & cmask, other=-float("inf"), eviction_policy=POLICY)
    i = 0
    while i < iters:
        nxt = rows + step  # past the end: fully masked, no traffic
        x_next = tl.load(x_ptr + _row_start(nxt, N, N_ALIGN)[:, None] + cols[None, :],
                         mask=(nxt < M)[:, None] & cmask, other=-float("inf"), eviction_policy=POLICY)
        xf = x.to(tl.float32)
        rmask = rows < M
        m = tl.where(rmask, tl.max(xf, axis=1), 0.0)
        e = tl.exp(xf - m[:, None])
        y = e * (1.0 / tl.where(rmask, tl.sum(e, axis=1), 1.0))[:, None]
        tl.store(y_ptr + _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=rmask[:, None] & cmask)
        x = x_next
        rows = nxt
        i += 1


@triton.jit
def _softmax_bwd(y_ptr, dy_ptr, dx_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 N_ALIGN: tl.constexpr, POLICY: tl.constexpr = "evict_first", ASM: tl.constexpr = False):
    # ASM: y and dy stay packed bf16 across the reduction, widened at each use (_utils.widen)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & _col_mask(cols, N, N_ALIGN)[None, :]
    offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY)
    dot = tl.sum(widen(y, ASM) * widen(dy, ASM), axis=1)
    dx = widen(y, ASM) * (widen(dy, ASM) - dot[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# Row streaming (rows wider than the register path): each program owns whole rows and
# streams each row twice in chunks of CHUNK elements. Pass 1 reads
# the row (evict_last, to keep it in L2) for its statistics; pass 2 reads it again and writes. Pass
# 2 runs the chunks in reverse order, so that it starts with those read last, the likeliest still in
# L2 if the rows in flight (programs x row bytes) overflow it. The grid is M programs, or a
# persistent grid of a few programs per SM to bound the rows in flight.


@triton.jit
def _softmax_fwd_stream(x_ptr, y_ptr, M, N, CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        # online max and sum of exp, one rescale per chunk (one exp per element). The next chunk's
        # load is issued before this chunk's two block reductions, so that their barriers do not
        # leave the program with no bytes in flight (past the row end it is fully masked: no traffic).
        m = -float("inf")
        s = 0.0
        c = 0
        nxt = tl.load(x_ptr + base + offs, mask=_col_mask(offs, N, N_ALIGN), other=-float("inf"),
                      eviction_policy="evict_last")
        while c < n_chunks:
            x = nxt.to(tl.float32)
            cols = (c + 1) * CHUNK + offs
            nxt = tl.load(x_ptr + base + cols, mask=_col_mask(cols, N, N_ALIGN), other=-float("inf"),
                          eviction_policy="evict_last")
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: add 0, no NaN
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
            c += 1
        r = 1.0 / s
        while c > 0:
            c -= 1
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf"),
                        eviction_policy="evict_first").to(tl.float32)
            tl.store(y_ptr + base + cols, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


@triton.jit
def _softmax_bwd_stream(y_ptr, dy_ptr, dx_ptr, M, N, CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        acc = tl.zeros((CHUNK,), tl.float32)  # per-lane partial sums of y * dy: one reduction per row
        c = 0
        while c < n_chunks:
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += y * dy
            c += 1
        dot = tl.sum(acc, axis=0)
        while c > 0:
            c -= 1
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_ptr + base + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


# Many rows too wide for registers, forward, "lines": cross_entropy's row structure (_ce_rows), for
# softmax. A chunk is [BLOCK // VEC, VEC], one 16-byte vector per line; pass 1 keeps max and sum of
# exp per line (_utils.lse_update), so its loop has no cross-thread reduction or barrier (the
# stream above does two block reductions per chunk), and combines the lines once per row; both
# passes issue the next chunk's load before using the current one. The row is N_FULL unmasked
# chunks and, if TAIL, one masked chunk, which pass 1 takes first and pass 2 last. Pass 1 loads
# evict_last, pass 2's loads and the stores evict_first; pass 2 runs newest chunk first. Programs
# stride over the rows (by default one program a row: _utils.lines_launch).


@triton.jit
def _softmax_fwd_lines(x_ptr, y_ptr, M, N, N_FULL: tl.constexpr, TAIL: tl.constexpr, BLOCK: tl.constexpr,
                       VEC: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = _col_mask(t_offs, N, N_ALIGN)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        m = tl.full([L], -float("inf"), tl.float32)
        d = tl.zeros([L], dtype=tl.float32)
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=-float("inf"), eviction_policy="evict_last")
        if N_FULL > 0:
            x_next = tl.load(x_ptr + base + offs, eviction_policy="evict_last")
        for k in tl.static_range(L2_AHEAD):  # pass 1's chunks L2_AHEAD past the one loaded, into L2
            prefetch_chunk(x_ptr + base, k + 1, N_FULL, BLOCK)
        if TAIL:
            m, d = lse_update(x_t.to(tl.float32), m, d, True)
        if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
            for c in range(N_FULL - 1):
                cur = x_next
                x_next = tl.load(x_ptr + base + (c + 1) * BLOCK + offs, eviction_policy="evict_last")
                if L2_AHEAD:
                    prefetch_chunk(x_ptr + base, c + 1 + L2_AHEAD, N_FULL, BLOCK)
                m, d = lse_update(cur.to(tl.float32), m, d, True)
        if N_FULL > 0:
            m, d = lse_update(x_next.to(tl.float32), m, d, True)
        # the lines combined: y = exp(x - max) / sum (x - max exact, as in lse_update's EXACT);
        # a row of only -inf gives NaN, as torch does
        m_row = tl.max(m, 0)
        r = 1.0 / tl.sum(d * tl.exp2((m - m_row) * LOG2E), 0)
        if N_FULL > 0:
            x_next = tl.load(x_ptr + base + (N_FULL - 1) * BLOCK + offs, eviction_policy="evict_first")
        if N_FULL > 1:
            for i in range(N_FULL - 1):
                c = N_FULL - 1 - i
                cur = x_next
                x_next = tl.load(x_ptr + base + (c - 1) * BLOCK + offs, eviction_policy="evict_first")
                y = tl.exp2((cur.to(tl.float32) - m_row) * LOG2E) * r
                tl.store(y_ptr + base + c * BLOCK + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=-float("inf"), eviction_policy="evict_first")
        if N_FULL > 0:
            y = tl.exp2((x_next.to(tl.float32) - m_row) * LOG2E) * r
            tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            y = tl.exp2((x_t.to(tl.float32) - m_row) * LOG2E) * r
            tl.store(y_ptr + base + t_offs, y.to(y_ptr.dtype.element_ty), mask=t_mask, eviction_policy="evict_first")
        row += tl.num_programs(0)


# Wide rows on the GPU, one launch: a row's segments held in the registers of co-resident programs
# that wait for each other's partials (_utils.publish / wait_total, publish2 / wait_slots2; the
# scheme of rms_norm._bwd_coop). Program (group g, segment s) keeps columns [s*SEG, (s+1)*SEG) of
# rows g, g+G, ...; in step i it loads row i+1, publishes row i's partials and finishes row i-1,
# still in registers, with what its partners published a step ago. x (y, dy) crosses HBM once.


@triton.jit(do_not_specialize=["iters"])
def _softmax_fwd_coop(x_ptr, y_ptr, slot_ptr, M, N, S, iters,
                      SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # partials: the segment's max m_j and sum d_j of e = exp(x - m_j); row: m = max m_j,
    # d = sum d_j * exp(m_j - m) (the split path's combination, -inf segments included). e stays
    # in registers (fp32) until the row's totals arrive: y = e * exp(m_j - m) / d, one exponential
    # an element (see _FWD_COOP_FROM for the variants measured).
    G, g, seg, cols = coop_program(S, SEG)
    cm = _col_mask(cols, N, N_ALIGN)
    j = tl.arange(0, S_BLOCK)
    x = tl.load(x_ptr + _row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=-float("inf"))
    ep = tl.zeros([SEG], dtype=tl.float32)
    mp = 0.0
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: -inf), finish row i - 1
        row = g + i * G
        x_next = tl.load(x_ptr + _row_start(row + G, N, N_ALIGN) + cols, mask=cm & (row + G < M),
                         other=-float("inf"))
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_utils.prefetch_l2)
            prefetch_segment(x_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
        xf = x.to(tl.float32)
        m_j = tl.max(xf, axis=0)
        m_s = _finite_or_zero(m_j)
        e = tl.exp2((xf - m_s) * LOG2E)
        publish2(slot_ptr, row, seg, S, m_j, tl.sum(e, axis=0))
        if i > 0:
            prow = row - G
            ms, ds = wait_slots2(slot_ptr, prow, S, S_BLOCK)
            ms = tl.where(j < S, ms, -float("inf"))
            m = _finite_or_zero(tl.max(ms, axis=0))
            d = tl.sum(ds * tl.exp2((ms - m) * LOG2E), axis=0)
            # mp <= m but for a segment of only -inf (mp = 0, e = 0): its scale is capped at 1, not
            # inf (0 * inf) where m is far below 0; a row of only -inf: 0 / 0, NaN as torch
            y = ep * (tl.exp2(tl.minimum(mp - m, 0.0) * LOG2E) / d)
            tl.store(y_ptr + _row_start(prow, N, N_ALIGN) + cols, y.to(y_ptr.dtype.element_ty), mask=cm & (prow < M))
        ep = e
        mp = m_s
        x = x_next
        i += 1


@triton.jit(do_not_specialize=["iters"])
def _softmax_bwd_coop(y_ptr, dy_ptr, dx_ptr, slot_ptr, M, N, S, iters,
                      SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # partial: the segment's sum of y * dy; row: dx = y * (dy - sum)
    G, g, seg, cols = coop_program(S, SEG)
    cm = _col_mask(cols, N, N_ALIGN)
    y = tl.load(y_ptr + _row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + _row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    yp = tl.zeros_like(y)  # (not `yp = y`: see rms_norm._bwd_coop)
    dyp = tl.zeros_like(dy)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = _row_start(row + G, N, N_ALIGN) + cols
        y_next = tl.load(y_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        dy_next = tl.load(dy_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        if L2_AHEAD:
            prefetch_segment(y_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            prefetch_segment(dy_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
        publish(slot_ptr, row, seg, S, tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0))
        if i > 0:
            prow = row - G
            dot = wait_total(slot_ptr, prow, S, S_BLOCK)
            dx = yp.to(tl.float32) * (dyp.to(tl.float32) - dot)
            tl.store(dx_ptr + _row_start(prow, N, N_ALIGN) + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=cm & (prow < M))
        yp = y
        dyp = dy
        y = y_next
        dy = dy_next
        i += 1


# Few wide rows: the split path (grid M x S). One program per row (the streaming path) leaves all
# but M SMs idle when M is small: a single 128256-wide row is streamed by one SM. Here each row is
# cut into S = cdiv(N, SEG) segments of SEG elements (the last one masked) and the (row, segment)
# programs run in two launches; each segment is loaded in registers once per launch:
#   fwd  _softmax_fwd_split_stats writes the segment's max m_j and sum d_j of exp(x - m_j) to a
#        float32 buffer [M, S, 2]; _softmax_fwd_split_write combines its row's S partials
#        (m = max m_j, d = sum d_j * exp(m_j - m)), re-reads its segment and writes exp(x - m) / d.
#   bwd  _softmax_bwd_split_dot writes the segment's sum of y * dy to [M, S];
#        _softmax_bwd_split_write sums its row's S partials, re-reads y and dy and writes dx.
# The re-read is meant to hit L2 (the first launch loads with the POLICY hint, evict_last by
# default; the whole few-row problem is a few MB). Every program of the second launch combines its
# row's partials itself (one masked load of S_BLOCK = next_pow2(S) floats) rather than a third
# launch doing it once per row. This is not the work-queue split removed above: that one served
# every M; this one is for M <= _SPLIT_MAX_ROWS (see the launchers).
# A segment of only -inf entries (masked scores) has m_j = -inf, d_j = 0: the shifts use 0 where a
# max is -inf, so no -inf - -inf makes NaN; an all -inf row gives 0 / 0 = NaN, as PyTorch does.


@triton.jit
def _split_segment(seg, row, N, SEG: tl.constexpr, N_ALIGN: tl.constexpr):
    # element offsets and mask of segment `seg` of `row` (masked past the row end)
    cols = seg * SEG + tl.arange(0, SEG)
    return _row_start(row, N, N_ALIGN) + cols, _col_mask(cols, N, N_ALIGN)


@triton.jit
def _finite_or_zero(m):
    # the shift to subtract for a max m: 0 where m is -inf, so that exp(-inf - 0) = 0, not NaN
    return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _softmax_fwd_split_stats(x_ptr, part_ptr, N, S, SEG: tl.constexpr, N_ALIGN: tl.constexpr,
                             POLICY: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy=POLICY).to(tl.float32)
    m = tl.max(x, axis=0)
    d = tl.sum(tl.exp(x - _finite_or_zero(m)), axis=0)
    p = part_ptr + (row.to(tl.int64) * S + seg) * 2
    tl.store(p, m)
    tl.store(p + 1, d)


@triton.jit
def _softmax_fwd_split_write(x_ptr, y_ptr, part_ptr, N, S, SEG: tl.constexpr, S_BLOCK: tl.constexpr,
                             N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    j = tl.arange(0, S_BLOCK)
    p = part_ptr + row.to(tl.int64) * S * 2 + j * 2
    m_j = tl.load(p, mask=j < S, other=-float("inf"))
    d_j = tl.load(p + 1, mask=j < S, other=0.0)
    m = _finite_or_zero(tl.max(m_j, axis=0))
    r = 1.0 / tl.sum(d_j * tl.exp(m_j - m), axis=0)  # -inf (or padding) segments: 0 * exp(-inf) = 0
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy=POLICY).to(tl.float32)
    tl.store(y_ptr + offs, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_split_dot(y_ptr, dy_ptr, part_ptr, N, S, SEG: tl.constexpr, N_ALIGN: tl.constexpr,
                           POLICY: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    tl.store(part_ptr + row.to(tl.int64) * S + seg, tl.sum(y * dy, axis=0))


@triton.jit
def _softmax_bwd_split_write(y_ptr, dy_ptr, dx_ptr, part_ptr, N, S, SEG: tl.constexpr,
                             S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    j = tl.arange(0, S_BLOCK)
    dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * S + j, mask=j < S, other=0.0), axis=0)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    tl.store(dx_ptr + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launchers

# Register path: 8 KB of each input per program (a 4096-wide bf16 row: one row, 8 warps), loads
# hinted evict_last although each element is read once. Both measured on the H200 (softmax_ab run 3,
# docs/evidence/softmax_ab_h200_run3.txt): fwd 32768x4096 92.7% -> 98.5% of copy, 65536x2048
# 85.1% -> 98.5%, 4096x32000 83.7% -> 89.7%; bwd 94% -> 101-102% (the hint; the tile size did not
# matter there). We have not found out why evict_last beats evict_first for streaming reads on this
# GPU; it did so for every kernel we tried it on (rms_norm too).
_TILE_BYTES = 8192
_POLICY = "evict_last"
# Widest row kept in registers, in bytes of one input row: 32768 bf16 elements (or 16384 fp32) in
# one program of 32 warps, 32 elements per thread. Measured on the H200 (benchmarks/softmax_ab.py,
# docs/evidence/softmax_ab_h200_run1.txt): at 4096x32000 bf16 this path took the forward from 44% of
# copy (the former split path) to 70% and the backward from 58% to 89%. 64K rows in registers
# spill (ptxas, docs/evidence/softmax_compile.txt).
_MAX_ROW_BYTES = 65536
_MAX_BLOCK = 16384       # rows up to this many elements run at most 16 warps (~16 elements per thread)
# Wider rows in registers take one program of 32 warps (1024 threads, 64 registers) per SM; the
# forward then runs a persistent grid that prefetches the next row (_softmax_fwd_persist), so the SM
# is not idle while its one program reduces: 70% -> 84% of copy at 4096x32000 bf16 on the H200
# (docs/evidence/softmax_ab_h200_run2.txt; at 4096 wide, 2 programs per SM, it lost: 68% -> 64%).
_PERSIST_WIDE = 1
# Wider rows stream: 32 KB chunks per input tensor, 32 warps, one program per SM. On the H200 this
# beat 16 KB chunks, more programs per SM and the removed split queue at every wide shape measured
# (65536 to 262144 wide; see the evidence file above).
_STREAM_CHUNK_BYTES = 32768
_STREAM_PROGRAMS_PER_SM = 1
# The forward's "lines" path (_softmax_fwd_lines, launched by _utils.lines_launch, whose comment has
# the measurements) instead of the stream, where `lines` (default _LINES) is on. H200 A/B runs 9-10
# (softmax_ab_h200_run9.txt, run10.txt), bf16 fwd, % of copy: 2048x65536 73.2% (the packed one-row
# register path, then the default) -> 81.4%, 2048x128256 61.7% (the stream) -> 82.7%, 1024x262144
# 58.3% -> 71.9%.
_LINES = True
# Its arithmetic is not what holds it below copy speed: one FMA per exponent (x * LOG2E - max * LOG2E)
# instead of the exact (x - max) * LOG2E measured the same within 1.8% (run 14,
# softmax_ab_h200_run14.txt: 2048x65536 81.5% -> 81.6%, 2048x128256 82.1% -> 81.1%, 1024x262144
# 71.6% -> 72.9%); neither did fewer rows in flight than SMs help the widest rows, whose rows in
# flight (132 x 512 KB) exceed the 50 MB L2 that pass 2 re-reads from (run 13: 1024x262144 0.5
# program per SM 59.3%, 0.75 68.4%, one a row 68.3%).
# Nor did more rows in flight at 65536 (run 18, softmax_ab_h200_run18.txt: 16 KB chunks of 8 warps
# take 109 registers, 2 programs per SM; capped at 80, 3 without spill: 2048x65536 80.8% -> 75.4%,
# 1024x65536 76.4% -> 71.4%, 4096x65536 82.8% -> 80.4%; at 64, 4 programs, 66.6-73.5%). Our reading:
# more rows in flight crowd the L2 that pass 2 re-reads from, where more programs of the coop
# backward, which holds its rows in registers, gained (_BWD_COOP_MAXNREG).
# Nsight Compute (docs/evidence/ncu_h200/, session 11): at 2048x65536 the DRAM bytes are the ideal
# ones (pass 2's re-reads hit L2), issue slots are 45% busy and half of the warps' stall cycles
# wait on loads, with 2 programs of 8 warps per SM (109 registers). The same loops
# software-pipelined by Triton instead (cp.async into shared memory, 64 registers, 4 programs per
# SM, but without the loads' L2 hints) lost everywhere: 66-69% at 65536, 60-67% at 128256
# (softmax_ab run 24). Nor did TMA loads pipelined by Triton (benchmarks/tma_probe.py: the row as
# lines of 256 through a 3-D tensor descriptor, 2-4 stages of 8-32 KB, 32 registers, 3-8 programs
# per SM): 60-69% of copy against the default's 75-82% at every wide shape
# (docs/evidence/tma_probe_h200_run1.txt).
# On the GPU, many rows too wide for registers take, in the backward, the coop path instead of the
# stream: segments of _COOP_SEG elements, _COOP_WARPS warps a program. H200 A/B run 8
# (softmax_ab_h200_run8.txt), bf16 bwd: 2048x65536 77.3% of copy -> 83.4%, 2048x128256 68.4% ->
# 77.1%, 1024x262144 62.1% -> 81.3% (segments of 4096: 81.1%, 82.0%, 78.1%; 8 warps or 1024: less).
# The forward's first coop kernel lost to the stream: 2048x128256 55.2% against 61.6% streamed,
# 1024x262144 60.1% against 58.3% (its second exp per element, and the max and sum to combine;
# rewritten since, see _FWD_COOP_FROM).
# The lines structure in the backward (pass 1 sums y * dy per line, pass 2 re-reads y and dy from
# L2) lost to coop, run 12 (softmax_ab_h200_run12.txt): 2048x65536 81.9% at best (32 KB chunks of 16
# warps; coop 82.6%), 2048x128256 67.8%, 1024x262144 63.5% (coop 75.9%, 80.4%): its rows in flight
# are twice the forward's in L2, and 64 KB chunks of 32 warps spill. It is not kept.
# Rows of 65537-131072 elements take segments of _COOP_SEG_MID instead: 4096 against 2048, bwd
# 2048x128256 82.0% / 81.0% / 81.8% of copy against 77.1% / 75.9% / 77.2% (runs 8, 12, 13), and
# in run 13 2048x126976 78.3% against 77.5%, 2048x131072 82.8% against 81.5%; narrower and wider
# rows lost with it (2048x65536 81.1% / 80.3% against 83.4% / 82.6%; 1024x262144 78.1% / 77.2% /
# 77.9% against 81.3% / 80.4% / 81.2%). Why the middle widths prefer it, we have not found out.
_COOP_SEG = 2048
_COOP_SEG_MID = 4096
_COOP_SEG_MID_WIDTHS = (65537, 131072)
# The backward's register caps on sm_90, (segment, warps) -> maxnreg. Segments of 2048 at 4 warps
# take 119 registers a thread uncapped (4 programs per SM), 96 fits 5 (8 bytes of stack; ptxas,
# Triton 3.6), and with them more row groups at once. H200 A/B runs 16-17 (softmax_ab_h200_run16.txt,
# run17.txt), bf16 bwd, % of copy: 1024x65536 79.6% -> 83.0%, 2048x65536 82.4% -> 86.5%, 4096x65536
# 85.2% -> 89.4%, 1024x262144 80.3% -> 83.9%; 80 registers (6 programs, more spill) 53-57%. The
# middle widths' segments of 4096 (215 registers, 2 programs per SM) lose far more at 96 (12.8%);
# there segments of 2048 capped at 96 measured 79.6-83.9% against 78.1-83.0% (run 17): a wash, not
# taken.
# The row a program finishes a step late re-read from L2 instead of held (as rms_norm's coop
# backward does since its runs 24-25, rms_norm.COOP_RELOAD) takes 72-77 registers instead of 121
# (sm_90), 64 without spill, but lost at every width (run 25, softmax_ab_h200_run25.txt, bf16 bwd,
# % of copy): 2048x65536 87.2% -> 68.2-68.4% (capped at 96, uncapped, at 64: 6-8 programs per SM),
# 2048x128256 86.0% -> 70.3-71.5%, 1024x262144 85.1% -> 69.9-76.0%, 4096x65536 89.2% -> 69.2-75.1%.
# Not kept.
_BWD_COOP_MAXNREG = {(2048, 4): 96}
_COOP_WARPS = 4
# The backward's middle widths run their segments of 4096 at 8 warps (16 elements a thread, as 2048
# at 4 warps; still 2 programs per SM, with twice the loads in flight). H200 A/B runs 19-21
# (softmax_ab_h200_run19.txt - run21.txt), bf16 bwd, % of copy: 2048x128256 81.0% -> 85.0%,
# 2048x126976 78.2% -> 81.2%, 2048x131072 83.0% -> 86.9%; at 65536 and 262144 (segments of 2048)
# segments of 4096 at 8 warps lost (1024x65536 80.5% against 82.7%, 1024x262144 77.6% against 84.6%).
_COOP_WARPS_MID = 8
# The forward's coop path, rewritten in run 19: e = exp(x - segment max) held in registers, exp2,
# one division a row instead of one an element (sm_90: 560 SASS instructions, 72 registers, 7
# programs per SM, against 760, 80, 6). It takes rows from _FWD_COOP_FROM elements, where the
# lines path's re-read rows (one a program, 512 KB at 262144 bf16) no longer fit the L2 together:
# 1024x262144 74.7% of copy against 71.7% (run 19). Without the L2 prefetch its 7 programs per SM
# (segments of 2048) mattered: a build of 77 registers (6) measured 71.9% against 71.4% (run 21);
# with it, segments of 4096 at 3 programs per SM are faster (_FWD_COOP_SEG).
# Narrower, lines won: 2048x128256 81.3% against 82.8%, 4096x65536 77.4% against 83.2% (runs
# 19-20; at 128256 the coop path wins since it prefetches into L2, see _COOP_L2_AHEAD).
# Measured and dropped: x held and exponentiated again (64.8-70.9%), the segment as 16-byte
# lines with (max, sum) pairs reduced at once (12 barriers instead of 18 but 50 MUFU instead of 20:
# 63.5-79.7%), 8 warps or segments of 1024, register caps for 8 or 9 programs per SM (run 23: 75.8%
# and 63.4% at 1024x262144); the first version (x held, tl.exp twice, a division an element)
# measured 60.0% at 1024x262144.
_FWD_COOP_FROM = 65537  # 131073 until run 26 (see _COOP_L2_AHEAD)
# Rows a coop step prefetches into L2 beyond the one it loads (_utils.prefetch_l2): 1. H200 A/B
# run 26 (softmax_ab_h200_run26.txt), bf16, % of copy, none -> 1 row (2 rows):
#   bwd 2048x65536 86.4 -> 87.9 (85.4), 4096x65536 88.6 -> 90.5 (87.3), 2048x128256 85.0 -> 90.8
#       (88.8), 1024x262144 83.8 -> 88.4 (85.0);
#   fwd 1024x262144 74.7 -> 76.0 (74.2), 2048x128256 81.7 -> 85.0 (82.2), where the lines path
#       measured 82.4; at 65536 the lines path stays ahead (2048x65536 80.8 against 76.9).
# So the forward's coop path now starts past 65536 (_FWD_COOP_FROM).
_COOP_L2_AHEAD = 1
# Chunks the lines forward's pass 1 prefetches into L2 past the one it loads, for rows of up to
# _utils.LINES_NARROW_ROW_BYTES (16 KB chunks of 8 warps): 1. H200 A/B run 27
# (softmax_ab_h200_run27.txt), bf16 fwd, % of copy, none -> 1 chunk (2): 2048x65536 81.0 -> 85.9
# (82.4); wider rows' 64 KB chunks lost with it (2048x128256 82.3 -> 75.9, 1024x262144 71.8 -> 68.8).
_LINES_L2_AHEAD = 1
# The forward's coop segments: 4096 elements (4 warps) at every width it takes. Run 27, with the L2
# prefetch: 1024x262144 75.8% (segments of 2048) -> 79.5%; at 65537-131072 wide it already had
# _COOP_SEG_MID (4096).
_FWD_COOP_SEG = 4096
# A few wide rows take the split path. Streamed, all of a 1 x 128256 bf16 softmax ran on one SM
# (25.8 us fwd, 16.7 us bwd on the H200 in CUDA graphs, against 13.6 / 9.7 us for torch.compile).
# H200 A/B (benchmarks/softmax_ab.py, docs/evidence/softmax_ab_h200_run4.txt): split, 1x128256
# takes 7.4 us fwd / 7.2 us bwd, 1x262144 8.0 / 7.5, 16x128256 2.6x / 2.0x faster than streamed;
# 1x32000 (32 warps in registers) 1.19x / 1.15x faster than the register path, 1x16384 (16 warps)
# 0.96x / 0.86x. So: up to 16 rows (the most measured), rows over 16384 elements (_MAX_BLOCK).
# Segments of 4096 elements (8 warps): 8192, 2048 and 1024 were no better overall.
_SPLIT_MAX_ROWS = 16
_SPLIT_SEG = 4096
# The second launch loads all of a row's partials in one masked vector of next_pow2(S): a bound
# on S (= cdiv(N, SEG)) keeps that vector small.
_SPLIT_MAX_SEGMENTS = 1024
# Backward register path: bf16 y and dy kept packed across the reduction (softmax_backward's
# `lean`, _utils.widen). At 4096x32000 (one 32768 block, 32 warps, 64 registers a thread) the plain
# kernel spills 8 registers a thread; lean, it does not: 199.8 -> 185.3 us, 92.6% -> 99.9% of copy
# (Liger 188.0) on the H200; the other shapes within 0.2% (docs/evidence/softmax_ab_h200_run6.txt).
_LEAN_BWD = True
# Forward, `lean` (off by default since softmax_ab run 9: the lines path beat it at 2048x65536, 81.4%
# against 73.2%): rows up to 65536 elements in registers, one 32-warp program per SM, when bf16 x stays
# packed (32 registers a thread for the row; widened to fp32, 64K rows spilled 43 registers a
# thread). H200 A/B run 7 (softmax_ab_h200_run7.txt): 2048x65536 fwd 202.4 -> 172.6 us, 62.4% ->
# 73.2% of copy (the stream's second read of each row from L2 is gone); the same without `lean`
# spills and takes 217.6 us. At 32768 the persistent prefetching grid stays (lean there, one row
# per program: 138 -> 198 us).
_LEAN_FWD_BLOCK = 65536


def _align(n: int) -> int:
    """The largest power of two (up to 16) dividing n: a constexpr hint for 16-byte loads."""
    return min(16, n & -n)


def _warps(tile: int, max_warps: int) -> int:
    """~16 elements per thread (32 at 32 warps): enough loads in flight per thread without
    spilling. 32 warps = 1024 threads, where the hardware caps a thread at 64 registers."""
    return max(4, min(max_warps, tile // 512))


# Keywords of softmax_forward / softmax_backward. The defaults are the production choice; the
# others exist for the tests (small rows through the streaming path) and for GPU A/B runs:
#   max_block        widest row (next power of two) kept in registers (default: 64 KB of the
#                    input dtype); wider rows stream, or split (below)
#   split            None (default): the automatic rule, the split path for rows over 16384
#                    elements when M <= _SPLIT_MAX_ROWS; True: always the split path; False: never
#                    (register path or stream)
#   split_seg        split path: elements per segment, a power of two (default _SPLIT_SEG = 4096);
#                    at most _SPLIT_MAX_SEGMENTS segments per row
#   policy           register and split paths: cache hint of the loads ("evict_first",
#                    "evict_last", "")
#   tile_bytes       register path: bytes of input per program (rows per tile; default 8 KB)
#   max_warps        most warps per program (default 32 for a row over 16384 elements in registers
#                    and for stream chunks, else 16; split: 16, 8 at the default segment)
#   chunk            elements per stream chunk (a power of two; default 32 KB of the dtype)
#   programs_per_sm  stream grid: programs per SM (default 1), or "rows" for one program per row
#   coop             rows too wide for registers, more than _SPLIT_MAX_ROWS of them: None (default)
#                    the coop path on the GPU, in the backward (_softmax_bwd_coop) and in the
#                    forward from _FWD_COOP_FROM elements (_softmax_fwd_coop), else the lines path
#                    or the stream; True / False force it on / off (on the CPU: one segment a row)
#   coop_seg         coop path: elements per segment (default: the forward's _FWD_COOP_SEG; the
#                    backward's _COOP_SEG, _COOP_SEG_MID for rows in _COOP_SEG_MID_WIDTHS)
#   coop_warps       coop path: warps a program (default _COOP_WARPS; the backward's rows in
#                    _COOP_SEG_MID_WIDTHS: _COOP_WARPS_MID)
#   coop_maxnreg     coop path: registers a thread at most, 0 for none (default: the backward's
#                    _BWD_COOP_MAXNREG on sm_90, else none; the forward: none)
#   coop_l2_ahead    coop path: each step also prefetches into L2 (_utils.prefetch_l2) the row this
#                    many steps past the one it loads; 0: none (default _COOP_L2_AHEAD; only on
#                    sm_90 with rows of whole 16-byte vectors)
#   lines_l2_ahead   lines path: chunks past the one loaded that pass 1 prefetches into L2 (default
#                    _LINES_L2_AHEAD for rows up to LINES_NARROW_ROW_BYTES, else 0; sm_90, rows of
#                    whole 16-byte vectors)
#   lines            forward, where the stream would run: _softmax_fwd_lines instead (default
#                    _LINES); `chunk`, `programs_per_sm` and `max_warps` apply to it as to the stream
#   persist          forward register path: a persistent grid of this many programs per SM, each
#                    prefetching its next row tile (_softmax_fwd_persist); 0: one tile per program;
#                    default: 1 for rows over 16384 elements, else 0


def _uses_split(M: int, block: int, split: bool | None) -> bool:
    if split is None:  # the automatic rule (measured, see _SPLIT_MAX_ROWS): few rows over 16384 wide
        return block > _MAX_BLOCK and M <= _SPLIT_MAX_ROWS
    return split


def _launch_split(split_kernels, tensors, M: int, N: int, seg: int, max_warps, policy) -> None:
    """The split path: grid (row, segment), partials in float32, two launches (see the kernels)."""
    stats, write, per_segment = split_kernels
    if seg < 1 or seg & (seg - 1):
        raise ValueError(f"split_seg must be a power of two: got {seg}")
    S = triton.cdiv(N, seg)
    if S > _SPLIT_MAX_SEGMENTS:
        raise ValueError(f"split_seg {seg} cuts rows of {N} into {S} segments, over {_SPLIT_MAX_SEGMENTS}")
    part = torch.empty((M, S, per_segment), dtype=torch.float32, device=tensors[0].device)
    meta = dict(SEG=seg, N_ALIGN=_align(N), POLICY=policy, num_warps=_warps(seg, max_warps or 16))
    stats[(M, S)](*tensors[:-1], part, N, S, **meta)  # inputs only: the output is written by `write`
    write[(M, S)](*tensors, part, N, S, S_BLOCK=triton.next_power_of_2(S), **meta)


def _bwd_coop_cap(device, seg: int, warps: int) -> int | None:
    """The backward coop kernel's register cap for this launch: _BWD_COOP_MAXNREG's on sm_90."""
    return _BWD_COOP_MAXNREG.get((seg, warps)) if on_sm90(device) else None


def _launch_coop(kernel, partials: int, tensors, M: int, N: int, seg, warps, maxnreg=None, l2_ahead=None) -> bool:
    """The coop path (see _softmax_fwd_coop, _utils.coop_plan): False, launching nothing, where not
    even one group of a row's programs fits on the GPU at once."""
    lo, hi = _COOP_SEG_MID_WIDTHS
    mid = lo <= N <= hi
    default_seg = _FWD_COOP_SEG if kernel is _softmax_fwd_coop else _COOP_SEG_MID if mid else _COOP_SEG
    warps = warps or (_COOP_WARPS_MID if mid and kernel is _softmax_bwd_coop else _COOP_WARPS)
    if maxnreg is None and kernel is _softmax_bwd_coop:
        maxnreg = _bwd_coop_cap(tensors[0].device, seg or default_seg, warps)
    inputs = tensors[:-1]  # what the kernel reads (and prefetches); the last tensor is its output
    plan = coop_plan(kernel, tensors, M, N, seg, default_seg, warps, partials, maxnreg, N_ALIGN=_align(N),
                     L2_AHEAD=prefetch_ahead(l2_ahead, _COOP_L2_AHEAD, *inputs))
    if plan is None:
        return False
    groups, iters, S, slots, meta = plan
    kernel[(groups * S,)](*tensors, slots, M, N, S, iters, num_warps=warps, **meta)
    return True


def _launch(fused, stream, split_kernels, tensors, M: int, N: int, elem: int, device, max_block,
            max_warps, chunk, programs_per_sm, persist=None, tile_bytes=None, policy=_POLICY,
            split=None, split_seg=None, fused_meta=None, coop_kernel=None, coop=None, coop_seg=None,
            coop_warps=None, coop_maxnreg=None, coop_l2_ahead=None, lines_l2_ahead=None) -> None:
    block = triton.next_power_of_2(N)
    fits_registers = block <= (_MAX_ROW_BYTES // elem if max_block is None else max_block)
    if _uses_split(M, block, split):
        _launch_split(split_kernels, tensors, M, N, split_seg or _SPLIT_SEG, max_warps, policy)
        return
    if fits_registers:
        rows = max(1, min((tile_bytes or _TILE_BYTES) // (block * elem), triton.next_power_of_2(M)))
        warps = _warps(rows * block, max_warps or (32 if block > _MAX_BLOCK else 16))
        meta = dict(ROWS=rows, BLOCK_N=block, N_ALIGN=_align(N), POLICY=policy, num_warps=warps)
        tiles = triton.cdiv(M, rows)
        if persist is None and fused is _softmax_fwd and block > _MAX_BLOCK:
            persist = _PERSIST_WIDE  # the forward of one 32-warp row per program: see above
        if persist:  # forward only
            programs = min(tiles, persist * sm_count(device))
            _softmax_fwd_persist[(programs,)](*tensors, M, N, triton.cdiv(tiles, programs), **meta)
        else:
            fused[(tiles,)](*tensors, M, N, **meta, **(fused_meta or {}))
        return
    if (device.type == "cuda" if coop is None else coop) and _launch_coop(*coop_kernel, tensors, M, N, coop_seg,
                                                                        coop_warps, coop_maxnreg, coop_l2_ahead):
        return
    if stream is _softmax_fwd_lines:
        grid, meta = lines_launch(M, N, elem, device, chunk, programs_per_sm, max_warps)
        ahead = prefetch_ahead(lines_l2_ahead, _LINES_L2_AHEAD if N * elem <= LINES_NARROW_ROW_BYTES else 0,
                               tensors[0])
        stream[(grid,)](*tensors, M, N, N_ALIGN=_align(N), L2_AHEAD=ahead, **meta)
        return
    chunk = chunk or _STREAM_CHUNK_BYTES // elem
    pps = programs_per_sm or _STREAM_PROGRAMS_PER_SM
    programs = M if pps == "rows" else min(M, pps * sm_count(device))
    stream[(programs,)](*tensors, M, N, CHUNK=chunk, N_ALIGN=_align(N), num_warps=_warps(chunk, max_warps or 32))


# (first launch, second launch, float32 partials per segment) of each direction's split path
_FWD_SPLIT = (_softmax_fwd_split_stats, _softmax_fwd_split_write, 2)
_BWD_SPLIT = (_softmax_bwd_split_dot, _softmax_bwd_split_write, 1)


def softmax_forward(x: torch.Tensor, *, max_block: int | None = None, max_warps: int | None = None,
                    chunk: int | None = None, programs_per_sm=None,
                    persist: int | None = None, tile_bytes: int | None = None,
                    policy: str = _POLICY, split: bool | None = None,
                    split_seg: int | None = None, lean: bool | None = None, coop: bool | None = None,
                    coop_seg: int | None = None, coop_warps: int | None = None,
                    coop_maxnreg: int | None = None, lines: bool | None = None,
                    coop_l2_ahead: int | None = None, lines_l2_ahead: int | None = None) -> torch.Tensor:
    """x [M, N] contiguous -> y. Keywords: see the comment above _launch, and `lean`: rows up to
    _LEAN_FWD_BLOCK in registers, one row per program (no persistent grid), bf16 x kept packed
    across the reductions on the GPU (_utils.widen). Default: off where `lines` is on (the default),
    else on for bf16 rows that only fit so."""
    M, N = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(N)
    if lines is None:
        lines = _LINES
    if lean is None:
        lean = not lines and widen_asm(x) and _MAX_ROW_BYTES // x.element_size() < block <= _LEAN_FWD_BLOCK
    if lean:
        max_block = max_block or _LEAN_FWD_BLOCK
        persist = persist or 0
    _launch(_softmax_fwd, _softmax_fwd_lines if lines else _softmax_fwd_stream, _FWD_SPLIT, (x, y), M, N,
            x.element_size(), x.device,
            max_block, max_warps, chunk, programs_per_sm, persist, tile_bytes, policy, split, split_seg,
            fused_meta={"ASM": lean and widen_asm(x)}, coop_kernel=(_softmax_fwd_coop, 2),
            coop=(x.is_cuda and N >= _FWD_COOP_FROM) if coop is None else coop, coop_seg=coop_seg,
            coop_warps=coop_warps, coop_maxnreg=coop_maxnreg, coop_l2_ahead=coop_l2_ahead,
            lines_l2_ahead=lines_l2_ahead)
    return y


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, max_block: int | None = None,
                     max_warps: int | None = None, chunk: int | None = None, programs_per_sm=None,
                     tile_bytes: int | None = None, policy: str = _POLICY,
                     split: bool | None = None, split_seg: int | None = None,
                     lean: bool | None = None, coop: bool | None = None, coop_seg: int | None = None,
                     coop_warps: int | None = None, coop_maxnreg: int | None = None,
                     coop_l2_ahead: int | None = None) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y)); y, dy [M, N] contiguous. Keywords as softmax_forward's, and
    `lean`: the register path keeps bf16 inputs packed across its reduction (_utils.widen; only
    bf16 on the GPU, elsewhere it changes nothing)."""
    M, N = y.shape
    dx = torch.empty_like(y)
    lean = _LEAN_BWD if lean is None else lean
    _launch(_softmax_bwd, _softmax_bwd_stream, _BWD_SPLIT, (y, dy, dx), M, N, y.element_size(), y.device,
            max_block, max_warps, chunk, programs_per_sm, tile_bytes=tile_bytes, policy=policy,
            split=split, split_seg=split_seg,
            fused_meta={"ASM": lean and widen_asm(y) and widen_asm(dy)}, coop_kernel=(_softmax_bwd_coop, 1),
            coop=coop, coop_seg=coop_seg, coop_warps=coop_warps, coop_maxnreg=coop_maxnreg,
            coop_l2_ahead=coop_l2_ahead)
    return dx


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(dy.contiguous(), y)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x [..., N]."""
    if x.numel() == 0:
        raise ValueError(f"x must not be empty: got shape {tuple(x.shape)}")
    n = x.shape[-1]
    return SoftmaxFunction.apply(x.reshape(-1, n).contiguous()).view(x.shape)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def softmax_eager(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def softmax_liger(x: torch.Tensor) -> torch.Tensor:
    # Liger keeps the whole row in registers: it refuses rows wider than 65536 (RuntimeError)
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(x: torch.Tensor) -> torch.Tensor:
    # Shifting by a per-row constant changes nothing mathematically (detached, it adds no gradient
    # path) and keeps exp finite for any logits.
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values.detach())
    return e / e.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # logits / attention scores: each row with its own spread (std 1 to 4), so some rows are flat
    # and some are dominated by a few entries
    x = torch.randn(m, n, generator=g) * (1.0 + 3.0 * torch.rand(m, 1, generator=g))
    return {"x": x.to(device=device, dtype=dtype)}


# ---------------------------------------------------------------------------------------------
# Shape grids: M = rows (tokens, or heads x queries), N = softmax width.


_s = Shape.rows


QUICK = (
    _s(64, 1024, "small, power of two: several rows per program"),
    _s(37, 1000, "awkward: rows and width not powers of two, width only 8-aligned"),
    _s(3, 40000, "a few wide rows: the split path (10 segments of 4096 per row, the last partial)"),
)

FULL = (
    _s(4096, 4096, "4k x 4k, the classic softmax benchmark shape"),
    _s(32768, 4096, "32k rows of 4096: 256 MB bf16, far beyond L2"),
    _s(65536, 2048, "attention scores: 32 heads x 2048 queries over 2048 keys"),
    _s(3000, 5000, "awkward: rows and width not powers of two, width only 8-aligned"),
    _s(4096, 32000, "LLaMA-2 / Mistral vocabulary over 4k tokens: one 32768 block in registers (bf16)"),
    _s(2048, 65536, "65536-wide rows, where torch.compile falls to half its bandwidth"),
    _s(2048, 128256, "LLaMA-3 vocabulary over 2k tokens (250 KB rows in bf16)"),
    _s(1024, 262144, "262144-wide rows (512 KB bf16): far wider than any one program can hold"),
    _s(1, 128256, "one row: a single decode step over the LLaMA-3 vocabulary (the split path)"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = element size):
#   fwd:      read x; write y                -> 2 * M * N * s
#   bwd:      read y, dy; write dx           -> 3 * M * N * s
#   fwd+bwd:  the sum of the two             -> 5 * M * N * s
# The register path moves exactly this; the streaming path reads each row twice, the second time
# mostly from L2 (that is what its grid of one program per SM is for), and so does the split path
# (its second launch re-reads the segments the first one read). FLOPs per element: fwd 5 (max,
# subtract, exp, sum, scale), bwd 4 (product, sum, subtract, product).


def bytes_moved(dims, dtype, mode) -> int:
    per = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode]
    return per * dims["M"] * dims["N"] * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 5, "bwd": 4, "fwd+bwd": 9}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="softmax",
    description="row softmax over the last dim (rows up to 262144 wide), forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(softmax, softmax_eager)
    + (Provider("liger", softmax_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x",),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # One rounding of the output to the storage dtype; the backward also inherits the rounding of
    # the saved y. Measured on the CPU: bf16 <= 4.7e-3 fwd, 8.1e-3 bwd for ours (the interpreter
    # truncates on every cast, ~2x round-to-nearest) and 4.6e-3 for PyTorch's; fp16 <= 5.6e-4;
    # fp32 <= 3e-7 for ours, 2e-6 for PyTorch's CPU kernel (its vectorised exp) forward; PyTorch's
    # fp32 backward at 40000-wide rows reached 1.01e-5 in CI (y * (dy - sum(dy * y)) cancels: the
    # error grows with the row), so fp32 allows 4e-5: 250x under a 1% mistake.
    tolerance={torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 4e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
