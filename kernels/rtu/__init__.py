"""Cortex's RTU (recurrent trace unit) sequence kernel in Triton: the diagonal complex-valued linear
recurrence with per-step resets, forward and backward (semantics in scan.py).

`rtu(x, nu_log, theta_log, w1, w2, resets=None)`: x [B, T, H], diagonal input maps (the weights
w1, w2 [H], Cortex's streaming-diagonal RTU); `rtu_lowrank(x, nu_log, theta_log, U1, U2, V1, V2,
resets=None)`: low-rank input maps u = x @ U @ V (U [H, R], V [R, H], Cortex's low-rank RTU; the
projections are cuBLAS matmuls, the scan ours). Both return y [B, T, 2H] (SiLU of the real and
imaginary parts) from a zero initial state; resets [B, T] bool zero the state before a step.
The state is kept in fp32 whatever the dtype of x. `config=None` takes config.pick's choice.
"""
from __future__ import annotations

import torch

from .._host.scan import KeptStates
from .config import RTUConfig, pick
from .scan import rtu_lanes_backward, rtu_scan_backward, rtu_scan_forward

__all__ = ["RTUConfig", "pick", "rtu", "rtu_lanes_backward", "rtu_lowrank", "rtu_scan_backward", "rtu_scan_forward"]


def _parameter_grads(sums: torch.Tensor, nu_log: torch.Tensor, theta_log: torch.Tensor):
    """d nu_log and d theta_log from the sums of dL/dg, dL/dp, dL/dgamma (g = r cos(theta),
    p = r sin(theta), gamma = sqrt(1 - r^2), r = exp(-exp(nu_log)), theta = exp(theta_log))."""
    dg, dp, dgam = sums[0].double(), sums[1].double(), sums[2].double()
    # in fp64 (H values), as the kernels' dynamics: d gamma / d nu = e r^2 / gamma, with gamma from
    # expm1, finite and exact for memories as long as fp32's r cannot tell from 1
    e, ang = torch.exp(nu_log.double()), torch.exp(theta_log.double())
    r = torch.exp(-e)
    g, p = r * torch.cos(ang), r * torch.sin(ang)
    gam = torch.sqrt(-torch.expm1(-2.0 * e))
    dnu = -e * (dg * g + dp * p) + e * (r * r / gam) * dgam
    dth = ang * (dp * g - dg * p)
    return dnu.to(nu_log.dtype), dth.to(theta_log.dtype)


def _backward(dy, x1, x2, w1, w2, nu_log, theta_log, resets, states, config):
    """The gradients of (x1, x2, w1, w2, nu_log, theta_log, resets) from the scan's and the
    parameter maps' backward."""
    if config.bwd_path == "lanes":
        dx1, dx2, dw1, dw2, dnu, dth = rtu_lanes_backward(dy, x1, x2, w1, w2, nu_log, theta_log, resets, states, config)
        return dx1, dx2, dw1, dw2, dnu, dth, None
    dx1, dx2, sums = rtu_scan_backward(dy, x1, x2, w1, w2, nu_log, theta_log, resets, states, config)
    dnu, dth = _parameter_grads(sums, nu_log, theta_log)
    dw1 = sums[3].to(w1.dtype) if w1 is not None else None
    dw2 = sums[4].to(w2.dtype) if w2 is not None else None
    return dx1, dx2, dw1, dw2, dnu, dth, None


def _scan(x1, x2, w1, w2, nu_log, theta_log, resets, config):
    nu_log, theta_log = nu_log.contiguous(), theta_log.contiguous()  # read by the kernels as vectors of stride 1
    B, T, H = x1.shape
    config = config or pick(B, T, H, x1.device, resets is not None)
    if resets is not None:
        if resets.shape != (B, T) or resets.dtype != torch.bool:
            raise ValueError(f"resets must be bool [B, T] = [{B}, {T}]; got {resets.dtype} {tuple(resets.shape)}")
        resets = resets.contiguous()
    tensors = (x1, x2, w1, w2, nu_log, theta_log)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return KeptStates.apply(rtu_scan_forward, _backward, config, x1, x2, w1, w2, nu_log, theta_log, resets)
    return rtu_scan_forward(x1, x2, w1, w2, nu_log, theta_log, resets, config)[0]


def _check(x, nu_log, theta_log, maps, shapes) -> None:
    """shapes(H, R): the maps' expected shapes."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, H]; got {tuple(x.shape)}")
    H = x.shape[2]
    if nu_log.shape != (H,) or theta_log.shape != (H,):
        raise ValueError(f"nu_log and theta_log must be [H] = [{H}]; got {tuple(nu_log.shape)}, {tuple(theta_log.shape)}")
    for name, m, want in zip(("first", "second", "third", "fourth"), maps, shapes(H, maps[0].shape[-1])):
        if tuple(m.shape) != want:
            raise ValueError(f"the {name} input map must be {list(want)}; got {list(m.shape)}")


def rtu(x, nu_log, theta_log, w1, w2, resets=None, config: RTUConfig | None = None) -> torch.Tensor:
    """Diagonal input maps (D == H): u1 = x * w1, u2 = x * w2."""
    _check(x, nu_log, theta_log, (w1, w2), lambda H, R: [(H,)] * 2)
    return _scan(x.contiguous(), None, w1.contiguous(), w2.contiguous(), nu_log, theta_log, resets, config)


def rtu_lowrank(x, nu_log, theta_log, U1, U2, V1, V2, resets=None, config: RTUConfig | None = None) -> torch.Tensor:
    """Low-rank input maps: u1 = x @ U1 @ V1, u2 = x @ U2 @ V2 (U [D, R], V [R, H]; here D == H)."""
    _check(x, nu_log, theta_log, (U1, U2, V1, V2), lambda H, R: [(H, R), (H, R), (R, H), (R, H)])
    u1 = (x @ U1) @ V1
    u2 = (x @ U2) @ V2
    return _scan(u1.contiguous(), u2.contiguous(), None, None, nu_log, theta_log, resets, config)
