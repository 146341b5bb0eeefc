"""Row softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))), forward and backward
(dx = y * (dy - sum(dy * y))), for rows up to 262144 wide.

`softmax(x)` is differentiable; `softmax_forward` / `softmax_backward` are the raw launches, each
with `config=None` (config.pick_forward / pick_backward's choice) or a config to force, whose type
is the path: RowsConfig, SplitConfig, CoopConfig, LinesConfig (forward), StreamConfig (backward)."""
from __future__ import annotations

import torch

from .config import CoopConfig, LinesConfig, RowsConfig, SplitConfig, StreamConfig, pick_backward, pick_forward
from .bwd import softmax_backward
from .fwd import softmax_forward

__all__ = ["CoopConfig", "LinesConfig", "RowsConfig", "SoftmaxFunction", "SplitConfig", "StreamConfig",
           "pick_backward", "pick_forward", "softmax", "softmax_backward", "softmax_forward"]


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(dy.contiguous(), y)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x [..., N]."""
    if x.numel() == 0:
        raise ValueError(f"x must not be empty: got shape {tuple(x.shape)}")
    n = x.shape[-1]
    return SoftmaxFunction.apply(x.reshape(-1, n).contiguous()).view(x.shape)
