"""SwiGLU: c = silu(a) * b, the gate of LLaMA-style MLPs (a = x @ W_gate, b = x @ W_up).

`swiglu(a, b)` is differentiable; `swiglu_forward` / `swiglu_backward` are the raw launches, each
with `config=None` (config.pick's choice) or a SwiGLUConfig to force."""
from __future__ import annotations

import torch

from .config import SwiGLUConfig, pick
from .kernels import swiglu_backward, swiglu_forward

__all__ = ["SwiGLUConfig", "SwiGLUFunction", "pick", "swiglu", "swiglu_backward", "swiglu_forward"]


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return swiglu_forward(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return swiglu_backward(dc, a, b)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    return SwiGLUFunction.apply(a, b)
