"""What the collector needs to measure gelu: providers, the float64 reference, inputs, grids, the
cost model and the tolerance. The variant is part of the shape (dims["approx"] = "tanh" | "none",
the names of F.gelu's `approximate`), so both variants sit in both grids and are timed side by side."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, standard_providers

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of, per_element_cost
from . import APPROX, gelu, pick
from .naive import reference


def gelu_eager(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    # MLP pre-activations; the scale 2 spans the curved part and both tails (x << 0 -> 0, x >> 0 -> x)
    x = torch.randn((dims["M"], dims["N"]), generator=g, dtype=torch.float32) * 2.0
    return {"x": x.to(device=device, dtype=dtype), "approximate": dims["approx"]}


def config_of(inputs) -> dict:
    return config_record(elementwise=pick(inputs["x"].numel(), inputs["x"].device))


def check_shape(dims) -> str | None:
    if dims.get("approx") not in APPROX:
        return f"approx must be one of {APPROX}, got {dims.get('approx')!r}"
    return None


# Cost model (minimum traffic; each input read once, each output written once; s = element size):
#   fwd:      read x; write y               -> 2 * M * N * s
#   bwd:      read dy, x; write dx          -> 3 * M * N * s
#   fwd+bwd:  the two passes                -> 5 * M * N * s
# FLOPs (rough, transcendentals counted as one): fwd ~8 per element, bwd ~14; negligible next to
# the bytes.
bytes_moved, flops = per_element_cost({"fwd": 2, "bwd": 3, "fwd+bwd": 5}, {"fwd": 8, "bwd": 14, "fwd+bwd": 22})


SPEC = KernelSpec(
    name="gelu", modes=MODES, baseline="torch", bound="memory",
    description="GELU, exact (erf) and tanh approximation, forward and backward", reference=reference,
    make_inputs=make_inputs, grad_inputs=("x",), grids=grids_of(__file__), check_shape=check_shape,
    bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=standard_providers(gelu, gelu_eager, config_of),  # Liger has no plain GELU
    # One rounding of the output (eager and compile also compute in fp32 and round once), plus the
    # rounding of dy to the dtype in bwd: ~2^-9 relative for bf16 (x1.5 under the interpreter's
    # truncating cast), ~2^-12 for fp16; fp32: exp/erf/division rounding only.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5})
