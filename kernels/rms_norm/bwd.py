"""RMSNorm's backward kernels and their launcher (add_rms_norm's too: the constexpr HAS_DH adds the
gradient that reaches h directly). dx = rstd * (m - xhat * mean(m * xhat)) [+ dh] with xhat = x *
rstd, m = dy * w; dw = the column sums of dy * xhat, accumulated per program in fp32 registers,
written once as the program's row of an fp32 [programs, N] buffer and summed by _sum_partials
(still in L2: just written)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.coop import coop_plan
from .._host.device import resident_programs
from .._host.prefetch import prefetch_ahead
from .._jit.coop import coop_program, publish, wait_total
from .._jit.prefetch import prefetch_segment
from .._host.rows import persistent_grid
from .config import SUM_ROWS, BackwardConfig, BwdRowsConfig, ColsConfig, CoopConfig, pick_backward
from .fwd import as_rows, load_tile, store_tile


@triton.jit(do_not_specialize=["iters"])
def _bwd_rows(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, dx_ptr, part_ptr, M, N, iters,
              BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_DH: tl.constexpr, PREFETCH: tl.constexpr = True,
              RSTD_AHEAD: tl.constexpr = False):
    # Rows in registers on a persistent grid; dw accumulated over all the tiles this program visits
    # and written once, as row `pid` of the partial buffer (or, with one program, dw itself).
    # One column block (unlike the forward: a second block costs the backward more registers
    # than the masked lanes do, for the same loads in flight; ptxas -v, sm_90).
    # PREFETCH off (16384 wide): no next tile in registers; fewer registers and spills, but nothing
    # in flight while a program reduces. RSTD_AHEAD (with PREFETCH): the next tile's rstd loaded with
    # its x and dy. Loads hinted evict_last, as the forward's (32768x4096: 88% -> 94% of copy).
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        rows = pid * ROWS + tl.arange(0, ROWS)
        x = load_tile(x_ptr, rows, cols, M, N, "evict_last")
        dy = load_tile(dy_ptr, rows, cols, M, N, "evict_last")
        if HAS_DH:
            dh = load_tile(dh_ptr, rows, cols, M, N, "evict_last")
        if RSTD_AHEAD:
            rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        if PREFETCH:
            x_next = load_tile(x_ptr, rows + step, cols, M, N, "evict_last")
            dy_next = load_tile(dy_ptr, rows + step, cols, M, N, "evict_last")
            if HAS_DH and BLOCK_N < 16384:  # 16384 wide: issued after the reduction, fewer spills
                dh_next = load_tile(dh_ptr, rows + step, cols, M, N, "evict_last")
        else:
            x = load_tile(x_ptr, rows, cols, M, N, "evict_last")
            dy = load_tile(dy_ptr, rows, cols, M, N, "evict_last")
            if HAS_DH:
                dh = load_tile(dh_ptr, rows, cols, M, N, "evict_last")
        if RSTD_AHEAD:
            rstd_next = tl.load(rstd_ptr + rows + step, mask=rows + step < M, other=0.0)
        else:
            rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        # (this order of the terms: 64 registers for fp32 at 4096 wide, two programs per SM;
        # computing the dot before the dw term takes 79, one program)
        xhat = x.to(tl.float32) * rstd[:, None]
        dyf = dy.to(tl.float32)
        acc += dyf * xhat
        if BLOCK_N >= 16384:
            # at one 32-warp program per SM (64 registers a thread at most) w is re-read from
            # L1 every row instead of held: 40 bytes of spills per thread instead of 126 (bf16)
            m = dyf * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        else:
            m = dyf * w[None, :]
        c = tl.sum(m * xhat, axis=1) / N
        dx = (m - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH:
            if PREFETCH and BLOCK_N >= 16384:
                dh_next = load_tile(dh_ptr, rows + step, cols, M, N, "evict_last")
            dx += dh.to(tl.float32)
            if PREFETCH:
                dh = dh_next
        store_tile(dx_ptr, dx, rows, cols, M, N)
        if PREFETCH:
            x = x_next
            dy = dy_next
        if RSTD_AHEAD:
            rstd = rstd_next
    tl.store(part_ptr + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cols < N)


@triton.jit(do_not_specialize=["iters"])
def _bwd_coop(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, dx_ptr, dwp_ptr, slot_ptr, M, N, S, iters,
              SEG: tl.constexpr, S_BLOCK: tl.constexpr, HAS_DH: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # Wide rows held by S co-resident programs (_jit.coop.publish / wait_total): program (group g,
    # segment s) keeps columns [s*SEG, (s+1)*SEG) of x and dy for rows g, g+G, g+2G, ... (G groups).
    # In step i it loads row i+1's segment, publishes row i's partial of sum(m * xhat) and then
    # finishes row i-1, re-reading its x and dy from L2 (loaded a step ago; the loads are issued
    # before the wait), with the total its partners published a step ago, so that it seldom waits at
    # all (waiting for row i itself: 40-45% of copy at 1024x65536, against 56-68% deferred). Its
    # columns' dw partial stays in fp32 registers over all its rows and is written once, as row g of
    # [G, N].
    G, g, seg, cols = coop_program(S, SEG)
    cm = cols < N
    w = tl.load(w_ptr + cols, mask=cm, other=0.0)
    acc = tl.zeros([SEG], dtype=tl.float32)
    x = tl.load(x_ptr + g.to(tl.int64) * N + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + g.to(tl.int64) * N + cols, mask=cm & (g < M), other=0.0)
    rstd_p = tl.load(rstd_ptr + g, mask=g < M, other=0.0)  # (a float tensor for the loop)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = (row + G).to(tl.int64) * N + cols
        x_next = tl.load(x_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        dy_next = tl.load(dy_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_jit.prefetch.prefetch_l2)
            prefetch_segment(x_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            prefetch_segment(dy_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            if HAS_DH:
                prefetch_segment(dh_ptr, row + L2_AHEAD * G, M, N, seg, SEG)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        xhat = x.to(tl.float32) * rstd
        dyf = dy.to(tl.float32)
        acc += dyf * xhat
        publish(slot_ptr, row, seg, S, tl.sum(dyf * w.to(tl.float32) * xhat, axis=0))
        if i > 0:
            prow = row - G
            here = prow.to(tl.int64) * N + cols
            live = cm & (prow < M)
            xp = tl.load(x_ptr + here, mask=live, other=0.0)
            dyp = tl.load(dy_ptr + here, mask=live, other=0.0)
            c = wait_total(slot_ptr, prow, S, S_BLOCK) / N
            xhat_p = xp.to(tl.float32) * rstd_p
            dx = (dyp.to(tl.float32) * w.to(tl.float32) - xhat_p * c) * rstd_p
            if HAS_DH:
                dx += tl.load(dh_ptr + here, mask=live, other=0.0).to(tl.float32)
            tl.store(dx_ptr + here, dx.to(dx_ptr.dtype.element_ty), mask=live)
        rstd_p = rstd
        x = x_next
        dy = dy_next
        i += 1
    tl.store(dwp_ptr + g.to(tl.int64) * N + cols, acc, mask=cm)


@triton.jit
def _bwd_row_dot(x_ptr, w_ptr, dy_ptr, rstd_ptr, c_ptr, M, N, CHUNK: tl.constexpr):
    # Wide rows, pass 1 of 2: c = mean(m * xhat) per row, the only cross-column quantity dx needs.
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    start = 0
    while start < N:
        c = start + cols
        start += CHUNK
        cm = c < N
        x = tl.load(x_ptr + base + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + c, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += dy * w * x
    rstd = tl.load(rstd_ptr + row)
    tl.store(c_ptr + row, tl.sum(acc, axis=0) * rstd / N)


@triton.jit(do_not_specialize=["iters"])
def _bwd_cols(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, c_ptr, dx_ptr, part_ptr, M, N, iters,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HAS_DH: tl.constexpr):
    # Wide rows, pass 2 of 2: program (column block, row group) walks its rows in BLOCK_R x BLOCK_C
    # tiles, writes dx and keeps its columns' dw partial in fp32 registers (partial row = group).
    cb = tl.program_id(0)
    g = tl.program_id(1)
    step = tl.num_programs(1) * BLOCK_R
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    i = 0
    while i < iters:
        rows = g * BLOCK_R + i * step + tl.arange(0, BLOCK_R)
        i += 1
        x = load_tile(x_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        dy = load_tile(dy_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        c = tl.load(c_ptr + rows, mask=rows < M, other=0.0)
        xhat = x * rstd[:, None]
        acc += dy * xhat
        dx = (dy * w[None, :] - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH:
            dx += load_tile(dh_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        store_tile(dx_ptr, dx, rows, cols, M, N)
    tl.store(part_ptr + g.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cols < N)


@triton.jit
def _sum_partials(part_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # dw = column sums of the [P, N] fp32 partial buffer (still in L2: it was just written), cast once.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    start = 0
    while start < P:
        acc += load_tile(part_ptr, start + tl.arange(0, BLOCK_P), cols, P, N, "evict_first")
        start += BLOCK_P
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < N)


def _rows(config: BwdRowsConfig, x2, w, dy2, dh2, rstd, dx, has_dh: bool) -> torch.Tensor:
    """dx, and the [programs, N] dw partials (or dw itself from a single program)."""
    M, N = x2.shape
    if config.block_n < N:
        raise ValueError(f"{config} must cover the row of {N} elements")
    meta = dict(BLOCK_N=config.block_n, ROWS=config.rows, HAS_DH=has_dh, PREFETCH=config.prefetch,
                RSTD_AHEAD=config.rstd_ahead)
    # the partial buffer's size depends on the answer: rstd (fp32 too) stands in for it
    resident = resident_programs(_bwd_rows, (x2, w, dy2, dh2, rstd, dx, rstd, M, N, 1), meta, config.warps, x2.device)
    grid, iters = persistent_grid(triton.cdiv(M, config.rows), resident)
    # a few rows (decode): the one program writes dw itself (the store casts)
    part = torch.empty_like(w) if grid == 1 else torch.empty((grid, N), dtype=torch.float32, device=x2.device)
    _bwd_rows[(grid,)](x2, w, dy2, dh2, rstd, dx, part, M, N, iters, num_warps=config.warps, **meta)
    return part


def _coop(config: CoopConfig, x2, w, dy2, dh2, rstd, dx, has_dh: bool) -> torch.Tensor | None:
    """dx and the [groups, N] dw partials; None where not even one group of programs fits."""
    M, N = x2.shape
    extra = {"maxnreg": config.maxnreg} if config.maxnreg else {}
    # (rstd: an fp32 stand-in for the dw partials, sized by the plan)
    plan = coop_plan(_bwd_coop, (x2, w, dy2, dh2, rstd, dx, rstd), M, N, config.seg, config.seg, config.warps, 1,
                     HAS_DH=has_dh, L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, x2, dy2, dh2), **extra)
    if plan is None:
        return None
    groups, iters, S, slots, meta = plan
    part = torch.empty((groups, N), dtype=torch.float32, device=x2.device)
    _bwd_coop[(groups * S,)](x2, w, dy2, dh2, rstd, dx, part, slots, M, N, S, iters, num_warps=config.warps, **meta)
    return part


def _cols(config: ColsConfig, x2, w, dy2, dh2, rstd, dx, has_dh: bool) -> torch.Tensor:
    """dx and the [groups, N] dw partials, in two passes."""
    M, N = x2.shape
    c = torch.empty(M, dtype=torch.float32, device=x2.device)
    _bwd_row_dot[(M,)](x2, w, dy2, rstd, c, M, N, CHUNK=config.dot_chunk,
                       num_warps=max(4, min(16, config.dot_chunk // 512)))
    n_cb = triton.cdiv(N, config.block_c)
    meta = dict(BLOCK_R=config.block_r, BLOCK_C=config.block_c, HAS_DH=has_dh)
    resident = resident_programs(_bwd_cols, (x2, w, dy2, dh2, rstd, c, dx, rstd, M, N, 1), meta, 8, x2.device)
    # as many row groups as fill the resident slots, each group at least 4 tiles deep
    groups = max(1, min(resident // n_cb, triton.cdiv(M, 4 * config.block_r)))
    part = torch.empty((groups, N), dtype=torch.float32, device=x2.device)
    _bwd_cols[(n_cb, groups)](x2, w, dy2, dh2, rstd, c, dx, part, M, N, triton.cdiv(M, groups * config.block_r),
                              num_warps=8, **meta)
    return part


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                      dh: torch.Tensor | None = None, config: BackwardConfig | None = None):
    """(dx, dw) for y = rms_norm(x) * w; with dh (add_rms_norm: x is h, dh the gradient reaching h
    directly), dx includes it. `config`: the launch (a config of .config); None: pick_backward's. A
    coop config falls back to ColsConfig() where not even one group of its programs fits."""
    N = x.shape[-1]
    x2, dy2 = as_rows(x, N), as_rows(dy, N)
    M = x2.shape[0]
    w = w.contiguous()
    has_dh = dh is not None
    dh2 = as_rows(dh, N) if has_dh else dy2
    dx = torch.empty_like(x2)
    config = config or pick_backward(M, N, x.dtype, has_dh, x.device)
    tensors = (x2, w, dy2, dh2, rstd, dx, has_dh)
    if isinstance(config, BwdRowsConfig):
        part = _rows(config, *tensors)
        if part.dim() == 1:
            return dx.view(x.shape), part
    elif isinstance(config, CoopConfig):
        part = _coop(config, *tensors)
        if part is None:
            part = _cols(ColsConfig(), *tensors)
    elif isinstance(config, ColsConfig):
        part = _cols(config, *tensors)
    else:
        raise ValueError(f"not a backward config of rms_norm: {config!r}")
    dw = torch.empty_like(w)
    # Tiles of 4096 fp32: with hundreds of partial rows, SUM_ROWS rows x 4096 / SUM_ROWS columns,
    # i.e. N / 8 programs with 16 KB of loads in flight each, one load for all the L2-resident
    # partials; with few partial rows (small M, or the interpreter), wider and fewer.
    block_p = min(SUM_ROWS, triton.next_power_of_2(part.shape[0]))
    block_n = 4096 // block_p
    _sum_partials[(triton.cdiv(N, block_n),)](part, dw, part.shape[0], N, BLOCK_P=block_p, BLOCK_N=block_n,
                                              num_warps=4)
    return dx.view(x.shape), dw
