"""GELU: y = x * Phi(x), exact (erf) or with the tanh approximation (GPT-2, Gemma), forward and backward.

The variant is part of the shape (dims["approx"] = "tanh" | "none", the names of F.gelu's
`approximate`), so both variants sit in both grids and are timed side by side.

The @triton.jit helpers `gelu_tanh_f32` and `gelu_tanh_and_grad_f32` are the one place the tanh
GELU maths lives: kernels/geglu.py imports them from here.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Shape, standard_providers

from .._lib import launch_elementwise

APPROX = ("tanh", "none")


# ---------------------------------------------------------------------------------------------
# GELU maths on fp32 registers, shared with geglu.py. Budget: on H200 a bf16 forward at 90% of copy
# bandwidth leaves ~30 instructions per element, so both forms are written to stay well under it
# (SASS for sm_90 counted offline, per element: tanh fwd 13, bwd 20; erf fwd 20, bwd 24; with
# libdevice erff and IEEE-checked divides the erf forward was 37, compute-bound at bf16).
#
# tanh form: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3). Since 0.5 (1 + tanh(z)) =
# sigmoid(2 z), this is x / (1 + exp(-2 z)): one exp2 (MUFU.EX2, with log2(e) folded into the
# constants: -2 z log2(e) = x (-2.3022... - 0.10294... x^2)) and one reciprocal; no libdevice tanh,
# which the CPU interpreter cannot run and which costs more. Saturates cleanly: exp2 -> inf gives
# x * 0 = -0 and exp2 -> 0 gives x, never NaN.
#
# exact form: x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)). erf by Abramowitz & Stegun 7.1.26,
# |error| <= 1.5e-7 (erfc(a) = t (a1 + a2 t + ... + a5 t^4) exp(-a^2), t = 1 / (1 + p a), a >= 0):
# as accurate as fp32 erff for GELU (relative-norm error over [-12, 12] in fp32: 1.6e-8, against
# torch's 2.4e-8), and Phi(x < 0) = 0.5 erfc(|x|) is computed without the cancellation of
# 1 + erf(x), so the negative tail keeps its relative accuracy. exp(-x^2 / 2) is the Gaussian the
# backward needs, so the gradient costs two more operations. Constants below: p / sqrt 2 and the
# a_i halved.


@triton.jit
def _recip_ge1(d):
    """1 / d for d >= 1 as rsqrt(d^2): rsqrt.approx.ftz is one MUFU.RSQ (relative error 2^-22.9),
    where `1.0 / d` (div.full.f32) expands to ~9 SASS instructions of range checks meant for
    denominators near 0 or 2^126. d^2 = inf (d > 2^64, only when exp2 overflows) gives 0, the
    right limit."""
    return tl.math.rsqrt(d * d)


@triton.jit
def gelu_tanh_f32(x):
    e = tl.exp2(x * (-2.302208198144325 - 0.1029432395800235 * x * x))  # exp(-2 z)
    return x * _recip_ge1(1.0 + e)


@triton.jit
def gelu_tanh_and_grad_f32(x):
    """(gelu(x), d gelu / dx) for the tanh form: with s = sigmoid(2 z) = 1 / (1 + exp(-2 z)),
    d/dx [x s] = s + x s (1 - s) d(2 z)/dx and d(2 z)/dx = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    x2 = x * x
    e = tl.exp2(x * (-2.302208198144325 - 0.1029432395800235 * x2))
    s = _recip_ge1(1.0 + e)
    g = x * s
    dg = s + g * (1.0 - s) * (1.5957691216057308 + 0.21406444881780073 * x2)
    return g, dg


@triton.jit
def _normal_cdf_f32(x):
    """(Phi(x), exp(-x^2 / 2)), Phi by Abramowitz & Stegun 7.1.26 (see above)."""
    t = _recip_ge1(1.0 + 0.2316418882663604 * tl.abs(x))
    half_erfc = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
    gauss = tl.exp2(-0.7213475204444817 * x * x)  # exp(-x^2 / 2)
    half_erfc = half_erfc * gauss  # Phi(-|x|)
    return tl.where(x >= 0.0, 1.0 - half_erfc, half_erfc), gauss


@triton.jit
def gelu_erf_f32(x):
    cdf, _ = _normal_cdf_f32(x)
    return x * cdf


@triton.jit
def gelu_erf_grad_f32(x):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    cdf, gauss = _normal_cdf_f32(x)
    return cdf + x * (0.3989422804014327 * gauss)


# ---------------------------------------------------------------------------------------------
# Triton kernels. Flat over the elements (elementwise op, contiguous tensors): every program gets
# full 16-byte loads whatever the row width is. The variant is a constexpr: one specialised kernel
# each, no runtime branch.


@triton.jit
def _gelu_fwd_block(x_ptr, y_ptr, offs, mask, TANH: tl.constexpr):
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        y = gelu_tanh_f32(x)
    else:
        y = gelu_erf_f32(x)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_fwd(x_ptr, y_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    # the block masked at a multiple of 16 (vector loads), the tail by the last program: see
    # _utils.launch_elementwise
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _gelu_fwd_block(x_ptr, y_ptr, offs, offs < n16, TANH)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _gelu_fwd_block(x_ptr, y_ptr, tail, tail < n, TANH)


@triton.jit
def _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, offs, mask, TANH: tl.constexpr):
    dy = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if TANH:
        _, dg = gelu_tanh_and_grad_f32(x)
    else:
        dg = gelu_erf_grad_f32(x)
    tl.store(dx_ptr + offs, (dy * dg).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    n16 = n // 16 * 16
    _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, offs, offs < n16, TANH)
    if TAIL:
        if tl.program_id(0) == tl.num_programs(0) - 1:
            tail = n16 + tl.arange(0, 16)
            _gelu_bwd_block(dy_ptr, x_ptr, dx_ptr, tail, tail < n, TANH)


# ---------------------------------------------------------------------------------------------
# Launchers


def _check_approx(approximate: str) -> None:
    if approximate not in APPROX:
        raise ValueError(f"approximate must be one of {APPROX}, got {approximate!r}")


def gelu_forward(x: torch.Tensor, approximate: str = "none", **launch) -> torch.Tensor:
    """`launch`: block / num_warps overrides for GPU A/Bs (see _utils.launch_elementwise)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    launch_elementwise(_gelu_fwd, x.numel(), x, y, TANH=approximate == "tanh", **launch)
    return y


def gelu_backward(dy: torch.Tensor, x: torch.Tensor, approximate: str = "none", **launch) -> torch.Tensor:
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    launch_elementwise(_gelu_bwd, x.numel(), dy, x, dx, TANH=approximate == "tanh", **launch)
    return dx


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        x = x.contiguous()
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return gelu_forward(x, approximate)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return gelu_backward(dy, x, ctx.approximate), None


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    _check_approx(approximate)
    if not x.is_floating_point():
        raise ValueError(f"gelu needs a floating tensor, got {x.dtype}")
    return GELUFunction.apply(x, approximate)


# ---------------------------------------------------------------------------------------------
# Baselines and peers (Liger has no plain GELU; its GEGLU is in geglu.py)


def gelu_eager(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    # MLP pre-activations; the scale 2 spans the curved part and both tails (x << 0 -> 0, x >> 0 -> x)
    x = torch.randn((dims["M"], dims["N"]), generator=g, dtype=torch.float32) * 2.0
    return {"x": x.to(device=device, dtype=dtype), "approximate": dims["approx"]}


# ---------------------------------------------------------------------------------------------
# Shape grids: M = tokens, N = MLP intermediate size, approx = the GELU variant.


def _s(m: int, n: int, approx: str, why: str) -> Shape:
    return Shape({"M": m, "N": n, "approx": approx}, why)


QUICK = (
    _s(64, 1024, "tanh", "small, power of two, tanh form"),
    _s(37, 1000, "none", "awkward: not powers of two, tail block masked, exact form"),
    _s(1, 4099, "tanh", "one row, width one past a power of two"),
    _s(5, 7, "none", "fewer elements than one block"),
)

FULL = (
    _s(1, 3072, "tanh", "a single token (decode), GPT-2 MLP: launch latency dominates"),
    _s(4096, 6400, "tanh", "GPT-2 XL MLP (4 x 1600), 4k tokens"),
    _s(16384, 4096, "tanh", "GPT-2 medium MLP, 16k tokens: the published eager/compile comparison point"),
    _s(8192, 16384, "tanh", "GPT-J-6B MLP, 8k tokens: the largest, far beyond L2"),
    _s(1, 4099, "none", "one row, awkward width"),
    _s(4096, 3072, "none", "BERT-base MLP (exact GELU), 4k tokens"),
    _s(16384, 4096, "none", "BERT-large MLP, 16k tokens: erf against tanh at the same size"),
    _s(3000, 18176, "none", "Falcon-7B MLP (4 x 4544), awkward token count"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; each input read once, each output written once; s = element size):
#   fwd:      read x; write y               -> 2 * M * N * s
#   bwd:      read dy, x; write dx          -> 3 * M * N * s
#   fwd+bwd:  the two passes                -> 5 * M * N * s
# FLOPs (rough, transcendentals counted as one): fwd ~8 per element, bwd ~14; negligible next to
# the bytes.


def check_shape(dims) -> str | None:
    if dims.get("approx") not in APPROX:
        return f"approx must be one of {APPROX}, got {dims.get('approx')!r}"
    return None


def bytes_moved(dims, dtype, mode) -> int:
    per = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode]
    return per * dims["M"] * dims["N"] * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 8, "bwd": 14, "fwd+bwd": 22}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="gelu",
    description="GELU, exact (erf) and tanh approximation, forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(gelu, gelu_eager),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x",),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # One rounding of the output (eager and compile also compute in fp32 and round once), plus the
    # rounding of dy to the dtype in bwd: ~2^-9 relative for bf16 (x1.5 under the interpreter's
    # truncating cast), ~2^-12 for fp16; fp32: exp/erf/division rounding only.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    check_shape=check_shape,
)
