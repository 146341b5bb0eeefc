"""What the ops' spec modules share when they declare their KernelSpec: the fields every spec module
defines under the same names, the defaults most ops take, a maker of labelled shapes and the
per-element cost model of the elementwise and row ops."""
from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from kcollect.spec import KernelSpec, Provider, Shape

FWD_BWD = ("fwd", "bwd", "fwd+bwd")
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


def shape_maker(*keys: str) -> Callable[..., Shape]:
    """A function (value per key..., why) -> Shape({key: value}, why), for a module's grids."""

    def make(*args: Any) -> Shape:
        *values, why = args
        return Shape(dict(zip(keys, values, strict=True)), why)

    return make


def grids_of(spec_file: str) -> dict[str, tuple[Shape, ...]]:
    """The shape grids in grids.toml beside `spec_file` (a spec module's __file__). The file holds one
    array per grid (`quick`, `full`), each shape an inline table of its dims, in order, with ints,
    floats and strings as written (resets = "0.1" is a string: it is part of the label), and `why`,
    the reason the shape is in the grid: {"quick": (Shape, ...), "full": (...)}."""
    path = Path(spec_file).with_name("grids.toml")
    with path.open("rb") as f:
        tables = tomllib.load(f)
    grids = {}
    for name, rows in tables.items():
        if any("why" not in row for row in rows):
            raise ValueError(f"{path}: every shape of grid {name!r} needs a 'why'")
        grids[name] = tuple(Shape({k: v for k, v in row.items() if k != "why"}, row["why"]) for row in rows)
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


def module_spec(module: Mapping[str, Any], name: str, description: str, triton: Callable | None = None,
                **fields: Any) -> KernelSpec:
    """The KernelSpec of a spec module, given its globals(): its `reference`, `make_inputs`, grids
    `GRIDS` (grids_of(__file__), from its grids.toml) or, where it builds them in code, `QUICK` and
    `FULL`, cost model `bytes_moved` and `flops` and, where it defines them, `check_shape` and `tokens`;
    `fields` give the rest and override these and the defaults (modes fwd, bwd and fwd+bwd, baseline
    "torch", memory-bound, the dtypes bf16, fp16 and fp32). `triton`: our function, put first in the
    providers as "triton" with the module's `config_of` (each row records the config it ran with)."""
    if triton is not None:
        fields["providers"] = (Provider("triton", triton, config=module["config_of"], ours=True), *fields.get("providers", ()))
    taken = {"reference": module["reference"], "make_inputs": module["make_inputs"],
             "grids": module["GRIDS"] if "GRIDS" in module else {"quick": module["QUICK"], "full": module["FULL"]},
             "bytes_moved": module["bytes_moved"], "flops": module["flops"],
             "modes": FWD_BWD, "baseline": "torch", "bound": "memory", "dtypes": FLOATS}
    for optional in ("check_shape", "tokens"):
        if optional in module:
            taken[optional] = module[optional]
    return KernelSpec(name=name, description=description, **{**taken, **fields})


def sequence_tokens(dims: Mapping[str, Any]) -> int:
    """Tokens of a batch of B sequences of T steps (the recurrent ops' spec.tokens)."""
    return dims["B"] * dims["T"]


def cell_spec(module: Mapping[str, Any], name: str, description: str, **fields: Any) -> KernelSpec:
    """module_spec of a recurrent cell (lstm, slstm, mlstm, axon): compute-bound (matrix products
    every step), measured in bf16 and fp32, B * T tokens a call."""
    return module_spec(module, name, description, **{"bound": "compute", "dtypes": (torch.bfloat16, torch.float32),
                                                     "tokens": sequence_tokens, **fields})
