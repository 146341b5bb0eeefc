"""What every family of awkward cases shares: one case run as a user would run it, and its verdict.

A family module (attention.py, scans.py, cells.py) exposes

    draw(rng: random.Random, device: str) -> dict     one JSON-able case: op, dtype, dims, options, seed
    check(case: dict, device: str) -> dict            the verdict of `verdict()` below, JSON-able

and builds, for each case, a `Subject`: our library call, PyTorch eager and the float64 reference
as three functions of the same inputs, and a function that makes those inputs afresh (seeded:
every call gives the same values in the same layout). `verdict(subject)` then

  - runs the reference in float64 (forward, and backward from random upstream gradients),
  - runs ours and eager on their own copies of the inputs, in the case's dtype, forward and backward
    from the same upstream gradients (cast to each output's dtype),
  - compares each output and each input gradient with the reference (relative error in norm, as
    the collector's gate: kcollect.verify.rel_error),
  - snapshots every input and every upstream gradient before the call and compares after it
    (a kernel that writes into either corrupts a tensor autograd or the caller still uses),
  - and classifies the case (STATUSES, most severe first):

    crash           an exception other than a refusal (its type and message), or a refusal of an
                    input the op's documented limits accept
    wrong_shape     an output or gradient of another shape than the reference's, or a missing one
    inplace         an input or an incoming gradient changed by the call
    over_tolerance  some output or gradient over its gate: fp32 more than FP32_FACTOR x eager's
                    error, and than FP32_FACTOR x the part's own spread under one fp32 rounding of
                    the inputs (an ill-conditioned part), and than FP32_FLOOR (a few fp32
                    roundings); bf16/fp16 over the spec's tolerance, over FP32_FACTOR x eager's
                    (eager over the tolerance as well means the shape's own rounding does: too few
                    elements to average, see `gate`) and over FP32_FACTOR x the part's spread under
                    the rounding of the upstream gradients to the outputs' dtype (which every
                    provider is handed); an fp32 part over its gate is judged again by the
                    medians over ROUNDINGS roundings of the inputs (named in `redrawn` if it passes)
    refused         a ValueError for an input past a documented limit, naming it (Subject.refusal)
    ok
    invalid         the float64 reference itself failed, or (bf16/fp16) some output or gradient of
                    the float64 reference lies past the dtype's largest finite value (fp16's
                    65504): the true answer is not representable in that dtype, so no
                    computation in it can be held to it (eager overflows as well); a defect of
                    the case, not of the op. A true answer within the range that ours turns into
                    inf stays over_tolerance, but where its largest element within the part's gate
                    would pass the dtype's largest (`_saturated`): there ours' overflows count as
                    that largest value and the part is judged so (floor-only if it then passes).

Helpers for awkward layouts: `padded` (a copy whose rows sit in a wider buffer: strides that are
not a multiple of 16 bytes, and optionally a data pointer off by some elements), `every_other` (a
copy whose last dim has stride 2); `seeded` and `dtype_of` for building a case's tensors."""
from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from kcollect import verify

STATUSES = ("crash", "wrong_shape", "inplace", "over_tolerance", "refused", "ok", "invalid")

# The fp32 bar (issue 40's "done"): ours within 2x of eager's error against float64, output by
# output. Below a few roundings of fp32 (8 units of 2^-23, relative, in norm) an error is the last
# bits' noise, where eager's can be lucky (a sum whose roundings cancel): there the ratio is not
# held against us, nor where the part's float64 answer itself moves that much under one fp32
# rounding of the inputs (`_spread`); the verdict names the parts that pass only so (`floor_only`;
# bf16/fp16 parts over the tolerance and eager's that pass by their spread too), and the sweep's
# summary counts those cases.
FP32_FACTOR = 2.0
FP32_FLOOR = 2.0 ** -20
# An fp32 part over its gate is judged again on ROUNDINGS copies of the case, every input moved by
# one fp32 rounding (`rounded`): the median of ours' errors against FP32_FACTOR x the median of
# eager's and of the spreads. A part of one or a few numbers (a parameter's gradient at H 1) has one
# error, a draw as random as the roundings it comes from: on the four fp32 RTU cases at H 1 an H200
# sweep failed (seed 97), eight roundings moved ours', eager's and the spread from draw to draw by
# up to 46x, 30x and 94x, ours over eager's in 53 of 184 (case, part, draw)
# (lab/results/awkward_spread_draws_cpu.txt): judged by one draw, the luckier one fails the other.
ROUNDINGS = 8
LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass
class Subject:
    """One case made concrete.

    make_inputs()  fresh inputs (tensors and plain values) on the device, the same every call;
                   floating tensors in the case's dtypes, any layout the case asks for
    ours, eager    fn(**inputs) -> a tensor or a tuple of them (eager None: no PyTorch version)
    reference      fn(**inputs upcast to float64) -> the answers, differentiable in grad_inputs
    grad_inputs    names of the inputs whose gradients are checked ((): forward only)
    dtype          the case's dtype (its gate: fp32 against eager, bf16/fp16 the tolerance)
    tolerance      the op's tolerance for that dtype (the spec's)
    refusal        where the case lies past a documented limit: a word the ValueError must name
                   (a refusal is then the right answer; None: any ValueError is a crash)
    grad_layout    'contiguous', or 'strided' (each upstream gradient a view of every other
                   element of a wider buffer: not contiguous, as autograd may hand one over)
    upstream       the spec's map of the random upstream gradients (KernelSpec.upstream), or None
    """

    make_inputs: Callable[[], dict]
    ours: Callable[..., Any]
    eager: Callable[..., Any] | None
    reference: Callable[..., Any]
    grad_inputs: tuple[str, ...]
    dtype: torch.dtype
    tolerance: float
    refusal: str | None = None
    grad_layout: str = "contiguous"
    seed: int = 0
    upstream: Callable[[tuple, tuple], tuple] | None = None
    log_scale: tuple[int, ...] = ()  # the spec's KernelSpec.log_scale: outputs whose error is absolute below 1


@dataclass
class _Run:
    """One provider's call: outputs, input gradients (in grad_inputs' order), and what went wrong."""

    outs: tuple = ()
    grads: tuple = ()
    error: BaseException | None = None
    trace: str = ""
    changed: list[str] = field(default_factory=list)
    dy_dtypes: tuple = ()  # the dtypes the upstream gradients were handed over in


def padded(t: torch.Tensor, pad: int = 1, offset: int = 0) -> torch.Tensor:
    """A copy of t (same values, last dim still contiguous) whose last dim sits in rows `pad`
    elements wider, `offset` elements into its buffer: row strides that are not multiples of 16
    bytes (for pad 1, odd widths) and, with an offset, a data pointer that is not 16-byte aligned."""
    shape = list(t.shape)
    buf = torch.zeros(offset + t.numel() // max(shape[-1], 1) * (shape[-1] + pad) + pad, dtype=t.dtype,
                      device=t.device)
    rows = buf[offset:offset + t.numel() // max(shape[-1], 1) * (shape[-1] + pad)]
    view = rows.view(*shape[:-1], shape[-1] + pad)[..., :shape[-1]]
    view.copy_(t)
    return view


def every_other(t: torch.Tensor) -> torch.Tensor:
    """A copy of t laid out as every other element of a buffer twice as wide in the last dim: a
    view whose last stride is 2 (not contiguous), as a slice x[..., ::2] a caller might pass."""
    if not t.dim():
        return t.clone()
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _snapshot(values) -> dict:
    return {k: v.detach().clone() for k, v in values.items() if torch.is_tensor(v)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal values (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool((a == b).all())


def _changed(snap: dict, now: dict) -> list[str]:
    return [k for k, v in snap.items() if not _same(v, now[k].detach())]


def _upstream(dy64: torch.Tensor, like: torch.Tensor, layout: str) -> torch.Tensor:
    dy = dy64.to(like.dtype)
    return every_other(dy) if layout == "strided" else dy


def _run(fn, subject: Subject, dys64: tuple | None) -> _Run:
    """fn on fresh inputs: forward, then (given upstream gradients) backward; exceptions caught."""
    run = _Run()
    try:
        inputs = subject.make_inputs()
        for n in subject.grad_inputs:
            inputs[n].requires_grad_(True)
        before = _snapshot(inputs)
        run.outs = verify.as_tuple(fn(**inputs))
        if dys64 is not None and subject.grad_inputs:
            diff = [o for o in run.outs if torch.is_tensor(o) and o.requires_grad]
            if len(diff) != len(dys64) or any(o.shape != d.shape for o, d in zip(diff, dys64)):
                run.grads = None  # shapes differ from the reference's: no backward to try
            else:
                dys = {str(i): _upstream(d, o, subject.grad_layout) for i, (d, o) in enumerate(zip(dys64, diff))}
                run.dy_dtypes = tuple(d.dtype for d in dys.values())
                dys_before = _snapshot(dys)
                leaves = [inputs[n] for n in subject.grad_inputs]
                grads = torch.autograd.grad(diff, leaves, list(dys.values()), allow_unused=True)
                run.grads = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))
                run.changed += [f"upstream gradient {k}" for k in _changed(dys_before, dys)]
        run.changed = [f"input {k}" for k in _changed(before, inputs)] + run.changed
        run.outs = tuple(o.detach() if torch.is_tensor(o) else o for o in run.outs)
    except Exception as e:  # noqa: BLE001 (a crash is a finding, whatever its type)
        run.error, run.trace = e, traceback.format_exc(limit=6)
    return run


def _reference(subject: Subject) -> tuple[tuple, tuple, tuple | None]:
    """(outputs, input gradients, upstream gradients) of the float64 reference."""
    inputs = verify.upcast(subject.make_inputs())
    leaves = [inputs[n].requires_grad_(True) for n in subject.grad_inputs]
    outs = verify.as_tuple(subject.reference(**inputs))
    diff = [o for o in outs if torch.is_tensor(o) and o.requires_grad]
    if not leaves or not diff:
        return tuple(o.detach() for o in outs), (), None
    # drawn on the CPU, as the inputs are: a case is the same case on every device (a GPU's
    # generator draws other numbers, and a GPU case then did not reproduce on the interpreter)
    gen = torch.Generator().manual_seed(subject.seed + 1)
    dys = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in diff)
    if subject.upstream is not None:
        with torch.no_grad():
            dys = subject.upstream(tuple(o.detach() for o in diff), dys)
    grads = torch.autograd.grad(diff, leaves, dys, allow_unused=True)
    grads = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))
    return tuple(o.detach() for o in outs), grads, dys


def _spread(subject: Subject, dys: tuple | None, want: tuple, dy_dtypes: tuple = (), draw: int = 0) -> list[float]:
    """How far the float64 answer itself moves, part by part, under the roundings every provider's
    call is handed: the error a computation of an ill-conditioned part cannot avoid (a sum whose
    terms cancel, a gradient through a saturated gate), whoever computes it.

    fp32: every floating input and every upstream gradient moved by one fp32 rounding (relative,
    uniform in +-2^-24). The upstream gradients too: ours and eager's get them rounded to fp32
    (conv1d's bias gradient at B1 T17 F1 is the sum of 17 dy whose sizes add up to 201x the sum:
    their rounding alone moves it by 2.0e-6, ours was off by 1.6e-6, eager's by 5.7e-7).

    bf16/fp16: the inputs are exact in the dtype (the reference takes the same values), but the
    upstream gradients reach ours and eager rounded to their outputs' dtypes (`dy_dtypes`), up to 2^-8 of
    each for bf16: conv1d's channel-mixing weight gradient at B3 T33 F1 K1 (x_scale 10) is a sum of
    99 products whose sizes add up to 136x the sum, and that rounding alone moves it by 3.6%; ours,
    the exact sum of the products it was handed rounded once, was off by 3.8%, eager's sum of
    rounded products by 0.09% (its roundings happened to undo the upstream's). No gradients: no
    spread. A part within FP32_FACTOR x this passes as eager's does. `draw` seeds the fp32 rounding
    (the bf16/fp16 one has no draw)."""
    low = subject.dtype in LOW_PRECISION
    if low and (dys is None or not dy_dtypes):
        return [0.0] * len(want)
    inputs = verify.upcast(subject.make_inputs())
    gen = torch.Generator().manual_seed(subject.seed + 2 + 1009 * draw)

    def nudged(v: torch.Tensor) -> torch.Tensor:
        return v * (1 + 2.0 ** -24 * (torch.rand(v.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(v.device))

    if not low:
        for k, v in inputs.items():
            if torch.is_tensor(v) and v.is_floating_point():
                inputs[k] = nudged(v)
    leaves = [inputs[n].requires_grad_(True) for n in subject.grad_inputs]
    outs = verify.as_tuple(subject.reference(**inputs))
    grads = ()
    if dys is not None:
        diff = [o for o in outs if torch.is_tensor(o) and o.requires_grad]
        moved = (tuple(d.to(t).double() for d, t in zip(dys, dy_dtypes)) if low else tuple(nudged(d) for d in dys))
        grads = torch.autograd.grad(diff, leaves, moved, allow_unused=True)
        grads = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))
    return verify.rel_errors(tuple(g.detach() for g in (*outs, *grads)), want, subject.log_scale)


def _shapes_of(run: _Run) -> list:
    return [list(t.shape) if torch.is_tensor(t) else None for t in (*run.outs, *(run.grads or ()))]


def _errors(run: _Run, want: tuple, log_scale: tuple[int, ...] = ()) -> list[float] | None:
    """Each part's error (outputs, then gradients; log_scale: Subject.log_scale)."""
    if run.error is not None or run.grads is None:
        return None
    got = (*run.outs, *run.grads)
    if len(got) != len(want):
        return None
    return verify.rel_errors(got, want, log_scale)


def gate(dtype: torch.dtype, tolerance: float, eager: float | None, spread: float = 0.0) -> float:
    """The largest error a part may have: fp32 FP32_FACTOR x eager's or x the part's `spread`
    (_spread: its own sensitivity to one fp32 rounding), at least FP32_FLOOR; the tolerance where
    eager has no finite answer; bf16/fp16 the tolerance, or FP32_FACTOR x eager's where eager itself
    is over it (the shape's own roundings do not average out), or FP32_FACTOR x the part's spread
    under the upstream gradients' rounding to the dtype."""
    if eager is None or not math.isfinite(eager):
        return tolerance
    if dtype in LOW_PRECISION:
        return max(tolerance, FP32_FACTOR * eager, FP32_FACTOR * spread)
    return max(FP32_FACTOR * eager, FP32_FACTOR * spread, FP32_FLOOR)


def _crash(e: BaseException, trace: str) -> dict:
    message = f"{type(e).__name__}: {str(e)[:400]}"
    # an illegal address or a device-side assert leaves the CUDA context unusable: the process
    # running the cases must be replaced before the next one
    fatal = "CUDA error" in str(e) or "device-side assert" in str(e) or "illegal" in str(e).lower()
    return {"status": "crash", "message": message, "trace": trace[-1500:], "fatal": fatal}


def verdict(subject: Subject) -> dict:
    """Run one case (module docstring) and classify it: {status, message, error, eager_error, gate,
    parts: [{name, ours, eager, spread, gate}], changed: [names], floor_only: [names], seconds}."""
    start = time.perf_counter()
    result = _verdict(subject)
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def _verdict(subject: Subject) -> dict:
    try:
        want_outs, want_grads, dys = _reference(subject)
    except Exception as e:  # noqa: BLE001 (the reference must run: a failure is the harness's)
        return {"status": "invalid", "message": f"the float64 reference failed: {type(e).__name__}: {e}"[:500],
                "trace": traceback.format_exc(limit=6)[-1500:], "fatal": False}
    beyond = _beyond_range(subject, want_outs, want_grads)
    if beyond:
        return {"status": "invalid", "message": beyond, "fatal": False}
    ours = _run(subject.ours, subject, dys)
    if isinstance(ours.error, ValueError):
        named = subject.refusal is not None and subject.refusal.lower() in str(ours.error).lower()
        if named:
            return {"status": "refused", "message": str(ours.error)[:400]}
        result = _crash(ours.error, ours.trace)
        result["message"] = ("refused an input it should take: " if subject.refusal is None else
                             f"refused without naming '{subject.refusal}': ") + result["message"]
        return result
    if ours.error is not None:
        return _crash(ours.error, ours.trace)
    want = (*want_outs, *want_grads)
    names = part_names(subject, len(want_outs))
    got = (*ours.outs, *(ours.grads or ()))
    if ours.grads is None or len(got) != len(want) or any(_shape_off(g, w) for g, w in zip(got, want)):
        return {"status": "wrong_shape", "message": f"got {_shapes_of(ours)}, want {[list(w.shape) for w in want]}"}
    eager = _run(subject.eager, subject, dys) if subject.eager is not None else None
    eager_errors = _errors(eager, want, subject.log_scale) if eager is not None else None
    errors = _errors(ours, want, subject.log_scale)
    spreads = _spread(subject, dys, want, ours.dy_dtypes)
    parts = _parts(subject, names, errors, eager_errors, spreads, want, got)
    low = subject.dtype in LOW_PRECISION
    redrawn = []  # fp32 parts over their gate that pass by the medians over ROUNDINGS roundings
    first = [p for p in parts if not p["ours"] <= p["gate"]]
    if not low and first:
        medians = _rounded_medians(subject, names, [names.index(p["name"]) for p in first])
        for p in first:
            m = medians.get(p["name"])
            if m is not None:
                p["rounded"] = m
                if m["ours"] <= m["gate"]:
                    redrawn.append(p["name"])
    over = [p for p in parts if not p["ours"] <= p["gate"] and p["name"] not in redrawn]
    floor_only = [p["name"] for p in parts if p["eager"] is not None
                  and _bar(subject.dtype, subject.tolerance, p["eager"]) < p["ours"] <= p["gate"]]
    floor_only += redrawn
    floor_only += [p["name"] for p in parts
                   if "saturated" in p and p["ours"] <= p["gate"] and p["name"] not in floor_only]
    worst = worst_part(parts)
    result = {"error": max((p["ours"] for p in parts), default=0.0),
              "eager_error": None if eager_errors is None else max((p["eager"] for p in parts), default=0.0),
              "gate": worst["gate"] if worst else subject.tolerance, "worst": worst["name"] if worst else None,
              "parts": parts, "changed": ours.changed, "floor_only": floor_only, "redrawn": redrawn}
    if eager is not None and eager.error is not None:
        result["eager_message"] = f"{type(eager.error).__name__}: {str(eager.error)[:200]}"
    if ours.changed:
        return {"status": "inplace", "message": "written by the call: " + ", ".join(ours.changed), **result}
    if over:
        return {"status": "over_tolerance", "message": over_message(over), **result}
    return {"status": "ok", **result}


def rounded(make_inputs, draw: int):
    """make_inputs for the `draw`th rounding of a case (0: the case as drawn): each floating input
    element moved one fp32 step up or down, with probability 2/5 each (seeded by draw)."""

    def make() -> dict:
        base = make_inputs()
        if not draw:
            return base
        g = torch.Generator().manual_seed(1000 + draw)
        out = {}
        for n, v in base.items():
            if torch.is_tensor(v) and v.is_floating_point():
                u = torch.randint(-2, 3, v.shape, generator=g).to(v.device)
                up = torch.nextafter(v, torch.full_like(v, math.inf))
                down = torch.nextafter(v, torch.full_like(v, -math.inf))
                v = torch.where(u > 0, up, torch.where(u < 0, down, v)).detach().clone()
            out[n] = v
        return out

    return make


def part_names(subject: Subject, n_outputs: int) -> list[str]:
    """The parts of a case, in the order its errors come: outputs, then the inputs' gradients."""
    return [f"output {i}" for i in range(n_outputs)] + [f"d{n}" for n in subject.grad_inputs]


def draw_errors(subject: Subject, draw: int) -> tuple[list, list, list] | None:
    """(ours', eager's, spreads) part by part on the `draw`th rounding of the case (`rounded`), each
    against the float64 answer of that rounding's inputs; None where either call fails."""
    sub = replace(subject, make_inputs=rounded(subject.make_inputs, draw))
    want_outs, want_grads, dys = _reference(sub)
    want = (*want_outs, *want_grads)
    ours = _run(sub.ours, sub, dys)
    o = _errors(ours, want, sub.log_scale)
    e = _errors(_run(sub.eager, sub, dys), want, sub.log_scale) if sub.eager is not None else None
    if o is None or e is None:
        return None
    return o, e, _spread(sub, dys, want, ours.dy_dtypes, draw)


def _rounded_medians(subject: Subject, names: list[str], which: list[int]) -> dict[str, dict]:
    """For the parts at indices `which` of `names` (fp32): the medians over ROUNDINGS roundings of
    the inputs of ours' error, eager's and the spread (draw_errors), with the gate of those medians.
    A rounding where either call fails gives no medians (the part stays judged by its first draw)."""
    draws: dict[int, list[tuple]] = {i: [] for i in which}
    for k in range(ROUNDINGS):
        got = draw_errors(subject, k)
        if got is None:
            return {}
        for i in which:
            draws[i].append(tuple(col[i] for col in got))
    out = {}
    for i, xs in draws.items():
        ours_m, eager_m, spread_m = (statistics.median(col) for col in zip(*xs))
        out[names[i]] = {"ours": ours_m, "eager": eager_m, "spread": spread_m,
                         "gate": gate(subject.dtype, subject.tolerance, eager_m, spread_m)}
    return out


def _parts(subject: Subject, names, errors, eager_errors, spreads, want, got) -> list[dict]:
    """Each part's errors (ours, eager's), spread and gate."""
    parts = []
    for i, (name, err) in enumerate(zip(names, errors)):
        e = eager_errors[i] if eager_errors is not None else None
        if not torch.isfinite(want[i]).all():
            continue  # the float64 answer itself overflowed: nothing to hold either to
        if _rounds_to_zero(subject.dtype, want[i], got[i]):
            err = 0.0  # an answer the dtype holds as zero (or fp32 as subnormal), and ours that zero
        held = _held(want[i], got[i])
        part = {"name": name, "ours": err, "eager": e, "spread": spreads[i],
                "gate": max(gate(subject.dtype, subject.tolerance, e, spreads[i]), FP32_FACTOR * held)}
        if not err <= part["gate"] and i not in subject.log_scale:
            clipped = _saturated(subject.dtype, want[i], got[i], part["gate"])
            if clipped is not None:
                part.update(ours=verify.rel_error(clipped, want[i]), saturated=err)
        parts.append(part)
    return parts


def _saturated(dtype: torch.dtype, want, got, bar: float):
    """bf16/fp16: ours with its overflows (+-inf where the float64 answer is finite) taken as the
    dtype's largest value, where the answer's largest element, off by `bar` (the part's gate, a
    relative error), would pass that largest: an error the gate allows can overflow there, and an
    eager that does not is lucky. None where that does not apply (nothing overflowed, a NaN, an
    answer far inside the range). The H200 sweep of seed 185: an fp16 LSTM with saturated gates whose
    float64 dw_ih reaches 45555 (fp16's largest is 65504) where eager's error is 1.43 of the norm;
    ours overflowed in 4 elements of dw_ih and 1 of db."""
    if dtype not in LOW_PRECISION or not (torch.is_tensor(want) and torch.is_tensor(got)):
        return None
    if not got.is_floating_point() or got.shape != want.shape:
        return None
    over = torch.isinf(got) & torch.isfinite(want)
    largest = torch.finfo(dtype).max
    top = want.detach().abs().max().item() if want.numel() else 0.0
    if not bool(over.any()) or bool(torch.isnan(got).any()) or top * (1 + bar) <= largest:
        return None
    return got.detach().double().clamp(-largest, largest)


def _bar(dtype: torch.dtype, tolerance: float, eager: float) -> float:
    """A part's gate without its floors (the spread, FP32_FLOOR, what the dtype holds): eager's
    error x FP32_FACTOR (bf16/fp16: at least the tolerance), the tolerance where eager's is not
    finite."""
    if not math.isfinite(eager):
        return tolerance
    return max(tolerance if dtype in LOW_PRECISION else 0.0, FP32_FACTOR * eager)


def _held(want, got) -> float:
    """The error of the float64 answer rounded to the dtype ours returns it in: what no computation
    of it can do better than. Negligible but where the answer is tiny in that dtype: an sLSTM's fp16
    dn0 of a few 1e-7 (H200 sweep of seed 180), in steps of fp16's least subnormal, 6e-8, that
    rounding alone 3-7% off, over the tolerance of 6%."""
    if not (torch.is_tensor(want) and torch.is_tensor(got)) or not got.is_floating_point():
        return 0.0
    return verify.rel_error(want.to(got.dtype), want)


def worst_part(parts: list[dict]) -> dict | None:
    """The part nearest its gate or furthest past it (a part judged again over roundings of the
    inputs, by the medians' ratio where they pass it)."""
    def ratio(p: dict) -> float:
        m = p.get("rounded")
        ours, gate_ = (m["ours"], m["gate"]) if m and m["ours"] <= m["gate"] else (p["ours"], p["gate"])
        return ours / gate_ if gate_ else ours

    return max(parts, key=ratio, default=None)


def over_message(over: list[dict]) -> str:
    """The parts over their gates, each with eager's error (and eager's under reordered sums, where
    cells.py judged it) and its spread."""
    return "; ".join(f"{p['name']} {p['ours']:.3g} > {p['gate']:.3g} (eager {_g(p['eager'])}"
                     + (f", reordered eager {_g(p['reordered'])}" if "reordered" in p else "")
                     + f", spread {_g(p['spread'])})" for p in over)


def _beyond_range(subject: Subject, want_outs: tuple, want_grads: tuple) -> str | None:
    """For bf16/fp16: the first float64 answer (outputs, then gradients) with a finite value past the
    dtype's largest, named with it; None where every answer fits (fp32: always None)."""
    if subject.dtype not in LOW_PRECISION:
        return None
    largest = torch.finfo(subject.dtype).max
    named = [*((f"output {i}", w) for i, w in enumerate(want_outs)),
             *((f"d{n}", w) for n, w in zip(subject.grad_inputs, want_grads))]
    for name, w in named:
        if not torch.is_tensor(w) or not w.is_floating_point():
            continue
        top = w.detach().abs().nan_to_num(nan=0.0, posinf=0.0).max().item() if w.numel() else 0.0
        if top > largest:
            return (f"the float64 answer's {name} reaches {top:.3g}, past {str(subject.dtype)[6:]}'s largest "
                    f"{largest:.6g}: not representable in that dtype")
    return None


def _rounds_to_zero(dtype: torch.dtype, want, got) -> bool:
    """Ours is all zero where the float64 answer is, in the dtype, zero or (fp32) subnormal everywhere:
    bf16/fp16 round it to zero (fp16 holds nothing under 6e-8: an sLSTM's dc0 of 3.5e-12 behind a
    reset); fp32's subnormals, under 1.2e-38, are what a GPU's fp32 arithmetic flushes to zero (an
    sLSTM's dc0 and dn0 of 5.4e-40 at one step of wild gates, CPU sweep of seed 165). Its relative
    error, 1, would count a correctly rounded answer as all wrong."""
    if not (torch.is_tensor(want) and torch.is_tensor(got) and bool((got == 0).all())):
        return False
    if dtype in LOW_PRECISION:
        return bool((want.to(dtype) == 0).all())
    return dtype == torch.float32 and bool((want.abs() < torch.finfo(torch.float32).tiny).all())


def _g(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g}"


def _shape_off(got, want) -> bool:
    return not torch.is_tensor(got) or tuple(got.shape) != tuple(want.shape)


def dtype_of(name: str) -> torch.dtype:
    """'float32' -> torch.float32 (cases store dtypes by name, to stay JSON)."""
    return getattr(torch, name)


def seeded(seed: int) -> torch.Generator:
    """A CPU generator for a case's tensors (drawn on the CPU, then moved: the same values on every device)."""
    return torch.Generator().manual_seed(seed)


def worst_first(results: list[dict]) -> list[dict]:
    """Results ordered as STATUSES (the most severe first), then by the ratio of error to gate."""
    def key(r):
        ratio = r.get("error", 0.0) / r["gate"] if r.get("gate") else 0.0
        return STATUSES.index(r["status"]), -ratio

    return sorted(results, key=key)


RESETS = ("none", "clear", "first", "last", "every", "random", "edges")


def reset_mask(mode: str, B: int, T: int, g: torch.Generator) -> torch.Tensor | None:
    """[B, T] bool of a reset mode (RESETS) for the recurrent families; None for 'none' (no mask
    given), all False for 'clear'."""
    if mode == "none":
        return None
    m = torch.zeros(B, T, dtype=torch.bool)
    if mode == "first":
        m[:, 0] = True
    elif mode == "last":
        m[:, -1] = True
    elif mode == "every":
        m[:] = True
    elif mode == "random":
        m = torch.rand(B, T, generator=g) < 0.3
    elif mode == "edges":  # row 0 at the first step, row 1 twice in a row, the last row at the last step
        m[0, 0] = True
        m[1 % B, 1:3] = True
        m[-1, -1] = True
    return m
