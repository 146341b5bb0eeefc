"""What the collector needs to measure the LSTM: providers, the float64 reference, inputs, grids, the
cost model and the tolerance.

Dims: B (batch rows), T (timesteps), H (hidden size; the input size is H too, as in Cortex's
LSTMCell), resets (the probability that a row's state is zeroed before a step: '0' or '0.1')."""
from __future__ import annotations

import math

import torch

from kcollect.spec import MODES, KernelSpec, Provider, Unavailable, peer_available

from .._host.config import config_record
from .._spec.cells import dims_check, resets_or_none, step_loop_limit
from .._spec.kit import by_mode, grids_of, sequence_tokens
from . import lstm, pick
from .naive import reference, step_loop
from .sequence import fitted

DIMS = ("B", "T", "H", "resets")


def eager(x, h0, c0, w_ih, w_hh, b, resets=None):
    step_loop_limit("the PyTorch step loop", x.shape[1])
    return step_loop(x, h0, c0, w_ih, w_hh, b, resets)


def cudnn(x, h0, c0, w_ih, w_hh, b, resets=None):
    """cuDNN's LSTM (what nn.LSTM runs on a GPU), b as its input bias and zeros as its hidden bias."""
    if resets is not None:
        raise Unavailable("cuDNN's LSTM cannot reset the state inside a sequence: it is the speed reference "
                          "of the shapes without resets")
    if x.dtype == torch.bfloat16 and (torch.backends.cudnn.version() or 0) < 91300:
        raise Unavailable(f"cuDNN {torch.backends.cudnn.version()} has no bf16 RNN (9.13 added it)")
    y, hn, cn = torch._VF.lstm(x, (h0[None], c0[None]), (w_ih, w_hh, b, torch.zeros_like(b)), True, 1, 0.0,
                               torch.is_grad_enabled(), False, True)
    return y, hn[0], cn[0]


def cudnn_available(device: str) -> str | None:
    return None if device == "cuda" else "cuDNN needs a CUDA GPU"


# Cortex's Triton LSTM: one program per 16 batch rows holds four [16, H] fp32 gate tiles and unrolls
# its recurrent product over H / 16 weight tiles, recompiled for every T; Cortex benchmarks it up to
# H = 128. Past H = 256 its compile and register spills grow beyond what a collection can wait for.
CORTEX_MAX_H = 256


class _CortexLSTM:
    """The attributes of an nn.LSTM that Cortex's lstm_sequence_triton reads, holding our tensors (so
    that gradients reach them)."""

    def __init__(self, w_ih, w_hh, b):
        self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0 = w_ih, w_hh, b
        self.bias_hh_l0 = torch.zeros_like(b)
        self.hidden_size, self.num_layers, self.proj_size, self.bias = w_hh.shape[1], 1, 0, True


def cortex(x, h0, c0, w_ih, w_hh, b, resets=None):
    from cortex.kernels.triton.lstm import lstm_sequence_triton

    H = w_hh.shape[1]
    if H > CORTEX_MAX_H or H & (H - 1):
        raise Unavailable(f"Cortex's Triton LSTM is collected up to H={CORTEX_MAX_H} (a power of two): its "
                          "kernel unrolls the whole recurrent product per program")
    y, hn, cn = lstm_sequence_triton(lstm=_CortexLSTM(w_ih, w_hh, b), x_seq=x, h0_bf=h0[:, None], c0_bf=c0[:, None],
                                     resets=resets)
    return y, hn[:, 0], cn[:, 0]


def triton_lstm(x, h0, c0, w_ih, w_hh, b, resets=None):
    return lstm(x, h0, c0, w_ih, w_hh, b, resets)


def config_of(inputs) -> dict:
    x, H = inputs["x"], inputs["w_hh"].shape[1]
    return config_record(lstm=fitted(pick(x.shape[0], H, x.device), x.dtype, H, x.device, picked=True))


def make_inputs(dims, dtype, device, seed):
    """nn.LSTM's initialisation (uniform within 1/sqrt(H)), random states, a seeded reset mask."""
    B, T, H = dims["B"], dims["T"], dims["H"]
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(H)

    def uniform(*shape, scale=1.0):
        return ((torch.rand(shape, generator=g) * 2 - 1) * scale).to(device=device, dtype=dtype)

    return {"x": torch.randn(B, T, H, generator=g).to(device=device, dtype=dtype), "h0": uniform(B, H),
            "c0": uniform(B, H), "w_ih": uniform(4 * H, H, scale=bound), "w_hh": uniform(4 * H, H, scale=bound),
            "b": uniform(4 * H, scale=2 * bound), "resets": resets_or_none(B, T, float(dims["resets"]), g, device)}


check_shape = dims_check("lstm", DIMS)


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model (I = H). Gate GEMMs: the input projection 2*B*T*I*4H and the recurrent product
# 2*B*T*H*4H forward, twice each backward (the input and the weight gradients); elementwise about 20
# FLOPs a unit and step forward, 30 backward. Bytes: x, the weights and the initial states read once,
# y and the final states written once (forward); backward reads dy, x and the weights and writes dx,
# the weight gradients and the initial-state gradients.
def flops(dims, mode) -> float:
    B, T, H = dims["B"], dims["T"], dims["H"]
    gemm = 2 * B * T * 4 * H * (H + H)
    fwd, bwd = gemm + 20 * B * T * H, 2 * gemm + 30 * B * T * H
    return float(by_mode(mode, fwd, bwd))


def bytes_moved(dims, dtype, mode) -> int:
    B, T, H = dims["B"], dims["T"], dims["H"]
    weights = 4 * H * (2 * H + 1)
    fwd = B * T * H + weights + 2 * B * H + B * T * H + 2 * B * H
    bwd = 2 * B * T * H + weights + B * T * H + weights + 2 * B * H
    return dtype.itemsize * by_mode(mode, fwd, bwd)


SPEC = KernelSpec(
    name="lstm", modes=MODES, baseline="cudnn", bound="compute",
    description="single-layer LSTM over a sequence with per-step resets of (h, c), forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("x", "h0", "c0", "w_ih", "w_hh", "b"), grids=GRIDS,
    check_shape=check_shape, tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops,
    dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", triton_lstm, config=config_of, ours=True),
        Provider("cudnn", cudnn, cudnn_available,
                 note="nn.LSTM's cuDNN kernels: no resets, so only the shapes without them", builds=False),
        Provider("eager", eager, note="the PyTorch step loop with resets", builds=False),
        Provider("cortex", cortex, peer_available("cortex"), note="Cortex's Triton LSTM (cortexcore)"),
    ),
    # About three times the PyTorch step loop's own error against float64 (bf16 backward 1.0e-2 to
    # 1.1e-2 at B=8, T=48, H=64 on the CPU; fp32 2.9e-7).
    tolerance={torch.bfloat16: 3e-2, torch.float32: 1e-5},
    notes="cudnn runs without resets: it is timed on the shapes without them. eager is timed up to T=256, "
          "cortex up to H=256 (see their rows).")
