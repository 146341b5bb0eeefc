"""Softmax's paths for rows too wide for registers.

lines (forward): one program a row reads it twice in chunks of [BLOCK // VEC, VEC], one 16-byte
vector a line. Pass 1 keeps max and sum of exp per line (_jit.lse.lse_update), so its loop has no
cross-thread reduction or barrier, and combines the lines once per row; both passes issue the next
chunk's load before using the current one. The row is N_FULL unmasked chunks and, if TAIL, one
masked chunk, which pass 1 takes first and pass 2 last. Pass 1 loads evict_last, pass 2's loads
and the stores evict_first; pass 2 runs newest chunk first (the likeliest still in L2).

coop (both directions, a GPU): a row's segments held in the registers of co-resident programs that
wait for each other's partials (_jit.coop.publish / wait_total, publish2 / wait_slots2). Program
(group g, segment s) keeps columns [s*SEG, (s+1)*SEG) of rows g, g+G, ...; in step i it loads row
i+1, publishes row i's partials and finishes row i-1, still in registers, with what its partners
published a step ago. x (y, dy) crosses HBM once.

stream (backward, where coop cannot run): each program owns whole rows and reads each twice in
chunks, pass 1 evict_last for sum(y * dy), pass 2 newest chunk first.

Measured against these and dropped: the forward streamed as the backward is (2048x128256 61.7% of
copy against lines 82.7%); the lines structure in the backward (its rows in flight are twice the
forward's in L2: 2048x128256 67.8% against coop 77.1%); loops software-pipelined by Triton through
shared memory, and TMA loads (60-69% at every wide shape against 75-82%); more lines programs per SM
by capping registers (2048x65536 80.8% -> 75.4%); the coop backward re-reading the late row from L2
instead of holding it (2048x65536 87.2% -> 68.4%)."""
from __future__ import annotations

import triton
import triton.language as tl

from .._host.coop import coop_plan
from .._host.device import sm_count
from .._host.prefetch import prefetch_ahead
from .._jit.coop import coop_program, publish, publish2, wait_slots2, wait_total
from .._jit.lse import LOG2E, lse_update
from .._jit.prefetch import prefetch_chunk, prefetch_segment
from .._host.rows import align
from .._jit.rows import col_mask, row_start
from .config import CoopConfig, LinesConfig, StreamConfig
from .split import _finite_or_zero


@triton.jit
def _softmax_bwd_stream(y_ptr, dy_ptr, dx_ptr, M, N, CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = row_start(row, N, N_ALIGN)
        acc = tl.zeros((CHUNK,), tl.float32)  # per-lane partial sums of y * dy: one reduction per row
        c = 0
        while c < n_chunks:
            cols = c * CHUNK + offs
            mask = col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += y * dy
            c += 1
        dot = tl.sum(acc, axis=0)
        while c > 0:
            c -= 1
            cols = c * CHUNK + offs
            mask = col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_ptr + base + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


@triton.jit
def _softmax_fwd_lines(x_ptr, y_ptr, M, N, N_FULL: tl.constexpr, TAIL: tl.constexpr, BLOCK: tl.constexpr,
                       VEC: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = col_mask(t_offs, N, N_ALIGN)
    row = tl.program_id(0)
    while row < M:
        base = row_start(row, N, N_ALIGN)
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


@triton.jit(do_not_specialize=["iters"])
def _softmax_fwd_coop(x_ptr, y_ptr, slot_ptr, M, N, S, iters,
                      SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # partials: the segment's max m_j and sum d_j of e = exp(x - m_j); row: m = max m_j,
    # d = sum d_j * exp(m_j - m) (the split path's combination, -inf segments included). e stays
    # in registers (fp32) until the row's totals arrive: y = e * exp(m_j - m) / d, one exponential
    # an element. (Holding x and exponentiating it again, or the segment as 16-byte lines with
    # (max, sum) pairs, measured slower: 64.8-70.9% and 63.5-79.7% of copy at 1024x262144.)
    G, g, seg, cols = coop_program(S, SEG)
    cm = col_mask(cols, N, N_ALIGN)
    j = tl.arange(0, S_BLOCK)
    x = tl.load(x_ptr + row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=-float("inf"))
    ep = tl.zeros([SEG], dtype=tl.float32)
    mp = 0.0
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: -inf), finish row i - 1
        row = g + i * G
        x_next = tl.load(x_ptr + row_start(row + G, N, N_ALIGN) + cols, mask=cm & (row + G < M),
                         other=-float("inf"))
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_jit.prefetch.prefetch_l2)
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
            tl.store(y_ptr + row_start(prow, N, N_ALIGN) + cols, y.to(y_ptr.dtype.element_ty), mask=cm & (prow < M))
        ep = e
        mp = m_s
        x = x_next
        i += 1


@triton.jit(do_not_specialize=["iters"])
def _softmax_bwd_coop(y_ptr, dy_ptr, dx_ptr, slot_ptr, M, N, S, iters,
                      SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # partial: the segment's sum of y * dy; row: dx = y * (dy - sum)
    G, g, seg, cols = coop_program(S, SEG)
    cm = col_mask(cols, N, N_ALIGN)
    y = tl.load(y_ptr + row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    yp = tl.zeros_like(y)  # (not `yp = y`: see rms_norm's coop backward)
    dyp = tl.zeros_like(dy)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = row_start(row + G, N, N_ALIGN) + cols
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
            tl.store(dx_ptr + row_start(prow, N, N_ALIGN) + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=cm & (prow < M))
        yp = y
        dyp = dy
        y = y_next
        dy = dy_next
        i += 1


def lines_forward(x, y, config: LinesConfig) -> None:
    M, N = x.shape
    block = config.block
    if block < config.vec or block & (block - 1):
        raise ValueError(f"LinesConfig.block must be a power of two >= vec {config.vec}: got {block}")
    pps = config.programs_per_sm
    grid = M if pps is None else max(1, min(M, int(pps * sm_count(x.device))))
    _softmax_fwd_lines[(grid,)](x, y, M, N, N_ALIGN=align(N), L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, x),
                                N_FULL=N // block, TAIL=N % block != 0, BLOCK=block, VEC=config.vec,
                                num_warps=config.warps)


def stream_backward(y, dy, dx, config: StreamConfig) -> None:
    M, N = y.shape
    pps = config.programs_per_sm
    programs = M if pps is None else min(M, pps * sm_count(y.device))
    _softmax_bwd_stream[(programs,)](y, dy, dx, M, N, CHUNK=config.chunk, N_ALIGN=align(N), num_warps=config.warps)


def _coop(kernel, partials: int, tensors, config: CoopConfig) -> bool:
    """The coop launch (_host.coop.coop_plan sizes the grid to what the GPU holds); False, launching
    nothing, where not even one group of a row's programs fits on the GPU at once."""
    M, N = tensors[0].shape
    inputs = tensors[:-1]  # what the kernel reads (and prefetches); the last tensor is its output
    plan = coop_plan(kernel, tensors, M, N, config.seg, config.seg, config.warps, partials, config.maxnreg,
                     N_ALIGN=align(N), L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, *inputs))
    if plan is None:
        return False
    groups, iters, S, slots, meta = plan
    kernel[(groups * S,)](*tensors, slots, M, N, S, iters, num_warps=config.warps, **meta)
    return True


def coop_forward(x, y, config: CoopConfig) -> bool:
    return _coop(_softmax_fwd_coop, 2, (x, y), config)


def coop_backward(y, dy, dx, config: CoopConfig) -> bool:
    return _coop(_softmax_bwd_coop, 1, (y, dy, dx), config)
