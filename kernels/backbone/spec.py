"""What the collector needs to measure the backbones: providers, the float64 reference, inputs,
grids, the cost model and the tolerance.

A row is one inference forward of a whole backbone (common.py): over the window of T frames
(stream=0: what an agent that recomputes its window pays per frame) or of one new frame with the
state the T - 1 frames before it left (stream=1: what a streaming agent pays). The site's budgets
page compares these times with a frame's budget (16.67 ms at 60 FPS).
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from kcollect.spec import KernelSpec, Provider

from .._spec.kit import grids_of
from .common import N_STATE, NETS, Arch, make_weights, state_shapes, weight_shapes
from .config import config_of
from .fwd import kcollect
from .naive import compiled, eager, prefill, reference


def make_inputs(dims, dtype, device, seed):
    """Weights and frames from a seeded generator, shared by every provider; for stream=1, the state
    the float64 reference leaves after T - 1 random frames (real states, not noise: a streamed
    step then computes what the window's last frame would), cast like the activations (the SSM
    state kept in fp32, as Mamba's inference keeps it)."""
    a = Arch.of(dims)
    g = torch.Generator().manual_seed(seed)
    w = make_weights(a, g)
    x = torch.randn((a.B, a.frames, a.H), generator=g, dtype=torch.float64)
    inputs = {n: t.to(device=device, dtype=dtype) for n, t in w.items()}
    inputs["x"] = x.to(device=device, dtype=dtype)
    if a.stream:
        prefix = torch.randn((a.B, a.T - 1, a.H), generator=g, dtype=torch.float64)
        w64 = {n: t.to(device) for n, t in w.items()}
        for name, t in prefill(a, w64, prefix.to(device)).items():
            inputs[name] = t.to(torch.float32 if name == "ssm_state" else dtype)
    inputs.update(net=a.net, window=a.T, stream=int(a.stream))
    return inputs


def check(dims: Mapping) -> str | None:
    missing = [n for n in ("net", "B", "T", "H", "L", "stream") if n not in dims]
    if missing:
        return f"backbone needs the dims net, B, T, H, L, stream; missing {', '.join(missing)}"
    if dims["net"] not in NETS:
        return f"net={dims['net']!r}: one of {', '.join(NETS)}"
    if min(dims["B"], dims["T"], dims["H"], dims["L"]) < 1 or dims["stream"] not in (0, 1):
        return "B, T, H, L must be positive and stream 0 or 1"
    if dims["stream"] and dims["T"] < 2:
        return "stream=1 needs T >= 2 (a state from the frames before the new one)"
    if dims["net"] == "jamba" and dims["L"] < 2:
        return "jamba needs L >= 2 (Mamba layers around one attention layer)"
    if dims["H"] > 64 and dims["H"] % 64:
        return f"H={dims['H']}: above 64, a multiple of 64 (heads of 64)"
    return None


# Cost model: FLOPs of the matmuls, 2 per multiply-add, per frame computed (B * frames of them):
#   MLP        gate, up, down                          6 H F
#   LSTM       input and recurrent gate GEMMs          16 H^2
#   attention  qkv, out projections                    8 H^2, plus 4 H per (query, key) pair
#              (q k^T and p v); the pairs: causal T (T + 1) / 2 over a window, T per streamed frame
#   Mamba      in_proj 4 H Di, x_proj 2 Di (R + 2N), dt_proj 2 R Di, out_proj 2 Di H, and the
#              readout C . h of the scan, 2 Di N (a batched matvec)
# The scan's recurrence, the conv, norms and activations are elementwise: not counted.
def flops(dims, mode) -> float:
    a = Arch.of(dims)
    H, Di, N = a.H, a.Di, N_STATE
    per_frame = a.L * 6 * H * a.F
    per_frame += a.count("lstm") * 16 * H * H
    per_frame += a.count("attention") * 8 * H * H
    per_frame += a.count("mamba") * (4 * H * Di + 2 * Di * (a.R + 2 * N) + 2 * a.R * Di + 2 * Di * H + 2 * Di * N)
    pairs = a.T if a.stream else a.T * (a.T + 1) / 2
    total = a.B * a.frames * per_frame + a.count("attention") * a.B * pairs * 4 * H
    return float(total)

def bytes_moved(dims, dtype, mode) -> int:
    """Weights read once, frames in and out, the state read and written (the SSM state in fp32)."""
    a = Arch.of(dims)
    s = dtype.itemsize
    weights = sum(math.prod(v) for v in weight_shapes(a).values()) * s
    frames = 2 * a.B * a.frames * a.H * s
    state = 0
    for name, shape in state_shapes(a).items():
        per = 4 if name == "ssm_state" else s
        # a streamed attention layer reads its cache and writes one frame's k and v
        state += math.prod(shape) * per * (1 if name in ("k_cache", "v_cache") else 2)
    return int(weights + frames + (state if a.stream else 0))


# Plain torch.compile (inductor's default mode), not mode="reduce-overhead": the collector times
# every provider as a CUDA-graph replay of its call, which removes the launch overhead that
# reduce-overhead's own graphs would remove (and a graph of compile's graphs cannot be captured),
# so all three providers are timed by one method. max-autotune's GEMM templates are left out:
# minutes of autotuning per shape for matrices this small.
PROVIDERS = (
    Provider("eager", eager, builds=False),
    Provider("compile", compiled()),
    Provider("kcollect", kcollect, config=config_of, ours=True),
)

SPEC = KernelSpec(
    name="backbone", modes=("fwd",), baseline="eager", bound="compute",
    description="inference forward of a sequence backbone (mlp, lstm, attention, mamba, jamba) over a window of "
                "frames or one streamed frame",
    reference=reference, make_inputs=make_inputs, grad_inputs=(), grids=grids_of(__file__), check_shape=check,
    bytes_moved=bytes_moved, flops=flops, dtypes=(torch.bfloat16, torch.float32), providers=PROVIDERS,
    # bf16: about 3x the worst error of the eager modules against float64, measured on the CPU over
    # every backbone at H 512, L 4, T 60, window and stream (4.3e-3 mlp to 6.3e-3 lstm; ours 4.5e-3
    # to 6.6e-3 on the quick grid): one rounding per sublayer output, over 8-12 sublayers. fp32:
    # the CPU gives 2e-7 to 4e-7, but on the GPU PyTorch lets cuDNN run fp32 RNNs and convolutions
    # in TF32 by default (torch.backends.cudnn.allow_tf32; 10-bit mantissa, 5e-4 a rounding), which
    # the eager and compile LSTM and conv take: the tolerance holds that, not fp32's own error.
    tolerance={torch.bfloat16: 2e-2, torch.float32: 3e-3})
