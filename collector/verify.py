"""The correctness gate: run a provider the way a mode needs it and compare with the float64 reference.

The runner times the same callables that are checked here, and the tests call `check` directly, so
what the tests prove is what the collector gates on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .spec import Inputs, KernelSpec, Provider


def as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def clone_inputs(inputs: Inputs) -> Inputs:
    """A private copy per provider: some peers overwrite their inputs (Liger's cross-entropy writes
    the gradient over the logits)."""
    return {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()}


def upcast(inputs: Inputs) -> Inputs:
    return {
        k: v.detach().to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v
        for k, v in inputs.items()
    }


def _differentiable(outs: tuple) -> tuple:
    return tuple(o for o in outs if torch.is_tensor(o) and o.requires_grad)


def make_grad_outputs(spec: KernelSpec, inputs: Inputs, seed: int) -> tuple:
    """Upstream gradients, one per differentiable output, drawn once so that every provider gets
    the same ones: random for tensors; 1 for a scalar, which is a loss, whose backward starts from
    1 as `loss.backward()` does (fused losses such as cross-entropy skip their scaling pass then,
    exactly as in training)."""
    ref_in = upcast(inputs)
    for name in spec.grad_inputs:
        ref_in[name].requires_grad_(True)
    outs = _differentiable(as_tuple(spec.reference(**ref_in)))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dys = []
    for o in outs:
        dy = torch.randn(o.shape, generator=gen, dtype=torch.float64) if o.dim() else torch.ones((), dtype=torch.float64)
        dys.append(dy.to(device=o.device))
    return tuple(dys)


def build_call(spec: KernelSpec, fn: Callable[..., Any], inputs: Inputs, mode: str, dys: tuple) -> Callable[[], tuple]:
    """A zero-argument callable that does one unit of the mode's work and returns what is checked:
    fwd -> outputs (no autograd, as at inference); bwd -> input gradients, given a graph built once
    before; fwd+bwd -> outputs then gradients. Gradients go through autograd.grad, so nothing
    accumulates into .grad between timed calls."""
    if mode == "fwd":

        def fwd() -> tuple:
            with torch.no_grad():
                return as_tuple(fn(**inputs))

        return fwd

    leaves = [inputs[n].requires_grad_(True) for n in spec.grad_inputs]
    cast: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def grads(outs: tuple) -> tuple:
        diff = _differentiable(outs)
        # Cast the float64 upstream gradients once, not inside every timed call: the cast would
        # otherwise be timed with the backward (and move more bytes than the backward itself).
        for i, (dy, o) in enumerate(zip(dys, diff)):
            if (i, o.dtype) not in cast:
                cast[(i, o.dtype)] = dy.to(o.dtype)
        gys = tuple(cast[(i, o.dtype)] for i, o in enumerate(diff))
        return torch.autograd.grad(diff, leaves, gys, retain_graph=(mode == "bwd"))

    if mode == "bwd":
        outs = as_tuple(fn(**inputs))
        return lambda: grads(outs)
    if mode == "fwd+bwd":

        def fwd_bwd() -> tuple:
            outs = as_tuple(fn(**inputs))
            return tuple(o.detach() for o in outs) + grads(outs)

        return fwd_bwd
    raise ValueError(f"unknown mode {mode!r}")


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf for NaN/Inf or a shape mismatch."""
    if not torch.is_tensor(out) or tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.detach().to(torch.float64)
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.detach().to(torch.float64)
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / denom if denom > 0 else num


def max_error(got: tuple, want: tuple) -> float:
    if len(got) != len(want):
        return float("inf")
    return max((rel_error(g, w) for g, w in zip(got, want)), default=0.0)


@dataclass
class Expected:
    """The reference's answers for one (inputs, mode): computed once, shared by all providers."""

    values: tuple


def expected(spec: KernelSpec, inputs: Inputs, mode: str, dys: tuple) -> Expected:
    ref_in = upcast(inputs)
    if mode == "fwd":
        with torch.no_grad():
            return Expected(as_tuple(spec.reference(**ref_in)))
    call = build_call(spec, spec.reference, ref_in, "fwd+bwd", dys)
    both = call()
    if mode == "bwd":
        return Expected(both[len(both) - len(spec.grad_inputs):])
    return Expected(both)


def error_of(spec: KernelSpec, got: tuple, want: Expected, mode: str) -> float:
    if spec.compare is not None and mode == "fwd":
        got = spec.compare(got)
    return max_error(got, want.values)


@dataclass
class CheckResult:
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance  # NaN/Inf give inf, which never passes


def check(spec: KernelSpec, provider: Provider | str, dims: Mapping[str, Any], dtype: torch.dtype,
          mode: str, device: str = "cpu", seed: int = 0) -> CheckResult:
    """Fresh inputs from `seed`, one call of the provider, relative error against float64."""
    if isinstance(provider, str):
        provider = spec.provider(provider)
    inputs = spec.make_inputs(dims, dtype, device, seed)
    dys = make_grad_outputs(spec, inputs, seed + 1) if mode != "fwd" else ()
    want = expected(spec, inputs, mode, dys)
    got = build_call(spec, provider.fn, clone_inputs(inputs), mode, dys)()
    return CheckResult(error_of(spec, got, want, mode), spec.tolerance[dtype])
