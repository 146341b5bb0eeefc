"""What the collector needs to measure conv1d: providers, the float64 reference, inputs, grids,
the cost model and the tolerance.

Dims: B, T, F (channels), K (width), groups ('depthwise': one filter a channel, the short conv
of Mamba-style blocks; '1': channel-mixing, Cortex's CausalConv1d), resets (0: no mask given;
1: a mask whose steps are resets with probability p, drawn from the case's seed).

Bound: memory. The depthwise kernels move bytes; the channel-mixing ones are matrix products
(2 B T F^2 K FLOPs in the flops column, so their TFLOP/s and % of matmul peak can be read there),
but one op has one bound and this op is here for its memory-bound member."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, Unavailable, peer_available

from .._host.config import config_record
from .._spec.scans import reset_mask
from .._spec.kit import by_mode, grids_of, sequence_tokens
from . import conv1d, is_depthwise, pick_depthwise, pick_mix
from .naive import eager, reference

DEPTHWISE, MIX = "depthwise", "1"  # the values of the dim "groups"


def make_inputs(dims, dtype, device, seed):
    """Weights and bias scaled as PyTorch's Conv1d initialises them (uniform in +-1/sqrt(fan_in))."""
    g = torch.Generator().manual_seed(seed)
    B, T, Fc, K = dims["B"], dims["T"], dims["F"], dims["K"]
    fan_in = K if dims["groups"] == DEPTHWISE else Fc * K
    shape = (Fc, 1, K) if dims["groups"] == DEPTHWISE else (Fc, Fc, K)
    bound = fan_in ** -0.5
    return {"x": torch.randn(B, T, Fc, generator=g).to(device=device, dtype=dtype),
            "weight": ((torch.rand(shape, generator=g) * 2 - 1) * bound).to(device=device, dtype=dtype),
            "bias": ((torch.rand(Fc, generator=g) * 2 - 1) * bound).to(device=device, dtype=dtype),
            "resets": reset_mask(B, T, float(dims["p"]), g).to(device) if int(dims["resets"]) else None}


def config_of(inputs) -> dict:
    x, w = inputs["x"], inputs["weight"]
    pick = pick_depthwise if is_depthwise(x, w) else pick_mix
    return config_record(conv1d=pick(x.shape[0], x.shape[1], x.shape[2], w.shape[-1], x.device))


def cortex(x, weight, bias=None, resets=None):
    if is_depthwise(x, weight):
        raise Unavailable("Cortex's Triton conv1d takes groups=1 only")
    from cortex.kernels.triton.conv1d import causal_conv1d_triton

    B, T, Fc = x.shape
    state = torch.zeros(B, weight.shape[-1], Fc, device=x.device, dtype=x.dtype)
    if resets is None:  # its kernel needs a mask: none set, as its benchmark passes
        resets = torch.zeros(B, T, device=x.device, dtype=torch.bool)
    return causal_conv1d_triton(state, x, weight, bias, 1, resets)[0]


def cudnn(x, weight, bias=None, resets=None):
    if resets is not None:
        raise Unavailable("F.conv1d has no resets: the speed reference is timed at the same shape with resets=0")
    K, T = weight.shape[-1], x.shape[1]
    groups = x.shape[2] if is_depthwise(x, weight) else 1
    return F.conv1d(x.transpose(1, 2), weight, bias, padding=K - 1, groups=groups)[..., :T].transpose(1, 2)


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model (minimum traffic; s = bytes of an element, Fin = 1 depthwise, F channel-mixing):
#   fwd: read x, W [F, Fin, K], bias; write y              -> (2 B T F + F Fin K + F) s (+ B T resets)
#   bwd: read dy, x, W; write dx, dW, dbias                -> (3 B T F + 2 F Fin K + F) s (+ resets)
# FLOPs: 2 B T F Fin K forward (a multiply-add per tap and input channel); twice that backward
# (dx and dW).
def _fin(dims) -> int:
    return 1 if dims["groups"] == DEPTHWISE else dims["F"]


def bytes_moved(dims, dtype, mode) -> int:
    B, T, Fc, K = dims["B"], dims["T"], dims["F"], dims["K"]
    s, w = dtype.itemsize, Fc * _fin(dims) * K
    resets = B * T if int(dims["resets"]) else 0
    fwd = (2 * B * T * Fc + w + Fc) * s + resets
    bwd = (3 * B * T * Fc + 2 * w + Fc) * s + resets
    return by_mode(mode, fwd, bwd)


def flops(dims, mode) -> float:
    fwd = 2 * dims["B"] * dims["T"] * dims["F"] * _fin(dims) * dims["K"]
    return float(by_mode(mode, fwd, 2 * fwd))


SPEC = KernelSpec(
    name="conv1d", modes=MODES, baseline="eager", bound="memory",
    description="causal conv1d with per-step resets (a reset starts a new window), depthwise or channel-mixing; "
    "cudnn is F.conv1d without resets, the speed reference, measured where the shape has none",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "weight", "bias"), grids=GRIDS,
    tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops, dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", conv1d, config=config_of, ours=True),
        Provider("cortex", cortex, peer_available("cortex")),
        Provider("cudnn", cudnn, builds=False),
        Provider("eager", eager, builds=False),
    ),
    # eager against float64 on the CPU, over fresh draws: bf16 2.9e-3 to 3.8e-3 (one rounding of y and
    # of each gradient), fp32 4e-8 to 1.1e-7 over reductions of up to 60 products; bf16 about 3x above,
    # fp32 ~20x for sums of up to F * K = 8192 products at the training sizes. fp32 products in TF32
    # (cuDNN's default for convolutions, Cortex's tl.dot) err by ~1e-3 and fail fp32's gate, as they
    # should; ours take three TF32 products (tf32x3).
    tolerance={torch.bfloat16: 1.2e-2, torch.float32: 2e-6})
