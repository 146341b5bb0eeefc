"""The LSTM in plain PyTorch, one step at a time: in float64 the reference the collector gates
on (the spec's eager provider runs it in the inputs' dtype; the tests import it)."""
from __future__ import annotations

import torch

from .._spec.cells import keep_factor


def step_loop(x, h0, c0, w_ih, w_hh, b, resets=None):
    """The LSTM as a PyTorch user writes it: the input projection at once, then one step at a time,
    zeroing the rows that restart. In float64 it is the reference."""
    B, T, _ = x.shape
    gx = (x @ w_ih.t() + b).unbind(1)
    h, c, ys = h0, c0, []
    for t in range(T):
        keep = keep_factor(resets, t, x)
        if keep is not None:
            h, c = h * keep, c * keep
        i, f, g, o = (gx[t] + h @ w_hh.t()).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys.append(h)
    return torch.stack(ys, 1), h, c


def reference(x, h0, c0, w_ih, w_hh, b, resets=None):
    """Plain maths in float64 (the tests import it)."""
    return step_loop(x, h0, c0, w_ih, w_hh, b, resets)
