"""Softmax's register path: each program holds a tile of whole rows (next_pow2(N) <= 32768 in
2-byte types, 16384 in fp32) and does max, exp, sum and the write in one read of x; the backward
the same with y and dy.

Loads are hinted evict_last although each element is read once: with the 8 KB tiles that took the
forward at 32768x4096 from 92.7% to 98.5% of copy on the H200, and the hint alone the backward from
94% to 101-102%; why evict_last beats evict_first for streaming reads on this GPU is not known
(rms_norm measured the same)."""
from __future__ import annotations

import triton
import triton.language as tl

from .._host.device import sm_count, widen_asm
from .._jit.widen import widen
from .._host.rows import align
from .._jit.rows import col_mask, row_start
from .config import RowsConfig


@triton.jit
def _softmax_fwd(x_ptr, y_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & col_mask(cols, N, N_ALIGN)[None, :]
    offs = row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy="evict_last")
    rmask = rows < M
    m = tl.where(rmask, tl.max(x.to(tl.float32), axis=1), 0.0)  # padding rows: no -inf - -inf (per-row ops: free)
    e = tl.exp(x.to(tl.float32) - m[:, None])  # 0 where masked
    inv = 1.0 / tl.where(rmask, tl.sum(e, axis=1), 1.0)
    y = e * inv[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["iters"])  # one binary whatever the trip count
def _softmax_fwd_persist(x_ptr, y_ptr, M, N, iters, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                         N_ALIGN: tl.constexpr):
    # _softmax_fwd on a persistent grid: programs stride over the row tiles and load the next tile
    # (kept in the input dtype) before reducing the current one, so that an SM holding a single
    # 32-warp program still has loads in flight while it reduces and stores.
    step = tl.num_programs(0) * ROWS
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    cmask = col_mask(cols, N, N_ALIGN)[None, :]
    x = tl.load(x_ptr + row_start(rows, N, N_ALIGN)[:, None] + cols[None, :],
                mask=(rows < M)[:, None] & cmask, other=-float("inf"), eviction_policy="evict_last")
    i = 0
    while i < iters:
        nxt = rows + step  # past the end: fully masked, no traffic
        x_next = tl.load(x_ptr + row_start(nxt, N, N_ALIGN)[:, None] + cols[None, :],
                         mask=(nxt < M)[:, None] & cmask, other=-float("inf"), eviction_policy="evict_last")
        xf = x.to(tl.float32)
        rmask = rows < M
        m = tl.where(rmask, tl.max(xf, axis=1), 0.0)
        e = tl.exp(xf - m[:, None])
        y = e * (1.0 / tl.where(rmask, tl.sum(e, axis=1), 1.0))[:, None]
        tl.store(y_ptr + row_start(rows, N, N_ALIGN)[:, None] + cols[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=rmask[:, None] & cmask)
        x = x_next
        rows = nxt
        i += 1


@triton.jit
def _softmax_bwd(y_ptr, dy_ptr, dx_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 N_ALIGN: tl.constexpr, PACKED: tl.constexpr = False):
    # PACKED: y and dy stay packed bf16 across the reduction, widened at each use (_jit.widen.widen)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & col_mask(cols, N, N_ALIGN)[None, :]
    offs = row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last")
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last")
    dot = tl.sum(widen(y, PACKED) * widen(dy, PACKED), axis=1)
    dx = widen(y, PACKED) * (widen(dy, PACKED) - dot[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _meta(N: int, config: RowsConfig) -> dict:
    if config.block < N or config.block & (config.block - 1):
        raise ValueError(f"RowsConfig.block must be a power of two >= N = {N}: got {config.block}")
    return dict(ROWS=config.rows, BLOCK_N=config.block, N_ALIGN=align(N), num_warps=config.warps)


def rows_forward(x, y, config: RowsConfig) -> None:
    M, N = x.shape
    meta = _meta(N, config)
    tiles = triton.cdiv(M, config.rows)
    if config.persist:
        programs = min(tiles, config.persist * sm_count(x.device))
        _softmax_fwd_persist[(programs,)](x, y, M, N, triton.cdiv(tiles, programs), **meta)
    else:
        _softmax_fwd[(tiles,)](x, y, M, N, **meta)


def rows_backward(y, dy, dx, config: RowsConfig) -> None:
    M, N = y.shape
    if config.packed and not (widen_asm(y) and widen_asm(dy)):
        raise ValueError("RowsConfig.packed widens with PTX: bf16 on a CUDA device only")
    _softmax_bwd[(triton.cdiv(M, config.rows),)](y, dy, dx, M, N, **_meta(N, config), PACKED=config.packed)
