"""Mamba-1's selective scan as a sequential loop over time: the float64 reference (inputs in
float64) and the `eager` provider (any other dtype: the state and maths in fp32, as mamba_ssm's
selective_scan_ref, the output in x's dtype)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# the reference's autograd graph keeps a few [B, D, N] float64 tensors a step (4 MB each at B 8,
# D 4096, N 16): it checkpoints this many steps at a time and recomputes them in the backward
REFERENCE_STEPS_KEPT = 128


def _steps(h, x, dt, A, B, C, D):
    """The loop over the steps of x [B, t, D] from state h: (last state, outputs before the gate)."""
    ys = []
    # the steps as views taken once (unbind): the backward of an index x[:, t] writes its gradient
    # into zeros of x's whole size at every step, quadratic in the steps
    for xt, dtt, Bt, Ct in zip(x.unbind(1), dt.unbind(1), B.unbind(1), C.unbind(1)):
        h = torch.exp(dtt[:, :, None] * A) * h + (dtt * xt)[:, :, None] * Bt[:, None, :]
        ys.append((h * Ct[:, None, :]).sum(-1) + D * xt)
    return h, torch.stack(ys, dim=1)


def selective_scan_loop(x, delta, A, B, C, D, z, steps_kept: int | None = None):
    """y [B, T, D] = (sum_n C_t h_t + D x_t) * silu(z_t), h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,
    dt = softplus(delta), h_0 = 0; x, delta, z [B, T, D], A [D, N], B and C [B, T, N], D [D].
    steps_kept: checkpoint the loop that many steps at a time (None: keep the whole graph)."""
    out_dtype = x.dtype
    work = torch.float64 if out_dtype == torch.float64 else torch.float32
    x, delta, A, B, C, D, z = (v.to(work) for v in (x, delta, A, B, C, D, z))
    dt = F.softplus(delta)
    h = torch.zeros(x.shape[0], x.shape[2], A.shape[1], dtype=work, device=x.device)
    T = x.shape[1]
    span = steps_kept if steps_kept and torch.is_grad_enabled() else T
    parts = []
    for t0 in range(0, T, span):
        s = slice(t0, t0 + span)
        args = (h, x[:, s], dt[:, s], A, B[:, s], C[:, s], D)
        h, y = checkpoint(_steps, *args, use_reentrant=False) if span < T else _steps(*args)
        parts.append(y)
    return (torch.cat(parts, dim=1) * F.silu(z)).to(out_dtype)


def reference(x, delta, A, B, C, D, z):
    """Plain maths in float64 (the tests import it)."""
    return selective_scan_loop(x, delta, A, B, C, D, z, REFERENCE_STEPS_KEPT)
