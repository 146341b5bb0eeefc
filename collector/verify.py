"""The correctness gate: run a provider the way a mode needs it and compare with the float64 reference.

The runner times the same callables that are checked here, and the tests call `check` directly, so
what the tests prove is what the collector gates on.
"""
from __future__ import annotations

import dataclasses
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


def _grad_outputs(outs: tuple, seed: int) -> tuple:
    """Upstream gradients, one per differentiable output, drawn once so that every provider gets
    the same ones: random for tensors; 1 for a scalar, which is a loss, whose backward starts from
    1 as `loss.backward()` does (fused losses such as cross-entropy skip their scaling pass then,
    exactly as in training). Drawn on the outputs' device: on the CPU, float64 draws of the full
    grid's gradients took 143 s of an H100 run's 1045."""
    gens: dict[torch.device, torch.Generator] = {}
    dys = []
    for o in outs:
        if not o.dim():
            dys.append(torch.ones((), dtype=torch.float64, device=o.device))
            continue
        gen = gens.setdefault(o.device, torch.Generator(device=o.device).manual_seed(seed))
        dys.append(torch.randn(o.shape, generator=gen, dtype=torch.float64, device=o.device))
    return tuple(dys)


def upstream(spec: KernelSpec, fn: Callable[..., Any], inputs: Inputs, seed: int) -> tuple:
    """Upstream gradients drawn as reference_modes draws them, shaped by a forward of `fn` itself:
    for a call that is built without the reference's answers (the precompile pass)."""
    inputs = clone_inputs(inputs)
    for n in spec.grad_inputs:
        inputs[n].requires_grad_(True)
    return _upstream_of(spec, _differentiable(as_tuple(fn(**inputs))), seed)


def _upstream_of(spec: KernelSpec, diff: tuple, seed: int) -> tuple:
    """The random upstream gradients of `diff`, through the spec's own map where it has one."""
    dys = _grad_outputs(diff, seed)
    if spec.upstream is None:
        return dys
    with torch.no_grad():
        return spec.upstream(tuple(o.detach().to(torch.float64) for o in diff), dys)


def reference_answers(spec: KernelSpec, inputs: Inputs, mode: str, seed: int) -> tuple[tuple, tuple]:
    """(upstream gradients, what the reference answers) for one (inputs, mode), from a single
    float64 forward (and backward): computed once and shared by all providers. fwd -> outputs;
    bwd -> input gradients; fwd+bwd -> outputs then input gradients."""
    return reference_modes(spec, inputs, (mode,), seed)[mode]


def reference_modes(spec: KernelSpec, inputs: Inputs, modes: tuple[str, ...],
                    seed: int) -> dict[str, tuple[tuple, tuple]]:
    """reference_answers for several modes of one case from one float64 forward and, when a mode
    needs gradients, one backward: the forward's outputs serve fwd as well."""
    ref_in = upcast(inputs)
    if all(m == "fwd" for m in modes):
        with torch.no_grad():
            return {"fwd": ((), as_tuple(spec.reference(**ref_in)))}
    leaves = [ref_in[n].requires_grad_(True) for n in spec.grad_inputs]
    outs = as_tuple(spec.reference(**ref_in))
    diff = _differentiable(outs)
    dys = _upstream_of(spec, diff, seed)
    grads = torch.autograd.grad(diff, leaves, dys)
    outs = tuple(o.detach() if torch.is_tensor(o) else o for o in outs)
    answers = {"fwd": ((), outs), "bwd": (dys, grads), "fwd+bwd": (dys, outs + grads)}
    return {m: answers[m] for m in modes}


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
        outs = _forward_off_the_legacy_stream(fn, inputs)
        return lambda: grads(outs)
    if mode == "fwd+bwd":

        def fwd_bwd() -> tuple:
            outs = as_tuple(fn(**inputs))
            return tuple(o.detach() for o in outs) + grads(outs)

        return fwd_bwd
    raise ValueError(f"unknown mode {mode!r}")


def _forward_off_the_legacy_stream(fn: Callable[..., Any], inputs: Inputs) -> tuple:
    """The bwd mode's forward, run once outside the timed call. On CUDA it runs on a side stream:
    autograd runs each backward op on the stream its forward op ran on, and a forward on the
    default (legacy) stream put the first backward captured in a process there, which fails the
    capture ("operation would make the legacy stream depend on a capturing blocking stream",
    found with benchmarks/capture_diag.py), so the first backward of a run could not be timed as a
    graph replay."""
    devices = {t.device.type for t in inputs.values() if torch.is_tensor(t)}
    if devices != {"cuda"}:
        return as_tuple(fn(**inputs))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = as_tuple(fn(**inputs))
    torch.cuda.current_stream().wait_stream(side)
    return outs


def rel_error(out: torch.Tensor, ref: torch.Tensor, log_scale: bool = False) -> float:
    """||out - ref|| / ||ref|| in float64; inf for NaN/Inf or a shape mismatch. log_scale (a log of
    a scale, KernelSpec.log_scale): over max(||ref||, sqrt(n)), each element's error absolute where
    the reference is under 1 in size."""
    if not torch.is_tensor(out) or tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.detach().to(torch.float64)
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.detach().to(torch.float64)
    denom = torch.linalg.vector_norm(r).item()
    if log_scale:
        denom = max(denom, r.numel() ** 0.5)
    num = torch.linalg.vector_norm(o - r).item()
    return num / denom if denom > 0 else num


def rel_errors(got: tuple, want: tuple, log_scale: tuple[int, ...] = ()) -> list[float]:
    """rel_error of each pair, those at the positions in log_scale as logs of a scale."""
    return [rel_error(g, w, n in log_scale) for n, (g, w) in enumerate(zip(got, want))]


def max_error(got: tuple, want: tuple) -> float:
    return largest(None if len(got) != len(want) else rel_errors(got, want))


def largest(errors: list[float] | None) -> float:
    """The error a row is gated on: its worst part's; inf when the parts did not match."""
    return float("inf") if errors is None else max(errors, default=0.0)


def part_errors(spec: KernelSpec, got: tuple, want: tuple, mode: str) -> list[float] | None:
    """Each checked value's relative error (outputs, then gradients); None when `got` has a
    different number of values than `want`."""
    if spec.compare is not None and mode == "fwd":
        got = spec.compare(got)
    if len(got) != len(want):
        return None
    return rel_errors(got, want, () if mode == "bwd" else spec.log_scale)  # bwd checks gradients alone


def error_of(spec: KernelSpec, got: tuple, want: tuple, mode: str) -> float:
    return largest(part_errors(spec, got, want, mode))


def worst_part(spec: KernelSpec, errors: list[float] | None, mode: str) -> str | None:
    """Which checked value has the largest of `errors` (part_errors'): 'output 0', 'gradient of r',
    so that a failed row says where it is wrong; None where the parts cannot be named."""
    if not errors:
        return None
    grads = [f"gradient of {n}" for n in spec.grad_inputs] if mode != "fwd" else []
    outputs = [f"output {i}" for i in range(len(errors) - len(grads))] if mode != "bwd" else []
    names = outputs + grads
    if len(names) != len(errors):
        return None
    return names[max(range(len(errors)), key=errors.__getitem__)]


@dataclass
class CheckResult:
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance  # NaN/Inf give inf, which never passes


def gated_spec(spec: KernelSpec, provider: Provider) -> KernelSpec:
    """The spec a provider is gated with: the op's own, or for a provider that computes another
    function (Provider.reference), the op's with that provider's reference and gradient inputs."""
    if provider.reference is None:
        return spec
    return dataclasses.replace(spec, reference=provider.reference,
                               grad_inputs=provider.grad_inputs or spec.grad_inputs)


def check(spec: KernelSpec, provider: Provider | str, dims: Mapping[str, Any], dtype: torch.dtype,
          mode: str, device: str = "cpu", seed: int = 0) -> CheckResult:
    """Fresh inputs from `seed`, one call of the provider, relative error against float64."""
    if isinstance(provider, str):
        provider = spec.provider(provider)
    spec = gated_spec(spec, provider)
    inputs = spec.make_inputs(dims, dtype, device, seed)
    dys, want = reference_answers(spec, inputs, mode, seed + 1)
    got = build_call(spec, provider.fn, clone_inputs(inputs), mode, dys)()
    return CheckResult(error_of(spec, got, want, mode), spec.tolerance[dtype])
