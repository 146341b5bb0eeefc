"""What the collector needs to measure add_rms_norm: providers, the float64 reference, inputs, grids,
the cost model and the tolerance."""
from __future__ import annotations

import torch

from kcollect.spec import MODES, KernelSpec

from .._spec.kit import FLOATS, drawn_on_device, grids_of
from .._spec.norms import norm_cost, norm_providers, quack_refusals
from ..rms_norm.spec import configs_of, rms_norm_eager
from . import add_rms_norm
from .naive import reference


def add_rms_norm_eager(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    """HF LLaMA/Qwen decoder layer: the add in the input dtype, then LlamaRMSNorm."""
    h = x + residual
    return h, rms_norm_eager(h, w, eps)


def add_rms_norm_liger(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    # (X, R, W, eps, offset, casting_mode, in_place): LLaMA casting, Liger's defaults otherwise.
    # It returns (normed, residual sum); ours is (h, y).
    y, h = LigerFusedAddRMSNormFunction.apply(x, residual, w, eps, 0.0, "llama", False)
    return h, y


def add_rms_norm_quack(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6):
    # QuACK's RMSNorm with its fused residual add: prenorm=True returns (normed, residual sum); the
    # gradient reaching the sum comes back through its rmsnorm_bwd as the residual's (= x's).
    quack_refusals(x, residual, w)
    import quack

    y, h = quack.rmsnorm(x, w, residual=residual, eps=eps, prenorm=True)
    return h, y


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # the residual stream's scale grows with depth and differs between tokens; the sublayer
    # output added to it is smaller
    residual = torch.randn((m, n), generator=g) * torch.exp(torch.randn((m, 1), generator=g))
    x = 0.5 * torch.randn((m, n), generator=g)
    w = 1.0 + 0.3 * torch.randn(n, generator=g)
    return {
        "x": x.to(device=device, dtype=dtype),
        "residual": residual.to(device=device, dtype=dtype),
        "w": w.to(device=device, dtype=dtype),
        "eps": 1e-6,
    }


# Cost model (minimum traffic, s = element size; rstd, our M*4-byte side output, not counted):
#   fwd:      read x, residual, w; write h, y              -> (4*M*N + N) * s
#   bwd:      read h, dy, dh, w; write dx (= dresidual), dw -> (4*M*N + 2*N) * s
#   fwd+bwd:  the two passes                               -> (8*M*N + 3*N) * s
# The two input gradients are one tensor (autograd hands the add's gradient to both inputs), so
# it is written once. Beyond the minimum, as in rms_norm: the bwd's fp32 dw partials (in L2); where
# the backward takes the cols path it reads h and dy twice (6*M*N*s instead of 4*M*N*s).
# FLOPs: fwd 5 per element (the add, then rms_norm's 4); bwd 10 (rms_norm's 9, plus dh).
bytes_moved, flops = norm_cost(traffic={"fwd": (4, 1, 0), "bwd": (4, 2, 0)}, flops_per={"fwd": 5, "bwd": 10})

SPEC = KernelSpec(
    name="add_rms_norm", modes=MODES, baseline="torch", bound="memory",
    description="h = x + residual, y = rms_norm(h) * w, returning (h, y), forward and backward", reference=reference,
    make_inputs=make_inputs, grad_inputs=("x", "residual", "w"), grids=grids_of(__file__), bytes_moved=bytes_moved,
    flops=flops, dtypes=FLOATS,
    providers=norm_providers(add_rms_norm, add_rms_norm_eager, lambda inputs: configs_of(inputs["x"], True),
                             add_rms_norm_liger, add_rms_norm_quack),
    # rms_norm's: the same maths plus one rounding of h, which every provider does. Measured worst
    # over seeds and the test shapes: bf16 4.2e-3 (ours, interpreter), 3.9e-3 (eager); fp16 4.8e-4;
    # fp32 1.4e-7.
    tolerance={torch.bfloat16: 1e-2, torch.float16: 1.5e-3, torch.float32: 1e-5})
