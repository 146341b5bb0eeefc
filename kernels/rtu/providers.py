"""The implementations the RTU is measured against, each taking the collector's inputs (x, nu_log,
theta_log, map1, map2, resets; see naive.py for the maps) and returning y [B, T, 2H].

- cortex: Cortex's Triton RTU (streaming-diagonal `rtu_stream_diag_triton`, low-rank
  `rtu_sequence_triton`), as its benchmark calls them: SiLU, zero initial state. The diagonal one
  also returns the eligibility traces of Cortex's streaming credit assignment, which it computes
  whether asked or not; they are part of its time.
- cortex_torch: Cortex's PyTorch RTU (`rtu_stream_diag_pytorch`; for low-rank maps the full-rank
  `rtu_stream_full_pytorch` with W = U @ V, its only PyTorch path for input matrices), a Python
  loop over time.
- compile: torch.compile of a log-depth scan in plain PyTorch, state in fp32.
- accelerated_scan: a real first-order scan (gates a_t, tokens b_t). The RTU's transition is a
  complex rotation, which no real gate expresses; in the frame that turns with it,
  w_t = e^{-i theta t} c_t, it is real: w_t = r keep_t w_{t-1} + e^{-i theta t} gamma u_t. So the
  inputs are turned by -theta t, the real and imaginary parts scanned with the gates r * keep
  (a reset is a zero gate), and the result turned back (phases theta * t in float64, so that
  long sequences keep their angle). The backward's gradient for theta_log sums terms as large as
  t * |c| that cancel down to |c| / (1 - r): in fp32 it loses about log10(T) digits, which is this
  formulation's error, not the scan's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import Unavailable, compiled

from .._lib.scan import first_order_complex, log_scan
from . import rtu, rtu_lowrank
from .naive import injections, is_diagonal, lowrank_factors

# Cortex's PyTorch RTU launches some 40 kernels a time step, forward and backward alike: beyond this
# many steps one call takes seconds, and its rows at T <= 2048 already give the comparison
CORTEX_TORCH_MAX_STEPS = 2048


def triton(x, nu_log, theta_log, map1, map2, resets=None):
    if is_diagonal(map1):
        return rtu(x, nu_log, theta_log, map1, map2, resets)
    (U1, V1), (U2, V2) = lowrank_factors(map1), lowrank_factors(map2)
    return rtu_lowrank(x, nu_log, theta_log, U1, U2, V1, V2, resets)


def _cortex_call(x, nu_log, theta_log, resets):
    """The keywords every Cortex RTU takes: SiLU, a zero initial state."""
    h0 = torch.zeros(x.shape[0], nu_log.shape[0], device=x.device, dtype=x.dtype)
    return dict(x_btd=x, nu_log=nu_log, theta_log=theta_log, activation_name="SiLU", hc1_init_bh=h0,
                hc2_init_bh=h0, resets_bt=resets)


def cortex(x, nu_log, theta_log, map1, map2, resets=None):
    common = _cortex_call(x, nu_log, theta_log, resets)
    if is_diagonal(map1):
        from cortex.kernels.triton.rtu import rtu_stream_diag_triton

        return rtu_stream_diag_triton(w1=map1, w2=map2, **common)[0]
    from cortex.kernels.triton.rtu.lowrank import rtu_sequence_triton

    (U1, V1), (U2, V2) = lowrank_factors(map1), lowrank_factors(map2)
    return rtu_sequence_triton(U1=U1, U2=U2, V1=V1, V2=V2, **common)[0]


def cortex_torch(x, nu_log, theta_log, map1, map2, resets=None):
    if x.shape[1] > CORTEX_TORCH_MAX_STEPS:
        raise Unavailable(f"Cortex's PyTorch RTU loops over time (some 40 launches a step): measured up to "
                          f"T={CORTEX_TORCH_MAX_STEPS}")
    from cortex.kernels.pytorch.rtu import rtu_stream_diag_pytorch, rtu_stream_full_pytorch

    common = _cortex_call(x, nu_log, theta_log, resets)
    if is_diagonal(map1):
        return rtu_stream_diag_pytorch(w1=map1, w2=map2, **common)[0]
    (U1, V1), (U2, V2) = lowrank_factors(map1), lowrank_factors(map2)
    return rtu_stream_full_pytorch(Wc1=U1 @ V1, Wc2=U2 @ V2, **common)[0]


def _gates(nu_log, theta_log):
    """(r, theta, gamma) in fp32."""
    r = torch.exp(-torch.exp(nu_log.float()))
    return r, torch.exp(theta_log.float()), torch.sqrt(torch.clamp(1.0 - r * r, min=0.0))


def _keep(resets, x):
    """[B, T, 1] fp32: 0 at a reset, else 1 (None: no resets)."""
    return None if resets is None else (~resets).to(torch.float32)[..., None]


def log_depth(x, nu_log, theta_log, map1, map2, resets=None):
    """The recurrence as a parallel scan of (transition, input) pairs over time, in PyTorch."""
    u1, u2 = (u.float() for u in injections(x, map1, map2))
    r, theta, gamma = _gates(nu_log, theta_log)
    ar = (r * torch.cos(theta)).expand_as(u1)
    ai = (r * torch.sin(theta)).expand_as(u1)
    keep = _keep(resets, x)
    if keep is not None:
        ar, ai = ar * keep, ai * keep
    _, _, c1, c2 = log_scan(first_order_complex.fn, (ar, ai, gamma * u1, gamma * u2), dim=1)
    return F.silu(torch.cat([c1, c2], dim=-1)).to(x.dtype)


compile_scan = compiled(log_depth)


def rotating_frame(scan, x, nu_log, theta_log, map1, map2, resets=None):
    """The RTU through `scan(gates, tokens)`, a real first-order scan over the last axis of
    [B, C, T] tensors (see the module docstring)."""
    u1, u2 = (u.float() for u in injections(x, map1, map2))
    r, theta, gamma = _gates(nu_log, theta_log)
    steps = torch.arange(x.shape[1], device=x.device, dtype=torch.float64)
    phase = steps[:, None] * theta.double()[None, :]  # [T, H]
    cos, sin = torch.cos(phase).float(), torch.sin(phase).float()
    v1 = gamma * (u1 * cos + u2 * sin)  # (u1 + i u2) e^{-i theta t}
    v2 = gamma * (u2 * cos - u1 * sin)
    gates = r.expand_as(u1) if resets is None else r * _keep(resets, x)
    H = u1.shape[2]
    tokens = torch.cat([v1, v2], dim=-1).transpose(1, 2).contiguous()  # [B, 2H, T]
    w = scan(torch.cat([gates, gates], dim=-1).transpose(1, 2).contiguous(), tokens).transpose(1, 2)
    w1, w2 = w[..., :H], w[..., H:]
    c1 = w1 * cos - w2 * sin  # w e^{i theta t}
    c2 = w1 * sin + w2 * cos
    return F.silu(torch.cat([c1, c2], dim=-1)).to(x.dtype)


def accelerated_scan(x, nu_log, theta_log, map1, map2, resets=None):
    from accelerated_scan.scalar import scan

    return rotating_frame(scan, x, nu_log, theta_log, map1, map2, resets)
