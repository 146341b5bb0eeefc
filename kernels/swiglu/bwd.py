"""SwiGLU's backward kernel and its launcher: da and db from dc, recomputing silu(a) from a (cheaper
than storing it). Flat over the elements, as the forward."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.gated import gated_backward
from .config import SwiGLUConfig


@triton.jit
def _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, mask):
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    db = dc * silu
    # d silu / da = sig * (1 + a * (1 - sig))
    da = dc * b * sig * (1.0 + a * (1.0 - sig))
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, tail, tail < n)


def swiglu_backward(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    config: SwiGLUConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_backward(_swiglu_bwd, dc, a, b, config)
