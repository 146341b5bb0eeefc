"""What the collector needs to measure swiglu: the providers, the float64 reference, inputs, grids,
the cost model and the tolerance (inputs, traffic and tolerance are the gated activations', shared
with geglu: kernels/_spec/gated.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, peer_available, standard_providers

from .._spec import gated
from .._spec.kit import FLOATS, grids_of, per_element_cost
from . import pick, swiglu
from .naive import reference


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def swiglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


# Cost model: the gated activations' traffic (gated.BYTES_PER: M x N tensors a mode); FLOPs per
# element, rough (an exp and a few multiply-adds): negligible next to the bytes.
bytes_moved, flops = per_element_cost(gated.BYTES_PER, {"fwd": 6, "bwd": 12, "fwd+bwd": 18})

SPEC = KernelSpec(
    name="swiglu", modes=MODES, baseline="torch", bound="memory",
    description="silu(a) * b, the gated MLP activation, forward and backward", reference=reference,
    make_inputs=gated.make_inputs, grad_inputs=("a", "b"), grids=grids_of(__file__), bytes_moved=bytes_moved,
    flops=flops, dtypes=FLOATS,
    providers=standard_providers(swiglu, swiglu_eager, gated.config_of(pick))
    + (Provider("liger", swiglu_liger, peer_available("liger_kernel")),),
    tolerance=gated.TOLERANCE)
