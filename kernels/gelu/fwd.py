"""GELU's forward kernel and its launcher, and the variants. Flat over the elements (elementwise op,
contiguous tensors): every program gets full 16-byte loads whatever the row width is. The variant
(tanh or erf) is a constexpr: one specialised kernel each, no runtime branch; so is PRECISE (fp32
tensors, see kernels/_jit/gelu.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.launch import launch_elementwise
from .._jit.gelu import gelu_erf_f32, gelu_tanh_f32
from .config import GELUConfig


APPROX = ("tanh", "none")


@triton.jit
def _gelu_fwd_block(x_ptr, y_ptr, offs, mask, TANH: tl.constexpr):
    PRECISE: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        y = gelu_tanh_f32(x, PRECISE)
    else:
        y = gelu_erf_f32(x, PRECISE)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_fwd(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _host.launch.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _gelu_fwd_block(x_ptr, y_ptr, offs, offs < n16, TANH)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _gelu_fwd_block(x_ptr, y_ptr, tail, tail < n, TANH)


def check_approx(approximate: str) -> None:
    if approximate not in APPROX:
        raise ValueError(f"approximate must be one of {APPROX}, got {approximate!r}")


def gelu_forward(x: torch.Tensor, approximate: str = "none", config: GELUConfig | None = None) -> torch.Tensor:
    check_approx(approximate)
    x = x.contiguous()
    y = torch.empty_like(x)
    launch_elementwise(_gelu_fwd, x.numel(), x, y, TANH=approximate == "tanh", config=config)
    return y
