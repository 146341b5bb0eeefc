"""What the collector needs to measure geglu: the providers, the float64 reference, inputs, grids,
the cost model and the tolerance (inputs, traffic and tolerance are the gated activations', shared
with swiglu: kernels/_spec/gated.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, peer_available, standard_providers

from .._spec import gated
from .._spec.kit import FLOATS, grids_of, per_element_cost
from . import geglu, pick
from .naive import reference


def geglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh") * b


def geglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Liger's backward writes da and db over its saved a and b (in place, to save memory).
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    return LigerGELUMulFunction.apply(a, b)


# Cost model: the gated activations' traffic (gated.BYTES_PER: M x N tensors a mode); FLOPs per
# element, rough (the tanh form's polynomial, an exp and a few multiply-adds): negligible next to
# the bytes.
bytes_moved, flops = per_element_cost(gated.BYTES_PER, {"fwd": 9, "bwd": 16, "fwd+bwd": 25})

SPEC = KernelSpec(
    name="geglu", modes=MODES, baseline="torch", bound="memory",
    description="gelu_tanh(a) * b, the GEGLU gated MLP activation, forward and backward", reference=reference,
    make_inputs=gated.make_inputs, grad_inputs=("a", "b"), grids=grids_of(__file__), bytes_moved=bytes_moved,
    flops=flops, dtypes=FLOATS,
    providers=standard_providers(geglu, geglu_eager, gated.config_of(pick))
    + (Provider("liger", geglu_liger, peer_available("liger_kernel")),),
    tolerance=gated.TOLERANCE)
