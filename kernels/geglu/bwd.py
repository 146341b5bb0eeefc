"""GEGLU's backward kernel and its launcher: da and db from dc, gelu(a) and its derivative recomputed
from a. Flat over the elements, as the forward."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.gated import gated_backward
from .._jit.gelu import gelu_tanh_and_grad_f32
from .config import GEGLUConfig


@triton.jit
def _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, mask):
    PRECISE: tl.constexpr = a_ptr.dtype.element_ty == tl.float32
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    g, dg = gelu_tanh_and_grad_f32(a, PRECISE)  # recomputed from a: cheaper than storing gelu(a) in fwd
    tl.store(da_ptr + offs, (dc * b * dg).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dc * g).to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, tail, tail < n)


def geglu_backward(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   config: GEGLUConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_backward(_geglu_bwd, dc, a, b, config)
