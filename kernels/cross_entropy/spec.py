"""What the collector needs to measure cross_entropy: providers, the float64 reference, inputs,
grids, the cost model and the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import KernelSpec, Provider, Unavailable, peer_available, standard_providers

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of
from . import IGNORE_INDEX, cross_entropy, pick
from .naive import reference


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def cross_entropy_eager(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing)


def cross_entropy_liger(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    # forward(ctx, _input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction,
    #         softcap, return_z_loss, return_token_accuracy, return_predicted_tokens) -> 4-tuple.
    # It writes the gradient over its input (the collector hands each provider a private clone),
    # whenever the input requires grad, and syncs with the host (n_non_ignore.item()).
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    return LigerCrossEntropyFunction.apply(logits, target, None, ignore_index, 0.0, label_smoothing,
                                           "mean", None, False, False, False)[0]


def cross_entropy_quack(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    if label_smoothing:
        raise Unavailable("QuACK's cross_entropy has no label smoothing")
    import quack

    return quack.cross_entropy(logits, target, ignore_index=ignore_index, reduction="mean")


# ---------------------------------------------------------------------------------------------
# Inputs


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    n, v = dims["tokens"], dims["vocab"]
    logits = torch.randn((n, v), generator=g, dtype=torch.float32) * 2.0
    target = torch.randint(0, v, (n,), generator=g)
    # A trained head puts mass on the target: raise its logit by 0-12 so that rows range from
    # near-uniform (p_y ~ 1/V) to confident (p_y -> 1, where softmax - 1 cancels).
    logits[torch.arange(n), target] += torch.rand(n, generator=g) * 12.0
    ignored = torch.rand(n, generator=g) < 0.1  # padding / prompt tokens
    ignored[0] = False  # at least one row counts
    target[ignored] = IGNORE_INDEX
    return {
        "logits": logits.to(device=device, dtype=dtype),
        "target": target.to(device=device),
        "ignore_index": IGNORE_INDEX,
        "label_smoothing": float(dims.get("smoothing", 0.0)),
    }


def config_of(inputs) -> dict:
    """The configs of the loss alone (fwd) and of the loss with its gradient (fwd+bwd)."""
    x = inputs["logits"]
    n, v = x.shape
    return config_record(fwd=pick(n, v, x.dtype, x.device, False), grad=pick(n, v, x.dtype, x.device, True))


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = bytes per logit, targets are int64):
#   fwd:      read logits once, read targets                       -> N * V * s + 8 * N
#   fwd+bwd:  read logits once, write dlogits, read targets        -> 2 * N * V * s + 8 * N
# fwd+bwd does not count a backward pass: the gradient is written in the forward. With an upstream
# gradient other than 1 (the collector draws a random one) backward scales it in place: one more
# read and write of dlogits that every fused implementation (Liger too) pays and the model does not
# count, so fwd+bwd tops out near half the copy bandwidth under that gradient, and near all of it
# for loss.backward().
# FLOPs: ~5 per logit in the forward (max, subtract, exp, add, convert), ~5 more for the gradient.


def bytes_moved(dims, dtype, mode) -> int:
    n, v = dims["tokens"], dims["vocab"]
    s = dtype.itemsize
    per = {"fwd": 1, "fwd+bwd": 2}[mode]
    return per * n * v * s + 8 * n


def flops(dims, mode) -> float:
    per = {"fwd": 5, "fwd+bwd": 10}[mode]
    return float(per * dims["tokens"] * dims["vocab"])


def check_shape(dims) -> str | None:
    if dims["vocab"] < 2:  # float64's reference rounds to about 1e-17: any relative error is 1
        return f"vocab must be at least 2 (over one class the loss is 0 whatever the logits), got {dims['vocab']}"
    eps = float(dims.get("smoothing", 0.0))
    if not 0.0 <= eps <= 1.0:
        return f"label smoothing {eps} is outside [0, 1]"
    return None


SPEC = KernelSpec(
    name="cross_entropy", modes=("fwd", "fwd+bwd"), baseline="torch", bound="memory",
    description="mean cross-entropy of LM logits with ignore_index and label smoothing; gradient fused into the forward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("logits",), grids=grids_of(__file__),
    check_shape=check_shape, bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=standard_providers(cross_entropy, cross_entropy_eager, config_of)
    + (Provider("liger", cross_entropy_liger, peer_available("liger_kernel")),
       Provider("quack", cross_entropy_quack, peer_available("quack"))),
    # Relative error of (loss, dlogits). bf16/fp16: the gradient is rounded once to the logits' dtype
    # and again when scaled by the upstream gradient (ours and Liger's), eager rounds log_softmax
    # before picking the target; seen up to 1e-2 / 1.8e-3 under the interpreter (whose bf16 cast
    # truncates). fp32: ours ~3e-7, but eager's log_softmax backward of the smoothing term cancels
    # over the row (seen 1.4e-5 at vocab 20k), and it is a legitimate fp32 implementation.
    tolerance={torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 5e-5})
