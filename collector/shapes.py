"""Shapes named on the command line (`M=4096,N=8192`, the labels of the store): a kernel's grid
restricted to them, for `kcollect find` and a `run --shape LABEL` option.

A label that a grid of the kernel holds keeps that grid's Shape (and its reason); any other is a
new point, which must name exactly the kernel's dimensions and pass its `check_shape`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # (spec imports torch, which `kcollect find` needs only once it measures)
    from .spec import KernelSpec, Shape


class ShapeError(ValueError):
    """A label that is malformed or that the kernel cannot take, in one sentence."""


def parse_label(label: str) -> dict[str, int | str]:
    """'M=4096,N=8192' -> {'M': 4096, 'N': 8192}; values that are not integers stay strings."""
    dims: dict[str, int | str] = {}
    for part in label.split(","):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name or not value or name in dims:
            raise ShapeError(f"shape {label!r} is not NAME=VALUE,... (e.g. M=4096,N=8192)")
        dims[name] = int(value) if value.lstrip("-").isdigit() else value
    return dims


def known_shapes(spec: KernelSpec) -> dict[str, Shape]:
    """Every shape of the kernel's grids, by label (the quick grid's first)."""
    found: dict[str, Shape] = {}
    for shapes in spec.grids.values():
        for s in shapes:
            found.setdefault(s.label, s)
    return found


def shape_for(spec: KernelSpec, label: str) -> Shape:
    from .spec import Shape, shape_label

    dims = parse_label(label)
    known = known_shapes(spec)
    if shape_label(dims) in known:
        return known[shape_label(dims)]
    names = {tuple(s.dims) for s in known.values()}
    if names and tuple(dims) not in names:
        valid = " or ".join(",".join(n) for n in sorted(names))
        raise ShapeError(f"{spec.name} has no dimensions {','.join(dims)}; valid: {valid} "
                         f"(e.g. {next(iter(known))})")
    _numbers(spec.name, dims, known)
    why = spec.check_shape(dims)
    if why:
        raise ShapeError(f"{spec.name} cannot take {label}: {why}")
    return Shape(dims, "named on the command line")


def _numbers(kernel: str, dims: dict[str, int | str], known: Mapping[str, Shape]) -> None:
    """Each value of a new point made the type its dimension has in the kernel's grids (in place):
    where those are all integers, an integer; where numbers, a number (`p=0.25`); else as given
    (`R=diag`, `approx=tanh`, the kernel's check_shape judges them). A word where a number belongs
    is refused here (the kernel's size arithmetic would fail on it with a TypeError), and so is a
    size below 1 where the grids' sizes are all 1 or more (below 0 where some are 0)."""
    kinds: dict[str, set[type]] = {}
    least: dict[str, float] = {}
    for shape in known.values():
        for name, value in shape.dims.items():
            kinds.setdefault(name, set()).add(type(value))
            if isinstance(value, (int, float)):
                least[name] = min(least.get(name, value), value)
    for name, value in dims.items():
        types = kinds.get(name, set())
        if isinstance(value, str) and types and types <= {int, float}:
            try:
                number = float(value)
            except ValueError:
                number = None
            if types == {int} or number is None:
                kind = "an integer" if types == {int} else "a number"
                raise ShapeError(f"{name} must be {kind} (as in every {kernel} shape), got {value!r}")
            dims[name] = value = number
        # a size of 0 or below, where every shape of the grids has at least 1 (0: where they have 0)
        floor = 1 if least.get(name, 0) >= 1 else 0
        if isinstance(value, (int, float)) and name in least and least[name] >= 0 and value < floor:
            raise ShapeError(f"{name} must be at least {floor} (as in every {kernel} shape), got {value}")


def restrict(spec: KernelSpec, labels: Sequence[str]) -> KernelSpec:
    """The spec with every grid replaced by the shapes labelled (in the order given)."""
    by_label = {s.label: s for s in (shape_for(spec, label) for label in labels)}
    shapes = tuple(by_label.values())
    grids: Mapping[str, tuple[Shape, ...]] = {name: shapes for name in spec.grids}
    return replace(spec, grids=grids)
