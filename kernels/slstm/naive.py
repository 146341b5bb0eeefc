"""The sLSTM in plain PyTorch, one step at a time: in float64 the reference the collector gates
on (the spec's eager provider runs it in the inputs' dtype; the tests import it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._spec.cells import keep_factor
from .sequence import EPS


def step_loop(wx, r, b, y0, c0, n0, m0, resets=None):
    """Cortex's sLSTM sequence as a PyTorch user writes it, one step at a time (see the package
    docstring for the maths). In float64 it is the reference."""
    T = wx.shape[1]
    y, c, n, m = y0, c0, n0, m0
    ys = []
    wxs = wx.unbind(1)  # views taken once: the backward of wx[:, t] would fill a wx-sized zero tensor a step
    for t in range(T):
        keep = keep_factor(resets, t, wx)
        if keep is not None:
            keep = keep[:, :, None]
            y, c, n, m = y * keep, c * keep, n * keep, m * keep
        i, f, z, o = (wxs[t] + torch.einsum("bhi,ghoi->bgho", y, r) + b).unbind(1)
        logfm = m + F.logsigmoid(f)
        m_new = torch.where(n == 0, i, torch.maximum(i, logfm))
        ig = torch.minimum(torch.exp(i - m_new), torch.ones_like(i))
        fg = torch.minimum(torch.exp(logfm - m_new), torch.ones_like(i))
        c = fg * c + ig * torch.tanh(z)
        n = fg * n + ig
        y = torch.sigmoid(o) * c / (n + EPS)
        m = m_new
        ys.append(y)
    return torch.stack(ys, 1), c, n, m.detach()


def reference(wx, r, b, y0, c0, n0, m0, resets=None):
    """Plain maths in float64 (the tests import it)."""
    return step_loop(wx, r, b, y0, c0, n0, m0, resets)
