"""What the collector needs to measure the RTU: providers, the float64 reference, inputs, grids,
the cost model and the tolerance.

Dims, in Cortex's config format (batch, seq_len, hidden, rank, resets, p): B, T, H, R (the
input maps' rank; 'diag' for Cortex's streaming-diagonal maps), resets (0: no reset mask given;
1: a mask whose steps are resets with probability p, drawn from the case's seed)."""
from __future__ import annotations

import torch

from kcollect.spec import MODES, KernelSpec, Provider, peer_available

from .._host.config import config_record
from .._spec.scans import reset_mask
from .._spec.kit import by_mode, drawn_on_device, grids_of, sequence_tokens
from . import pick, providers
from .naive import reference

DIAG = "diag"


@drawn_on_device  # drawn on the CPU, the full grid's inputs took 7.2 s of an H200 run (2d7991ae, 399 s)
def make_inputs(dims, dtype, device, seed):
    """x in `dtype`; the recurrence's parameters (nu_log, theta_log, diagonal weights) in fp32, as
    a model keeps them (autocast leaves elementwise maths in fp32); low-rank factors in `dtype`,
    as autocast casts a matmul's weights. |lambda| = r uniform in [0.5, 0.999] (memories of 2 to
    1000 steps), angles uniform in (0, pi]; factors scaled so that u stays of order 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    B, T, H, R = dims["B"], dims["T"], dims["H"], dims["R"]
    r = 0.5 + 0.499 * torch.rand(H, generator=g, dtype=torch.float64)
    theta = torch.pi * (1.0 - torch.rand(H, generator=g, dtype=torch.float64))
    out = {"x": torch.randn(B, T, H, generator=g).to(device=device, dtype=dtype),
           "nu_log": torch.log(-torch.log(r)).float().to(device), "theta_log": torch.log(theta).float().to(device)}
    if R == DIAG:
        out["map1"] = torch.randn(H, generator=g).to(device)
        out["map2"] = torch.randn(H, generator=g).to(device)
    else:
        scale = torch.tensor([H ** -0.5, R ** -0.5])[:, None, None]
        out["map1"] = (torch.randn(2, H, R, generator=g) * scale).to(device=device, dtype=dtype)
        out["map2"] = (torch.randn(2, H, R, generator=g) * scale).to(device=device, dtype=dtype)
    out["resets"] = reset_mask(B, T, float(dims["p"]), g).to(device) if int(dims["resets"]) else None
    return out


def config_of(inputs) -> dict:
    x = inputs["x"]
    return config_record(rtu=pick(x.shape[0], x.shape[1], x.shape[2], x.device, inputs.get("resets") is not None))


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model (minimum traffic, s = bytes of an element of x; the fp32 parameters are a few H):
#   fwd:     read x, write y [B, T, 2H]         -> 3 * B*T*H * s  (+ B*T bytes of resets)
#   bwd:     read x and dy, write dx            -> 4 * B*T*H * s  (+ resets)
#   low-rank: + the factors, 4 * H*R * s, each way; u = x @ U @ V stays inside the op
# FLOPs per step and channel: forward ~14 (a complex multiply-add, gamma, SiLU), backward ~40 (the
# recomputed state, SiLU', the adjoint's multiply-add, dx and five parameter sums); low-rank maps
# add the projections, 8 * H*R per step forward and 16 backward (dx, dU, dV).
def bytes_moved(dims, dtype, mode) -> int:
    B, T, H, R = dims["B"], dims["T"], dims["H"], dims["R"]
    s = dtype.itemsize
    resets = B * T if int(dims["resets"]) else 0
    factors = 0 if R == DIAG else 4 * H * R * s
    fwd = 3 * B * T * H * s + resets + factors
    bwd = 4 * B * T * H * s + resets + 2 * factors
    return by_mode(mode, fwd, bwd)


def flops(dims, mode) -> float:
    B, T, H, R = dims["B"], dims["T"], dims["H"], dims["R"]
    proj = 0 if R == DIAG else H * R
    fwd, bwd = B * T * (14 * H + 8 * proj), B * T * (40 * H + 16 * proj)
    return float(by_mode(mode, fwd, bwd))


SPEC = KernelSpec(
    name="rtu", modes=MODES, baseline="cortex_torch", bound="memory",
    description="Cortex's RTU: y = SiLU of a complex diagonal recurrence c_t = lambda c_{t-1} + gamma u_t "
    "with resets, diagonal or low-rank input maps; forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "nu_log", "theta_log", "map1", "map2"),
    grids=GRIDS, tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops, dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", providers.triton, config=config_of, ours=True),
        Provider("cortex", providers.cortex, peer_available("cortex")),
        Provider("cortex_torch", providers.cortex_torch, peer_available("cortex"), builds=False),
        Provider("compile", providers.compile_scan),
        Provider("accelerated_scan", providers.accelerated_scan, peer_available("accelerated_scan")),
    ),
    # The PyTorch paths with their state in fp32 (log_depth, and a step loop) against float64 at
    # T 2048 on the CPU, forward and backward over fresh draws: bf16 2.9e-3 to 4.0e-3 (one rounding
    # of y, x's own rounding in dx); fp32 y and dx below 2.5e-6, but theta_log's gradient up to
    # 6.5e-5 (for both paths: a sum of terms as large as t * |c| that cancel); about 3x above,
    # for growth with T to 8192. With low-rank maps in bf16 the maps' products are rounded to bf16
    # for every provider, and theta_log's cancelling sum makes that rounding a heavy tail: the
    # PyTorch path's gradients over 200 seeds of each low-rank shape up to T 1024 reached 2.3e-2
    # (B 8, T 512, H 64, R 16; median 4.0e-3), and a gate of 1e-2 failed every provider at 1 in
    # 20 seeds there (lab/rtu_bf16_gate.py; an H200 run at cd54508 failed ours, compile and
    # accelerated_scan at 1.6e-2 alike). 1.5x the largest of those draws; 200 other seeds per shape
    # stayed below it (lab/results/rtu_bf16_gate.txt).
    tolerance={torch.bfloat16: 3.5e-2, torch.float32: 2e-4},
    notes="Cortex's PyTorch and Triton RTUs zero the adjoint at the reset step itself instead of the step after "
          "it, so their gradients with resets fail the gate; their forwards pass.")
