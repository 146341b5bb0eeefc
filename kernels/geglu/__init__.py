"""GEGLU: c = gelu_tanh(a) * b, the gate of Gemma-style MLPs (a = x @ W_gate, b = x @ W_up).

The tanh approximation, as Liger's GEGLU and Gemma use. The GELU maths is imported from gelu.py
(one @triton.jit helper for both kernels).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import launch_elementwise
from ..gelu import gelu_tanh_and_grad_f32, gelu_tanh_f32


# ---------------------------------------------------------------------------------------------
# Triton kernels. Flat over the elements: a and b are contiguous and the op is elementwise, so a
# 1-D grid gives every program full 16-byte loads whatever the row width is. All maths in fp32,
# one rounding per output (Liger rounds gelu(a) to the dtype before the multiply).


@triton.jit
def _geglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, mask):
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    c = gelu_tanh_f32(a) * b
    tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_fwd(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _utils.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _geglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _geglu_fwd_block(a_ptr, b_ptr, c_ptr, tail, tail < n)


@triton.jit
def _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, mask):
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    g, dg = gelu_tanh_and_grad_f32(a)  # recomputed from a: cheaper than storing gelu(a) in fwd
    tl.store(da_ptr + offs, (dc * b * dg).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dc * g).to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _utils.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _geglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, tail, tail < n)


# ---------------------------------------------------------------------------------------------
# Launchers


def geglu_forward(a: torch.Tensor, b: torch.Tensor, **launch) -> torch.Tensor:
    """`launch`: block / num_warps overrides for GPU A/Bs (see _utils.launch_elementwise)."""
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty_like(a)
    launch_elementwise(_geglu_fwd, a.numel(), a, b, c, **launch)
    return c


def geglu_backward(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **launch) -> tuple[torch.Tensor, torch.Tensor]:
    dc = dc.contiguous()
    da, db = torch.empty_like(a), torch.empty_like(b)
    launch_elementwise(_geglu_bwd, a.numel(), dc, a, b, da, db, **launch)
    return da, db


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class GEGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return geglu_forward(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return geglu_backward(dc, a, b)


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    return GEGLUFunction.apply(a, b)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def geglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a, approximate="tanh") * b


def geglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Liger's backward writes da and db over its saved a and b (in place, to save memory).
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    return LigerGELUMulFunction.apply(a, b)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    gelu = 0.5 * a * (1.0 + torch.tanh(0.7978845608028654 * (a + 0.044715 * a**3)))  # sqrt(2/pi)
    return gelu * b


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (dims["M"], dims["N"])
    a = torch.randn(shape, generator=g, dtype=torch.float32) * 2.0  # gate pre-activations span the curve and both tails
    b = torch.randn(shape, generator=g, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


# ---------------------------------------------------------------------------------------------
# Shape grids: M = tokens, N = intermediate size of the (Gemma) MLP.


_s = Shape.rows


QUICK = (
    _s(64, 1024, "small, power of two"),
    _s(37, 1000, "awkward: rows and width not powers of two, tail block masked"),
    _s(1, 4099, "one row, width one past a power of two"),
)

FULL = (
    _s(1, 16384, "a single token (decode), Gemma-2B MLP: launch latency dominates"),
    _s(1024, 16384, "Gemma-2B MLP, short batch"),
    _s(4096, 24576, "Gemma-7B MLP"),
    _s(8192, 14336, "Gemma-2-9B MLP, 8k tokens"),
    _s(16384, 16384, "Gemma-2B MLP, 16k tokens: the largest, far beyond L2"),
    _s(3000, 13824, "awkward token count, non-power-of-two width"),
    _s(2048, 36864, "Gemma-2-27B MLP: the widest rows"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; each input read once, each output written once):
#   fwd:      read a, b; write c                  -> 3 * M * N * s
#   bwd:      read dc, a, b; write da, db         -> 5 * M * N * s
#   fwd+bwd:  the two passes                      -> 8 * M * N * s
# FLOPs are negligible next to the bytes (an exp and ~10 multiply-adds per element).


def bytes_moved(dims, dtype, mode) -> int:
    per = {"fwd": 3, "bwd": 5, "fwd+bwd": 8}[mode]
    return per * dims["M"] * dims["N"] * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 9, "bwd": 16, "fwd+bwd": 25}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="geglu",
    description="gelu_tanh(a) * b, the GEGLU gated MLP activation, forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(geglu, geglu_eager)
    + (Provider("liger", geglu_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("a", "b"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # About 2-3x the error one rounding of each output gives (bf16 eps 2^-8, fp16 2^-11; the CPU
    # interpreter truncates instead of rounding, which doubles it: measured 4e-3 bf16, 3e-4 fp16),
    # so a 1% systematic error fails. Eager and Liger round gelu(a) (Liger also dc * b) before the
    # multiply: ~2-3 roundings, still well inside on the GPU. fp32: exp/reciprocal rounding (3e-7).
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
