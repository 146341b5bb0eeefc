"""What the collector needs to measure softmax: providers, the float64 reference, inputs, grids, the
cost model and the tolerance."""
from __future__ import annotations

import torch

from kcollect.spec import MODES, KernelSpec, Provider, Unavailable, peer_available, standard_providers

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of, per_element_cost
from . import pick_backward, pick_forward, softmax
from .naive import reference


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def softmax_eager(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def softmax_liger(x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    try:
        return LigerSoftmaxFunction.apply(x)
    except RuntimeError as e:
        # Liger keeps the whole row in registers and refuses wider rows itself ("n = 128256 exceeds
        # the recommended Triton blocksize = 65536"): a shape it does not take, not a failure
        if "exceeds the recommended Triton blocksize" in str(e):
            raise Unavailable(f"Liger's softmax refuses this row width: {e}") from None
        raise


def softmax_quack(x: torch.Tensor) -> torch.Tensor:
    import quack

    return quack.softmax(x)


# ---------------------------------------------------------------------------------------------
# Inputs


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # logits / attention scores: each row with its own spread (std 1 to 4), so some rows are flat
    # and some are dominated by a few entries
    x = torch.randn(m, n, generator=g) * (1.0 + 3.0 * torch.rand(m, 1, generator=g))
    return {"x": x.to(device=device, dtype=dtype)}


def config_of(inputs) -> dict:
    x = inputs["x"]
    M, N = x.reshape(-1, x.shape[-1]).shape
    return config_record(fwd=pick_forward(M, N, x.dtype, x.device), bwd=pick_backward(M, N, x.dtype, x.device))


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = element size):
#   fwd:      read x; write y                -> 2 * M * N * s
#   bwd:      read y, dy; write dx           -> 3 * M * N * s
#   fwd+bwd:  the sum of the two             -> 5 * M * N * s
# The register and coop paths move exactly this; the lines, stream and split paths read each row
# twice, the second time mostly from L2. FLOPs per element: fwd 5 (max, subtract, exp, sum,
# scale), bwd 4 (product, sum, subtract, product).


bytes_moved, flops = per_element_cost({"fwd": 2, "bwd": 3, "fwd+bwd": 5}, {"fwd": 5, "bwd": 4, "fwd+bwd": 9})


SPEC = KernelSpec(
    name="softmax", modes=MODES, baseline="torch", bound="memory",
    description="row softmax over the last dim (rows up to 262144 wide), forward and backward", reference=reference,
    make_inputs=make_inputs, grad_inputs=("x",), grids=grids_of(__file__), bytes_moved=bytes_moved, flops=flops,
    dtypes=FLOATS,
    providers=standard_providers(softmax, softmax_eager, config_of)
    + (Provider("liger", softmax_liger, peer_available("liger_kernel")),
       Provider("quack", softmax_quack, peer_available("quack"))),
    # One rounding of the output to the storage dtype; the backward also inherits the rounding of
    # the saved y. Measured on the CPU: bf16 <= 4.7e-3 fwd, 8.1e-3 bwd for ours (the interpreter
    # truncates on every cast, ~2x round-to-nearest) and 4.6e-3 for PyTorch's; fp16 <= 5.6e-4;
    # fp32 <= 3e-7 for ours, 2e-6 for PyTorch's CPU kernel (its vectorised exp) forward; PyTorch's
    # fp32 backward at 40000-wide rows reached 1.01e-5 in CI (y * (dy - sum(dy * y)) cancels: the
    # error grows with the row), so fp32 allows 4e-5: 250x under a 1% mistake.
    tolerance={torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 4e-5})
