"""Row addressing with an alignment hint (softmax, layer_norm): rows of e.g. 1000 or 5000 elements
still get 16-byte loads. The JIT marks only ints divisible by 16 on its own; without the hint every
load of such a row is scalar. The host picks N_ALIGN (kernels/_host/rows.py: align)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_start(row, N, N_ALIGN: tl.constexpr):
    """row * N in int64, written so that the compiler sees it is a multiple of N_ALIGN."""
    return row.to(tl.int64) * (N // N_ALIGN) * N_ALIGN


@triton.jit
def col_mask(cols, N, N_ALIGN: tl.constexpr):
    """cols < N, written so that the compiler sees it is constant over runs of N_ALIGN columns."""
    return cols // N_ALIGN < N // N_ALIGN
