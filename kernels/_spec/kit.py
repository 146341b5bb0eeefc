"""What any op's spec.py may use: the float dtypes, inputs drawn on the device, the shape grids in
grids.toml, the cost model's helpers, and the tokens of a batch of sequences."""
from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from kcollect.names import DTYPE_CHOICES
from kcollect.spec import Shape

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def drawn_on_device(make_inputs: Callable) -> Callable:
    """A spec's make_inputs(dims, dtype, device, seed), drawn on `device`: its tensors are made
    there (torch.device as the default), so its generator must be torch.Generator(device=device).
    On the CPU the draws are those of a CPU generator, as before; on a GPU, the full memory-bound
    grid's inputs drawn on the CPU took 67 s of an H100 run."""

    @functools.wraps(make_inputs)
    def make(dims, dtype, device, seed):
        with torch.device(device):
            return make_inputs(dims, dtype, device, seed)

    return make



def grids_of(spec_file: str) -> dict[str, tuple[Shape, ...]]:
    """The shape grids in grids.toml beside `spec_file` (a spec module's __file__). The file holds one
    array per grid (`quick`, `full`), each shape an inline table of its dims, in order, with ints,
    floats and strings as written (resets = "0.1" is a string: it is part of the label), `why`,
    the reason the shape is in the grid, and optionally `dtypes`, the bench dtypes it is measured in
    by default (Shape.dtypes): {"quick": (Shape, ...), "full": (...)}."""
    path = Path(spec_file).with_name("grids.toml")
    with path.open("rb") as f:
        tables = tomllib.load(f)
    grids = {}
    for name, rows in tables.items():
        if any("why" not in row for row in rows):
            raise ValueError(f"{path}: every shape of grid {name!r} needs a 'why'")
        for row in rows:
            if "dtypes" in row and not (row["dtypes"] and set(row["dtypes"]) <= set(DTYPE_CHOICES)):
                raise ValueError(f"{path}: dtypes {row['dtypes']!r} of a shape of grid {name!r}: "
                                 f"valid: a list of {', '.join(DTYPE_CHOICES)}")
        grids[name] = tuple(Shape({k: v for k, v in row.items() if k not in ("why", "dtypes")}, row["why"],
                                  tuple(row["dtypes"]) if "dtypes" in row else None) for row in rows)
    return grids


def per_element_cost(bytes_per: Mapping[str, int], flops_per: Mapping[str, int]):
    """(bytes_moved, flops) of an op over [M, N] that moves bytes_per[mode] M x N tensors of the
    dtype and does flops_per[mode] operations an element."""

    def bytes_moved(dims, dtype, mode) -> int:
        return bytes_per[mode] * dims["M"] * dims["N"] * dtype.itemsize

    def flops(dims, mode) -> float:
        return float(flops_per[mode] * dims["M"] * dims["N"])

    return bytes_moved, flops


def by_mode(mode: str, fwd, bwd):
    """A cost of `mode` from the forward's and the backward's: fwd+bwd runs both passes."""
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]



def sequence_tokens(dims: Mapping[str, Any]) -> int:
    """Tokens of a batch of B sequences of T steps (the recurrent ops' spec.tokens)."""
    return dims["B"] * dims["T"]
