"""SwiGLU: c = silu(a) * b, the gate of LLaMA-style MLPs (a = x @ W_gate, b = x @ W_up)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from ._utils import launch_elementwise


# ---------------------------------------------------------------------------------------------
# Triton kernels. Flat over the elements: a and b are contiguous and the op is elementwise, so a
# 1-D grid gives every program full 16-byte loads whatever the row width is.


@triton.jit
def _swiglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, mask):
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    c = a * tl.sigmoid(a) * b
    tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_fwd(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _utils.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _swiglu_fwd_block(a_ptr, b_ptr, c_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _swiglu_fwd_block(a_ptr, b_ptr, c_ptr, tail, tail < n)


@triton.jit
def _swiglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, mask):
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    db = dc * silu
    # d silu / da = sig * (1 + a * (1 - sig))
    da = dc * b * sig * (1.0 + a * (1.0 - sig))
    tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _utils.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _swiglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, offs < n16)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _swiglu_bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, tail, tail < n)


# ---------------------------------------------------------------------------------------------
# Launchers


def swiglu_forward(a: torch.Tensor, b: torch.Tensor, **launch) -> torch.Tensor:
    """`launch`: block / num_warps overrides for GPU A/Bs (see _utils.launch_elementwise)."""
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty_like(a)
    launch_elementwise(_swiglu_fwd, a.numel(), a, b, c, **launch)
    return c


def swiglu_backward(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **launch) -> tuple[torch.Tensor, torch.Tensor]:
    dc = dc.contiguous()
    da, db = torch.empty_like(a), torch.empty_like(b)
    launch_elementwise(_swiglu_bwd, a.numel(), dc, a, b, da, db, **launch)
    return da, db


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return swiglu_forward(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return swiglu_backward(dc, a, b)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    return SwiGLUFunction.apply(a, b)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def swiglu_liger(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a / (1.0 + torch.exp(-a)) * b


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (dims["M"], dims["N"])
    a = torch.randn(shape, generator=g, dtype=torch.float32) * 2.0  # gate pre-activations span the sigmoid
    b = torch.randn(shape, generator=g, dtype=torch.float32)
    return {"a": a.to(device=device, dtype=dtype), "b": b.to(device=device, dtype=dtype)}


# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
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
    providers=standard_providers(swiglu, swiglu_eager)
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
