"""The mLSTM cell (matrix memory, exponential input gate) over a sequence with resets, chunkwise-
parallel over the sequence.

    h, C_T, n_T, m_T = mlstm(q, k, v, i, f, resets=None)

q, k, v [B, NH, T, DH], i and f [B, NH, T] the input and forget gate pre-activations, resets [B, T]
bool (a row's state zeroed before that step). The maths is naive.recurrent's (Cortex's step); the
state starts at zero. h [B, NH, T, DH]; C_T [B, NH, DH, DH], n_T [B, NH, DH], m_T [B, NH] the
stabilised final state, returned without gradient (the state a next segment starts from, detached).

Forward (fwd.py): a scan over chunks for the chunk-start states, then all chunks' outputs at once.
Backward (bwd.py): a reverse scan for the states' gradients, then all chunks' gradients at once."""
from __future__ import annotations

import torch

from .._lib.recurrent import dot_f32
from .bwd import mlstm_bwd
from .config import MLSTMConfig, pick
from .fwd import mlstm_fwd
from .naive import EPS

__all__ = ["MLSTMConfig", "MLSTMFunction", "mlstm", "pick"]


class MLSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, i, f, resets, config):
        B, NH, T, DH = q.shape
        config = config or pick(T, DH, q.device)
        flat = [x.reshape(B * NH, T, DH) for x in (q, k, v)] + [x.reshape(B * NH, T) for x in (i, f)]
        fast = dot_f32(q.dtype, q.device)
        h, cs, ns, ms, mo, den = mlstm_fwd(*flat, resets, NH, config, fast, EPS)
        ctx.save_for_backward(*flat, resets, h, cs, ns, ms, mo, den)
        ctx.config, ctx.dot_f32, ctx.shape = config, fast, (B, NH)
        last = (cs[:, -1].view(B, NH, DH, DH).to(q.dtype), ns[:, -1].view(B, NH, DH).to(q.dtype),
                ms[:, -1].view(B, NH).to(q.dtype))
        ctx.mark_non_differentiable(*last)
        return (h.view(B, NH, T, DH),) + last

    @staticmethod
    def backward(ctx, dh, *_):
        q, k, v, i, f, resets, h, *saved = ctx.saved_tensors
        B, NH = ctx.shape
        BH, T, DH = q.shape
        dq, dk, dv, di, df = mlstm_bwd(dh.reshape(BH, T, DH), q, k, v, i, f, resets, NH, h, saved, ctx.config,
                                       ctx.dot_f32, EPS)
        return (dq.view(B, NH, T, DH), dk.view(B, NH, T, DH), dv.view(B, NH, T, DH), di.view(B, NH, T),
                df.view(B, NH, T), None, None)


def mlstm(q, k, v, i, f, resets=None, config: MLSTMConfig | None = None):
    """(h, C_T, n_T, m_T); see the module docstring."""
    if q.dim() != 4:
        raise ValueError(f"mlstm: q must be [B, NH, T, DH], got {tuple(q.shape)}")
    B, NH, T, DH = q.shape
    for name, t, shape in (("k", k, (B, NH, T, DH)), ("v", v, (B, NH, T, DH)), ("i", i, (B, NH, T)),
                           ("f", f, (B, NH, T))):
        if tuple(t.shape) != shape:
            raise ValueError(f"mlstm: {name} must be {shape} for q {tuple(q.shape)}, got {tuple(t.shape)}")
    if resets is not None and (tuple(resets.shape) != (B, T) or resets.dtype != torch.bool):
        raise ValueError(f"mlstm: resets must be a bool [B, T] = ({B}, {T}) mask, got {resets.dtype} "
                         f"{tuple(resets.shape)}")
    return MLSTMFunction.apply(*(x.contiguous() for x in (q, k, v, i, f)), resets, config)
