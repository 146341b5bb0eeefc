"""What the collector needs to measure swiglu: providers, the float64 reference, grids and FLOPs;
the rest (inputs, quick grid, cost model, tolerance) is shared with geglu (_lib/gated.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import Shape

from .._lib.gated import gated_spec
from . import pick, swiglu


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def swiglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plain maths in float64 (the tests import it)."""
    return a / (1.0 + torch.exp(-a)) * b


# M = tokens, N = intermediate size of the MLP
_s = Shape.rows
FULL = (
    _s(1, 14336, "a single token (decode): launch latency dominates"),
    _s(1024, 5632, "TinyLlama-1.1B MLP, short batch"),
    _s(4096, 11008, "LLaMA-2-7B MLP"),
    _s(4096, 14336, "LLaMA-3-8B / Mistral-7B MLP"),
    _s(8192, 14336, "LLaMA-3-8B MLP, 8k tokens"),
    _s(16384, 14336, "LLaMA-3-8B MLP, 16k tokens: the largest, far beyond L2"),
    _s(3000, 13824, "awkward token count, Qwen-14B-like intermediate size"),
    _s(2048, 28672, "LLaMA-3-70B MLP"),
)

SPEC = gated_spec(
    "swiglu", "silu(a) * b, the gated MLP activation, forward and backward", swiglu, swiglu_eager, swiglu_liger,
    reference, FULL, flops_per={"fwd": 6, "bwd": 12, "fwd+bwd": 18}, pick=pick)
