"""GEGLU's forward kernel and its launcher: c = gelu_tanh(a) * b. Flat over the elements: a and b are
contiguous and the op is elementwise, so a 1-D grid gives every program full 16-byte loads whatever
the row width is. All maths in fp32, one rounding per output (Liger rounds gelu(a) to the dtype
before the multiply); the GELU maths is kernels/_jit/gelu.py (PRECISE: fp32 tensors)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.gated import gated_forward
from .._jit.gelu import gelu_tanh_f32
from .config import GEGLUConfig


@triton.jit
def _geglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, mask):
    PRECISE: tl.constexpr = a_ptr.dtype.element_ty == tl.float32
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    c = gelu_tanh_f32(a, PRECISE) * b
    tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_fwd(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _host.launch.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _geglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _geglu_fwd_block(a_ptr, b_ptr, c_ptr, tail, tail < n)


def geglu_forward(a: torch.Tensor, b: torch.Tensor, config: GEGLUConfig | None = None) -> torch.Tensor:
    return gated_forward(_geglu_fwd, a, b, config)
