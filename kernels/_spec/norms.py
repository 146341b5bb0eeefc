"""What the specs of the row normalisations share (rms_norm, add_rms_norm, layer_norm): the providers
around ours (eager, torch.compile, Liger, QuACK and other peers), the cost model's form, and the rows
QuACK's kernels refuse. Each op's spec.py declares its KernelSpec with them and says where its numbers
come from."""
from __future__ import annotations

from typing import Callable

import torch

from kcollect.spec import Provider, Unavailable, peer_available, standard_providers


def norm_providers(fn: Callable, eager: Callable, config_of: Callable, liger: Callable,
                   quack: Callable | None = None, peers: tuple[Provider, ...] = ()) -> tuple[Provider, ...]:
    """Ours, eager and torch.compile, then `peers`, Liger and (where given) QuACK: its CuTe DSL
    needs a Hopper or newer GPU and Python 3.12, so the provider is gated on the package importing."""
    return (standard_providers(fn, eager, config_of) + peers
            + (Provider("liger", liger, peer_available("liger_kernel")),)
            + ((Provider("quack", quack, peer_available("quack")),) if quack else ()))


def norm_cost(traffic: dict[str, tuple[int, int, int]], flops_per: dict[str, int]):
    """(bytes_moved, flops) of a normalisation over the last dimension of [M, N] rows. `traffic` per
    pass (fwd, bwd): (elements per M*N, elements per N, bytes per row), i.e. (a*M*N + b*N) *
    itemsize + c*M bytes; `flops_per` element and pass; fwd+bwd is the sum of the two in both."""

    def bytes_moved(dims, dtype, mode) -> int:
        m, n = dims["M"], dims["N"]
        return sum((a * m * n + b * n) * dtype.itemsize + c * m for a, b, c in (traffic[p] for p in _passes(mode)))

    def flops(dims, mode) -> float:
        return float(sum(flops_per[p] for p in _passes(mode)) * dims["M"] * dims["N"])

    return bytes_moved, flops


def _passes(mode: str) -> tuple[str, ...]:
    return {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd", "bwd")}[mode]


# QuACK's norm backward (quack.rmsnorm.RMSNormBackward, LayerNorm's too) stages a row in shared memory
# and raises ValueError for rows over 128K elements of a 32-bit type.
QUACK_BWD_MAX_N_32BIT = 128 * 1024


def quack_refusals(x: torch.Tensor, *params: torch.Tensor) -> None:
    """Raise Unavailable for the rows QuACK's norm kernels refuse (x and the tensors the gradient
    flows to), before they get to raise their own errors."""
    n = x.shape[-1]
    needs_bwd = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params))
    if needs_bwd and x.dtype.itemsize >= 4 and n > QUACK_BWD_MAX_N_32BIT:
        raise Unavailable(f"QuACK's norm backward holds at most {QUACK_BWD_MAX_N_32BIT} elements of a 32-bit "
                          f"row in shared memory: got {n} ({x.dtype})")
