"""Causal conv1d with per-step resets in Triton, forward and backward: depthwise (groups = channels,
the short convolution of Mamba-style blocks, widths 2-4) and channel-mixing (groups=1, Cortex's
CausalConv1d). A reset at step s starts a new window: y_s sees x_s and nothing before it.

`conv1d(x, weight, bias=None, resets=None)`: x [B, T, F]; weight [F, 1, K] (depthwise: F_out = F)
or [F_out, F, K] (channel-mixing), PyTorch's Conv1d layout, weight[..., K-1] multiplying the current
step; bias [F_out] or None; x, weight and bias of one dtype; resets [B, T] bool or None. Returns
y [B, T, F_out] like x, from a zero initial state. A weight [F_out, 1, K] with F = 1 input feature
is channel-mixing (as in PyTorch, groups=1 with one input channel); with F_out = F = 1 the two
kinds are the same map. `config=None` takes config.pick_depthwise's / pick_mix's choice.
"""
from __future__ import annotations

import torch

from .config import DepthwiseConfig, MixConfig, pick_depthwise, pick_mix
from .depthwise import depthwise_backward, depthwise_forward
from .mix import mix_backward, mix_forward

__all__ = ["DepthwiseConfig", "MixConfig", "conv1d", "depthwise_backward", "depthwise_forward", "is_depthwise",
           "mix_backward", "mix_forward", "pick_depthwise", "pick_mix"]


def is_depthwise(x, weight) -> bool:
    """Whether the weight is depthwise for x: [F, 1, K] with F = x's features (one filter a
    feature); otherwise [F_out, F, K] is channel-mixing, F_out = 1 or F = 1 included."""
    return weight.shape[1] == 1 and weight.shape[0] == x.shape[-1]


def _launches(x, weight):
    """(forward, backward) of the kind the weight's shape says."""
    if is_depthwise(x, weight):
        return depthwise_forward, depthwise_backward
    return mix_forward, mix_backward


class Conv1dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, resets, config, picked):
        ctx.save_for_backward(x, weight, resets)
        ctx.config, ctx.picked, ctx.has_bias = config, picked, bias is not None
        return _launches(x, weight)[0](x, weight, bias, resets, config, picked)

    @staticmethod
    def backward(ctx, dy):
        x, weight, resets = ctx.saved_tensors
        dx, dw, db = _launches(x, weight)[1](dy, x, weight, resets, ctx.config, ctx.picked)
        return dx, dw, db.to(weight.dtype) if ctx.has_bias else None, None, None, None


def _check(x, weight, bias, resets) -> None:
    if x.dim() != 3 or weight.dim() != 3:
        raise ValueError(f"x must be [B, T, F] and weight [F_out, F_in / groups, K]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    B, T, F = x.shape
    if not is_depthwise(x, weight) and weight.shape[1] != F or weight.shape[-1] < 1:
        raise ValueError(f"weight {tuple(weight.shape)}: [{F}, 1, K] (depthwise) or [F_out, {F}, K] (groups=1), K >= 1")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}]; got {tuple(bias.shape)}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x, weight and bias must share a dtype; got {x.dtype}, {weight.dtype}"
                         + (f", {bias.dtype}" if bias is not None else ""))
    if resets is not None and (resets.shape != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"resets must be bool [B, T] = [{B}, {T}]; got {resets.dtype} {tuple(resets.shape)}")


def conv1d(x, weight, bias=None, resets=None, config: DepthwiseConfig | MixConfig | None = None) -> torch.Tensor:
    _check(x, weight, bias, resets)
    x, weight = x.contiguous(), weight.contiguous()
    bias = bias.contiguous() if bias is not None else None  # the kernels read it as a vector of stride 1
    resets = resets.contiguous() if resets is not None else None
    picked = config is None  # a picked config falls back to smaller tiles where the device needs it
    if picked:
        pick = pick_depthwise if is_depthwise(x, weight) else pick_mix
        config = pick(x.shape[0], x.shape[1], x.shape[2], weight.shape[-1], x.device)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return Conv1dFunction.apply(x, weight, bias, resets, config, picked)
    return _launches(x, weight)[0](x, weight, bias, resets, config, picked)
