"""Bulk prefetch into L2 (sm_90) for the wide-row kernels: the device side (kernels/_host/prefetch.py
says where it may run)."""
from __future__ import annotations

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------
# L2 prefetch. The wide-row kernels are short of loads in flight: a load holds its destination
# registers until the data arrives, so the bytes in flight per SM are capped by the registers
# (Nsight Compute, session 11: half the stall cycles wait on loads). A bulk prefetch into L2
# (sm_90's cp.async.bulk.prefetch.L2, one instruction for a whole segment, issued by the
# program's first thread) takes no register and is not waited for: a kernel asks for the rows it
# will load a step or two later, and its register loads then find them in L2, at a fraction of the
# HBM latency. GPU only (PTX, Hopper): the launchers pass the AHEAD constexprs as 0 elsewhere.


@triton.jit
def prefetch_l2(ptr, nbytes):
    """Bring nbytes at ptr into L2 (nbytes a multiple of 16, ptr 16-byte aligned; 0: nothing)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.ne.u32 p, $2, 0; @p setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_segment(ptr, row, M, N, seg, SEG: tl.constexpr):
    """prefetch_l2 of columns [seg*SEG, (seg+1)*SEG) (within N) of row `row` of the [M, N] tensor at
    ptr; nothing for a row past M. The caller makes sure rows are whole 16-byte vectors."""
    elt: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    nbytes = tl.where(row < M, tl.minimum(SEG, N - seg * SEG) * elt, 0)
    prefetch_l2(ptr + row.to(tl.int64) * N + seg * SEG, nbytes)


@triton.jit
def prefetch_chunk(row_ptr, c, N_FULL: tl.constexpr, BLOCK: tl.constexpr):
    """prefetch_l2 of chunk c (BLOCK elements from row_ptr + c * BLOCK) of a row of N_FULL full
    chunks; nothing for c past them."""
    elt: tl.constexpr = row_ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_l2(row_ptr + c * BLOCK, tl.where(c < N_FULL, BLOCK * elt, 0))


@triton.jit
def prefetch_rows(ptr, row0, ROWS: tl.constexpr, M, N):
    """prefetch_l2 of rows [row0, row0 + ROWS) of the [M, N] tensor at ptr, those below M (a tile of
    a persistent rows kernel: contiguous)."""
    elt: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    rows = tl.minimum(tl.maximum(M - row0, 0), ROWS)
    prefetch_l2(ptr + row0.to(tl.int64) * N, rows * N * elt)
