"""What the collector needs to measure Mamba-1's selective scan: providers, the float64 reference,
inputs, grids, the cost model and the tolerance.

Dims: B (sequences), T (steps), D (channels), N (states per channel)."""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, Unavailable, compiled

from .._host.config import config_record
from .._jit.scan import first_order
from .._spec.scans import log_scan
from .._spec.kit import by_mode, drawn_on_device, grids_of, sequence_tokens
from . import pick, selective_scan
from .naive import reference, selective_scan_loop


@drawn_on_device  # drawn on the CPU, inputs took 13.5-19.7 s of H200 runs of this grid and the backbone's
def make_inputs(dims, dtype, device, seed):
    """Mamba-1's initialisation: A = -(n + 1) (S4D-real, jittered), softplus(delta) around a
    per-channel step drawn log-uniformly in [1e-3, 1e-1]; A and D in fp32 (parameters, kept so by
    Mamba), the activations x, delta, B, C, z in `dtype`."""
    g = torch.Generator(device=device).manual_seed(seed)
    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    step = torch.exp(torch.empty(D).uniform_(-6.9, -2.3, generator=g))
    bias = torch.log(torch.expm1(step))  # softplus(bias) = step

    def act(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(device=device, dtype=dtype)

    return {"x": act(B, T, D), "delta": act(B, T, D, scale=0.5, shift=bias),
            "A": (-(torch.arange(1, N + 1).float()[None, :]) * torch.exp(0.1 * torch.randn(D, N, generator=g))).to(device),
            "B": act(B, T, N), "C": act(B, T, N), "D": torch.randn(D, generator=g).to(device), "z": act(B, T, D)}


# The sequential loop launches several kernels a time step: past this many steps one call takes
# seconds (on an H100 its rows at T = 2048 and 4096 took 177 s of a warm full grid's collection);
# its rows at the real-time windows and the 1k-step shapes give the comparison
EAGER_MAX_T = 1024


def eager(x, delta, A, B, C, D, z):
    """The sequential loop, state and maths in fp32 (as mamba_ssm's selective_scan_ref)."""
    if x.shape[1] > EAGER_MAX_T:
        raise Unavailable(f"the sequential loop launches several kernels a step: measured up to T={EAGER_MAX_T}")
    return selective_scan_loop(x, delta, A, B, C, D, z)


def log_depth(x, delta, A, B, C, D, z):
    """The recurrence as a parallel scan over time of [B, T, D, N] (decay, input) pairs, fp32."""
    dt = F.softplus(delta.float())
    decay = torch.exp(dt[..., None] * A)
    _, h = log_scan(first_order.fn, (decay, (dt * x.float())[..., None] * B.float()[:, :, None, :]), dim=1)
    y = (h * C.float()[:, :, None, :]).sum(-1) + D * x.float()
    return (y * F.silu(z.float())).to(x.dtype)


def mamba_ssm(x, delta, A, B, C, D, z):
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    t = lambda v: v.transpose(1, 2)  # noqa: E731 (its layout: [B, D or N, T])
    return t(selective_scan_fn(t(x), t(delta), A, t(B), t(C), D, t(z), delta_softplus=True))


def mamba_available(device: str) -> str | None:
    if importlib.util.find_spec("mamba_ssm") is None:
        return ("mamba_ssm is not installed: its CUDA extension builds against the local torch and CUDA, and no "
                "build of it can be installed on the benchmark machine")
    return None if device == "cuda" else "mamba_ssm needs a CUDA GPU"


def config_of(inputs) -> dict:
    x = inputs["x"]
    return config_record(selective_scan=pick(x.shape[0], x.shape[1], x.shape[2], inputs["A"].shape[1], x.device))


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model (minimum traffic; s = bytes of an activation element, A and D fp32 and small):
#   fwd: read x, delta, z [B, T, D] and B, C [B, T, N]; write y                  -> (4 BTD + 2 BTN) s
#   bwd: read x, delta, z, dy and B, C; write dx, ddelta, dz and dB, dC          -> (7 BTD + 4 BTN) s
#   (+ A [D, N] and D [D] in fp32 each way)
# FLOPs per step, channel and state: forward ~7 (the decay's exponential and product, the state's
# multiply-add, the output's multiply-add), backward ~20 (the recomputed state, the adjoint's
# multiply-add and the products for dx, ddelta, dA, dB, dC); plus ~10 per step and channel.
def bytes_moved(dims, dtype, mode) -> int:
    B, T, D, N = dims["B"], dims["T"], dims["D"], dims["N"]
    s, params = dtype.itemsize, 4 * (D * N + D)
    fwd = (4 * B * T * D + 2 * B * T * N) * s + params
    bwd = (7 * B * T * D + 4 * B * T * N) * s + 2 * params
    return by_mode(mode, fwd, bwd)


def flops(dims, mode) -> float:
    steps = dims["B"] * dims["T"] * dims["D"]
    fwd, bwd = steps * (7 * dims["N"] + 10), steps * (20 * dims["N"] + 20)
    return float(by_mode(mode, fwd, bwd))


SPEC = KernelSpec(
    name="selective_scan", modes=MODES, baseline="eager", bound="memory",
    description="Mamba-1's selective scan: h_t = exp(softplus(delta_t) A) h_{t-1} + softplus(delta_t) B_t x_t, "
    "y_t = (C_t h_t + D x_t) silu(z_t); forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "delta", "A", "B", "C", "D", "z"), grids=GRIDS,
    tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops, dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", selective_scan, config=config_of, ours=True),
        Provider("eager", eager, builds=False),
        Provider("compile", compiled(log_depth)),
        Provider("mamba_ssm", mamba_ssm, mamba_available),
    ),
    # eager (the fp32 loop) and the log-depth scan against float64, over fresh draws at T 64 and 1024:
    # bf16 1.5e-3 to 3.0e-3 (one rounding of each output and gradient), fp32 6e-8 to 9e-7 (dA and dD,
    # sums over every step, the largest); a few times above, for sums over B * T up to 32k steps.
    tolerance={torch.bfloat16: 1e-2, torch.float32: 1e-5})
