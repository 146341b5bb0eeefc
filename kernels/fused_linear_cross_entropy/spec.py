"""What the collector needs to measure fused_linear_cross_entropy: providers, the float64 reference,
inputs, grids, the cost model and the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import KernelSpec, Provider, peer_available, standard_providers

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of
from ..cross_entropy import IGNORE_INDEX
from ..cross_entropy import pick as cross_entropy_pick
from ..cross_entropy.spec import check_shape  # two classes at least, the label smoothing in [0, 1]
from . import fused_linear_cross_entropy, pick
from .naive import reference


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def fused_linear_cross_entropy_eager(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                     ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(F.linear(x, weight), target, ignore_index=ignore_index, label_smoothing=label_smoothing)


def fused_linear_cross_entropy_liger(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                     ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0) -> torch.Tensor:
    # forward(ctx, _input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
    #         label_smoothing, reduction, ...) -> (loss, z_loss, token_accuracy, predicted_tokens).
    # Its default chunk is next_pow2(T / ceil(V / H)) tokens (256 at 8192 x 4096 x 128256), and it
    # syncs with the host (n_non_ignore.item()).
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    return LigerFusedLinearCrossEntropyFunction.apply(x, weight, target, None, None, ignore_index, 0.0,
                                                      label_smoothing, "mean")[0]


# ---------------------------------------------------------------------------------------------
# Inputs


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    t, h, v = dims["tokens"], dims["hidden"], dims["vocab"]
    # Hidden states after the final RMSNorm are O(1) per element; W ~ N(0, 4 / H) gives logits of
    # standard deviation ~2, the spread of a trained LM head.
    x = torch.randn((t, h), generator=g, dtype=torch.float32)
    w = torch.randn((v, h), generator=g, dtype=torch.float32) * (2.0 / h ** 0.5)
    target = torch.randint(0, v, (t,), generator=g)
    ignored = torch.rand(t, generator=g) < 0.1  # padding / prompt tokens
    ignored[0] = False
    target[ignored] = IGNORE_INDEX
    return {
        "x": x.to(device=device, dtype=dtype),
        "weight": w.to(device=device, dtype=dtype),
        "target": target.to(device=device),
        "ignore_index": IGNORE_INDEX,
        "label_smoothing": float(dims.get("smoothing", 0.0)),
    }


def config_of(inputs) -> dict:
    """The chunk and the cross-entropy config of a chunk (the valid targets counted once, given)."""
    x, w = inputs["x"], inputs["weight"]
    chunk = pick(x.shape[0], w.shape[0], x.dtype)
    return config_record(flce=chunk, cross_entropy=cross_entropy_pick(chunk.chunk, w.shape[0], x.dtype, x.device,
                                                                       True, True))


# ---------------------------------------------------------------------------------------------
# Cost model. Compute-bound: the three matmuls (logits, dx, dW), 2 T H V flops each:
#   flops = 6 * T * H * V                      (the CE itself, ~10 T V, is noise next to it)
# Bytes (minimum: read x and W, write dx and dW, read targets), for the record only:
#   bytes = 2 * (T * H + V * H) * s + 8 * T


def bytes_moved(dims, dtype, mode) -> int:
    t, h, v = dims["tokens"], dims["hidden"], dims["vocab"]
    s = dtype.itemsize
    return 2 * (t * h + v * h) * s + 8 * t


def flops(dims, mode) -> float:
    return 6.0 * dims["tokens"] * dims["hidden"] * dims["vocab"]


SPEC = KernelSpec(
    name="fused_linear_cross_entropy", modes=("fwd+bwd",), baseline="torch", bound="compute",
    description="cross-entropy of x @ W.T without materialising the logits: chunked cuBLAS + the cross_entropy kernel in place",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "weight"), grids=grids_of(__file__),
    check_shape=check_shape, bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=standard_providers(fused_linear_cross_entropy, fused_linear_cross_entropy_eager, config_of)
    + (Provider("liger", fused_linear_cross_entropy_liger, peer_available("liger_kernel")),),
    # Relative error of (loss, dx, dW). bf16: dx and dW are rounded three times (dlogits, the matmul
    # output, the upstream scaling; eager: twice), seen up to 1.5e-2 at one token under the
    # interpreter, whose casts truncate; Liger adds a bf16 dW accumulation over its chunks. fp16 has
    # 8x the mantissa. fp32: as cross_entropy (eager's smoothing backward cancels over the row).
    tolerance={torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 5e-5})
