"""What the collector needs to measure swiglu: providers, the float64 reference, inputs, grids, the
cost model and the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import config_record
from . import pick, swiglu


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def swiglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plain maths in float64 (the tests import it)."""
    return a / (1.0 + torch.exp(-a)) * b


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (dims["M"], dims["N"])
    a = torch.randn(shape, generator=g, dtype=torch.float32) * 2.0  # gate pre-activations span the sigmoid
    b = torch.randn(shape, generator=g, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


def config_of(inputs) -> dict:
    return config_record(elementwise=pick(inputs["a"].numel(), inputs["a"].device))


# Shape grids: M = tokens, N = intermediate size of the MLP.
_s = Shape.rows
QUICK = (
    _s(64, 1024, "small, power of two"),
    _s(37, 1000, "awkward: rows and width not powers of two, tail block masked"),
    _s(1, 4099, "one row, width one past a power of two"),
)
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


# Cost model (minimum traffic; each input read once, each output written once):
#   fwd:      read a, b; write c                  -> 3 * M * N * s
#   bwd:      read dc, a, b; write da, db         -> 5 * M * N * s
#   fwd+bwd:  the two passes                      -> 8 * M * N * s
# FLOPs are negligible next to the bytes (a sigmoid and a few multiplies per element).
def bytes_moved(dims, dtype, mode) -> int:
    per = {"fwd": 3, "bwd": 5, "fwd+bwd": 8}[mode]
    return per * dims["M"] * dims["N"] * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 6, "bwd": 12, "fwd+bwd": 18}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="swiglu",
    description="silu(a) * b, the gated MLP activation, forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(swiglu, swiglu_eager, config_of)
    + (Provider("liger", swiglu_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("a", "b"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # About 2-3x the error one rounding of the output gives (bf16 eps 2^-8, fp16 2^-11; the CPU
    # interpreter truncates instead of rounding, which doubles it), so a 1% systematic error fails.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
