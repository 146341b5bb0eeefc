"""The implementations the RTU is measured against, each taking the collector's inputs (x, nu_log,
theta_log, map1, map2, resets; see naive.py for the maps) and returning y [B, T, 2H].

Every provider gets the inputs as mixed-precision training holds them: activations and input maps in
the run's dtype, the decay parameters nu_log and theta_log in fp32. Cortex's low-rank backward (both
its Triton and its PyTorch path) multiplies an fp32 intermediate with a bf16 input there and raises
("expected scalar type BFloat16 but found Float"): those rows are errors with Cortex's own message.

- cortex: Cortex's Triton RTU (streaming-diagonal `rtu_stream_diag_triton`, low-rank
  `rtu_sequence_triton`), as its benchmark calls them: SiLU, zero initial state. The diagonal one
  also returns the eligibility traces of Cortex's streaming credit assignment, which it computes
  whether asked or not; they are part of its time.
- cortex_torch: Cortex's PyTorch RTU (`rtu_stream_diag_pytorch`; for low-rank maps the full-rank
  `rtu_stream_full_pytorch` with W = U @ V, its only PyTorch path for input matrices), a Python
  loop over time.
- compile: torch.compile of a log-depth scan in plain PyTorch, state in fp32.
- accelerated_scan: its complex first-order scan (`accelerated_scan.complex.scan`, Triton, forward
  and backward; the package's real one, `scalar.scan`, cannot turn the state), with gates
  lambda * keep (a reset is a zero gate) and tokens gamma * u: it applies to every shape, the
  input maps and the SiLU done in PyTorch around it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import Unavailable, compiled

from .._jit.scan import first_order_complex
from .._spec.scans import log_scan
from . import rtu, rtu_lowrank
from .naive import injections, is_diagonal, lowrank_factors

# Cortex's PyTorch RTU launches some 40 kernels a time step, forward and backward alike: beyond this
# many steps one call takes seconds (at T = 2048 on an H100 its two shapes' rows took 150 s of a warm
# full grid's collection), and its rows at Cortex's configs and the T = 1024 training shape already
# give the comparison
CORTEX_TORCH_MAX_STEPS = 1024


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


def log_depth(x, nu_log, theta_log, map1, map2, resets=None):
    """The recurrence as a parallel scan of (transition, input) pairs over time, in PyTorch."""
    u1, u2 = (u.float() for u in injections(x, map1, map2))
    r, theta, gamma = _gates(nu_log, theta_log)
    ar = (r * torch.cos(theta)).expand_as(u1)
    ai = (r * torch.sin(theta)).expand_as(u1)
    if resets is not None:
        keep = (~resets).to(torch.float32)[..., None]
        ar, ai = ar * keep, ai * keep
    _, _, c1, c2 = log_scan(first_order_complex.fn, (ar, ai, gamma * u1, gamma * u2), dim=1)
    return F.silu(torch.cat([c1, c2], dim=-1)).to(x.dtype)


compile_scan = compiled(log_depth)


def through_scan(scan, x, nu_log, theta_log, map1, map2, resets=None):
    """The RTU through `scan(gates, tokens)`, a complex first-order scan over the last axis of
    [B, H, T] complex64 tensors: gates lambda * keep (a reset is a zero gate), tokens gamma * u."""
    u1, u2 = (u.float() for u in injections(x, map1, map2))
    r, theta, gamma = _gates(nu_log, theta_log)
    lam = torch.polar(r, theta)[None, :, None]
    gates = lam.expand(x.shape[0], -1, x.shape[1]) if resets is None else lam * (~resets)[:, None, :]
    tokens = (torch.complex(u1, u2) * gamma).transpose(1, 2)
    c = scan(gates.contiguous(), tokens.contiguous()).transpose(1, 2)
    return F.silu(torch.cat([c.real, c.imag], dim=-1)).to(x.dtype)


def accelerated_scan(x, nu_log, theta_log, map1, map2, resets=None):
    from accelerated_scan.complex import scan

    return through_scan(scan, x, nu_log, theta_log, map1, map2, resets)
