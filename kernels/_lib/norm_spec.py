"""What the specs of the row normalisations share (rms_norm, add_rms_norm, layer_norm): the modes,
the providers around ours (eager, torch.compile, Liger, QuACK and other peers), the cost model's form,
the dtypes, and the rows QuACK's kernels refuse. Each op's spec gives its numbers and says where they come from."""
from __future__ import annotations

from typing import Callable

import torch

from kcollect.spec import KernelSpec, Provider, Shape, Unavailable, peer_available, standard_providers

# M = tokens, N = hidden size. A smoke run in seconds on the CPU's interpreter: the wide-row paths
# are timed in each op's full grid and checked by its tests on small forced configs.
QUICK = (
    Shape.rows(16, 256, "tiny, power of two: several rows a program"),
    Shape.rows(7, 1000, "awkward: rows and width not powers of two, tail masked"),
)


def norm_spec(name: str, description: str, *, fn: Callable, eager: Callable, liger: Callable, config_of: Callable,
              reference: Callable, make_inputs: Callable, grad_inputs: tuple[str, ...],
              full: tuple[Shape, ...], traffic: dict[str, tuple[int, int, int]],
              flops_per: dict[str, int], tolerance: dict, peers: tuple[Provider, ...] = (),
              quack: Callable | None = None) -> KernelSpec:
    """The spec of a normalisation over the last dimension of [M, N] rows, timed on QUICK and `full`.
    `traffic` per mode (fwd, bwd): (elements per M*N, elements per N, bytes per row), i.e.
    (a*M*N + b*N) * itemsize + c*M bytes; `flops_per` element and mode (fwd, bwd); fwd+bwd is the
    sum of the two in both. `quack`: the provider calling QuACK's kernel (CuTe DSL: a Hopper or
    newer GPU, Python 3.12), gated on the package importing."""

    def bytes_moved(dims, dtype, mode) -> int:
        m, n = dims["M"], dims["N"]
        return sum((a * m * n + b * n) * dtype.itemsize + c * m for a, b, c in (traffic[p] for p in _passes(mode)))

    def flops(dims, mode) -> float:
        return float(sum(flops_per[p] for p in _passes(mode)) * dims["M"] * dims["N"])

    return KernelSpec(
        name=name,
        description=description,
        modes=("fwd", "bwd", "fwd+bwd"),
        providers=standard_providers(fn, eager, config_of) + peers
        + (Provider("liger", liger, peer_available("liger_kernel")),)
        + ((Provider("quack", quack, peer_available("quack")),) if quack else ()),
        baseline="torch",
        reference=reference,
        make_inputs=make_inputs,
        grad_inputs=grad_inputs,
        grids={"quick": QUICK, "full": full},
        bytes_moved=bytes_moved,
        flops=flops,
        bound="memory",
        tolerance=tolerance,
        dtypes=(torch.bfloat16, torch.float16, torch.float32),
    )


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
