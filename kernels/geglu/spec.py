"""What the collector needs to measure geglu: providers, the float64 reference, grids and FLOPs;
the rest (inputs, quick grid, cost model, tolerance) is shared with swiglu (_lib/gated.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._lib.gated import gated_spec
from .._lib.spec_kit import grids_of
from . import geglu, pick


def geglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh") * b


def geglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Liger's backward writes da and db over its saved a and b (in place, to save memory).
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    return LigerGELUMulFunction.apply(a, b)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plain maths in float64 (the tests import it)."""
    gelu = 0.5 * a * (1.0 + torch.tanh(0.7978845608028654 * (a + 0.044715 * a**3)))  # sqrt(2/pi)
    return gelu * b


FULL = grids_of(__file__)["full"]  # grids.toml beside this file

SPEC = gated_spec(
    "geglu", "gelu_tanh(a) * b, the GEGLU gated MLP activation, forward and backward", geglu, geglu_eager,
    geglu_liger, reference, FULL, flops_per={"fwd": 9, "bwd": 16, "fwd+bwd": 25}, pick=pick)
