"""Mamba-1's selective scan in Triton, forward and backward (semantics in scan.py).

`selective_scan(x, delta, A, B, C, D, z)`: x, delta (before softplus), z [B, T, D]; A [D, N];
B, C [B, T, N] (one per step, shared by the channels); D [D]. Returns y [B, T, D] like x, the
state kept in fp32 whatever the inputs' dtype. `config=None` takes config.pick's choice;
`selective_scan_forward` / `selective_scan_backward` are the raw launches.
"""
from __future__ import annotations

import torch

from .._host.scan import KeptStates
from .config import SelectiveScanConfig, pick
from .scan import selective_scan_backward, selective_scan_forward

__all__ = ["SelectiveScanConfig", "pick", "selective_scan", "selective_scan_backward", "selective_scan_forward"]


def _check(x, delta, A, B, C, D, z) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, D]; got {tuple(x.shape)}")
    Bsz, T, Dm = x.shape
    N = A.shape[-1]
    want = {"delta": (delta, (Bsz, T, Dm)), "z": (z, (Bsz, T, Dm)), "A": (A, (Dm, N)), "B": (B, (Bsz, T, N)),
            "C": (C, (Bsz, T, N)), "D": (D, (Dm,))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} for x {list(x.shape)} and A {list(A.shape)}; "
                             f"got {list(t.shape)}")


def selective_scan(x, delta, A, B, C, D, z, config: SelectiveScanConfig | None = None) -> torch.Tensor:
    _check(x, delta, A, B, C, D, z)
    tensors = tuple(t.contiguous() for t in (x, delta, A, B, C, D, z))
    config = config or pick(x.shape[0], x.shape[1], x.shape[2], A.shape[1], x.device)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return KeptStates.apply(selective_scan_forward, selective_scan_backward, config, *tensors)
    return selective_scan_forward(*tensors, config)[0]
