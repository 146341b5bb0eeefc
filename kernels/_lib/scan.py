"""What the scan ops share (rtu, selective_scan, conv1d): the combine functions of first-order linear
recurrences for tl.associative_scan, the seeded reset masks of their inputs, and the autograd of a
scan whose forward keeps its chunk states for the backward.

A first-order recurrence h_t = a_t * h_{t-1} + b_t composes as pairs: applying (a1, b1) then
(a2, b2) is (a2 * a1, a2 * b1 + b2). tl.associative_scan passes the earlier element first; with
reverse=True it scans from the end, the later element first, which is the adjoint recurrence
s_t = b_t + a_t * s_{t+1} with the same combine."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def first_order(a1, b1, a2, b2):
    """Real gates."""
    return a2 * a1, a2 * b1 + b2


@triton.jit
def first_order_complex(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    """Complex gates and states, as (real, imaginary) pairs."""
    ar = ar2 * ar1 - ai2 * ai1
    ai = ar2 * ai1 + ai2 * ar1
    br = ar2 * br1 - ai2 * bi1 + br2
    bi = ar2 * bi1 + ai2 * br1 + bi2
    return ar, ai, br, bi


@triton.jit
def approx(x, OP: tl.constexpr):
    """OP.approx.ftz.f32 of fp32 x in PTX (OP: "ex2", "lg2", "rcp"): one MUFU instruction, where
    Triton's exp2, log2 and division fix up denormal inputs and outputs around it. GPU only."""
    return tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def sigmoid(x, ASM: tl.constexpr):
    """1 / (1 + exp(-x)) in fp32. ASM (on the GPU): ex2 and rcp.approx.ftz, four instructions where
    tl.sigmoid takes about twelve (its exp and division fix up denormal inputs and huge divisors,
    which change nothing here: exp(-x) below 2^-126 leaves 1 + exp(-x) = 1, and a divisor past 2^126
    gives 0 either way); each rounding within two ulps. The interpreter cannot run PTX: launchers
    pass ASM for CUDA tensors only."""
    if ASM:
        return approx(1.0 + approx(x * -1.4426950408889634, "ex2"), "rcp")
    return tl.sigmoid(x)


@triton.jit
def row_of(x, rows, i):
    """Row i of a tile whose first axis is indexed by `rows` (a register tile has no dynamic
    indexing: a masked sum over that axis)."""
    return tl.sum(tl.where(rows == i, x, 0.0), axis=0)


def reset_mask(batch: int, steps: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """[batch, steps] bool: each step a reset with probability p, from `generator` (seeded by the
    caller, so that every provider of a case sees the same episodes)."""
    return torch.rand(batch, steps, generator=generator) < p


class KeptStates(torch.autograd.Function):
    """apply(forward, backward, config, *inputs): y from forward(*inputs, config, keep_states=True)
    -> (y, states), which keeps the states at the chunk boundaries so that backward(dy, *inputs,
    states, config) -> the inputs' gradients need not scan forward again."""

    @staticmethod
    def forward(ctx, forward, backward, config, *inputs):
        y, states = forward(*inputs, config, keep_states=True)
        ctx.save_for_backward(*inputs, states)
        ctx.backward_fn, ctx.config = backward, config
        return y

    @staticmethod
    def backward(ctx, dy):
        *inputs, states = ctx.saved_tensors
        return (None, None, None, *ctx.backward_fn(dy, *inputs, states, ctx.config))


def log_scan(combine, elems: tuple, dim: int) -> tuple:
    """Inclusive scan of the tensors `elems` along `dim` in plain PyTorch, by doubling (Hillis and
    Steele): ceil(log2 T) levels of pointwise ops, differentiable by ordinary autograd, which keeps
    every level for the backward. `combine(*earlier, *later)` as the Triton combines above, whose
    Python bodies (`first_order.fn`) serve unchanged on tensors."""
    steps = elems[0].shape[dim]
    d = 1
    while d < steps:
        earlier = [e.narrow(dim, 0, steps - d) for e in elems]
        later = [e.narrow(dim, d, steps - d) for e in elems]
        elems = tuple(torch.cat([e.narrow(dim, 0, d), c], dim) for e, c in zip(elems, combine(*earlier, *later)))
        d *= 2
    return elems
