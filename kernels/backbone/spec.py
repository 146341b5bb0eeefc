"""What the collector needs to measure the backbones: providers, the float64 reference, inputs,
grids, the cost model and the tolerance.

A row is one inference forward of a whole backbone (arch.py): over the window of T frames
(stream=0: what an agent that recomputes its window pays per frame) or of one new frame with the
state the T - 1 frames before it left (stream=1: what a streaming agent pays). The site's budgets
page compares these times with a frame's budget (16.67 ms at 60 FPS).
"""
from __future__ import annotations

import torch

from kcollect.spec import Provider, Shape

from .._lib.spec_kit import module_spec

from .arch import NETS, Arch, bytes_moved, check, flops, make_weights
from .eager import compiled, eager, prefill, reference
from .ours import config_of, kcollect


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


def _s(net, b, t, h, layers, stream, why) -> Shape:
    return Shape({"net": net, "B": b, "T": t, "H": h, "L": layers, "stream": stream}, why)


QUICK = (  # every backbone, window and stream, on shapes the CPU interpreter runs in seconds
    _s("mlp", 3, 5, 32, 1, 0, "MLP window: one layer"), _s("mlp", 4, 5, 32, 2, 1, "MLP, one frame"),
    _s("lstm", 3, 5, 16, 2, 0, "LSTM window, two layers"), _s("lstm", 4, 5, 32, 1, 1, "LSTM step from a state"),
    _s("attention", 2, 6, 32, 2, 0, "causal attention over the window"),
    _s("attention", 4, 6, 32, 1, 1, "one frame over the cached window"),
    _s("mamba", 2, 5, 16, 2, 0, "Mamba window: the scan, conv from zeros"),
    _s("mamba", 4, 5, 32, 1, 1, "Mamba step: conv window and SSM state carried"),
    _s("jamba", 2, 5, 32, 2, 0, "Mamba then attention"), _s("jamba", 4, 5, 16, 3, 1, "jamba step, 3 layers"),
)

FULL = (
    # the agent's model: hidden 512, 4 layers, a 60-frame window; one game (B 1) and batched
    # self-play (B 32); recomputing the window against streaming one frame with the state
    *(_s(n, b, 60, 512, 4, st, f"agent model, {'stream' if st else 'window'}, {b} stream(s)")
      for n in NETS for b in (1, 32) for st in (0, 1)),
    # the small model (hidden 256, 2 layers) for one game
    *(_s(n, 1, 60, 256, 2, st, f"small model, {'stream' if st else 'window'}, one game")
      for n in NETS for st in (0, 1)),
)

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

SPEC = module_spec(
    globals(), "backbone",
    "inference forward of a sequence backbone (mlp, lstm, attention, mamba, jamba) over a window of "
    "frames or one streamed frame",
    modes=("fwd",),
    providers=PROVIDERS,
    baseline="eager",
    grad_inputs=(),
    bound="compute",
    # bf16: about 3x the worst error of the eager modules against float64, measured on the CPU over
    # every backbone at H 512, L 4, T 60, window and stream (4.3e-3 mlp to 6.3e-3 lstm; ours 4.5e-3
    # to 6.6e-3 on the quick grid): one rounding per sublayer output, over 8-12 sublayers. fp32:
    # the CPU gives 2e-7 to 4e-7, but on the GPU PyTorch lets cuDNN run fp32 RNNs and convolutions
    # in TF32 by default (torch.backends.cudnn.allow_tf32; 10-bit mantissa, 5e-4 a rounding), which
    # the eager and compile LSTM and conv take: the tolerance holds that, not fp32's own error.
    tolerance={torch.bfloat16: 2e-2, torch.float32: 3e-3},
    dtypes=(torch.bfloat16, torch.float32),
    check_shape=check,
)
