"""What the collector needs to measure swiglu: providers, the float64 reference, grids and FLOPs;
the rest (inputs, quick grid, cost model, tolerance) is shared with geglu (_lib/gated.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._lib.gated import gated_spec
from .._lib.spec_kit import grids_of
from . import pick, swiglu


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def swiglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plain maths in float64 (the tests import it)."""
    return a / (1.0 + torch.exp(-a)) * b


FULL = grids_of(__file__)["full"]  # grids.toml beside this file

SPEC = gated_spec(
    "swiglu", "silu(a) * b, the gated MLP activation, forward and backward", swiglu, swiglu_eager, swiglu_liger,
    reference, FULL, flops_per={"fwd": 6, "bwd": 12, "fwd+bwd": 18}, pick=pick)
