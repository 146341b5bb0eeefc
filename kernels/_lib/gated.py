"""What the specs of the gated MLP activations share (swiglu: silu(a) * b, geglu: gelu_tanh(a) * b,
a = x @ W_gate, b = x @ W_up): inputs, the quick grid, the cost model, the tolerance and the
providers (ours, eager, torch.compile, Liger)."""
from __future__ import annotations

from typing import Callable

import torch

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .config import config_record
from .spec_kit import drawn_on_device, per_element_cost


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (dims["M"], dims["N"])
    a = torch.randn(shape, generator=g, dtype=torch.float32) * 2.0  # gate pre-activations span the curve and both tails
    b = torch.randn(shape, generator=g, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


# M = tokens, N = intermediate size of the MLP
QUICK = (
    Shape.rows(64, 1024, "small, power of two"),
    Shape.rows(37, 1000, "awkward: rows and width not powers of two, tail block masked"),
    Shape.rows(1, 4099, "one row, width one past a power of two"),
)


# Cost model (minimum traffic; each input read once, each output written once):
#   fwd:      read a, b; write c                  -> 3 * M * N * s
#   bwd:      read dc, a, b; write da, db         -> 5 * M * N * s
#   fwd+bwd:  the two passes                      -> 8 * M * N * s
# FLOPs are negligible next to the bytes (an exp and a few multiply-adds per element).
BYTES_PER = {"fwd": 3, "bwd": 5, "fwd+bwd": 8}


def gated_spec(name: str, description: str, fn: Callable, eager: Callable, liger: Callable, reference: Callable,
               full: tuple[Shape, ...], flops_per: dict[str, int], pick: Callable) -> KernelSpec:
    """The spec of a gated activation `fn(a, b)`; `flops_per` element per mode, `pick` the op's
    elementwise config heuristic (recorded with each row)."""

    def config_of(inputs) -> dict:
        return config_record(elementwise=pick(inputs["a"].numel(), inputs["a"].device))

    bytes_moved, flops = per_element_cost(BYTES_PER, flops_per)

    return KernelSpec(
        name=name,
        description=description,
        modes=("fwd", "bwd", "fwd+bwd"),
        providers=standard_providers(fn, eager, config_of)
        + (Provider("liger", liger, peer_available("liger_kernel")),),
        baseline="torch",
        reference=reference,
        make_inputs=make_inputs,
        grad_inputs=("a", "b"),
        grids={"quick": QUICK, "full": full},
        bytes_moved=bytes_moved,
        flops=flops,
        bound="memory",
        # About 2-3x the error one rounding of each output gives (bf16 eps 2^-8, fp16 2^-11; the CPU
        # interpreter truncates instead of rounding, which doubles it: measured 4e-3 bf16, 3e-4 fp16
        # for geglu), so a 1% systematic error fails. Eager and Liger round the activation (Liger
        # also dc * b) before the multiply: 2-3 roundings, still well inside on the GPU. fp32:
        # exp/reciprocal rounding (3e-7).
        tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
        dtypes=(torch.bfloat16, torch.float16, torch.float32),
    )
