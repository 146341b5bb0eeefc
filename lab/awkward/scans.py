"""Awkward cases of the scans: rtu (diagonal and low-rank maps), selective_scan and conv1d
(depthwise and channel-mixing, 1 input or 1 output feature included).

Awkward: T = 1 and T not a multiple of any chunk, odd and non-power-of-two sizes (hidden sizes,
channels, states, widths), batch 1; reset masks with no reset, one at the first step, at the last,
at every step, at random, and at the edges of each row; extreme gates (RTU memories of 1e6 steps
and of none, tiny and large angles; selective-scan steps that decay to 1e-26 at once or never;
large gate inputs), large and small inputs; parameters and inputs that are strided views, and upstream
gradients that are not contiguous.

Shapes come from a fixed pool per op (`pool`): the GPU compiles one kernel variant per shape class,
dtype and constexpr flags, so a sweep of thousands of cases compiles a bounded number of them."""
from __future__ import annotations

import math
import random

import torch

from . import common

OPS = ("rtu", "selective_scan", "conv1d")
STEPS = (1, 2, 3, 5, 16, 17, 31, 33, 64, 65, 100, 129, 257, 600)
STEPS_CPU = (1, 2, 3, 7, 8, 9, 17, 33)
WIDTHS = (1, 2, 3, 5, 15, 16, 17, 33, 64, 100, 130)
WIDTHS_CPU = (1, 2, 3, 5, 8, 9, 17)
STATES = (1, 2, 3, 4, 5, 7, 8, 16)
MIX_PAIRS = ((1, 3), (3, 1), (1, 1), (2, 5), (5, 5), (16, 17), (33, 20), (3, 64))
MIX_PAIRS_CPU = ((1, 3), (3, 1), (1, 1), (2, 5), (5, 5), (17, 9))
POOL_SIZE, POOL_SIZE_CPU = 28, 10


def _rtu_shape(r: random.Random, cpu: bool) -> dict:
    return {"B": r.choice((1, 1, 2, 3)), "T": r.choice(STEPS_CPU if cpu else STEPS),
            "H": r.choice(WIDTHS_CPU if cpu else WIDTHS), "R": r.choice(("diag", "diag", 1, 2, 3, 5))}


def _ss_shape(r: random.Random, cpu: bool) -> dict:
    return {"B": r.choice((1, 1, 2, 3)), "T": r.choice(STEPS_CPU if cpu else STEPS),
            "D": r.choice(WIDTHS_CPU if cpu else WIDTHS), "N": r.choice(STATES)}


def _conv_shape(r: random.Random, cpu: bool) -> dict:
    dims = {"B": r.choice((1, 1, 2, 3)), "T": r.choice(STEPS_CPU if cpu else STEPS), "K": r.choice((1, 2, 3, 4, 5))}
    if r.random() < 0.5:
        f = r.choice(WIDTHS_CPU if cpu else WIDTHS)
        return {**dims, "groups": "depthwise", "F": f, "F_out": f}
    f_in, f_out = r.choice(MIX_PAIRS_CPU if cpu else MIX_PAIRS)
    return {**dims, "groups": "1", "F": f_in, "F_out": f_out}


_SHAPES = {"rtu": _rtu_shape, "selective_scan": _ss_shape, "conv1d": _conv_shape}


def pool(op: str, cpu: bool) -> list[dict]:
    """The fixed shapes of one op (the same list on every call and machine)."""
    r = random.Random(f"scans-{op}-{cpu}")
    return [_SHAPES[op](r, cpu) for _ in range(POOL_SIZE_CPU if cpu else POOL_SIZE)]


def draw(rng: random.Random, device: str) -> dict:
    """One case: a pooled shape of an op, a dtype, a reset mask, gate extremes and layouts."""
    op = rng.choice(OPS)
    dims = dict(rng.choice(pool(op, device == "cpu")))
    options = {"resets": rng.choice(common.RESETS), "x_scale": rng.choice((1.0, 1.0, 1.0, 0.01, 10.0)),
               "layout": rng.choice(("contiguous", "contiguous", "strided")),
               "grad_layout": rng.choice(("contiguous", "contiguous", "strided"))}
    if op == "rtu":
        options["radius"] = rng.choice(("typical", "typical", "long", "short", "mixed"))
        options["angle"] = rng.choice(("typical", "typical", "tiny", "large"))
    elif op == "selective_scan":
        options["step"] = rng.choice(("typical", "typical", "large", "tiny", "mixed"))
        options["decay"] = rng.choice(("typical", "typical", "weak", "strong"))
        options["gate"] = rng.choice(("typical", "typical", "large"))
        options.pop("resets")  # Mamba's scan takes no reset mask
    else:
        options["bias"] = rng.random() < 0.7
    return {"op": op, "dtype": rng.choice(("bfloat16", "float32")), "dims": dims, "options": options,
            "refusal": None, "seed": rng.randrange(2**31)}


def variant(case: dict) -> str:
    """What decides the compiled kernels (cases sorted by it share compiles)."""
    o = case["options"]
    return f"{case['op']}-{case['dtype']}-{o.get('resets') == 'none'}-{o.get('bias')}-{sorted(case['dims'].items())}"


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return common.every_other(t) if layout == "strided" else t


def _uniform(n: int, lo: float, hi: float, g) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)


def _radii(mode: str, H: int, g) -> torch.Tensor:
    """|lambda| per channel: typical memories of 2 to 1000 steps, long ones up to 1e6 (r a few fp32
    roundings below 1), none (r down to 1e-4), or each channel from any of these."""
    ranges = {"typical": (0.5, 0.999), "long": (1 - 1e-3, 1 - 1e-6), "short": (1e-4, 0.1)}
    if mode != "mixed":
        return _uniform(H, *ranges[mode], g)
    pick = torch.randint(0, 3, (H,), generator=g)
    return torch.stack([_uniform(H, *ranges[k], g) for k in ranges])[pick, torch.arange(H)]


def _rtu_inputs(case, device):
    d, o = case["dims"], case["options"]
    g = common.seeded(case["seed"])
    dtype = common.dtype_of(case["dtype"])
    B, T, H, R = d["B"], d["T"], d["H"], d["R"]
    r = _radii(o["radius"], H, g)
    angle = {"typical": (1e-3, math.pi), "tiny": (1e-4, 1e-2), "large": (math.pi, 50.0)}[o["angle"]]
    theta = _uniform(H, *angle, g)
    x = (torch.randn(B, T, H, generator=g) * o["x_scale"]).to(device=device, dtype=dtype)
    params = {"nu_log": torch.log(-torch.log(r)).float(), "theta_log": torch.log(theta).float()}
    if R == "diag":
        params |= {"map1": torch.randn(H, generator=g), "map2": torch.randn(H, generator=g)}
    else:
        scale = torch.tensor([H ** -0.5, R ** -0.5])[:, None, None]
        params |= {"map1": (torch.randn(2, H, R, generator=g) * scale).to(dtype),
                   "map2": (torch.randn(2, H, R, generator=g) * scale).to(dtype)}
    resets = common.reset_mask(o["resets"], B, T, g)
    return {"x": _layout(x, o["layout"]), **{k: _layout(v.to(device), o["layout"]) for k, v in params.items()},
            "resets": resets.to(device) if resets is not None else None}


def _ss_inputs(case, device):
    d, o = case["dims"], case["options"]
    g = common.seeded(case["seed"])
    dtype = common.dtype_of(case["dtype"])
    B, T, D, N = d["B"], d["T"], d["D"], d["N"]
    # log of softplus(delta). Large steps and strong decays keep exp(dt A) above 1e-30 a step: below
    # fp32's normal range (1e-38) dA's float64 answer lives where fp32 has no digits left
    step = {"typical": (-6.9, -2.3), "large": (0.0, 1.1), "tiny": (-16.0, -12.0)}
    if o["step"] == "mixed":
        lo_hi = [step[k] for k in step]
        pick = torch.randint(0, 3, (D,), generator=g)
        log_dt = torch.stack([_uniform(D, *lh, g) for lh in lo_hi])[pick, torch.arange(D)]
    else:
        log_dt = _uniform(D, *step[o["step"]], g)
    bias = torch.log(torch.expm1(torch.exp(log_dt))).float()  # softplus(bias) = exp(log_dt)
    decay = {"typical": (1.0, 1.0), "weak": (1e-5, 1e-3), "strong": (5.0, 20.0)}[o["decay"]]
    if o["decay"] == "typical":
        A = -(torch.arange(1, N + 1).float()[None, :]) * torch.exp(0.1 * torch.randn(D, N, generator=g))
    else:
        A = -_uniform(D * N, *decay, g).reshape(D, N).float()
    gate = 15.0 if o["gate"] == "large" else 1.0

    def act(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(device=device, dtype=dtype)

    x = {"x": act(B, T, D, scale=o["x_scale"]), "delta": act(B, T, D, scale=0.5, shift=bias), "A": A.to(device),
         "B": act(B, T, N), "C": act(B, T, N), "D": torch.randn(D, generator=g).to(device),
         "z": act(B, T, D, scale=gate)}
    return {k: _layout(v, o["layout"]) for k, v in x.items()}


def _conv_inputs(case, device):
    d, o = case["dims"], case["options"]
    g = common.seeded(case["seed"])
    dtype = common.dtype_of(case["dtype"])
    B, T, F, F_out, K = d["B"], d["T"], d["F"], d["F_out"], d["K"]
    depthwise = d["groups"] == "depthwise"
    bound = (K if depthwise else F * K) ** -0.5
    shape = (F, 1, K) if depthwise else (F_out, F, K)
    x = (torch.randn(B, T, F, generator=g) * o["x_scale"]).to(device=device, dtype=dtype)
    w = ((torch.rand(shape, generator=g) * 2 - 1) * bound).to(device=device, dtype=dtype)
    bias = ((torch.rand(F_out, generator=g) * 2 - 1) * bound).to(device=device, dtype=dtype)
    resets = common.reset_mask(o["resets"], B, T, g)
    return {"x": _layout(x, o["layout"]), "weight": _layout(w, o["layout"]),
            "bias": _layout(bias, o["layout"]) if o["bias"] else None,
            "resets": resets.to(device) if resets is not None else None}


def subject(case: dict, device: str) -> common.Subject:
    dtype = common.dtype_of(case["dtype"])
    kw = dict(dtype=dtype, refusal=case["refusal"], grad_layout=case["options"]["grad_layout"], seed=case["seed"])
    if case["op"] == "rtu":
        from kcollect.kernels.rtu import naive, providers
        from kcollect.kernels.rtu.spec import SPEC

        return common.Subject(lambda: _rtu_inputs(case, device), providers.triton, providers.log_depth,
                              naive.reference, ("x", "nu_log", "theta_log", "map1", "map2"),
                              tolerance=SPEC.tolerance[dtype], **kw)
    if case["op"] == "selective_scan":
        from kcollect.kernels.selective_scan import naive, selective_scan
        from kcollect.kernels.selective_scan.spec import SPEC

        return common.Subject(lambda: _ss_inputs(case, device), selective_scan, naive.selective_scan_loop,
                              naive.reference, ("x", "delta", "A", "B", "C", "D", "z"),
                              tolerance=SPEC.tolerance[dtype], **kw)
    from kcollect.kernels.conv1d import conv1d, naive
    from kcollect.kernels.conv1d.spec import SPEC

    grads = ("x", "weight", "bias") if case["options"]["bias"] else ("x", "weight")
    return common.Subject(lambda: _conv_inputs(case, device), conv1d, naive.eager, naive.reference, grads,
                          tolerance=SPEC.tolerance[dtype], **kw)


def check(case: dict, device: str) -> dict:
    return common.verdict(subject(case, device))
