"""Fused linear + cross-entropy: mean cross-entropy of x @ W.T (x [T, H], W [V, H]) without the
[T, V] logits ever existing at once: the LM head and its loss in one step, gradients for x and W
computed in the forward (Liger's design; backward only scales them by the upstream scalar).

Per chunk of C tokens: logits_c = x_c @ W.T (cuBLAS) into one reused [C, V] buffer; the
cross_entropy Triton kernel turns it, in place, into per-row losses and dlogits_c (already divided
by the number of non-ignored tokens of the whole batch); then dx_c = dlogits_c @ W and
dW += dlogits_c.T @ x_c (cuBLAS, accumulating into dW with beta = 1). Peak memory is dW + dx + one
chunk instead of several [T, V] tensors; the FLOPs are eager's (6 T H V), the logits traffic is one
chunk-sized write, read and write per chunk.

No "fwd" or "bwd" mode: the op exists for training (the brief's scope), and its backward does no
work of its own (see cross_entropy.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from ..cross_entropy import IGNORE_INDEX, cross_entropy_rows, finish_mean, scale_
from ..cross_entropy import reference as cross_entropy_reference


# ---------------------------------------------------------------------------------------------
# Triton kernels: none of its own; the loss and dlogits of each chunk come from
# cross_entropy._ce_rows (in place, n_valid of the whole batch passed in).


# ---------------------------------------------------------------------------------------------
# Launcher

# Logits chunk budget: 256 MiB keeps the peak at vocab 128256, hidden 4096 (dW 1 GB bf16) under a
# quarter of eager's, while chunks of >= 1024 tokens keep dW += dlogits.T @ x_c compute-bound
# (K = C: 2 C flops per byte of dW read and written, against a ridge near 300 on Hopper).
# Against torch.compile (all the logits at once, 3 GiB over the inputs) it stays 3-7% behind at
# 8192x4096x128256 on the H200 (collector, A/B), though not from idle time:
#   - One CUDA-graph replay under torch.profiler spans 36.9 ms for both, kernels back to back
#     (docs/evidence/flce_timeline_h200.txt). Our cuBLAS calls take 35.4 ms of it against
#     compile's 33.9, the difference being the dW passes; our cross-entropy kernel takes 1.4 ms
#     against compile's 3.0.
#   - Replayed back to back, every provider sits at the 700 W cap at a median SM clock of
#     1485-1515 MHz instead of 1980 (benchmarks/power_probe.py, docs/evidence/flce_power_h200.txt):
#     ours 41.7 ms, compile 40.6, eager 42.1.
#   - Our reading, not measured directly: at the cap, time follows the energy of the call, and
#     ours spends more of it moving bytes, since each chunk after the first reads and writes the
#     1 GB dW again (14 GB more HBM traffic than compile's one dW write).
# Larger chunks cut those passes, but within the quarter of eager's peak memory (at most ~1700
# tokens here) they measured within +-3% of 1024, with no trend (flce_ab runs 1-3).
_CHUNK_BYTES = 256 << 20


def _chunk_rows(T: int, V: int, elt: int) -> int:
    c = max(128, (_CHUNK_BYTES // (V * elt)) // 128 * 128)  # multiples of 128: whole GEMM tiles
    return min(T, c)


def fused_linear_cross_entropy_forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                       ignore_index: int, label_smoothing: float, need_dx: bool,
                                       need_dw: bool, chunk: int | None = None):
    """(mean loss in x's dtype, dx or None, dW or None). `chunk` overrides the tokens per chunk
    (tests use it to run several chunks on small shapes)."""
    T, H = x.shape
    V = weight.shape[0]
    x, weight, target = x.contiguous(), weight.contiguous(), target.contiguous()
    C = chunk or _chunk_rows(T, V, x.element_size())
    has_grad = need_dx or need_dw
    buf = torch.empty((min(C, T), V), dtype=x.dtype, device=x.device)
    loss_rows = torch.empty(T, dtype=torch.float32, device=x.device)
    # The mean is over the whole batch's non-ignored tokens: counted once, on the device (no sync).
    n_valid = (target != ignore_index).sum() if has_grad else None
    dx = torch.empty_like(x) if need_dx else None
    dw = None
    for s in range(0, T, C):
        e = min(s + C, T)
        x_c, logits = x[s:e], buf[: e - s]
        torch.mm(x_c, weight.t(), out=logits)
        cross_entropy_rows(logits, target[s:e], loss_rows[s:e], logits if has_grad else None,
                           ignore_index, label_smoothing, n_valid=n_valid)
        if need_dx:
            torch.mm(logits, weight, out=dx[s:e])
        if need_dw:
            if dw is None:
                dw = torch.mm(logits.t(), x_c)  # the first chunk writes dW: no zero fill
            else:
                dw.addmm_(logits.t(), x_c)  # cuBLAS accumulates in fp32, rounds once per chunk
    return finish_mean(loss_rows, target, ignore_index, x.dtype), dx, dw


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, chunk):
        loss, dx, dw = fused_linear_cross_entropy_forward(x, weight, target, ignore_index, label_smoothing,
                                                         need_dx, need_dw, chunk)
        ctx.grads = (dx, dw)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        if ctx.grads is None:
            raise RuntimeError("fused_linear_cross_entropy: the gradients were computed in the forward "
                               "and already consumed; a second backward through the same graph is not supported")
        dx, dw = ctx.grads
        ctx.grads = None  # scaled in place: a second backward would scale them twice
        s = dloss.reshape(())
        if dx is not None:
            scale_(dx, s)
        if dw is not None:
            scale_(dw, s)
        return dx, dw, None, None, None, None, None, None


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0,
                               chunk: int | None = None) -> torch.Tensor:
    """F.cross_entropy(x @ weight.T, target, ignore_index=..., label_smoothing=...), mean reduction."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [T, H] and weight [V, H]: got {tuple(x.shape)} and {tuple(weight.shape)}")
    if target.shape != (x.shape[0],) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must be int64/int32 of shape [{x.shape[0]}]: got {tuple(target.shape)} {target.dtype}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x and weight must share a dtype: {x.dtype} vs {weight.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    grad = torch.is_grad_enabled()  # decided here: forward runs with grad mode off
    return FusedLinearCrossEntropyFunction.apply(x, weight, target, ignore_index, float(label_smoothing),
                                                 grad and x.requires_grad, grad and weight.requires_grad, chunk)


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
# Reference: plain maths, float64


def reference(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
              label_smoothing: float = 0.0) -> torch.Tensor:
    return cross_entropy_reference(x @ weight.T, target, ignore_index, label_smoothing)


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
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


# ---------------------------------------------------------------------------------------------
# Shape grids: tokens x hidden -> vocab. The full grid is kept to three shapes: each costs seconds
# of cuBLAS work per provider and a float64 reference of ~40 GB at the largest.


def _s(tokens: int, hidden: int, vocab: int, smoothing: str, why: str) -> Shape:
    return Shape({"tokens": tokens, "hidden": hidden, "vocab": vocab, "smoothing": smoothing}, why)


QUICK = (
    _s(37, 64, 1000, "0", "awkward token count and vocabulary, one chunk"),
    _s(130, 48, 3001, "0.1", "prime vocabulary, label smoothing"),
    _s(1, 32, 500, "0", "a single token"),
)

FULL = (
    _s(8192, 4096, 128256, "0", "LLaMA-3-8B head, 8k tokens: the memory goal (a quarter of eager's peak)"),
    _s(4096, 4096, 32000, "0.1", "LLaMA-2-7B / Mistral-7B head, label smoothing"),
    _s(3000, 3584, 152064, "0", "Qwen2-7B head, awkward token count: a partial last chunk"),
)


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


def check_shape(dims) -> str | None:
    eps = float(dims.get("smoothing", 0.0))
    if not 0.0 <= eps <= 1.0:
        return f"label smoothing {eps} is outside [0, 1]"
    return None


SPEC = KernelSpec(
    name="fused_linear_cross_entropy",
    description="cross-entropy of x @ W.T without materialising the logits: chunked cuBLAS + the cross_entropy kernel in place",
    modes=("fwd+bwd",),
    providers=standard_providers(fused_linear_cross_entropy, fused_linear_cross_entropy_eager)
    + (Provider("liger", fused_linear_cross_entropy_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="compute",
    # Relative error of (loss, dx, dW). bf16: dx and dW are rounded three times (dlogits, the matmul
    # output, the upstream scaling; eager: twice), seen up to 1.5e-2 at one token under the
    # interpreter, whose casts truncate; Liger adds a bf16 dW accumulation over its chunks. fp16 has
    # 8x the mantissa. fp32: as cross_entropy (eager's smoothing backward cancels over the row).
    tolerance={torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 5e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    check_shape=check_shape,
)
