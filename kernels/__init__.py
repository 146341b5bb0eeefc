"""The kernel registry: an explicit tuple of specs, one per kernel file.

Importing this package defines Triton kernels, so whoever wants Triton's CPU interpreter must set
TRITON_INTERPRET=1 before the first import (the CLI and tests/conftest.py do).
"""
from __future__ import annotations

from kcollect.spec import KernelSpec

from . import (add_rms_norm, cross_entropy, fp8_quant, fused_linear_cross_entropy, geglu, gelu, layer_norm,
               rms_norm, rope, softmax, swiglu)

SPECS: tuple[KernelSpec, ...] = (
    rms_norm.SPEC,
    swiglu.SPEC,
    cross_entropy.SPEC,
    gelu.SPEC,
    geglu.SPEC,
    rope.SPEC,
    fp8_quant.SPEC,
    layer_norm.SPEC,
    softmax.SPEC,
    add_rms_norm.SPEC,
    fused_linear_cross_entropy.SPEC,
)


def names() -> tuple[str, ...]:
    return tuple(s.name for s in SPECS)


def get(name: str) -> KernelSpec:
    for s in SPECS:
        if s.name == name:
            return s
    raise KeyError(f"unknown kernel {name!r}; known: {', '.join(names())}")
