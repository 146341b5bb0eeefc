"""What the specs of the gated MLP activations share (swiglu: silu(a) * b, geglu: gelu_tanh(a) * b,
a = x @ W_gate, b = x @ W_up): the inputs, the config each row records, the traffic of the cost
model and the tolerance. Each op's spec.py declares its KernelSpec with them."""
from __future__ import annotations

import torch

from .._host.config import config_record
from .kit import drawn_on_device


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (dims["M"], dims["N"])
    a = torch.randn(shape, generator=g, dtype=torch.float32) * 2.0  # gate pre-activations span the curve and both tails
    b = torch.randn(shape, generator=g, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


# Cost model (minimum traffic; each input read once, each output written once), in M x N tensors:
#   fwd:      read a, b; write c                  -> 3
#   bwd:      read dc, a, b; write da, db         -> 5
#   fwd+bwd:  the two passes                      -> 8
# FLOPs are negligible next to the bytes (an exp and a few multiply-adds per element).
BYTES_PER = {"fwd": 3, "bwd": 5, "fwd+bwd": 8}

# About 2-3x the error one rounding of each output gives (bf16 eps 2^-8, fp16 2^-11; the CPU
# interpreter truncates instead of rounding, which doubles it: measured 4e-3 bf16, 3e-4 fp16
# for geglu), so a 1% systematic error fails. Eager and Liger round the activation (Liger
# also dc * b) before the multiply: 2-3 roundings, still well inside on the GPU. fp32:
# exp/reciprocal rounding (3e-7).
TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}


def config_of(pick):
    """The spec's config_of for an op whose elementwise launch `pick(numel, device)` chooses: the
    launch our call makes, recorded with each row."""

    def config(inputs) -> dict:
        return config_record(elementwise=pick(inputs["a"].numel(), inputs["a"].device))

    return config
