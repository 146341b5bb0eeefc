"""Softmax's split path for a few wide rows (M <= config.SPLIT_MAX_ROWS): one program per row would
leave all but M SMs idle (a single 128256-wide row streamed by one SM). Each row is cut into
S = cdiv(N, SEG) segments of SEG elements (the last one masked) and the (row, segment) programs run
in two launches; each segment is loaded in registers once per launch:
  fwd  _softmax_fwd_split_stats writes the segment's max m_j and sum d_j of exp(x - m_j) to a
       float32 buffer [M, S, 2]; _softmax_fwd_split_write combines its row's S partials
       (m = max m_j, d = sum d_j * exp(m_j - m)), re-reads its segment and writes exp(x - m) / d.
  bwd  _softmax_bwd_split_dot writes the segment's sum of y * dy to [M, S];
       _softmax_bwd_split_write sums its row's S partials, re-reads y and dy and writes dx.
The re-read is meant to hit L2 (the first launch loads evict_last; the whole few-row problem is a
few MB). Every program of the second launch combines its row's partials itself (one masked load of
S_BLOCK = next_pow2(S) floats) rather than a third launch doing it once per row.
A segment of only -inf entries (masked scores) has m_j = -inf, d_j = 0: the shifts use 0 where a
max is -inf, so no -inf - -inf makes NaN; an all -inf row gives 0 / 0 = NaN, as PyTorch does."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.rows import align
from .._jit.rows import col_mask, row_start
from .config import SPLIT_MAX_SEGMENTS, SplitConfig


@triton.jit
def _split_segment(seg, row, N, SEG: tl.constexpr, N_ALIGN: tl.constexpr):
    # element offsets and mask of segment `seg` of `row` (masked past the row end)
    cols = seg * SEG + tl.arange(0, SEG)
    return row_start(row, N, N_ALIGN) + cols, col_mask(cols, N, N_ALIGN)


@triton.jit
def _finite_or_zero(m):
    # the shift to subtract for a max m: 0 where m is -inf, so that exp(-inf - 0) = 0, not NaN
    return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _softmax_fwd_split_stats(x_ptr, part_ptr, N, S, SEG: tl.constexpr, N_ALIGN: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
    m = tl.max(x, axis=0)
    d = tl.sum(tl.exp(x - _finite_or_zero(m)), axis=0)
    p = part_ptr + (row.to(tl.int64) * S + seg) * 2
    tl.store(p, m)
    tl.store(p + 1, d)


@triton.jit
def _softmax_fwd_split_write(x_ptr, y_ptr, part_ptr, N, S, SEG: tl.constexpr, S_BLOCK: tl.constexpr,
                             N_ALIGN: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    j = tl.arange(0, S_BLOCK)
    p = part_ptr + row.to(tl.int64) * S * 2 + j * 2
    m_j = tl.load(p, mask=j < S, other=-float("inf"))
    d_j = tl.load(p + 1, mask=j < S, other=0.0)
    m = _finite_or_zero(tl.max(m_j, axis=0))
    r = 1.0 / tl.sum(d_j * tl.exp(m_j - m), axis=0)  # -inf (or padding) segments: 0 * exp(-inf) = 0
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
    tl.store(y_ptr + offs, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_split_dot(y_ptr, dy_ptr, part_ptr, N, S, SEG: tl.constexpr, N_ALIGN: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(part_ptr + row.to(tl.int64) * S + seg, tl.sum(y * dy, axis=0))


@triton.jit
def _softmax_bwd_split_write(y_ptr, dy_ptr, dx_ptr, part_ptr, N, S, SEG: tl.constexpr,
                             S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    j = tl.arange(0, S_BLOCK)
    dot = tl.sum(tl.load(part_ptr + row.to(tl.int64) * S + j, mask=j < S, other=0.0), axis=0)
    offs, mask = _split_segment(seg, row, N, SEG, N_ALIGN)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(dx_ptr + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def _launch(stats, write, partials: int, tensors, config: SplitConfig) -> None:
    """Grid (row, segment), `partials` float32 values a segment, two launches."""
    M, N = tensors[0].shape
    seg = config.seg
    if seg < 1 or seg & (seg - 1):
        raise ValueError(f"SplitConfig.seg must be a power of two: got {seg}")
    S = triton.cdiv(N, seg)
    if S > SPLIT_MAX_SEGMENTS:
        raise ValueError(f"SplitConfig.seg {seg} cuts rows of {N} into {S} segments, over {SPLIT_MAX_SEGMENTS}")
    part = torch.empty((M, S, partials), dtype=torch.float32, device=tensors[0].device)
    meta = dict(SEG=seg, N_ALIGN=align(N), num_warps=config.warps)
    stats[(M, S)](*tensors[:-1], part, N, S, **meta)  # inputs only: the output is written by `write`
    write[(M, S)](*tensors, part, N, S, S_BLOCK=triton.next_power_of_2(S), **meta)


def split_forward(x, y, config: SplitConfig) -> None:
    _launch(_softmax_fwd_split_stats, _softmax_fwd_split_write, 2, (x, y), config)


def split_backward(y, dy, dx, config: SplitConfig) -> None:
    _launch(_softmax_bwd_split_dot, _softmax_bwd_split_write, 1, (y, dy, dx), config)
