"""The RTU in plain PyTorch: the float64 reference the collector and the tests gate on, and the
input maps every provider shares.

An input map is given as one tensor per part (what the spec's inputs call map1, map2): the
diagonal weights w [H] (Cortex's streaming-diagonal RTU), or the low-rank factors stacked as
[2, H, R] = (U, V^T) (Cortex's low-rank RTU: u = x @ U @ V)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def is_diagonal(map1: torch.Tensor) -> bool:
    return map1.dim() == 1


def lowrank_factors(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U [H, R], V [R, H]) of a stacked low-rank map."""
    return m[0], m[1].transpose(0, 1)


def injections(x, map1, map2) -> tuple[torch.Tensor, torch.Tensor]:
    """(u1, u2) [B, T, H]: what each part of the state receives at each step, before gamma."""
    if is_diagonal(map1):
        return x * map1, x * map2
    (U1, V1), (U2, V2) = lowrank_factors(map1), lowrank_factors(map2)
    return (x @ U1) @ V1, (x @ U2) @ V2


def dynamics(nu_log, theta_log):
    """(lambda = r e^{i theta} as a complex tensor, gamma = sqrt(1 - r^2)), r = exp(-exp(nu_log)),
    theta = exp(theta_log): Cortex's parametrisation."""
    r = torch.exp(-torch.exp(nu_log))
    theta = torch.exp(theta_log)
    lam = torch.complex(r * torch.cos(theta), r * torch.sin(theta))
    return lam, torch.sqrt(torch.clamp(1.0 - r * r, min=0.0))


def reference(x, nu_log, theta_log, map1, map2, resets=None):
    """y [B, T, 2H]: step by step, c_t = lambda * c_{t-1} + gamma * (u1_t + i u2_t) from c = 0, the
    state zeroed before a step whose reset is set; y = SiLU of c's real and imaginary parts."""
    u1, u2 = injections(x, map1, map2)
    lam, gamma = dynamics(nu_log, theta_log)
    drive = torch.complex(u1, u2) * gamma
    c = torch.zeros(x.shape[0], x.shape[2], dtype=drive.dtype, device=x.device)
    # the steps as views taken once: the backward of an index drive[:, t] would write its gradient
    # into zeros of drive's whole size at every step (quadratic in T: 73 s for T 4096 on the CPU)
    keeps = (~resets).to(x.dtype).unbind(1) if resets is not None else None
    states = []
    for t, d in enumerate(drive.unbind(1)):
        if keeps is not None:
            c = c * keeps[t][:, None]
        c = lam * c + d
        states.append(c)
    c = torch.stack(states, dim=1)
    return F.silu(torch.cat([c.real, c.imag], dim=-1))
