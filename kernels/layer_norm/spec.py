"""What the collector needs to measure layer_norm: providers, the float64 reference, inputs, grids,
the cost model and the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of
from .._spec.norms import norm_cost, norm_providers, quack_refusals
from . import layer_norm, pick_backward, pick_forward
from .naive import reference


def layer_norm_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm_liger(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return LigerLayerNormFunction.apply(x, weight, bias, eps)


class QuackLayerNormFunction(torch.autograd.Function):
    """QuACK's LayerNorm kernels (quack.rmsnorm.layernorm_fwd / layernorm_bwd; QuACK has no autograd
    wrapper for them) on [M, N] rows, with float32 weight and bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        from quack.rmsnorm import layernorm_fwd

        y, rstd, mean = layernorm_fwd(x, weight, bias, eps, return_rstd=True, return_mean=True)
        ctx.save_for_backward(x, weight, rstd, mean)
        return y

    @staticmethod
    def backward(ctx, dy):
        from quack.rmsnorm import layernorm_bwd

        x, weight, rstd, mean = ctx.saved_tensors
        dx, dw, db = layernorm_bwd(x, weight, dy.contiguous(), rstd, mean, has_bias=True)
        return dx, dw, db, None


def layer_norm_quack(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    quack_refusals(x, weight, bias)
    n = x.shape[-1]
    # QuACK's LayerNorm asserts float32 weight and bias: bf16/fp16 ones are widened here (two casts
    # of N elements, in its time; autograd casts dw and db back), as its user would have to.
    y = QuackLayerNormFunction.apply(x.reshape(-1, n).contiguous(), weight.float(), bias.float(), eps)
    return y.view(x.shape)


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # residual-stream-like activations: each row has its own offset and scale, so centring and
    # scaling both matter; weight near 1 and a small bias, as a trained LayerNorm has
    x = torch.randn(m, n, generator=g) * (1.0 + torch.rand(m, 1, generator=g) * 3.0) + torch.randn(m, 1, generator=g)
    weight = 1.0 + 0.2 * torch.randn(n, generator=g)
    bias = 0.1 * torch.randn(n, generator=g)
    return {
        "x": x.to(device=device, dtype=dtype),
        "weight": weight.to(device=device, dtype=dtype),
        "bias": bias.to(device=device, dtype=dtype),
        "eps": 1e-5,
    }


def config_of(inputs) -> dict:
    """The forward's and the backward's configs (a coop backward falls back to the cols path where
    not even one group of its programs fits: rows of over a million elements)."""
    x = inputs["x"]
    M, N = x.numel() // x.shape[-1], x.shape[-1]
    return config_record(fwd=pick_forward(M, N, x.dtype, x.device), bwd=pick_backward(M, N, x.dtype, x.device))


# Cost model (minimum traffic; s = element size, stats are fp32):
#   fwd:      read x, w, b; write y, mean, rstd            -> (2*M*N + 2*N) * s + 8*M
#   bwd:      read dy, x, w, mean, rstd; write dx, dw, db   -> (3*M*N + 3*N) * s + 8*M
#   fwd+bwd:  the sum of the two
# Where the backward takes the cols path (the CPU, or rows too wide for a coop group) it reads x and
# dy twice, (5*M*N) * s, as PyTorch's does; it is still charged the minimum. FLOPs, approximately per
# element: fwd 8 (two sums, centre, square, scale, affine), bwd 13 (xhat, w*dy, two row sums, dx, dw
# and db accumulation).
bytes_moved, flops = norm_cost(traffic={"fwd": (2, 2, 8), "bwd": (3, 3, 8)}, flops_per={"fwd": 8, "bwd": 13})

SPEC = KernelSpec(
    name="layer_norm", modes=MODES, baseline="torch", bound="memory",
    description="LayerNorm over the last dim with weight and bias (eps 1e-5), forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "weight", "bias"), grids=grids_of(__file__),
    bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=norm_providers(layer_norm, layer_norm_eager, config_of, layer_norm_liger, layer_norm_quack),
    # Ours sums statistics and gradients in fp32: one rounding of each output to the storage dtype
    # (bf16 measured <= 5.2e-3 under the interpreter's truncating casts, fp16 <= 5e-4). PyTorch's CPU
    # kernel rounds more in its bf16/fp16 backward (measured up to 7.7e-3 / 9.6e-4), hence the
    # headroom. fp32: rounding of the sums over N and over M rows (measured ~1e-7).
    tolerance={torch.bfloat16: 1.6e-2, torch.float16: 3e-3, torch.float32: 1e-5})
