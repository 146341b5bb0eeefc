"""The types a kernel file declares itself with.

A kernel is data: one `KernelSpec` per file, with an explicit name. The runner reads the spec and
does everything else (inputs on the device, the correctness gate, timing, units, storage).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .names import DTYPE_CHOICES, MODES

# Names used on the command line and in the store, mapped to torch dtypes.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_CHOICES}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

Inputs = dict[str, Any]  # tensors and plain parameters (eps, ignore_index, ...), passed as keywords


@dataclass(frozen=True)
class Shape:
    """One point of a shape grid. `dims` may hold ints and short strings (a variant such as
    approx='tanh'); `why` says why the point is in the grid. `dtypes`: the names of the kernel's
    bench dtypes a run measures this point in by default (None: all of them); a dtype the command
    names (--dtype) measures every point."""

    dims: Mapping[str, int | str]
    why: str
    dtypes: tuple[str, ...] | None = None

    @classmethod
    def rows(cls, m: int, n: int, why: str) -> "Shape":
        """The common case: M rows (tokens) of N elements."""
        return cls({"M": m, "N": n}, why)

    @property
    def label(self) -> str:
        """The dims with their names, e.g. M=4096,N=8192: the series key in the store."""
        return shape_label(self.dims)


def shape_label(dims: Mapping[str, int | str]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def always_available(device: str) -> str | None:
    return None


class Unavailable(Exception):
    """Raised by a provider's call for inputs it cannot take (a backend that refuses a shape, a mask
    or a length): the runner stores an 'unavailable' row with this message, never an error. For
    refusals that depend only on the device, use `Provider.available`."""


@dataclass(frozen=True)
class Provider:
    """One implementation of the kernel. `fn(**inputs)` returns a tensor or a tuple of tensors.
    `available(device)` returns None when it can run on that device type ('cuda' or 'cpu'),
    otherwise the reason it cannot (reported as unavailable, never as an error); a refusal that
    depends on the inputs is raised from `fn` as `Unavailable`."""

    name: str
    fn: Callable[..., Any]
    available: Callable[[str], str | None] = always_available
    # inputs -> the tuned config(s) this provider launches with for them (JSON-able): stored with
    # each row, so that a number says which plan it came from (ours; None for the others)
    config: Callable[[Inputs], Mapping[str, Any]] | None = None
    # A provider that computes another function than the op (the layer the op replaces, timed
    # beside it) is gated on its own float64 reference, with its own gradient inputs; `note` says
    # what it computes, for the reader of its rows.
    reference: Callable[..., Any] | None = None
    grad_inputs: tuple[str, ...] | None = None
    note: str = ""
    # whether its first call builds code that a disk cache keeps (Triton, torch.compile, the CuTe
    # DSL): the precompile pass calls only these (precompile.py); False for native PyTorch
    builds: bool = True
    # whether its code is this repository's (our kernels): stored on every row, it decides which
    # series can fail the regression gate; every other provider is a reference whose code does not
    # change between our commits
    ours: bool = False

    @property
    def package(self) -> str:
        """The distribution of the peer package it runs ('liger-kernel'), '' for any other provider:
        stored on every row, so that a peer's upgrade is a change of conditions for that peer's
        series only. A peer's availability check (peer_available) names the module it imports."""
        module = getattr(self.available, "module", None)
        return _distribution(module) if module else ""


@dataclass(frozen=True)
class KernelSpec:
    name: str
    description: str
    modes: tuple[str, ...]
    providers: tuple[Provider, ...]
    baseline: str  # the provider the speedup column divides by
    # plain maths in float64: takes the inputs with floating tensors upcast, returns like fn
    reference: Callable[..., Any]
    # (dims, dtype, device, seed) -> Inputs; fresh random data, never zeros
    make_inputs: Callable[[Mapping[str, Any], torch.dtype, str, int], Inputs]
    grad_inputs: tuple[str, ...]  # the inputs that get gradients in bwd modes
    grids: Mapping[str, tuple[Shape, ...]]  # 'quick' and 'full'
    # cost model: (dims, dtype, mode) -> bytes; (dims, mode) -> flops. The collector turns them
    # into GB/s, TFLOP/s and the fraction of the measured ceiling.
    bytes_moved: Callable[[Mapping[str, Any], torch.dtype, str], int]
    flops: Callable[[Mapping[str, Any], str], float]
    bound: str  # 'memory' (compare with copy bandwidth) or 'compute' (with matmul peak)
    tolerance: Mapping[torch.dtype, float]  # max relative error against the reference, per dtype
    dtypes: tuple[torch.dtype, ...]  # every dtype the kernel claims (the tests cover each)
    bench_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)  # what `kcollect run` times by default
    # dims -> None, or the reason this kernel cannot take the shape
    check_shape: Callable[[Mapping[str, Any]], str | None] = lambda dims: None
    # maps a provider's (tuple) output to what is compared with the reference (e.g. dequantise)
    compare: Callable[[tuple], tuple] | None = None
    notes: str = ""
    # dims -> the tokens (query positions) one call processes, where the op has them: each row
    # stores it and the site shows tokens/s beside the rate
    tokens: Callable[[Mapping[str, Any]], int] | None = None
    # (the differentiable outputs, in float64; their random upstream gradients) -> the upstream
    # gradients the check uses, for an op where some random ones would differentiate a kink that
    # no model's loss has (the sLSTM's stabilised final states)
    upstream: Callable[[tuple, tuple], tuple] | None = None
    # the outputs (by position) that are the log of a scale, as a stabiliser m: a recurrent cell's
    # state is (C, n) exp(m), so an error d in m is the relative error e^d - 1 of the state it
    # scales, whatever m's own size. Their error is absolute where |m| < 1 (verify.rel_error's
    # log_scale), not relative to an m that rounds near zero (log sigmoid of a large forget gate)
    log_scale: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problem = spec_problem(self)
        if problem:
            raise ValueError(f"KernelSpec {self.name!r}: {problem}")

    def provider(self, name: str) -> Provider:
        for p in self.providers:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no provider {name!r}; known: {', '.join(self.provider_names)}")

    @property
    def provider_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.providers)

    def grid(self, name: str) -> tuple[Shape, ...]:
        return self.grids[name]


BOUNDS = ("memory", "compute")


def spec_problem(spec: KernelSpec) -> str | None:
    """What is wrong with a spec's declaration, in one sentence (None: nothing): the mistakes that
    would otherwise surface deep in a run, or never (a baseline that is not a provider gives no
    speedup column; a dtype without a tolerance has no gate)."""
    names = [p.name for p in spec.providers]
    bad_modes = [m for m in spec.modes if m not in MODES]
    no_tolerance = [DTYPE_NAMES.get(d, str(d)) for d in spec.dtypes if d not in spec.tolerance]
    checks = (
        (not spec.name or not isinstance(spec.name, str), "its name must be a non-empty string"),
        (not spec.modes or bad_modes, f"modes must be some of {', '.join(MODES)}, got {spec.modes!r}"),
        (not names, "it declares no provider"),
        (len(set(names)) < len(names), f"provider names repeat: {', '.join(names)}"),
        (spec.baseline not in names, f"baseline {spec.baseline!r} is not one of its providers ({', '.join(names)})"),
        (spec.bound not in BOUNDS, f"bound must be one of {', '.join(BOUNDS)}, got {spec.bound!r}"),
        (not spec.dtypes, "it claims no dtype"),
        (bool(no_tolerance), f"no tolerance for {', '.join(no_tolerance)} (a tolerance per dtype it claims)"),
        (any(not t > 0 for t in spec.tolerance.values()), "every tolerance must be a positive number"),
        (isinstance(spec.grad_inputs, str), f"grad_inputs must be a tuple of names, got the string "
                                            f"{spec.grad_inputs!r}"),
        (not spec.grids or any(not all(isinstance(s, Shape) for s in g) for g in spec.grids.values()),
         "grids must map each grid's name to its Shapes"),
    )
    return next((why for bad, why in checks if bad), None)


def compiled(eager_fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile of the eager code, built on first call. dynamic=False: each shape gets its own
    specialised graph (the best case for compile; the runner raises dynamo's recompile limit)."""
    holder: dict[str, Callable[..., Any]] = {}

    def call(**inputs: Any) -> Any:
        if "fn" not in holder:
            holder["fn"] = torch.compile(eager_fn, dynamic=False)
        return holder["fn"](**inputs)

    return call


def standard_providers(triton_fn: Callable[..., Any], eager_fn: Callable[..., Any],
                       config: Callable[[Inputs], Mapping[str, Any]] | None = None) -> tuple[Provider, ...]:
    """ours (with the function that names its tuned config, `ours=True`), PyTorch eager, and
    torch.compile of the same eager code."""
    return (
        Provider("triton", triton_fn, config=config, ours=True),
        Provider("torch", eager_fn, builds=False),
        Provider("compile", compiled(eager_fn)),
    )


def peer_available(module: str) -> Callable[[str], str | None]:
    """Availability of a peer package: importable, and on a CUDA device (peers' Triton kernels are
    not written for Triton's CPU interpreter; Liger's fail there). On a GPU the package is imported
    once, so that one whose own dependencies are missing (QuACK without its CuTe DSL libraries) is
    reported unavailable with the import error, not as an error row per shape."""

    def check(device: str) -> str | None:
        import importlib
        import importlib.util

        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
        if device != "cuda":
            return f"{module} needs a CUDA GPU (its kernels do not run under Triton's interpreter)"
        try:
            importlib.import_module(module)
        except Exception as e:  # a missing dependency of the peer's own, an incompatible torch
            return f"{module} cannot be imported: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return None

    check.module = module  # Provider.package reads it
    return check


@functools.lru_cache(maxsize=None)
def _distribution(module: str) -> str:
    """The installed distribution that provides a top-level module ('liger_kernel' -> 'liger-kernel'),
    or the module's own name where none is installed (the row is then 'unavailable' anyway)."""
    from importlib.metadata import packages_distributions

    from .series import canonical

    found = packages_distributions().get(module.split(".")[0])
    return canonical(found[0]) if found else module
