"""The sLSTM cell of xLSTM as Cortex defines it, over a sequence, with per-timestep resets.

    y, c_T, n_T, m_T = slstm(wx, r, b, y0, c0, n0, m0, resets=None)

wx [B, T, 4, NH, DH] the feed-forward pre-activations of the gates (i, f, z, o), r [4, NH, DH, DH]
the block-diagonal recurrent weights (gate, head, out, in: head h's gates get y_h @ r[g, h].T), b
[4, NH, DH], the states y0, c0, n0, m0 [B, NH, DH], resets [B, T] bool (a row's four states zeroed
before that step). Per step, with f' = logsigmoid(f):

    m' = i if n == 0 else max(i, f' + m)          (the stabiliser; n == 0: a row's first step)
    i' = min(exp(i - m'), 1), f'' = min(exp(f' + m - m'), 1)
    c' = f'' c + i' tanh(z),  n' = f'' n + i',  y' = sigmoid(o) c' / (n' + 1e-6)

y [B, T, NH, DH] the outputs; c_T, n_T, m_T the final states (m_T carries no gradient; c_T and n_T do,
through the stabiliser too)."""
from __future__ import annotations

import torch

from .._host.cells import bias_grad, check_dtypes, wide
from .config import SLSTMConfig, pick
from .sequence import fitted, slstm_bwd, slstm_fwd

__all__ = ["SLSTMConfig", "SLSTMFunction", "pick", "slstm"]


class SLSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wx, r, b, y0, c0, n0, m0, resets, config, save):
        B, T, _, NH, DH = wx.shape
        config = fitted(config or pick(B, NH, DH, wx.device), wx.dtype, DH, wx.device, picked=config is None)
        states = torch.stack((y0, c0, n0, m0)).to(wx.dtype)
        ys, saved, last = slstm_fwd(wx, r, b, states, resets, save, config)
        if save:
            ctx.save_for_backward(ys, r, resets, *saved)
        ctx.config = config
        c_t, n_t, m_t = last.unbind(0)
        ctx.mark_non_differentiable(m_t)
        return ys[:, 1:], c_t, n_t, m_t

    @staticmethod
    def backward(ctx, dy, dc_t, dn_t, _dm_t):
        ys, r, resets, *saved = ctx.saved_tensors
        T = ys.shape[1] - 1
        dwx, dst = slstm_bwd(dy, torch.stack((dc_t, dn_t)), r, saved, resets, ctx.config)
        y_prev = ys[:, :T]
        if resets is not None:
            y_prev = y_prev * (~resets).to(y_prev.dtype)[:, :, None, None]
        w = wide(dwx.dtype)  # the recurrent weights' sums over B x T (cells.py)
        dr = torch.einsum("btgho,bthi->ghoi", dwx.to(w), y_prev.to(w)).to(dwx.dtype)
        return dwx, dr, bias_grad(dwx, (0, 1)), dst[0], dst[1], dst[2], dst[3], None, None, None


def slstm(wx, r, b, y0, c0, n0, m0, resets=None, config: SLSTMConfig | None = None):
    """(y, c_T, n_T, m_T); see the module docstring."""
    if wx.dim() != 5 or wx.shape[2] != 4:
        raise ValueError(f"slstm: wx must be [B, T, 4, NH, DH], got {tuple(wx.shape)}")
    B, T, _, NH, DH = wx.shape
    expect = {"r": (4, NH, DH, DH), "b": (4, NH, DH), "y0": (B, NH, DH), "c0": (B, NH, DH), "n0": (B, NH, DH),
              "m0": (B, NH, DH)}
    for name, t in zip(expect, (r, b, y0, c0, n0, m0)):
        if tuple(t.shape) != expect[name]:
            raise ValueError(f"slstm: {name} must be {expect[name]} for wx {tuple(wx.shape)}, got {tuple(t.shape)}")
    check_dtypes("slstm", wx=wx, r=r, b=b)
    if resets is not None and (tuple(resets.shape) != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"slstm: resets must be a bool [B, T] = ({B}, {T}) mask, got {resets.dtype} "
                         f"{tuple(resets.shape)}")
    # what the backward reads is kept only when a gradient will be asked for
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (wx, r, b, y0, c0, n0, m0))
    resets = resets.contiguous() if resets is not None else None  # the kernels read it as [B, T]
    return SLSTMFunction.apply(wx.contiguous(), r.contiguous(), b.contiguous(), y0, c0, n0, m0, resets, config, save)
