"""GEGLU: c = gelu_tanh(a) * b, the gate of Gemma-style MLPs (a = x @ W_gate, b = x @ W_up), with
the tanh approximation as Liger's GEGLU and Gemma use.

`geglu(a, b)` is differentiable; `geglu_forward` / `geglu_backward` are the raw launches, each
with `config=None` (config.pick's choice) or a GEGLUConfig to force."""
from __future__ import annotations

import torch

from .._host.gated import check_pair, gated_function
from .config import GEGLUConfig, pick
from .bwd import geglu_backward
from .fwd import geglu_forward

__all__ = ["GEGLUConfig", "GEGLUFunction", "geglu", "geglu_backward", "geglu_forward", "pick"]


GEGLUFunction = gated_function("GEGLUFunction", geglu_forward, geglu_backward)


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_pair(a, b)
    return GEGLUFunction.apply(a, b)
