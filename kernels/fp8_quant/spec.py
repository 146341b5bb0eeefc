"""What the collector needs to measure fp8_quant: providers, the float64 reference (the input), inputs,
grids, the cost model and the tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import KernelSpec, Provider, compiled

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of
from . import AMAX_FLOOR, FP8_MAX, GRANULARITIES, block_shape, dequantize, fp8_quant, pick
from .naive import reference


def _triton_available(device: str) -> str | None:
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        return "float8e4nv conversions need compute capability 8.9 or newer"
    return None


# Baselines: eager torch code as one would write it (pad to whole blocks, amax per block, divide,
# clamp, cast), and torch.compile of the same code. Known: torch 2.13's CPU inductor miscompiles it
# for "1x128" with N % 128 != 0 (its fused loop never writes the partial last group), so the CPU
# quick grid shows compile failing the gate at 37x1000; the GPU (Triton) codegen is another path.
# On CUDA, torch divides by a Python scalar as a multiply by its reciprocal, so eager's scales can
# be one float32 ulp off ours there, and its q one e4m3 step off at the exact midpoints that bf16
# data often hits (~0.1% of elements); on the CPU both are bit-identical to ours.


def fp8_quant_eager(x: torch.Tensor, gran: str):
    M, N = x.shape
    br, bc = block_shape(M, N, gran)
    pad_r, pad_c = -M % br, -N % bc
    xp = F.pad(x, (0, pad_c, 0, pad_r)) if pad_r or pad_c else x  # zeros never win the amax
    blocks = xp.view((M + pad_r) // br, br, (N + pad_c) // bc, bc)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True).float()
    scale = amax.clamp(min=AMAX_FLOOR) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(M + pad_r, N + pad_c)[:M, :N].contiguous()
    return q, scale.view(scale.shape[0], scale.shape[2])


def compare(out: tuple) -> tuple:
    q, scales = out
    return (dequantize(q, scales),)


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    M, N = dims["M"], dims["N"]
    x = torch.randn((M, N), generator=g, dtype=torch.float32)
    if dims["gran"] == "128x128":
        x = x * 0.02  # weights: initialiser scale
    else:
        # activations: channels of unequal magnitude (log-normal per column: one channel in a
        # thousand ~10x the median), which is what makes per-block scales worth having
        x = x * torch.exp(torch.randn((N,), generator=g) * 0.75)
    return {"x": x.to(device=device, dtype=dtype), "gran": dims["gran"]}


def config_of(inputs) -> dict:
    x = inputs["x"]
    cfg = pick(*x.shape, inputs["gran"], x.element_size(), x.device)
    return config_record(**{type(cfg).__name__[:-len("Config")].lower(): cfg})


# Cost model (minimum traffic): read x once, write q once (1 byte per element) and the scales
#   fwd: M * N * s + M * N + 4 * n_scales,  n_scales = ceil(M / br) * ceil(N / bc)
# (3 bytes per element for bf16; the 1x128 scales add 1/32 byte per element). The two-pass wide-row
# kernel re-reads x from L2, which this model does not count. FLOPs: an abs-max and a multiply per
# element, negligible next to the bytes.


def bytes_moved(dims, dtype, mode) -> int:
    M, N = dims["M"], dims["N"]
    br, bc = block_shape(M, N, dims["gran"])
    n_scales = -(-M // br) * -(-N // bc)
    return M * N * dtype.itemsize + M * N + 4 * n_scales


def flops(dims, mode) -> float:
    return float(2 * dims["M"] * dims["N"])


def check_shape(dims) -> str | None:
    if dims.get("gran") not in GRANULARITIES:
        return f"unknown granularity {dims.get('gran')!r}; known: {', '.join(GRANULARITIES)}"
    if dims["M"] < 1 or dims["N"] < 1:
        return "M and N must be at least 1"
    return None


SPEC = KernelSpec(
    name="fp8_quant", modes=("fwd",), baseline="torch", bound="memory",
    description="bf16 -> float8_e4m3fn with float32 scales per row, 1x128 group or 128x128 tile", reference=reference,
    make_inputs=make_inputs, grad_inputs=(), grids=grids_of(__file__), check_shape=check_shape, compare=compare,
    bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=(
        Provider("triton", fp8_quant, _triton_available, config_of, ours=True),
        Provider("torch", fp8_quant_eager, builds=False),
        Provider("compile", compiled(fp8_quant_eager)),
    ),
    # The gate compares q * scale with x. e4m3 keeps 3 mantissa bits: round-to-nearest errs by at
    # most 2^-4 relative per element, and by about 2^-3 / sqrt(12) ~ 3.6% of the binade's lower
    # end in RMS, i.e. ~2.2-2.6% in Frobenius norm on these inputs whatever the input dtype (the
    # input's own rounding is not in the error: the reference is the input). 3.2% passes that with
    # margin yet fails round-toward-zero (~4.5%) or a misplaced scale.
    tolerance={torch.bfloat16: 3.2e-2, torch.float16: 3.2e-2, torch.float32: 3.2e-2},
    notes="q rounds to nearest even; equal to the eager code's q and scales up to the sign of zero")
