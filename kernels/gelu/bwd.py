"""GELU's backward kernel and its launcher: dx from dy, the derivative recomputed from x. Flat over the
elements, as the forward."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.launch import launch_elementwise
from .._jit.gelu import gelu_erf_grad_f32, gelu_tanh_and_grad_f32
from .config import GELUConfig
from .fwd import check_approx


@triton.jit
def _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, offs, mask, TANH: tl.constexpr):
    PRECISE: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        _, dg = gelu_tanh_and_grad_f32(x, PRECISE)
    else:
        dg = gelu_erf_grad_f32(x, PRECISE)
    tl.store(dx_ptr + offs, (dy * dg).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, offs, offs < n16, TANH)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, tail, tail < n, TANH)


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none",
                  config: GELUConfig | None = None) -> torch.Tensor:
    check_approx(approximate)
    dy, x = dy.contiguous(), x.contiguous()
    dx = torch.empty_like(x)
    launch_elementwise(_gelu_bwd, x.numel(), dy, x, dx, TANH=approximate == "tanh", config=config)
    return dx
