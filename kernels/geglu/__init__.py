"""GEGLU: c = gelu_tanh(a) * b, the gate of Gemma-style MLPs (a = x @ W_gate, b = x @ W_up), with
the tanh approximation as Liger's GEGLU and Gemma use.

`geglu(a, b)` is differentiable; `geglu_forward` / `geglu_backward` are the raw launches, each
with `config=None` (config.pick's choice) or a GEGLUConfig to force."""
from __future__ import annotations

import torch

from .config import GEGLUConfig, pick
from .kernels import geglu_backward, geglu_forward

__all__ = ["GEGLUConfig", "GEGLUFunction", "geglu", "geglu_backward", "geglu_forward", "pick"]


class GEGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return geglu_forward(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return geglu_backward(dc, a, b)


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    return GEGLUFunction.apply(a, b)
