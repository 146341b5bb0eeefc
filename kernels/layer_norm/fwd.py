"""LayerNorm's forward kernels and their launcher. Rows that fit in registers: a program normalises a
tile of ROWS whole rows (so narrow rows still give each program ~16 KB of x, enough loads in
flight to cover DRAM latency, and amortise the loads of w and b), mean and variance as two
reductions over the registers (exact two-pass variance, no E[x^2] - E[x]^2 cancellation). Wider
rows: two passes of chunks (the lines kernel), the second re-reading the row from L2.

Row starts and column masks go through row_start / col_mask with N_ALIGN (_jit.rows): rows of 1000
or 5000 elements then still get 16-byte loads. Loops with runtime bounds are `while` loops: under
NumPy 2.4 the interpreter cannot turn its 1-element scalars into a `range` bound."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import resident_programs
from .._host.rows import align, lines_grid, LinesConfig, persistent_grid
from .._jit.rows import col_mask, row_start
from .config import ForwardConfig, RowsConfig, TileConfig, pick_forward


@triton.jit
def load_rows(x_ptr, rows, cols, M, N, N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    mask = (rows < M)[:, None] & col_mask(cols, N, N_ALIGN)[None, :]
    start = row_start(rows, N, N_ALIGN)
    return tl.load(x_ptr + start[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy=POLICY)


@triton.jit
def _load_wb(w_ptr, b_ptr, cols, cmask):
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last")
    return w, b


@triton.jit
def _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN: tl.constexpr,
             EARLY_WB: tl.constexpr = False, w=None, b=None):
    """Normalise a loaded [ROWS, BLOCK_N] tile of x and store y, mean and rstd (both register
    forwards). EARLY_WB: w and b were loaded by the caller, with x."""
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
        w, b = _load_wb(w_ptr, b_ptr, cols, cmask)
    y = xc * rstd[:, None] * w.to(tl.float32)[None, :] + b.to(tl.float32)[None, :]
    offs = row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps,
            ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr, POLICY: tl.constexpr):
    # One tile per program, w and b loaded with x (a load after the reductions is one more memory
    # round trip, which a latency-bound launch pays in full).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = col_mask(cols, N, N_ALIGN)
    x = load_rows(x_ptr, rows, cols, M, N, N_ALIGN, POLICY)
    w, b = _load_wb(w_ptr, b_ptr, cols, cmask)
    _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN, True, w, b)


@triton.jit(do_not_specialize=["iters"])
def _ln_fwd_rows(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, iters,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr):
    # _ln_fwd's tile on a persistent grid (each program strides over `iters` tiles; one binary for
    # any trip count), the next tile's loads issued before the current tile's reductions wait on its
    # data (as rms_norm's _fwd_rows). x hinted evict_last (see config.py).
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    cmask = col_mask(cols, N, N_ALIGN)
    x = load_rows(x_ptr, pid * ROWS + tl.arange(0, ROWS), cols, M, N, N_ALIGN, "evict_last")
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        # past the last tile the rows are >= M: fully masked, no traffic
        x_next = load_rows(x_ptr, rows + step, cols, M, N, N_ALIGN, "evict_last")
        _ln_tile(x, rows, cols, cmask, M, N, eps, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_ALIGN)
        x = x_next


@triton.jit
def _shifted_sums(x, k, s1, s2):
    d = x.to(tl.float32) - k
    return s1 + tl.sum(d, 1), s2 + tl.sum(d * d, 1)


@triton.jit
def _ln_fwd_lines(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, N_FULL: tl.constexpr,
                  TAIL: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr, N_ALIGN: tl.constexpr):
    # Wide rows, the lines scheme of softmax's forward for the mean and variance: chunks of
    # [BLOCK // VEC, VEC] (a 16-byte vector a line), sums kept per line (no block reduction in the
    # loop, no division), the next chunk loaded before the current one is used in both passes; pass
    # 2 re-reads the row from L2, newest chunk first, with w and b loaded at their use (one row for
    # all rows, always in L2: prefetched a chunk ahead they cost registers and spilled). The sums
    # are of x - k, k the row's first element: the variance s2 / N - (s1 / N)^2 then loses to
    # cancellation only (mean - k)^2 / var, which a sample of the row keeps near 1, however far the
    # mean is from 0. N_FULL unmasked chunks and a masked one if TAIL (pass 1 first, pass 2 last;
    # its masked lanes load k: d = 0).
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = col_mask(t_offs, N, N_ALIGN)
    row = tl.program_id(0)
    while row < M:
        base = row_start(row, N, N_ALIGN)
        k = tl.load(x_ptr + base).to(tl.float32)
        s1 = tl.zeros([L], dtype=tl.float32)
        s2 = tl.zeros([L], dtype=tl.float32)
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=k, eviction_policy="evict_last")
        if N_FULL > 0:
            nxt = tl.load(x_ptr + base + offs, eviction_policy="evict_last")
        if TAIL:
            s1, s2 = _shifted_sums(x_t, k, s1, s2)
        if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
            for c in range(N_FULL - 1):
                cur = nxt
                nxt = tl.load(x_ptr + base + (c + 1) * BLOCK + offs, eviction_policy="evict_last")
                s1, s2 = _shifted_sums(cur, k, s1, s2)
        if N_FULL > 0:
            s1, s2 = _shifted_sums(nxt, k, s1, s2)
        d_mean = tl.sum(s1, 0) / N
        mean = k + d_mean
        rstd = tl.rsqrt(tl.maximum(tl.sum(s2, 0) / N - d_mean * d_mean, 0.0) + eps)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)
        if N_FULL > 0:
            # (the chunk's offsets `o`, carried through the loop below: written inline instead, the
            # kernel compiles to other code, 80 registers a thread instead of the 88 measured)
            o = (N_FULL - 1) * BLOCK + offs
            v = tl.load(x_ptr + base + o, eviction_policy="evict_first")
        if N_FULL > 1:
            for j in range(N_FULL - 1):
                c = N_FULL - 1 - j
                cur = v
                o = (c - 1) * BLOCK + offs
                v = tl.load(x_ptr + base + o, eviction_policy="evict_first")
                w_cur = tl.load(w_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                b_cur = tl.load(b_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                y = (cur.to(tl.float32) - mean) * rstd * w_cur.to(tl.float32) + b_cur.to(tl.float32)
                tl.store(y_ptr + base + c * BLOCK + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            v_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
            w_t = tl.load(w_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
            b_t = tl.load(b_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
        if N_FULL > 0:
            w = tl.load(w_ptr + offs, eviction_policy="evict_last")
            b = tl.load(b_ptr + offs, eviction_policy="evict_last")
            y = (v.to(tl.float32) - mean) * rstd * w.to(tl.float32) + b.to(tl.float32)
            tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            y = (v_t.to(tl.float32) - mean) * rstd * w_t.to(tl.float32) + b_t.to(tl.float32)
            tl.store(y_ptr + base + t_offs, y.to(y_ptr.dtype.element_ty), mask=t_mask, eviction_policy="evict_first")
        row += tl.num_programs(0)


def _check_tile(config, N: int) -> None:
    if config.block_n < N or config.rows & (config.rows - 1):
        raise ValueError(f"{config} must cover the row of {N} elements, with a power-of-two number of rows")


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                       config: ForwardConfig | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, N] contiguous -> (y, mean, rstd); mean and rstd in fp32, kept for the backward.
    `config`: the launch (a config of .config or _host.rows.LinesConfig); None: pick_forward's."""
    M, N = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(M, dtype=torch.float32, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    config = config or pick_forward(M, N, x.dtype, x.device)
    args = (x, weight, bias, y, mean, rstd, M, N, eps)
    if isinstance(config, TileConfig):
        _check_tile(config, N)
        _ln_fwd[(triton.cdiv(M, config.rows),)](*args, ROWS=config.rows, BLOCK_N=config.block_n, N_ALIGN=align(N),
                                                POLICY=config.policy, num_warps=config.warps)
    elif isinstance(config, RowsConfig):
        _check_tile(config, N)
        meta = dict(ROWS=config.rows, BLOCK_N=config.block_n, N_ALIGN=align(N))
        resident = resident_programs(_ln_fwd_rows, args + (1,), meta, config.warps, x.device)
        grid, iters = persistent_grid(triton.cdiv(M, config.rows), resident)
        _ln_fwd_rows[(grid,)](*args, iters, num_warps=config.warps, **meta)
    elif isinstance(config, LinesConfig):
        grid, meta = lines_grid(config, M, N, x.element_size(), x.device)
        _ln_fwd_lines[(grid,)](*args, N_ALIGN=align(N), **meta)
    else:
        raise ValueError(f"not a forward config of layer_norm: {config!r}")
    return y, mean, rstd
