"""LayerNorm over the last dim with weight and bias: y = (x - mean) / sqrt(var + eps) * w + b.

`layer_norm(x, weight, bias, eps)` is differentiable (gradients for x, weight and bias).
`layer_norm_forward` / `layer_norm_backward` are the raw launches on [M, N] rows, each with
`config=None` (config.pick_forward's / pick_backward's choice) or a config to force: rows up to 8192
elements in registers (TileConfig, RowsConfig; BwdRowsConfig), wider rows in two passes of chunks
(LinesConfig) forward and, backward, in segments over programs that wait for each other's sums
on the GPU (CoopConfig), in two passes elsewhere (ColsConfig).
"""
from __future__ import annotations

import torch

from .._host.rows import LinesConfig
from .bwd import layer_norm_backward
from .config import BwdRowsConfig, ColsConfig, CoopConfig, RowsConfig, TileConfig, pick_backward, pick_forward
from .fwd import layer_norm_forward

__all__ = ["BwdRowsConfig", "ColsConfig", "CoopConfig", "LayerNormFunction", "LinesConfig", "RowsConfig",
           "TileConfig", "layer_norm", "layer_norm_backward", "layer_norm_forward", "pick_backward", "pick_forward"]


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)
        return dx, dw, db, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of x [..., N]; weight and bias [N] (one dtype, may differ from x's)."""
    n = x.shape[-1]
    if tuple(weight.shape) != (n,) or tuple(bias.shape) != (n,):
        raise ValueError(f"weight and bias must have shape ({n},): got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if weight.dtype != bias.dtype:
        raise ValueError(f"weight and bias must share a dtype: got {weight.dtype} and {bias.dtype}")
    if x.numel() == 0:
        raise ValueError(f"x must not be empty: got shape {tuple(x.shape)}")
    y = LayerNormFunction.apply(x.reshape(-1, n).contiguous(), weight.contiguous(), bias.contiguous(), eps)
    return y.view(x.shape)
