"""The autograd of a scan whose forward keeps its chunk states for the backward (rtu, selective_scan)."""
from __future__ import annotations

import torch


class KeptStates(torch.autograd.Function):
    """apply(forward, backward, config, *inputs): y from forward(*inputs, config, keep_states=True)
    -> (y, states), which keeps the states at the chunk boundaries so that backward(dy, *inputs,
    states, config) -> the inputs' gradients need not scan forward again."""

    @staticmethod
    def forward(ctx, forward, backward, config, *inputs):
        y, states = forward(*inputs, config, keep_states=True)
        ctx.save_for_backward(*inputs, states)
        ctx.backward_fn, ctx.config = backward, config
        return y

    @staticmethod
    def backward(ctx, dy):
        *inputs, states = ctx.saved_tensors
        return (None, None, None, *ctx.backward_fn(dy, *inputs, states, ctx.config))
