"""A single-layer LSTM over a sequence, with per-timestep resets of (h, c) for chosen batch rows.

    y, h_n, c_n = lstm(x, h0, c0, w_ih, w_hh, b, resets=None)

x [B, T, I], h0 and c0 [B, H], w_ih [4H, I], w_hh [4H, H], b [4H] (PyTorch's gate order i, f, g, o;
its two biases summed), resets [B, T] bool: where True, row b's h and c are zeroed before step t
(an episode boundary inside the sequence). y [B, T, H] the hidden states, h_n and c_n the last.

Forward: the input projection of all timesteps as one GEMM, then one persistent launch for the
recurrence (sequence.py). Backward: a reverse persistent launch for the gate gradients, then the
weight and input gradients as three GEMMs over all timesteps."""
from __future__ import annotations

import torch

from .._host.cells import bias_grad, check_dtypes, unit_major, weight_grads
from .config import LSTMConfig, pick
from .sequence import fitted, lstm_bwd, lstm_fwd

__all__ = ["LSTMConfig", "LSTMFunction", "lstm", "pick"]


class LSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b, resets, config, save):
        B, T, I = x.shape
        H = w_hh.shape[1]
        config = fitted(config or pick(B, H, x.device), x.dtype, H, x.device, picked=config is None)
        perm = unit_major(H, 4, x.device)
        w_ih_p, w_hh_p = w_ih[perm], w_hh[perm].contiguous()
        gx = torch.addmm(b[perm], x.reshape(B * T, I), w_ih_p.t()).view(B, T, 4 * H)
        ys, cs, act, cn = lstm_fwd(gx, w_hh_p.t().contiguous(), h0, c0, resets, save, config)
        ctx.save_for_backward(x, ys, cs, act, w_ih_p, w_hh_p, resets, perm)
        ctx.config = config
        return ys[:, 1:], ys[:, T], cn

    @staticmethod
    def backward(ctx, dy, dhn, dcn):
        x, ys, cs, act, w_ih_p, w_hh_p, resets, perm = ctx.saved_tensors
        B, T, I = x.shape
        H = w_hh_p.shape[1]
        dg, dh0, dc0 = lstm_bwd(dy, dhn, dcn, w_hh_p, act, cs, resets, ctx.config)
        dg2 = dg.view(B * T, 4 * H)
        h_prev = ys[:, :T]
        if resets is not None:
            h_prev = h_prev * (~resets).to(h_prev.dtype)[:, :, None]
        inv = torch.argsort(perm)
        dx = (dg2 @ w_ih_p).view(B, T, I)
        dw_ih, dw_hh = weight_grads(dg2.t(), x.reshape(B * T, I), h_prev.reshape(B * T, H))
        return dx, dh0, dc0, dw_ih[inv], dw_hh[inv], bias_grad(dg2, 0)[inv], None, None, None


def lstm(x, h0, c0, w_ih, w_hh, b, resets=None, config: LSTMConfig | None = None):
    """(y, h_n, c_n); see the module docstring."""
    B, T, I = x.shape
    H = w_hh.shape[1]
    expect = {"h0": (B, H), "c0": (B, H), "w_ih": (4 * H, I), "w_hh": (4 * H, H), "b": (4 * H,)}
    for name, t in zip(expect, (h0, c0, w_ih, w_hh, b)):
        if tuple(t.shape) != expect[name]:
            raise ValueError(f"lstm: {name} must be {expect[name]} for x {tuple(x.shape)} and H={H}, "
                             f"got {tuple(t.shape)}")
    check_dtypes("lstm", x=x, w_ih=w_ih, w_hh=w_hh, b=b)
    if resets is not None and (tuple(resets.shape) != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"lstm: resets must be a bool [B, T] = ({B}, {T}) mask, got {resets.dtype} "
                         f"{tuple(resets.shape)}")
    # what the backward reads is kept only when a gradient will be asked for
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (x, h0, c0, w_ih, w_hh, b))
    resets = resets.contiguous() if resets is not None else None  # the kernels read it as [B, T]
    return LSTMFunction.apply(x.contiguous(), h0.contiguous(), c0.contiguous(), w_ih, w_hh, b, resets, config, save)
