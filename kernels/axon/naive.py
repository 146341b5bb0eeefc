"""AxonLayer in plain PyTorch: the SRHT by its butterfly, then the RTU one step at a time with its
eligibility traces. In float64 the reference the collector gates on (the spec's eager provider
runs it in the inputs' dtype; the tests import it)."""
from __future__ import annotations

import math

import torch

from .._spec.cells import keep_factor


def fwht_srht(x, signs, perm):
    """SRHT(x) by the butterfly (Cortex's srht_pytorch): permute, sign, Walsh-Hadamard, 1/sqrt(H)."""
    H = x.shape[-1]
    y = (x[..., perm] * signs).reshape(-1, H)
    h = 1
    while h < H:
        pairs = y.view(y.shape[0], -1, 2, h)
        y = torch.cat((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=-1).view(-1, H)
        h *= 2
    return (y / math.sqrt(H)).view(x.shape)


def step_loop(x, w_lin, b_lin, w_out, b_out, nu_log, theta_log, w1, w2, signs, perm, resets=None):
    """AxonLayer on a fresh state as a PyTorch user writes it: the SRHT, then the RTU one step at a
    time (with its eligibility traces, which carry no gradient), then the two linear maps. In
    float64 it is the reference."""
    B, T, H = x.shape
    xhat = fwht_srht(x, signs, perm)
    g, phi, gamma, e_nu, r, theta = _dynamics(nu_log, theta_log, x.dtype)
    c1 = c2 = x.new_zeros(B, H)
    e = [x.new_zeros(B, H) for _ in range(8)]
    outs = []
    xs = xhat.unbind(1)  # views taken once: the backward of xhat[:, t] would fill an xhat-sized zero tensor a step
    for t in range(T):
        keep = keep_factor(resets, t, x)
        if keep is not None:
            c1, c2, e = c1 * keep, c2 * keep, [v * keep for v in e]
        u1, u2 = w1 * xs[t], w2 * xs[t]
        with torch.no_grad():
            e = _traces(e, c1, c2, u1, u2, xs[t], g, phi, gamma, e_nu, r, theta)
        c1, c2 = g * c1 - phi * c2 + gamma * u1, g * c2 + phi * c1 + gamma * u2
        outs.append(torch.cat((c1, c2), -1))
    y = x @ w_lin.t() + b_lin + torch.stack(outs, 1) @ w_out.t() + b_out
    return y, torch.stack([c1, c2] + e).detach()


def _dynamics(nu_log, theta_log, dtype):
    """(g, phi, gamma, exp(nu_log), r, theta) computed in fp32 at least, then in the inputs' dtype: in
    bf16 a radius within 2^-9 of 1 rounds to 1 and gamma = sqrt(1 - r^2) to 0 (whose traces divide by it)."""
    wide = torch.promote_types(dtype, torch.float32)
    e_nu, theta = torch.exp(nu_log.to(wide)), torch.exp(theta_log.to(wide))
    r = torch.exp(-e_nu)
    out = r * torch.cos(theta), r * torch.sin(theta), torch.sqrt(torch.clamp(1 - r * r, min=0.0)), e_nu, r, theta
    return tuple(v.to(dtype) for v in out)


def _traces(e, c1, c2, u1, u2, xhat, g, phi, gamma, e_nu, r, theta):
    """One step of the forward-mode derivatives of (c1, c2) with respect to nu_log, theta_log, w1, w2
    (the test checks them against torch.func.jvp)."""
    g, phi, gamma, e_nu, r, theta = (v.detach() for v in (g, phi, gamma, e_nu, r, theta))
    c1, c2, u1, u2, xhat = (v.detach() for v in (c1, c2, u1, u2, xhat))
    dg_nu, dphi_nu, dgamma_nu = -e_nu * g, -e_nu * phi, e_nu * r * r / gamma.clamp(min=torch.finfo(gamma.dtype).tiny)
    dg_th, dphi_th = -phi * theta, g * theta
    enu1, enu2, eth1, eth2, ew11, ew12, ew21, ew22 = e
    return [dg_nu * c1 + g * enu1 - dphi_nu * c2 - phi * enu2 + dgamma_nu * u1,
            dg_nu * c2 + g * enu2 + dphi_nu * c1 + phi * enu1 + dgamma_nu * u2,
            dg_th * c1 + g * eth1 - dphi_th * c2 - phi * eth2,
            dg_th * c2 + g * eth2 + dphi_th * c1 + phi * eth1,
            g * ew11 - phi * ew12 + gamma * xhat, g * ew12 + phi * ew11,
            g * ew21 - phi * ew22, g * ew22 + phi * ew21 + gamma * xhat]


def reference(**inputs):
    """Plain maths in float64 (the tests import it)."""
    return step_loop(**inputs)
