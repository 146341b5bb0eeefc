"""LayerNorm over the last dim with weight and bias: y = (x - mean) / sqrt(var + eps) * w + b."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import (coop_plan, coop_program, l2_bytes, lines_launch, prefetch_ahead, prefetch_rows,
                     prefetch_segment, publish2, sm_count, wait_total2)


# ---------------------------------------------------------------------------------------------
# Triton kernels.
#
# Forward, rows that fit in registers (next_pow2(N) <= 16384): one program normalises a tile of
# ROWS whole rows, so narrow rows still give each program ~16 KB of x (enough loads in flight to
# cover DRAM latency) and amortise the loads of w and b. Mean and variance are two reductions over
# the registers (exact two-pass variance, no E[x^2] - E[x]^2 cancellation).
#
# Forward, wider rows: a persistent grid of one program per SM walks the rows; per row, pass 1
# streams the row in 32 KB chunks and merges per-chunk (count, mean, M2) with Chan's formula;
# pass 2 re-reads the row and writes y. One open row per SM keeps the re-read in L2 (132 rows of
# 128 KB = 17 MB at N = 65536 bf16), and a 32 KB chunk keeps the SM's loads in flight.
#
# Backward: dx needs two row sums, c1 = mean(xhat * w * dy) and c2 = mean(w * dy); dw and db are
# column sums over all rows. Programs keep their dw/db partials in fp32 registers while they stride
# over their rows, write one partial row each to a small [programs, 2, N] buffer, and a second tiny
# kernel sums them (the partials are still in L2; a single program writes dw and db itself). When
# a whole row fits in registers (next_pow2(N) <= 8192) a persistent grid sized to the resident
# programs walks whole-row tiles, prefetching the next one: c1, c2 come from the same registers,
# one read of x and dy, one write of dx. Wider rows do not fit with their dw/db accumulators (about
# 5 fp32 registers per element), so a first pass computes c1, c2 per row and a grid of [row group,
# column block] programs reads x and dy a second time (as PyTorch does).
#
# Row starts and column masks go through _row_start/_col_mask with N_ALIGN, the largest power of
# two dividing N: rows of 1000 or 5000 elements then still get 16-byte loads (the JIT itself only
# marks ints divisible by 16, and otherwise every load of a row is scalar). Loops with runtime bounds
# are `while` loops and grid sizes are passed as arguments (P, G): under NumPy 2.4 the interpreter
# cannot turn its 1-element scalars into a `range` bound.


@triton.jit
def _row_start(row, N, N_ALIGN: tl.constexpr):
    # row * N in int64, written so that the compiler sees it is a multiple of N_ALIGN
    return row.to(tl.int64) * (N // N_ALIGN) * N_ALIGN


@triton.jit
def _col_mask(cols, N, N_ALIGN: tl.constexpr):
    # cols < N, written so that the compiler sees it is constant over runs of N_ALIGN columns
    return cols // N_ALIGN < N // N_ALIGN


@triton.jit
def _ln_load_rows(x_ptr, rows, cols, M, N, N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    mask = (rows < M)[:, None] & _col_mask(cols, N, N_ALIGN)[None, :]
    start = _row_start(rows, N, N_ALIGN)
    return tl.load(x_ptr + start[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy=POLICY)


@triton.jit
def _ln_load_wb(w_ptr, b_ptr, cols, cmask):
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
    return w, b


@triton.jit
def _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN: tl.constexpr,
             EARLY_WB: tl.constexpr = False, w=None, b=None):
    """Normalise a loaded [ROWS, BLOCK_N] tile of x and store y, mean and rstd (both forwards).
    EARLY_WB: w and b were loaded by the caller, with x (measured: the comment at _FWD_NO_HINT_FROM)."""
    rmask = rows < M
    mask = rmask[:, None] & cmask[None, :]
    xf = x.to(tl.float32)
    mean = tl.sum(xf, axis=1) / N
    xc = tl.where(mask, xf - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    rstd = tl.rsqrt(var + eps)
    if not EARLY_WB:
        # w and b (L2 hits: every program reads them) are loaded only now, after the reductions'
        # barriers, so that they do not hold registers while x is in flight
        w, b = _ln_load_wb(w_ptr, b_ptr, cols, cmask)
    y = xc * rstd[:, None] * w.to(tl.float32)[None, :] + b.to(tl.float32)[None, :]
    offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps,
            ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr,
            POLICY: tl.constexpr = "evict_first", EARLY_WB: tl.constexpr = False):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = _col_mask(cols, N, N_ALIGN)
    x = _ln_load_rows(x_ptr, rows, cols, M, N, N_ALIGN, POLICY)
    if EARLY_WB:
        w, b = _ln_load_wb(w_ptr, b_ptr, cols, cmask)
    else:
        w, b = None, None
    _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN, EARLY_WB, w, b)


@triton.jit
def _ln_fwd_wide(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, P,
                 CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        count = 0.0
        mean = 0.0
        m2 = 0.0
        start = 0
        while start < N:
            cols = start + offs
            mask = _col_mask(cols, N, N_ALIGN)
            # keep the row in L2 for pass 2
            x = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            n_c = tl.minimum(N - start, CHUNK).to(tl.float32)
            mean_c = tl.sum(x, axis=0) / n_c
            d = tl.where(mask, x - mean_c, 0.0)
            m2_c = tl.sum(d * d, axis=0)
            # Chan et al.: merge (count, mean, m2) with the chunk's (n_c, mean_c, m2_c)
            delta = mean_c - mean
            total = count + n_c
            mean += delta * (n_c / total)
            m2 += m2_c + delta * delta * (count * (n_c / total))
            count = total
            start += CHUNK
        rstd = tl.rsqrt(m2 / N + eps)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)
        start = 0
        while start < N:
            cols = start + offs
            mask = _col_mask(cols, N, N_ALIGN)
            x = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            b = tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = (x - mean) * rstd * w + b
            tl.store(y_ptr + base + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")
            start += CHUNK
        row += P


@triton.jit
def _ln_bwd_row_sums(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, c_ptr, M, N,
                     CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    # Wide rows only: c1 = mean(xhat * w * dy) -> c[row], c2 = mean(w * dy) -> c[M + row].
    # Vector accumulators, reduced once at the end (one cross-warp reduction per row, not per chunk).
    row = tl.program_id(0)
    base = _row_start(row, N, N_ALIGN)
    offs = tl.arange(0, CHUNK)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    acc1 = tl.zeros([CHUNK], dtype=tl.float32)
    acc2 = tl.zeros([CHUNK], dtype=tl.float32)
    start = 0
    while start < N:
        cols = start + offs
        mask = _col_mask(cols, N, N_ALIGN)
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        wdy = w * dy  # 0 where masked, so xhat's value there does not matter
        acc1 += (x - mean) * rstd * wdy
        acc2 += wdy
        start += CHUNK
    tl.store(c_ptr + row, tl.sum(acc1, axis=0) / N)
    tl.store(c_ptr + M + row, tl.sum(acc2, axis=0) / N)


@triton.jit
def _ln_bwd(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, c_ptr, dx_ptr, part_ptr, M, N, G,
            ROWS: tl.constexpr, BLOCK_C: tl.constexpr, N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    # Wide rows, pass 2 of 2. Program (g, j): rows g*ROWS.. strided by G*ROWS, columns of block j;
    # c1, c2 come from _ln_bwd_row_sums.
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = _col_mask(cols, N, N_ALIGN)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    db = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    r0 = g * ROWS
    while r0 < M:
        rows = r0 + tl.arange(0, ROWS)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = (x - mean[:, None]) * rstd[:, None]
        wdy = w[None, :] * dy  # 0 wherever masked
        c1 = tl.load(c_ptr + rows, mask=rmask, other=0.0)
        c2 = tl.load(c_ptr + M + rows, mask=rmask, other=0.0)
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
        r0 += G * ROWS
    part = part_ptr + _row_start(g, 2 * N, N_ALIGN)
    tl.store(part + cols, tl.sum(dw, axis=0), mask=cmask)
    tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)


@triton.jit(do_not_specialize=["iters"])
def _ln_bwd_coop(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, slot_ptr, M, N, S, iters,
                 SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # Wide rows on the GPU, one launch: rms_norm's _bwd_coop with layer_norm's two row sums (c1, c2,
    # _utils.publish2 / wait_total2). Program (group g, segment s) keeps columns [s*SEG, (s+1)*SEG)
    # of x and dy for rows g, g+G, ...; in step i it loads row i+1, publishes row i's partial sums
    # and finishes row i-1 (still in registers) with the totals published a step ago. Its dw and db
    # partials stay in fp32 registers and are written once, as row g of the [G, 2, N] buffer.
    G, g, seg, cols = coop_program(S, SEG)
    cm = _col_mask(cols, N, N_ALIGN)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0)
    dw = tl.zeros([SEG], dtype=tl.float32)
    db = tl.zeros([SEG], dtype=tl.float32)
    x = tl.load(x_ptr + _row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + _row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    # (not `xp = x`: see rms_norm._bwd_coop)
    xp = tl.zeros_like(x)
    dyp = tl.zeros_like(dy)
    mean_p = tl.load(mean_ptr + g, mask=g < M, other=0.0)  # (float tensors for the loop)
    rstd_p = tl.load(rstd_ptr + g, mask=g < M, other=0.0)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = _row_start(row + G, N, N_ALIGN) + cols
        x_next = tl.load(x_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        dy_next = tl.load(dy_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_utils.prefetch_l2)
            prefetch_segment(x_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            prefetch_segment(dy_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
        mean = tl.load(mean_ptr + row, mask=row < M, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        # masked columns: dy = w = 0, so xhat's value there adds nothing
        xhat = (x.to(tl.float32) - mean) * rstd
        dyf = dy.to(tl.float32)
        wdy = dyf * w.to(tl.float32)
        dw += dyf * xhat
        db += dyf
        publish2(slot_ptr, row, seg, S, tl.sum(xhat * wdy, axis=0), tl.sum(wdy, axis=0))
        if i > 0:
            prow = row - G
            c1, c2 = wait_total2(slot_ptr, prow, S, S_BLOCK)
            xhat_p = (xp.to(tl.float32) - mean_p) * rstd_p
            dx = (dyp.to(tl.float32) * w.to(tl.float32) - (xhat_p * (c1 / N) + c2 / N)) * rstd_p
            tl.store(dx_ptr + _row_start(prow, N, N_ALIGN) + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=cm & (prow < M))
        xp = x
        dyp = dy
        mean_p = mean
        rstd_p = rstd
        x = x_next
        dy = dy_next
        i += 1
    part = part_ptr + _row_start(g, 2 * N, N_ALIGN)
    tl.store(part + cols, dw, mask=cm)
    tl.store(part + N + cols, db, mask=cm)


@triton.jit
def _add_pair(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit(do_not_specialize=["iters"])
def _ln_bwd_rows(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, M, N, iters,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr,
                 PREFETCH: tl.constexpr, W_RELOAD: tl.constexpr, POLICY: tl.constexpr,
                 FUSED_SUMS: tl.constexpr = False, STATS_AHEAD: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0):
    # Rows in registers (next_pow2(N) <= max_block): whole-row tiles on a persistent grid, as
    # rms_norm's _bwd_rows; c1 and c2 are reduced from the same registers (one read of x and dy).
    # Each program strides over `iters` row tiles with its dw/db partials in fp32 registers and
    # writes them once, as its row of the [programs, 2, N] partial buffer (or, with one program,
    # straight into the [2N] result: the store casts to its dtype). PREFETCH: the next tile's x and
    # dy loads are issued before this tile's reductions wait on its data. W_RELOAD: w is re-read
    # (an L1/L2 hit) every tile instead of held, for the widest rows' register budget. STATS_AHEAD
    # (with PREFETCH): the next tile's mean and rstd are loaded with its x and dy, so that no load
    # waits between a tile's data arriving and its arithmetic.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    cmask = _col_mask(cols, N, N_ALIGN)
    if not W_RELOAD:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    rows0 = pid * ROWS + tl.arange(0, ROWS)
    if PREFETCH:
        x = _ln_load_rows(x_ptr, rows0, cols, M, N, N_ALIGN, POLICY)
        dy = _ln_load_rows(dy_ptr, rows0, cols, M, N, N_ALIGN, POLICY)
    if STATS_AHEAD:
        mean = tl.load(mean_ptr + rows0, mask=rows0 < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows0, mask=rows0 < M, other=0.0)
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        rmask = rows < M
        if L2_AHEAD:  # the tile L2_AHEAD past the next one into L2 (_utils.prefetch_l2)
            prefetch_rows(x_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
            prefetch_rows(dy_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
        if PREFETCH:  # past the last tile the rows are >= M: fully masked, no traffic
            x_next = _ln_load_rows(x_ptr, rows + step, cols, M, N, N_ALIGN, POLICY)
            dy_next = _ln_load_rows(dy_ptr, rows + step, cols, M, N, N_ALIGN, POLICY)
        else:
            x = _ln_load_rows(x_ptr, rows, cols, M, N, N_ALIGN, POLICY)
            dy = _ln_load_rows(dy_ptr, rows, cols, M, N, N_ALIGN, POLICY)
        if STATS_AHEAD:
            mean_next = tl.load(mean_ptr + rows + step, mask=rows + step < M, other=0.0)
            rstd_next = tl.load(rstd_ptr + rows + step, mask=rows + step < M, other=0.0)
        else:
            mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        # masked rows and columns load 0 (x, dy, mean, rstd), so they add nothing to dw, db, c1, c2
        xhat = (x.to(tl.float32) - mean[:, None]) * rstd[:, None]
        dyf = dy.to(tl.float32)
        dw += dyf * xhat
        db += dyf
        if W_RELOAD:
            wdy = dyf * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        else:
            wdy = dyf * w[None, :]
        if FUSED_SUMS:  # both row sums in one reduction: one exchange between warps, not two
            c1, c2 = tl.reduce((xhat * wdy, wdy), 1, _add_pair)
            c1 = c1 / N
            c2 = c2 / N
        else:
            c1 = tl.sum(xhat * wdy, axis=1) / N
            c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
        if PREFETCH:
            x = x_next
            dy = dy_next
        if STATS_AHEAD:
            mean = mean_next
            rstd = rstd_next
    part = part_ptr + _row_start(pid, 2 * N, N_ALIGN)
    tl.store(part + cols, tl.sum(dw, axis=0), mask=cmask)
    tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)


@triton.jit
def _ln_sum_partials(part_ptr, out_ptr, G, n2, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                     N_ALIGN: tl.constexpr):
    # out[c] = sum_g part[g, c] over the [G, 2N] partials (dw then db), cast to the weight dtype.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = _col_mask(cols, n2, N_ALIGN)
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    g0 = 0
    while g0 < G:
        gs = g0 + tl.arange(0, BLOCK_G)
        mask = (gs < G)[:, None] & cmask[None, :]
        acc += tl.load(part_ptr + _row_start(gs, n2, N_ALIGN)[:, None] + cols[None, :], mask=mask, other=0.0)
        g0 += BLOCK_G
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cmask)


# ---------------------------------------------------------------------------------------------
# _ln_fwd_rows: _ln_fwd's tile on a persistent grid (each program strides over `iters` tiles; one
# binary for any trip count), with PREFETCH: the next tile's loads are issued before the current
# tile's reductions wait on its data (as rms_norm's _fwd_rows). The default from 8192 wide (see
# _FWD_PERSIST_FROM); below that, and without the flags, an A/B variant.


@triton.jit(do_not_specialize=["iters"])
def _ln_fwd_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, iters,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr,
                 PREFETCH: tl.constexpr, POLICY: tl.constexpr = "evict_first"):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    cmask = _col_mask(cols, N, N_ALIGN)
    if PREFETCH:
        x = _ln_load_rows(x_ptr, pid * ROWS + tl.arange(0, ROWS), cols, M, N, N_ALIGN, POLICY)
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        if PREFETCH:
            # past the last tile the rows are >= M: fully masked, no traffic
            x_next = _ln_load_rows(x_ptr, rows + step, cols, M, N, N_ALIGN, POLICY)
        else:
            x = _ln_load_rows(x_ptr, rows, cols, M, N, N_ALIGN, POLICY)
        _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN)
        if PREFETCH:
            x = x_next


# ---------------------------------------------------------------------------------------------
# Launchers

@triton.jit
def _ln_shifted_sums(x, k, s1, s2):
    d = x.to(tl.float32) - k
    return s1 + tl.sum(d, 1), s2 + tl.sum(d * d, 1)


@triton.jit
def _ln_fwd_lines(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, N_FULL: tl.constexpr,
                  TAIL: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr, N_ALIGN: tl.constexpr,
                  WB_AHEAD: tl.constexpr):
    # Wide rows, softmax's lines path (_softmax_fwd_lines) for the mean and variance: chunks of
    # [BLOCK // VEC, VEC] (a 16-byte vector a line), sums kept per line (no block reduction in the
    # loop, no division: _ln_fwd_wide does two block reductions and a Chan merge per chunk), the next
    # chunk loaded before the current one is used in both passes; pass 2 re-reads the row from L2,
    # newest chunk first, with w and b (prefetched a chunk ahead too if WB_AHEAD; else loaded at
    # their use: one row for all rows, always in L2, whose prefetched chunks cost registers). The
    # sums are of x - k, k the row's first element: the variance s2 / N - (s1 / N)^2 then loses to
    # cancellation only (mean - k)^2 / var, which a sample of the row keeps near 1, however far the
    # mean is from 0. N_FULL unmasked chunks and a masked
    # one if TAIL (pass 1 first, pass 2 last; its masked lanes load k: d = 0).
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = _col_mask(t_offs, N, N_ALIGN)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        k = tl.load(x_ptr + base).to(tl.float32)
        s1 = tl.zeros([L], dtype=tl.float32)
        s2 = tl.zeros([L], dtype=tl.float32)
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=k, eviction_policy="evict_last")
        if N_FULL > 0:
            nxt = tl.load(x_ptr + base + offs, eviction_policy="evict_last")
        if TAIL:
            s1, s2 = _ln_shifted_sums(x_t, k, s1, s2)
        if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
            for c in range(N_FULL - 1):
                cur = nxt
                nxt = tl.load(x_ptr + base + (c + 1) * BLOCK + offs, eviction_policy="evict_last")
                s1, s2 = _ln_shifted_sums(cur, k, s1, s2)
        if N_FULL > 0:
            s1, s2 = _ln_shifted_sums(nxt, k, s1, s2)
        d_mean = tl.sum(s1, 0) / N
        mean = k + d_mean
        rstd = tl.rsqrt(tl.maximum(tl.sum(s2, 0) / N - d_mean * d_mean, 0.0) + eps)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)
        if N_FULL > 0:
            o = (N_FULL - 1) * BLOCK + offs
            v = tl.load(x_ptr + base + o, eviction_policy="evict_first")
            if WB_AHEAD:
                w = tl.load(w_ptr + o, eviction_policy="evict_last")
                b = tl.load(b_ptr + o, eviction_policy="evict_last")
        if N_FULL > 1:
            for j in range(N_FULL - 1):
                c = N_FULL - 1 - j
                cur = v
                o = (c - 1) * BLOCK + offs
                v = tl.load(x_ptr + base + o, eviction_policy="evict_first")
                if WB_AHEAD:
                    w_cur, b_cur = w, b
                    w = tl.load(w_ptr + o, eviction_policy="evict_last")
                    b = tl.load(b_ptr + o, eviction_policy="evict_last")
                else:
                    w_cur = tl.load(w_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                    b_cur = tl.load(b_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                y = (cur.to(tl.float32) - mean) * rstd * w_cur.to(tl.float32) + b_cur.to(tl.float32)
                tl.store(y_ptr + base + c * BLOCK + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            v_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
            w_t = tl.load(w_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
            b_t = tl.load(b_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
        if N_FULL > 0:
            if not WB_AHEAD:
                w = tl.load(w_ptr + offs, eviction_policy="evict_last")
                b = tl.load(b_ptr + offs, eviction_policy="evict_last")
            y = (v.to(tl.float32) - mean) * rstd * w.to(tl.float32) + b.to(tl.float32)
            tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            y = (v_t.to(tl.float32) - mean) * rstd * w_t.to(tl.float32) + b_t.to(tl.float32)
            tl.store(y_ptr + base + t_offs, y.to(y_ptr.dtype.element_ty), mask=t_mask, eviction_policy="evict_first")
        row += tl.num_programs(0)


_FWD_TILE_BYTES = 16384  # bytes of x per forward program
_FWD_MAX_BLOCK = 8192    # widest row the forward keeps in registers (wider: _ln_fwd_lines, see _FWD_LINES)
_FWD_CHUNK_BYTES = 32768  # chunk of a wider row: 16 warps x 32 bytes per thread
# Measured on the H200 (benchmarks/layer_norm_ab.py, docs/evidence/layer_norm_ab_h200_run1.txt, bf16):
# 32 elements per thread (half the warps of 16) took fwd 32768x4096 from 82% of copy to 91% and
# 8192x8192 from 64% to 82%; rows of 16384 need more than that: a persistent grid with the next
# tile prefetched, 55% -> 82%; wider rows, two programs per SM on the chunked path: 60% -> 71%.
# Run 2 (layer_norm_ab_h200_run2.txt): x loads hinted evict_last, though each is read once (as for
# rms_norm and softmax: we have not found out why it wins on this GPU), 32768x4096 90% -> 97%; with
# it, the persistent prefetching grid also pays from 8192 wide (82% -> 86%); in the backward, the
# column-blocked path (rows over 8192) with evict_last and 16 warps, 48% -> 52% (16384 wide) and
# 43% -> 46% (65536); the fused backward (<= 8192 wide) keeps evict_first (evict_last: no gain).
_FWD_PER_THREAD = 32
_FWD_PERSIST_FROM = 8192
_FWD_WIDE_PER_SM = 2
_FWD_POLICY = "evict_last"
# Runs 10-11 (layer_norm_ab_h200_run10/11.txt), the one-tile-per-program forward (rows up to 4096):
# w and b loaded with x instead of after the reductions (EARLY_WB) never lost: 1x4096 6.0-6.2 ->
# 5.2 us (a w/b load after the reductions is one more memory round trip on a latency-bound
# kernel), 3000x3584 2.7-4.3% faster, 4096x4096, 1024x2048 and 32768x4096 within 1%; the
# programs per SM stay the same (sm_90 compile: 64 against 58 registers at 8 warps, 4 per SM).
# And x loads without a hint for an x of 8 MB up to the L2's size: 4096x4096 (32 MB) 4.2-5.8%
# faster, 3000x3584 (21 MB) 8.5-8.7%; evict_last stays above that (32768x4096: no hint 3.5% slower)
# and below it (1x4096 6% slower, 1024x2048 the same). In the collector, early w/b took 1x4096
# from 6.0 to 5.1-5.2 us (runs dd17ebc3 -> 56a11cd4, 369a663a), but 4096x4096 stayed within 1%
# (23.1 -> 22.8-23.0 us): the A/Bs of runs 10-11 ran with the default CUDA allocator, the
# collector with expandable segments (since then the A/Bs use it too: benchmarks/ab_tools.py).
_FWD_NO_HINT_FROM = 8 << 20
# Rows wider than the register path: _ln_fwd_lines where _FWD_LINES (else _ln_fwd_wide), w and b
# loaded at their use (_FWD_LINES_WB_AHEAD off), the wide rows' launch of _utils.lines_launch from
# rows over _FWD_LINES_NARROW_ROW_BYTES, two programs per SM there (_FWD_LINES_WIDE_PROGRAMS). H200
# A/B runs 14-16 (layer_norm_ab_h200_run14/15/16.txt), bf16 fwd: 2048x65536 71.5% of copy
# (_ln_fwd_wide) -> 89.6% (64 KB chunks of 32 warps, 2 programs per SM; one per SM 87.2-87.3%, one a
# row 85.4%; 16 KB of 8 warps, one program a row, 62.0%); w and b prefetched a chunk ahead as x is cost
# registers (207 a thread at 16 KB of 8 warps, spills at 16 and 32 warps: 24.8-58.3%). And rows of
# 16384 (max_block 8192: the lines path instead of the register path) 4096x16384 83.5% -> 85.6%.
_FWD_LINES = True
_FWD_LINES_WB_AHEAD = False
_FWD_LINES_NARROW_ROW_BYTES = 65536
_FWD_LINES_WIDE_PROGRAMS = 2
_BWD_WIDE_WARPS = 16
_BWD_WIDE_POLICY = "evict_last"
# Run 3 (layer_norm_ab_h200_run3.txt): the persistent prefetching backward (_ln_bwd_rows) with
# evict_first loads against the earlier grid of ~2 row groups per SM without prefetch: 32768x4096
# 73% -> 83% of copy, 8192x8192 60% -> 70%, 1x4096 8.2 -> 6.2 us (one launch instead of two);
# evict_last and no prefetch gave less; 32 warps, 2-row tiles and a 64-register cap lost. Run 4
# (layer_norm_ab_h200_run4.txt): 4 or 16 warps, w re-read instead of held, register caps of 64 or
# 80 (2-3 programs per SM, with spills): none beat it at 32768x4096 (83.9%) or 8192x8192 (69.9%).
# Runs 20-21 (layer_norm_ab_h200_run20.txt, run21.txt) again: at 32768x4096 evict_last 87.1 / 87.8%
# and no hint 87.3 / 87.6% against evict_first's 85.3 / 86.2%, but evict_first stays ahead at
# 8192x8192 (71.0% against 68.0 / 68.4%), 4096x4096, 3000x3584 and 3000x5120 (1-3 points): kept.
# 16 warps with w held, capped at 64 (2 programs per SM, 16 bytes of spill): 77.2 / 77.8%.
_BWD_POLICY = "evict_first"
# The next tile's mean and rstd loaded with its x and dy (STATS_AHEAD), where before its arithmetic
# waited on them, and for rows of up to 4096 evict_last instead of evict_first: H200 A/B runs 22-23
# (layer_norm_ab_h200_run22.txt, run23.txt), bf16 bwd, % of copy (default before / stats ahead with
# evict_first / with evict_last): 32768x4096 85.4 / 82.2 / 90.9, 16384x4096 80.8 / 79.0 / 84.8,
# 8192x4096 70.7 / 71.9 / 75.0, 4096x4096 60.1 / 61.8 / 62.2, 3000x3584 51.3 / 53.5 / 51.2; rows of
# 8192 (blocks of 16 warps, one program per SM) keep evict_first: 8192x8192 70.5 / 79.6 / 77.9,
# 3000x5120 47.7 / 54.2 / 51.6. Same registers (sm_90). Why the hint matters so with the stats
# ahead at 4096 wide (82.2% against 90.9% at 32768x4096) we have not found out. 32 warps at 8192
# wide (64 registers: 32 warps per SM instead of 16) lost: 8192x8192 80.2% -> 64.0% (run 25).
_BWD_STATS_AHEAD = True
_BWD_POLICY_NARROW = "evict_last"  # rows of up to 4096 (next power of two)
_BWD_TILE = 4096         # elements per backward tile (x and dy each; ~5 fp32 registers per element)
_BWD_MAX_BLOCK = 8192    # widest row whose dw/db accumulators fit in registers with x and dy
_BWD_CHUNK = 4096        # column block for wider rows
# Wider rows on the GPU: _ln_bwd_coop (rms_norm's coop backward, see rms_norm.COOP_SEG), segments of
# _BWD_COOP_SEG elements, _BWD_COOP_WARPS warps a program. H200 A/B (layer_norm_ab_h200_run13.txt):
# bwd 2048x65536 46.0% of copy (two passes: row sums, then column blocks) -> 66.7%, 4096x16384
# 51.9% -> 67.9%; segments of 1024 or 4096, or 8 warps, 54-56%. Rows up to _BWD_MAX_BLOCK stay in
# registers (8192x8192: 70.9% against 69.4% coop, coop_ab_h200_run16.txt).
# Register caps (coop_maxnreg) lost: uncapped 168 registers a thread (3 programs of 4 warps per SM),
# 128 (4) spills 104 bytes a thread and measured 52.3% at 2048x65536, 34.3% at 4096x16384 (runs
# 17-18); w loaded at its uses (159 registers; 48 bytes of spill at 128, which rms_norm's coop
# avoids so) 63.8% / 65.5%, and 60.1% / 37.7% capped at 128 (run 19, layer_norm_ab_h200_run19.txt).
# The row finished a step late re-read from L2 instead of held in registers, which gained rms_norm's
# coop 2-4 points (rms_norm.COOP_RELOAD; here 167 registers uncapped, 128 with 40 bytes of stack),
# lost here (run 20, layer_norm_ab_h200_run20.txt): 2048x65536 65.7% -> 60.8% (59.2% capped at
# 128), 4096x16384 67.1% -> 59.5% (52.1%). Removed. So was the next row's mean and rstd loaded
# with its x and dy (which gained the register path 1-9 points, _BWD_STATS_AHEAD): run 24
# (layer_norm_ab_h200_run24.txt) 2048x65536 67.0% -> 67.2%, 4096x16384 68.0% -> 57.2%.
_BWD_COOP_SEG = 2048
_BWD_COOP_WARPS = 4
# Rows past the one a coop step loads that it also prefetches into L2 (_utils.prefetch_l2), for rows
# of at least _BWD_COOP_L2_FROM elements: 1. H200 A/B run 27 (layer_norm_ab_h200_run27.txt), bf16
# bwd, % of copy, none -> 1 row (2 rows): 2048x65536 65.6 -> 71.8 (71.8); but 4096x16384 67.4 ->
# 53.5 (53.2), so none below 65536 (widths between were not measured).
_BWD_COOP_L2_AHEAD = 1
_BWD_COOP_L2_FROM = 65536
# Tiles past the next one that the register-path backward prefetches into L2 (_utils.prefetch_l2):
# 1. H200 A/B run 28 (layer_norm_ab_h200_run28.txt), bf16 bwd, % of copy, none -> 1 tile (2):
# 32768x4096 91.6 -> 94.3 (80.9), 8192x8192 80.0 -> 85.7 (85.0), 4096x4096 63.4 -> 63.5 (62.4),
# 3000x5120 56.2 -> 56.9 (57.0). (rms_norm's register paths lost with it: rms_norm.FWD_L2_AHEAD.)
_BWD_ROWS_L2_AHEAD = 1
# Partial sums: many small column blocks so that all SMs help. Run 5 (layer_norm_ab_h200_run5.txt):
# 32 columns a program instead of 128 (4 times the programs), bwd 1024x2048 16.8 -> 13.2 us (its
# [programs, 2, N] partials are as large as x and dy), 3000x3584 32.0 -> 30.5, 32768x4096 1.4%
# faster; fewer, longer-striding programs for the main kernel (4 or 8 tiles each, shrinking the
# partials) gained nothing on top of it.
# Run 26 (layer_norm_ab_h200_run26.txt): 128 partial rows a load instead of 32 (2-3 dependent
# loads for 264 partial rows instead of 9): bwd 4096x4096 62.8% -> 64.0%, 1024x2048 23.6% ->
# 25.2%, 32768x4096 and 8192x8192 the same, 3000x5120 55.7% -> 54.9%; 512 x 8 and 256 x 16 lost
# at 2048x65536 (66.5% -> 62.8%, 64.9%).
_SUM_BLOCK_G, _SUM_BLOCK_C = 128, 32
# Run 9 (layer_norm_ab_h200_run9.txt): c1 and c2 of a row in one tl.reduce over the pair (one
# exchange between warps, 3 barriers fewer in the sm_90 SASS) instead of two sums: 32768x4096
# 84.5% -> 86.2% of copy, 1024x2048 14.0 -> 13.5 us, 8192x8192 and 3000x3584 the same.
_BWD_FUSED_SUMS = True


def _fwd_policy(x: torch.Tensor) -> str:
    """The x loads' cache hint on the one-tile-per-program path: none for an x between
    _FWD_NO_HINT_FROM bytes and the L2's size, evict_last otherwise (see _FWD_NO_HINT_FROM)."""
    return "" if _FWD_NO_HINT_FROM <= x.numel() * x.element_size() <= l2_bytes(x.device) else _FWD_POLICY


def _bwd_policy(block: int) -> str:
    """The register-path backward's cache hint for x and dy: see _BWD_STATS_AHEAD."""
    return _BWD_POLICY_NARROW if block <= 4096 else _BWD_POLICY


def _align(n: int) -> int:
    """The largest power of two (up to 16) dividing n. Passed as a constexpr hint so that rows of
    e.g. 1000 or 5000 elements still get 16-byte vector loads: the JIT only marks ints divisible by
    16 on its own, and without the hint every load of a row is scalar."""
    return min(16, n & -n)


def _warps(tile: int) -> int:
    """~16 elements per thread: enough loads in flight per thread without spilling."""
    return max(4, min(16, tile // 512))


def _resident_programs(kernel, args: tuple, constexprs: dict, num_warps: int, maxnreg, device) -> int:
    """Programs of this compiled kernel the GPU holds at once (registers, threads, shared memory per
    SM), for the persistent-grid variant; on the CPU interpreter a few, enough to exercise striding."""
    if device.type != "cuda":
        return sm_count(device)
    key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), num_warps, maxnreg, device.index,
           tuple(a.dtype for a in args if torch.is_tensor(a)))
    if key not in _RESIDENT:
        props = torch.cuda.get_device_properties(device)
        extra = {"maxnreg": maxnreg} if maxnreg else {}
        compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps, **extra, **constexprs)
        compiled._init_handles()
        regs_per_warp = triton.cdiv(max(compiled.n_regs, 1) * 32, 256) * 256  # allocation granularity
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs_per_warp // num_warps
        by_threads = props.max_threads_per_multi_processor // (32 * num_warps)
        smem = compiled.metadata.shared
        by_smem = props.shared_memory_per_multiprocessor // (smem + 1024) if smem else 32
        _RESIDENT[key] = max(1, min(by_regs, by_threads, by_smem, 32)) * props.multi_processor_count
    return _RESIDENT[key]


_RESIDENT: dict[tuple, int] = {}


def _persistent_grid(tiles: int, resident: int) -> tuple[int, int]:
    """(programs, tiles per program): fewest programs for the same number of sweeps."""
    per = triton.cdiv(tiles, resident)
    return triton.cdiv(tiles, per), per


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, *,
                       rows: int | None = None, num_warps: int | None = None,
                       per_thread: int = _FWD_PER_THREAD, persistent: bool | None = None,
                       prefetch: bool | None = None,
                       maxnreg: int | None = None, max_block: int = _FWD_MAX_BLOCK,
                       chunk: int | None = None, wide_warps: int | None = None,
                       wide_per_sm: int = _FWD_WIDE_PER_SM, policy: str | None = None,
                       early_wb: bool = True, lines: bool | None = None, lines_programs=None,
                       lines_wb_ahead: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, N] contiguous -> (y, mean, rstd); mean and rstd in fp32, kept for the backward.

    Keyword options for GPU A/Bs (benchmarks/layer_norm_ab.py); left out, the measured default.
    Register path (next_pow2(N) <= max_block): `rows` per program (a power of two), `num_warps` or
    `per_thread` (elements of x per thread, which sets num_warps), `maxnreg` (register cap),
    `persistent` grid sized to the resident programs, `prefetch` of the next tile (the last two
    use _ln_fwd_rows). A `max_block` above the default (8192) keeps wider rows in registers (up to
    65536, 32 warps). Wide path: `lines` (default _FWD_LINES) runs _ln_fwd_lines (`chunk` elements a chunk,
    `lines_programs` per SM or "rows", `wide_warps`; defaults _utils.lines_launch; `lines_wb_ahead`:
    w and b prefetched a chunk ahead too, default _FWD_LINES_WB_AHEAD), else _ln_fwd_wide
    (`chunk`, `wide_warps`, `wide_per_sm` programs per SM).
    `policy`: cache hint of the x loads on the register path (default: _fwd_policy on the
    one-tile path, _FWD_POLICY on the persistent one). `early_wb`: w and b loaded with x rather
    than after the reductions (one tile per program only)."""
    M, N = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(M, dtype=torch.float32, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(N)
    if block <= max_block:
        if rows is None:
            rows = max(1, min(_FWD_TILE_BYTES // (block * x.element_size()), triton.next_power_of_2(M)))
        if rows & (rows - 1):
            raise ValueError(f"rows per program must be a power of two: {rows}")
        tile = rows * block
        if num_warps is None:
            num_warps = max(4, min(32, tile // (32 * per_thread)))
        extra = {"maxnreg": maxnreg} if maxnreg else {}
        big = block >= _FWD_PERSIST_FROM  # the measured default: persistent and prefetching
        persistent = big if persistent is None else persistent
        prefetch = big if prefetch is None else prefetch
        if not (persistent or prefetch):
            _ln_fwd[(triton.cdiv(M, rows),)](x, weight, bias, y, mean, rstd, M, N, eps,
                                              ROWS=rows, BLOCK_N=block, N_ALIGN=_align(N),
                                              POLICY=_fwd_policy(x) if policy is None else policy,
                                              EARLY_WB=early_wb, num_warps=num_warps, **extra)
        else:
            policy = _FWD_POLICY if policy is None else policy
            meta = dict(ROWS=rows, BLOCK_N=block, N_ALIGN=_align(N), PREFETCH=prefetch, POLICY=policy)
            args = (x, weight, bias, y, mean, rstd, M, N, eps)
            tiles = triton.cdiv(M, rows)
            if persistent:
                grid, iters = _persistent_grid(tiles, _resident_programs(
                    _ln_fwd_rows, args + (1,), meta, num_warps, maxnreg, x.device))
            else:
                grid, iters = tiles, 1
            _ln_fwd_rows[(grid,)](*args, iters, num_warps=num_warps, **extra, **meta)
    elif _FWD_LINES if lines is None else lines:
        grid, meta = lines_launch(M, N, x.element_size(), x.device, chunk, lines_programs, wide_warps,
                                  narrow_row_bytes=_FWD_LINES_NARROW_ROW_BYTES, wide_programs=_FWD_LINES_WIDE_PROGRAMS)
        _ln_fwd_lines[(grid,)](x, weight, bias, y, mean, rstd, M, N, eps, N_ALIGN=_align(N),
                               WB_AHEAD=_FWD_LINES_WB_AHEAD if lines_wb_ahead is None else lines_wb_ahead, **meta)
    else:
        chunk = chunk or _FWD_CHUNK_BYTES // x.element_size()
        programs = min(M, wide_per_sm * sm_count(x.device))
        warps = wide_warps or 16
        _ln_fwd_wide[(programs,)](x, weight, bias, y, mean, rstd, M, N, eps, programs,
                                  CHUNK=chunk, N_ALIGN=_align(N), num_warps=warps)
    return y, mean, rstd


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor, *, rows: int | None = None, num_warps: int | None = None,
                        max_block: int = _BWD_MAX_BLOCK, chunk: int = _BWD_CHUNK, groups_per_sm: int = 2,
                        policy: str | None = None, prefetch: bool | None = None, maxnreg: int | None = None,
                        w_reload: bool | None = None, sum_block: int = _SUM_BLOCK_C,
                        sum_rows: int = _SUM_BLOCK_G,
                        fused_sums: bool = _BWD_FUSED_SUMS, wide: str | None = None, coop_seg: int | None = None,
                        coop_warps: int | None = None, coop_maxnreg: int | None = None,
                        stats_ahead: bool | None = None, coop_l2_ahead: int | None = None,
                        rows_l2_ahead: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx, dw, db); dw and db in the weight's dtype, summed in fp32.

    Keyword options for GPU A/Bs; left out, the measured default. Rows up to `max_block`
    (next_pow2(N)) go through _ln_bwd_rows: `rows` per tile, `num_warps`, `prefetch` of the next
    tile, `maxnreg` (register cap), `policy` (cache hint of the x and dy loads), `w_reload` (w
    re-read every tile instead of held in registers; default from 16384 wide), `sum_block` and
    `sum_rows` (columns per program of the partial sums, and rows a load), `fused_sums` (c1 and c2
    in one reduction), `stats_ahead` (the next tile's mean and rstd loaded with its x and dy;
    default _BWD_STATS_AHEAD), `rows_l2_ahead` (tiles past the next one each step prefetches into
    L2, default _BWD_ROWS_L2_AHEAD; sm_90 only). Wider rows: `wide` = "coop" (the GPU's default:
    _ln_bwd_coop, `coop_seg` elements and `coop_warps` warps a program, `coop_maxnreg` registers a
    thread at most, `coop_l2_ahead` rows past the one loaded that each step prefetches into L2,
    default _BWD_COOP_L2_AHEAD from _BWD_COOP_L2_FROM wide, sm_90 only) or "cols" (elsewhere, and
    where a coop group does not fit: row sums, then _ln_bwd over column blocks of `chunk` with
    `groups_per_sm` row groups per SM and column block (about), `rows` per tile, `num_warps`,
    `policy`)."""
    if wide not in (None, "cols", "coop"):
        raise ValueError(f"wide must be 'cols' or 'coop', got {wide!r}")
    M, N = x.shape
    dx = torch.empty_like(x)
    if triton.next_power_of_2(N) <= max_block:
        return _ln_bwd_persistent(dy, x, weight, mean, rstd, dx, rows, num_warps, policy, prefetch, maxnreg,
                                  w_reload, (sum_rows, sum_block), fused_sums, stats_ahead, rows_l2_ahead)
    if (wide or ("coop" if x.is_cuda else "cols")) == "coop":
        done = _ln_bwd_coop_launch(dy, x, weight, mean, rstd, dx, coop_seg, coop_warps, (sum_rows, sum_block),
                                   coop_maxnreg, coop_l2_ahead)
        if done is not None:
            return done
    rows, block_c = rows or 1, chunk
    policy = policy if policy is not None else _BWD_WIDE_POLICY
    n_col_blocks = triton.cdiv(N, block_c)
    sums = torch.empty(2 * M, dtype=torch.float32, device=x.device)
    _ln_bwd_row_sums[(M,)](x, dy, weight, mean, rstd, sums, M, N,
                           CHUNK=_BWD_CHUNK, N_ALIGN=_align(N), num_warps=_warps(_BWD_CHUNK))
    # ~2 programs per SM in all; with few rows, at least one per SM, and each program takes
    # several row tiles where possible so that the partial buffer stays small next to x and dy.
    sms = sm_count(x.device)
    row_tiles = triton.cdiv(M, rows)
    groups = max(1, min(row_tiles, triton.cdiv(groups_per_sm * sms, n_col_blocks),
                        max(triton.cdiv(sms, n_col_blocks), triton.cdiv(row_tiles, 8))))
    partial = torch.empty((groups, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd[(groups, n_col_blocks)](x, dy, weight, mean, rstd, sums, dx, partial, M, N, groups,
                                    ROWS=rows, BLOCK_C=block_c, N_ALIGN=_align(N), POLICY=policy,
                                    num_warps=num_warps or _BWD_WIDE_WARPS)
    out = torch.empty(2 * N, dtype=weight.dtype, device=x.device)
    _sum_partials(partial, out, groups, (sum_rows, sum_block))
    return dx, out[:N], out[N:]


def _ln_bwd_coop_launch(dy, x, weight, mean, rstd, dx, seg, warps, sum_tile, maxnreg=None, l2_ahead=None):
    """_ln_bwd_coop (see _utils.coop_plan); None when not even one group of its programs fits."""
    M, N = x.shape
    warps = warps or _BWD_COOP_WARPS
    ahead = prefetch_ahead(l2_ahead, _BWD_COOP_L2_AHEAD if N >= _BWD_COOP_L2_FROM else 0, x, dy)
    # (mean: an fp32 stand-in for the dw/db partials, sized by the plan)
    plan = coop_plan(_ln_bwd_coop, (x, dy, weight, mean, rstd, dx, mean), M, N, seg, _BWD_COOP_SEG, warps, 2,
                     maxnreg, N_ALIGN=_align(N), L2_AHEAD=ahead)
    if plan is None:
        return None
    groups, iters, S, slots, meta = plan
    partial = torch.empty((groups, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd_coop[(groups * S,)](x, dy, weight, mean, rstd, dx, partial, slots, M, N, S, iters, num_warps=warps,
                                **meta)
    out = torch.empty(2 * N, dtype=weight.dtype, device=x.device)
    _sum_partials(partial, out, groups, sum_tile)
    return dx, out[:N], out[N:]


def _sum_partials(partial: torch.Tensor, out: torch.Tensor, groups: int,
                  tile: tuple[int, int] = (_SUM_BLOCK_G, _SUM_BLOCK_C)) -> None:
    """out = column sums of the [groups, 2N] partials, in tiles of (rows a load, columns a program)."""
    block_g, block_c = tile
    n2 = out.numel()
    _ln_sum_partials[(triton.cdiv(n2, block_c),)](partial, out, groups, n2, BLOCK_G=block_g, BLOCK_C=block_c,
                                                  N_ALIGN=_align(n2), num_warps=4)


def _ln_bwd_persistent(dy, x, weight, mean, rstd, dx, rows, num_warps, policy, prefetch, maxnreg, w_reload,
                       sum_tile=(_SUM_BLOCK_G, _SUM_BLOCK_C), fused_sums=_BWD_FUSED_SUMS, stats_ahead=None,
                       l2_ahead=None):
    M, N = x.shape
    block = triton.next_power_of_2(N)
    rows = rows or max(1, min(_BWD_TILE // block, triton.next_power_of_2(M)))
    warps = num_warps or _warps(rows * block)
    wide = block >= 16384  # one 32-warp program per SM: no room for a prefetched tile or a held w
    meta = dict(ROWS=rows, BLOCK_N=block, N_ALIGN=_align(N), PREFETCH=not wide if prefetch is None else prefetch,
                W_RELOAD=wide if w_reload is None else w_reload,
                POLICY=policy if policy is not None else _bwd_policy(block), FUSED_SUMS=fused_sums)
    if _BWD_STATS_AHEAD if stats_ahead is None else stats_ahead:  # (only with the prefetch, whose loop it joins)
        meta["STATS_AHEAD"] = meta["PREFETCH"]
    ahead = prefetch_ahead(l2_ahead, _BWD_ROWS_L2_AHEAD, x, dy)
    if ahead:
        meta["L2_AHEAD"] = ahead
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    # the partial buffer stands in for itself by mean (fp32, same pointer properties)
    resident = _resident_programs(_ln_bwd_rows, (x, dy, weight, mean, rstd, dx, mean, M, N, 1), meta, warps,
                                  maxnreg, x.device)
    grid, iters = _persistent_grid(triton.cdiv(M, rows), resident)
    out = torch.empty(2 * N, dtype=weight.dtype, device=x.device)
    # one program (a few rows: decode) writes dw and db itself, saving the summing launch
    part = out if grid == 1 else torch.empty((grid, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd_rows[(grid,)](x, dy, weight, mean, rstd, dx, part, M, N, iters, num_warps=warps, **extra, **meta)
    if grid > 1:
        _sum_partials(part, out, grid, sum_tile)
    return dx, out[:N], out[N:]


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)
        return dx, dw, db, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of x [..., N]; weight and bias [N] (one dtype, may differ from x's)."""
    n = x.shape[-1]
    if tuple(weight.shape) != (n,) or tuple(bias.shape) != (n,):
        raise ValueError(f"weight and bias must have shape ({n},): got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if weight.dtype != bias.dtype:
        raise ValueError(f"weight and bias must share a dtype: got {weight.dtype} and {bias.dtype}")
    if x.numel() == 0:
        raise ValueError(f"x must not be empty: got shape {tuple(x.shape)}")
    y = LayerNormFunction.apply(x.reshape(-1, n).contiguous(), weight.contiguous(), bias.contiguous(), eps)
    return y.view(x.shape)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def layer_norm_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm_liger(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return LigerLayerNormFunction.apply(x, weight, bias, eps)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # residual-stream-like activations: each row has its own offset and scale, so centring and
    # scaling both matter; weight near 1 and a small bias, as a trained LayerNorm has
    x = torch.randn(m, n, generator=g) * (1.0 + torch.rand(m, 1, generator=g) * 3.0) + torch.randn(m, 1, generator=g)
    weight = 1.0 + 0.2 * torch.randn(n, generator=g)
    bias = 0.1 * torch.randn(n, generator=g)
    return {
        "x": x.to(device=device, dtype=dtype),
        "weight": weight.to(device=device, dtype=dtype),
        "bias": bias.to(device=device, dtype=dtype),
        "eps": 1e-5,
    }


# ---------------------------------------------------------------------------------------------
# Shape grids: M = tokens, N = hidden size.


_s = Shape.rows


QUICK = (
    _s(64, 1024, "small, power of two: several rows per program"),
    _s(37, 1000, "awkward: rows and width not powers of two, tail masked"),
    _s(3, 20000, "wide rows: chunked forward, row sums plus column-blocked backward"),
)

FULL = (
    _s(1, 4096, "a single token (decode): launch latency dominates"),
    _s(1024, 2048, "TinyLlama-1.1B / GPT-2-XL-sized hidden, short batch: two rows per program"),
    _s(4096, 4096, "LLaMA-7B hidden, 4k tokens"),
    _s(32768, 4096, "LLaMA-7B hidden, 32k tokens: 256 MB bf16, far beyond L2 (Liger's headline shape)"),
    _s(8192, 8192, "LLaMA-70B hidden: the widest row with a fused backward"),
    _s(3000, 5120, "awkward token count, LLaMA-13B / Qwen-14B hidden (not a power of two)"),
    _s(4096, 16384, "LLaMA-3-405B hidden: forward in two passes of prefetched chunks (lines), "
                    "backward in coop segments"),
    _s(2048, 65536, "very wide rows (128 KB bf16): forward in two passes of 64 KB chunks (lines), "
                    "backward in coop segments"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = element size, stats are fp32):
#   fwd:      read x, w, b; write y, mean, rstd            -> (2*M*N + 2*N) * s + 8*M
#   bwd:      read dy, x, w, mean, rstd; write dx, dw, db   -> (3*M*N + 3*N) * s + 8*M
#   fwd+bwd:  the sum of the two
# Our wide-row backward (next_pow2(N) > 8192) reads x and dy twice, (5*M*N) * s, as PyTorch's does;
# it is still charged the minimum. FLOPs, approximately per element: fwd 8 (two sums, centre,
# square, scale, affine), bwd 13 (xhat, w*dy, two row sums, dx, dw and db accumulation).


def bytes_moved(dims, dtype, mode) -> int:
    m, n = dims["M"], dims["N"]
    s = dtype.itemsize
    fwd = (2 * m * n + 2 * n) * s + 8 * m
    bwd = (3 * m * n + 3 * n) * s + 8 * m
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def flops(dims, mode) -> float:
    per = {"fwd": 8, "bwd": 13, "fwd+bwd": 21}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="layer_norm",
    description="LayerNorm over the last dim with weight and bias (eps 1e-5), forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(layer_norm, layer_norm_eager)
    + (Provider("liger", layer_norm_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight", "bias"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # Ours sums statistics and gradients in fp32: one rounding of each output to the storage dtype
    # (bf16 measured <= 5.2e-3 under the interpreter's truncating casts, fp16 <= 5e-4). PyTorch's CPU
    # kernel rounds more in its bf16/fp16 backward (measured up to 7.7e-3 / 9.6e-4), hence the
    # headroom. fp32: rounding of the sums over N and over M rows (measured ~1e-7).
    tolerance={torch.bfloat16: 1.6e-2, torch.float16: 3e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
