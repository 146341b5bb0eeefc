"""Awkward cases of the recurrent cells: lstm, slstm, mlstm and axon.

Awkward: T = 1 and T not a multiple of any chunk (mlstm's chunks are 64 on a GPU, 16 on the CPU),
odd and non-power-of-two hidden sizes and head sizes (1 included), an LSTM input size unlike its
hidden size, Axon outputs unlike its features, batch 1; reset masks with no reset, none set, one at
the first step, at the last, at every step, at random and at the edges of each row; extreme gates
(saturated LSTM gates and large cell states, gate inputs near 0, sLSTM and mLSTM input gates of +20
and more, forget gates that forget at once or never, wild gates of either sign; Axon radii within
1e-6 of 1 and down to 1e-4, tiny and large angles); initial states at zero (the sLSTM's first-step
path) or random; large and small inputs; inputs (reset masks included) that are strided views, and
upstream gradients that are not contiguous. Past a documented limit (Axon's H a power of two; on a
GPU, sLSTM heads too wide for its shared memory) the right answer is a ValueError naming it.

The fp32 bar is common.verdict's (within 2x of eager's error against float64, or of the part's
spread under one rounding of the inputs), and one more rule here, for the ill-conditioned cases
the recurrences make (saturated LSTM gates over a hundred steps: a gradient through sigmoid'(x) =
s (1 - s) at s near 1 keeps only the digits that the rounding of s left, and each step multiplies
what the last one rounded): a case over that bar is run again in eager, fp32, under REORDERINGS
random permutations of the hidden units (the same network, its sums over units in another order:
an equally valid fp32 computation), and a part of ours within 2x of the largest of those errors
passes, named in the verdict's `conditioned` (and counted with `floor_only`). On issue 40's
B5 H64 I1 T129 saturated LSTM (seed 1435337957, CPU) eager's dx error was 2.7e-6 and eager's under
ten permutations 2.7e-6 to 9.8e-6 (ours then 8.1e-6); on its chaotic sibling (seed 289823019)
eager's h_T error under eight permutations ran from 0.0084 to 0.30 and its dx from 0.02 to 0.99,
where one fp32 rounding of the inputs moves float64's h_T by 0.13. The rule applies to the lstm, slstm and mlstm
(axon's units are mixed by its Hadamard transform).

Shapes come from a fixed pool per op (`pool`): the GPU compiles one kernel variant per shape class,
dtype and config, so a sweep of thousands of cases compiles a bounded number of them."""
from __future__ import annotations

import functools
import math
import random

import torch

from . import common

OPS = ("lstm", "slstm", "mlstm", "axon")
# T, B and the reset mask take no part in what is compiled (the kernels do not specialise on them);
# the hidden and head sizes, the dtype, whether a mask is given (and for the lstm the batch, through
# its config) do. The GPU's pool is written out so that its compiles are few and known: ~10 shapes an
# op, times 3 dtypes and 2 mask flags. The CPU's (the interpreter: no compiles, slow large sizes) is
# drawn from small sizes. (The mLSTM's 256-wide heads are left out: its fp32 backward kernel took 6
# minutes to compile 128 wide on a busy 2-core CPU, and a case has 4 minutes in the sweep.)
STEPS = (1, 2, 3, 5, 16, 17, 63, 64, 65, 100, 129, 200, 257)
STEPS_CPU = (1, 2, 3, 5, 16, 17, 33)
POOLS = {  # op -> (dims without T), the GPU's
    "lstm": [{"B": 1, "H": 1, "I": 1}, {"B": 2, "H": 3, "I": 3}, {"B": 3, "H": 20, "I": 7}, {"B": 1, "H": 33, "I": 33},
             {"B": 5, "H": 64, "I": 1}, {"B": 17, "H": 100, "I": 100}, {"B": 40, "H": 128, "I": 128},
             {"B": 2, "H": 300, "I": 300}, {"B": 3, "H": 512, "I": 7}, {"B": 1, "H": 16, "I": 16}],
    "slstm": [{"B": 1, "NH": 1, "DH": 1}, {"B": 2, "NH": 1, "DH": 3}, {"B": 3, "NH": 2, "DH": 16},
              {"B": 1, "NH": 3, "DH": 24}, {"B": 5, "NH": 1, "DH": 33}, {"B": 2, "NH": 2, "DH": 64},
              {"B": 17, "NH": 1, "DH": 100}, {"B": 1, "NH": 1, "DH": 128}, {"B": 2, "NH": 1, "DH": 72},
              {"B": 3, "NH": 2, "DH": 256}],
    "mlstm": [{"B": 1, "NH": 1, "DH": 1}, {"B": 2, "NH": 1, "DH": 3}, {"B": 1, "NH": 2, "DH": 16},
              {"B": 3, "NH": 1, "DH": 24}, {"B": 2, "NH": 2, "DH": 33}, {"B": 1, "NH": 1, "DH": 64},
              {"B": 2, "NH": 1, "DH": 100}, {"B": 1, "NH": 1, "DH": 128}, {"B": 1, "NH": 2, "DH": 80}],
    "axon": [{"B": 1, "H": 1, "O": 1}, {"B": 2, "H": 2, "O": 3}, {"B": 3, "H": 4, "O": 4}, {"B": 1, "H": 16, "O": 7},
             {"B": 2, "H": 64, "O": 64}, {"B": 5, "H": 256, "O": 1}, {"B": 2, "H": 1024, "O": 1024},
             {"B": 1, "H": 3, "O": 3}, {"B": 2, "H": 24, "O": 24}, {"B": 1, "H": 100, "O": 7}],
}
GATES = {"lstm": ("typical", "typical", "saturated", "large_state", "tiny"),
         "slstm": ("typical", "typical", "large_input", "strong_forget", "weak_forget", "wild", "tiny"),
         "mlstm": ("typical", "typical", "large_input", "strong_forget", "large_and_strong", "weak_forget", "wild"),
         "axon": ("typical", "typical", "long", "short", "mixed")}
POOL_SIZE_CPU = 10


def _cpu_shape(op: str, r: random.Random) -> dict:
    B = r.choice((1, 1, 2, 3, 17))
    if op == "lstm":
        H = r.choice((1, 3, 16, 20, 33))
        return {"B": B, "H": H, "I": r.choice((H, H, 1, 7))}
    if op in ("slstm", "mlstm"):
        return {"B": B, "NH": r.choice((1, 1, 2, 3)), "DH": r.choice((1, 3, 16, 24, 33))}
    H = r.choice((1, 2, 4, 16, 32, 3, 24))
    return {"B": B, "H": H, "O": r.choice((H, H, 1, 7))}


def pool(op: str, cpu: bool) -> list[dict]:
    """The fixed shapes of one op, without T (the same list on every call and machine)."""
    if not cpu:
        return POOLS[op]
    r = random.Random(f"cells-{op}")
    return [_cpu_shape(op, r) for _ in range(POOL_SIZE_CPU)]


def refusal(op: str, dims: dict, dtype: str, device: str) -> str | None:
    """The word a ValueError must name where the input is past a documented limit: Axon's H a power
    of two; on a GPU, sLSTM heads whose recurrent blocks do not fit its shared memory one at a time
    (past 128 in fp32, 256 in bf16 and fp16, on Hopper's 227 KB)."""
    if op == "axon" and dims["H"] & (dims["H"] - 1):
        return "power of two"
    if op == "slstm" and device == "cuda" and dims["DH"] > (128 if dtype == "float32" else 256):
        return "shared memory"
    return None


def draw(rng: random.Random, device: str) -> dict:
    """One case: a pooled shape of an op, a dtype, a reset mask, gate extremes, states and layouts."""
    op = rng.choice(OPS)
    dims = dict(rng.choice(pool(op, device == "cpu")), T=rng.choice(STEPS_CPU if device == "cpu" else STEPS))
    options = {"resets": rng.choice(common.RESETS), "gates": rng.choice(GATES[op]),
               "x_scale": rng.choice((1.0, 1.0, 1.0, 0.01, 10.0)),
               "layout": rng.choice(("contiguous", "contiguous", "strided")),
               "grad_layout": rng.choice(("contiguous", "contiguous", "strided"))}
    if op == "slstm":
        options["states"] = rng.choice(("random", "random", "zero"))
    if op == "axon":
        options["angle"] = rng.choice(("typical", "typical", "tiny", "large"))
    dtype = rng.choice(("float32", "float32", "bfloat16", "float16"))
    return {"op": op, "dtype": dtype, "dims": dims, "options": options, "refusal": refusal(op, dims, dtype, device),
            "seed": rng.randrange(2**31)}


def variant(case: dict) -> str:
    """What decides the compiled kernels (cases sorted by it share compiles): not T."""
    dims = {k: v for k, v in case["dims"].items() if k != "T"}
    return f"{case['op']}-{case['dtype']}-{case['options']['resets'] == 'none'}-{sorted(dims.items())}"


class _Draw:
    """Seeded values drawn on the CPU (the same on every device), then cast and laid out."""

    def __init__(self, case: dict, device: str):
        self.g = common.seeded(case["seed"])
        self.dtype, self.device = common.dtype_of(case["dtype"]), device
        self.strided = case["options"]["layout"] == "strided"

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, dtype=torch.float64)

    def uniform(self, *shape, bound=1.0) -> torch.Tensor:
        return (torch.rand(shape, generator=self.g, dtype=torch.float64) * 2 - 1) * bound

    def put(self, x: torch.Tensor, dtype=None) -> torch.Tensor:
        x = x.to(device=self.device, dtype=dtype or self.dtype)
        return common.every_other(x) if self.strided and x.dim() else x

    def resets(self, mode: str, B: int, T: int):
        m = common.reset_mask(mode, B, T, self.g)
        return None if m is None else self.put(m, torch.bool)


def _lstm_inputs(case, device):
    d, o, r = case["dims"], case["options"], _Draw(case, device)
    B, T, H, I = d["B"], d["T"], d["H"], d["I"]
    gates = o["gates"]
    w = {"saturated": 8.0, "tiny": 1e-3}.get(gates, 1.0) / math.sqrt(H)
    x = r.randn(B, T, I) * o["x_scale"]
    h0, c0 = r.uniform(B, H), r.uniform(B, H) * (30.0 if gates == "large_state" else 1.0)
    return {"x": r.put(x), "h0": r.put(h0), "c0": r.put(c0), "w_ih": r.put(r.uniform(4 * H, I, bound=w)),
            "w_hh": r.put(r.uniform(4 * H, H, bound=w)), "b": r.put(r.uniform(4 * H, bound=2 * w)),
            "resets": r.resets(o["resets"], B, T)}


def _gate_shift(gates: str, i: torch.Tensor, f: torch.Tensor, r: _Draw) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and forget gate pre-activations of the sLSTM and mLSTM for a gate mode."""
    if gates in ("large_input", "large_and_strong"):
        i = i * 5 + 20
    if gates in ("strong_forget", "large_and_strong"):
        f = f * 5 - 20
    if gates == "weak_forget":
        f = f + 20
    if gates == "wild":
        i, f = i * 30, f * 30
    return i, f


def _slstm_inputs(case, device):
    d, o, r = case["dims"], case["options"], _Draw(case, device)
    B, NH, T, DH = d["B"], d["NH"], d["T"], d["DH"]
    tiny = 1e-3 if o["gates"] == "tiny" else 1.0  # every gate input small: tanh(z) near 0
    wx = r.randn(B, T, 4, NH, DH) * o["x_scale"] * tiny
    wx[:, :, 0], wx[:, :, 1] = _gate_shift(o["gates"], wx[:, :, 0], wx[:, :, 1], r)
    states = [r.randn(B, NH, DH) * 0.5, r.randn(B, NH, DH), 1.5 + 0.5 * r.uniform(B, NH, DH), r.randn(B, NH, DH) * 0.5]
    if o["states"] == "zero":
        states = [s * 0 for s in states]
    return {"wx": r.put(wx), "r": r.put(r.uniform(4, NH, DH, DH, bound=tiny / math.sqrt(DH))),
            "b": r.put(r.randn(4, NH, DH) * tiny),
            **{n: r.put(s) for n, s in zip(("y0", "c0", "n0", "m0"), states)},
            "resets": r.resets(o["resets"], B, T)}


def _mlstm_inputs(case, device):
    d, o, r = case["dims"], case["options"], _Draw(case, device)
    B, NH, T, DH = d["B"], d["NH"], d["T"], d["DH"]
    q, k, v = (r.randn(B, NH, T, DH) * o["x_scale"] for _ in range(3))
    i, f = _gate_shift(o["gates"], r.randn(B, NH, T), r.randn(B, NH, T), r)
    return {"q": r.put(q), "k": r.put(k), "v": r.put(v), "i": r.put(i), "f": r.put(f),
            "resets": r.resets(o["resets"], B, T)}


def _axon_inputs(case, device):
    d, o, r = case["dims"], case["options"], _Draw(case, device)
    B, T, H, O = d["B"], d["T"], d["H"], d["O"]
    ranges = {"typical": (0.5, 0.999), "long": (1 - 1e-3, 1 - 1e-6), "short": (1e-4, 0.1)}
    lo_hi = [ranges[k] for k in ranges] if o["gates"] == "mixed" else [ranges[o["gates"]]]
    pick = torch.randint(0, len(lo_hi), (H,), generator=r.g)
    radius = torch.stack([lo + (hi - lo) * torch.rand(H, generator=r.g, dtype=torch.float64) for lo, hi in lo_hi])
    radius = radius[pick, torch.arange(H)]
    lo, hi = {"typical": (1e-3, 6.28), "tiny": (1e-4, 1e-2), "large": (math.pi, 50.0)}[o["angle"]]
    theta = lo + (hi - lo) * torch.rand(H, generator=r.g, dtype=torch.float64)
    b_in, b_out = 1 / math.sqrt(H), 1 / math.sqrt(2 * H)
    return {"x": r.put(r.randn(B, T, H) * o["x_scale"]), "w_lin": r.put(r.uniform(O, H, bound=b_in)),
            "b_lin": r.put(r.uniform(O, bound=b_in)), "w_out": r.put(r.uniform(O, 2 * H, bound=b_out)),
            "b_out": r.put(r.uniform(O, bound=b_out)), "nu_log": r.put(torch.log(-torch.log(radius))),
            "theta_log": r.put(torch.log(theta)), "w1": r.put(r.uniform(H, bound=b_in)),
            "w2": r.put(r.uniform(H, bound=b_in)),
            "signs": r.put((torch.randint(0, 2, (H,), generator=r.g) * 2 - 1).double()),
            "perm": torch.randperm(H, generator=r.g).to(device), "resets": r.resets(o["resets"], B, T)}


def _mlstm_eager(q, k, v, i, f, resets=None, chunk=64):
    """The spec's eager (the chunkwise form in PyTorch, fp32 at least) with our kernels' chunk length:
    how well the chunkwise form is conditioned depends on it (a state carried across a chunk boundary
    is stored, and where one step's key is all of h, its gradient cancels to a part in 1e4), so the
    same chunks compare the arithmetic of the two (on a GPU both take 64; on the CPU ours takes 16)."""
    from kcollect.kernels.mlstm.naive import chunkwise

    wide = torch.promote_types(q.dtype, torch.float32)
    out = chunkwise(*(x.to(wide) for x in (q, k, v, i, f)), resets, chunk=chunk)
    return tuple(o.to(q.dtype) for o in out)


# The mLSTM's step-by-step recurrence keeps a DH x DH state a step for autograd: up to this many
# float64 elements it is the reference, past it the chunkwise form (the same maths, checked against
# it by tests/test_mlstm.py)
RECURRENT_MAX = 2 ** 27


def subject(case: dict, device: str) -> common.Subject:
    import importlib

    op = case["op"]
    dtype = common.dtype_of(case["dtype"])
    spec = importlib.import_module(f"kcollect.kernels.{op}.spec")
    ours = getattr(importlib.import_module(f"kcollect.kernels.{op}"), op)
    reference, eager = spec.reference, getattr(spec, "step_loop", None)
    if op == "mlstm":
        from kcollect.kernels.mlstm import naive, pick

        d = case["dims"]
        eager = functools.partial(_mlstm_eager, chunk=pick(d["T"], d["DH"], device).chunk)
        if d["B"] * d["NH"] * d["T"] * d["DH"] ** 2 <= RECURRENT_MAX:
            reference = naive.recurrent
    inputs = {"lstm": _lstm_inputs, "slstm": _slstm_inputs, "mlstm": _mlstm_inputs, "axon": _axon_inputs}[op]
    tolerance = spec.SPEC.tolerance.get(dtype, spec.SPEC.tolerance[torch.bfloat16])  # fp16: bf16's
    return common.Subject(lambda: inputs(case, device), ours, eager, reference, spec.SPEC.grad_inputs, dtype=dtype,
                          tolerance=tolerance, refusal=case["refusal"], grad_layout=case["options"]["grad_layout"],
                          seed=case["seed"], upstream=spec.SPEC.upstream, log_scale=spec.SPEC.log_scale)


def check(case: dict, device: str) -> dict:
    subject_ = subject(case, device)
    if case["refusal"]:  # past a documented limit there is no float64 answer to run first
        try:
            subject_.ours(**subject_.make_inputs())
        except ValueError as e:
            if case["refusal"].lower() in str(e).lower():
                return {"status": "refused", "message": str(e)[:400]}
    result = common.verdict(subject_)
    if result["status"] == "over_tolerance" and case["dtype"] == "float32" and case["op"] in _PERMUTED:
        result = _rejudge(case, subject_, result)
    return result


# ---------------------------------------------------------------------------------------------
# Eager in another, equally valid order of its sums (the conditioning rule of the module docstring)

REORDERINGS = 4  # hidden-unit permutations eager is run under, for a case over the gate in fp32


def _unit_rows(p: torch.Tensor, gates: int) -> torch.Tensor:
    """The rows of a gate-major [gates * H, ...] weight for the unit order p."""
    H = p.numel()
    return torch.cat([g * H + p for g in range(gates)])


def _lstm_permuted(eager, p):
    def run(x, h0, c0, w_ih, w_hh, b, resets=None):
        rows, inv = _unit_rows(p, 4), torch.argsort(p)
        y, hn, cn = eager(x, h0[:, p], c0[:, p], w_ih[rows], w_hh[rows][:, p], b[rows], resets)
        return y[..., inv], hn[:, inv], cn[:, inv]
    return run


def _slstm_permuted(eager, p):
    def run(wx, r, b, y0, c0, n0, m0, resets=None):
        inv = torch.argsort(p)
        out = eager(wx[..., p], r[:, :, p][..., p], b[..., p], y0[..., p], c0[..., p], n0[..., p], m0[..., p], resets)
        return tuple(o[..., inv] for o in out)
    return run


def _mlstm_permuted(eager, p):
    def run(q, k, v, i, f, resets=None):
        inv = torch.argsort(p)
        h, C, n, m = eager(q[..., p], k[..., p], v[..., p], i, f, resets)
        return h[..., inv], C[..., inv, :][..., inv], n[..., inv], m
    return run


_PERMUTED = {"lstm": ("H", _lstm_permuted), "slstm": ("DH", _slstm_permuted), "mlstm": ("DH", _mlstm_permuted)}


def _rejudge(case: dict, subject_: common.Subject, result: dict) -> dict:
    """The verdict of an fp32 case over the gate, judged again against eager under REORDERINGS
    hidden-unit permutations (see the module docstring): a part within FP32_FACTOR x the largest
    of those errors passes, named in `conditioned` (and counted as `floor_only`)."""
    want_outs, want_grads, dys = common._reference(subject_)
    want = (*want_outs, *want_grads)
    names = common.part_names(subject_, len(want_outs))
    axis, permuted = _PERMUTED[case["op"]]
    g = torch.Generator().manual_seed(case["seed"] + 3)
    reordered = dict.fromkeys(names, 0.0)
    for _ in range(REORDERINGS):
        p = torch.randperm(case["dims"][axis], generator=g).to(want[0].device)
        run = common._run(permuted(subject_.eager, p), subject_, dys)
        errors = common._errors(run, want, subject_.log_scale)
        if errors is None:
            return result
        for name, e in zip(names, errors):
            if math.isfinite(e):  # an order that overflows sets no bar: as one it would pass anything
                reordered[name] = max(reordered[name], e)
    parts, conditioned = [], []
    for part in result["parts"]:
        part = dict(part, reordered=reordered[part["name"]])
        if not part["ours"] <= part["gate"] and part["ours"] <= common.FP32_FACTOR * part["reordered"]:
            conditioned.append(part["name"])
            part["gate"] = common.FP32_FACTOR * part["reordered"]
        parts.append(part)
    over = [p for p in parts if not p["ours"] <= p["gate"] and p["name"] not in result.get("redrawn", ())]
    worst = common.worst_part(parts)
    result = dict(result, parts=parts, conditioned=conditioned, gate=worst["gate"], worst=worst["name"],
                  floor_only=sorted(set(result.get("floor_only", [])) | set(conditioned)))
    if over:
        return dict(result, message=common.over_message(over))
    return {k: v for k, v in dict(result, status="ok").items() if k != "message"}
