"""GELU: y = x * Phi(x), exact (erf) or with the tanh approximation (GPT-2, Gemma), forward and backward.

`gelu(x, approximate)` is differentiable (`approximate` as F.gelu's: "none" or "tanh");
`gelu_forward` / `gelu_backward` are the raw launches, each with `config=None` (config.pick's
choice) or a GELUConfig to force. The GELU maths (kernels/_jit/gelu.py) is shared with geglu."""
from __future__ import annotations

import torch

from .config import GELUConfig, pick
from .bwd import gelu_backward
from .fwd import APPROX, check_approx, gelu_forward

__all__ = ["APPROX", "GELUConfig", "GELUFunction", "gelu", "gelu_backward", "gelu_forward", "pick"]


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        x = x.contiguous()
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return gelu_forward(x, approximate)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return gelu_backward(dy, x, ctx.approximate), None


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    check_approx(approximate)
    if not x.is_floating_point():
        raise ValueError(f"gelu needs a floating tensor, got {x.dtype}")
    return GELUFunction.apply(x, approximate)
