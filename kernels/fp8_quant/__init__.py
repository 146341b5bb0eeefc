"""FP8 quantisation: x (bf16/fp16/fp32) -> q (float8_e4m3fn) and float32 scales, x ~= q * scale.

Three granularities, chosen by the shape's `gran`:
  "row"      one scale per row (per-token scaling)                    scales [M, 1]
  "1x128"    one per row and 128-column group (activations, DeepSeek-V3) scales [M, ceil(N/128)]
  "128x128"  one per 128 x 128 tile (weights)                         scales [ceil(M/128), ceil(N/128)]
Partial groups and tiles at the right and bottom edges are supported (N or M not a multiple of 128,
e.g. gpt-oss's hidden size 2880): the edge group's scale covers only its valid elements.

Per block: scale = max(amax, AMAX_FLOOR) / 448 (448 = e4m3's largest finite value; the floor keeps
an all-zero block from dividing by zero), q = e4m3(clamp(x / scale, -448, 448)), rounded to nearest
even. Our kernel gets the correctly rounded x / scale from a multiply by 1 / scale and one fma
correction (no division per element), so on the CPU it agrees with the eager code's division on
every q and every scale, up to the sign of zero (a -0.0 input gives +0 in our q, -0 in eager's: the
same value); on CUDA eager's scales can differ by an ulp (see the baselines).

`fp8_quant(x, gran)` is the public entry (no autograd: quantisation is an inference / forward-only
step here); `fp8_quant_forward` is the raw launch, with `config=None` (config.pick's choice) or the
path's TilesConfig ("128x128"), GroupsConfig ("1x128", "row" up to ROW_MAX columns) or LinesConfig
(wider rows) to force.
"""
from __future__ import annotations

import torch

from .config import GROUP, ROW_MAX, GroupsConfig, LinesConfig, TilesConfig, pick
from .fwd import AMAX_FLOOR, FP8_MAX, GRANULARITIES, block_shape, fp8_quant_forward

__all__ = ["AMAX_FLOOR", "FP8_MAX", "GRANULARITIES", "GROUP", "ROW_MAX", "GroupsConfig", "LinesConfig", "TilesConfig",
           "block_shape", "dequantize", "fp8_quant", "fp8_quant_forward", "pick"]


def fp8_quant(x: torch.Tensor, gran: str):
    """(q float8_e4m3fn [M, N], float32 scales), x ~= q * scale."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}")
    if gran not in GRANULARITIES:
        raise ValueError(f"unknown granularity {gran!r}; known: {', '.join(GRANULARITIES)}")
    return fp8_quant_forward(x, gran)


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """q * its block's scale, in float64 (exact: q has 4 significant bits, the scale 24). The
    block shape follows from the scales' shape: [M, *] means one row per block, otherwise 128;
    [*, 1] means whole rows, otherwise 128 columns (where two readings fit, they agree)."""
    M, N = q.shape
    br = 1 if scales.shape[0] == M else GROUP
    bc = N if scales.shape[1] == 1 else GROUP
    s = scales.to(torch.float64).repeat_interleave(br, dim=0)[:M].repeat_interleave(bc, dim=1)[:, :N]
    return q.to(torch.float64) * s
