"""SwiGLU: c = silu(a) * b, the gate of LLaMA-style MLPs (a = x @ W_gate, b = x @ W_up).

`swiglu(a, b)` is differentiable; `swiglu_forward` / `swiglu_backward` are the raw launches, each
with `config=None` (config.pick's choice) or a SwiGLUConfig to force."""
from __future__ import annotations

import torch

from .._host.gated import check_pair, gated_function
from .config import SwiGLUConfig, pick
from .bwd import swiglu_backward
from .fwd import swiglu_forward

__all__ = ["SwiGLUConfig", "SwiGLUFunction", "pick", "swiglu", "swiglu_backward", "swiglu_forward"]


SwiGLUFunction = gated_function("SwiGLUFunction", swiglu_forward, swiglu_backward)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_pair(a, b)
    return SwiGLUFunction.apply(a, b)
