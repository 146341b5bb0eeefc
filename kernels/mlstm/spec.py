"""What the collector needs to measure the mLSTM: providers, the float64 reference, inputs, grids, the
cost model and the tolerance.

Dims (Cortex's benchmark order): B (batch rows), NH (heads), T (timesteps), DH (head size), resets
(the probability that a row's state is zeroed before a step)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kcollect.spec import MODES, KernelSpec, Provider, Unavailable, peer_available

from .._host.config import config_record
from .._spec.cells import dims_check, resets_or_none
from .._spec.kit import by_mode, grids_of, sequence_tokens
from . import fitted, mlstm, pick
from .naive import EPS, chunkwise, reference

DIMS = ("B", "NH", "T", "DH", "resets")


def eager(q, k, v, i, f, resets=None):
    """The chunkwise form in PyTorch ops (Cortex's own PyTorch mLSTM is the same form), computed in fp32
    at least: in bf16 the running sums of the log forget gates lose their last digits and the gate
    weights exp(A_t - A_s) come out 6% off forward, 50% backward (B=2, NH=2, T=96, DH=32, CPU)."""
    wide = torch.promote_types(q.dtype, torch.float32)
    out = chunkwise(*(x.to(wide) for x in (q, k, v, i, f)), resets)
    return tuple(o.to(q.dtype) for o in out)


def triton_mlstm(q, k, v, i, f, resets=None):
    return mlstm(q, k, v, i, f, resets)


def cortex(q, k, v, i, f, resets=None):
    """Cortex's Triton mLSTM (TFLA's kernels with resets; it pads T to a multiple of 16 with input
    gates of -10)."""
    from cortex.kernels.triton.mlstm import mlstm_chunkwise_triton

    h, (C, n, m) = mlstm_chunkwise_triton(queries=q, keys=k, values=v, igate_preact=i, fgate_preact=f,
                                          reset_mask=resets, chunk_size=64, return_last_state=True, eps=EPS)
    return h, C.detach(), n[..., 0].detach(), m[..., 0, 0].detach()


def mlstm_kernels(q, k, v, i, f, resets=None):
    """mlstm_kernels' TFLA chunkwise kernels (triton_xl_chunk; its state keeps k unscaled)."""
    from mlstm_kernels.torch.chunkwise import mlstm_chunkwise__xl_chunk

    T, DH = q.shape[2], q.shape[3]
    if resets is not None:
        raise Unavailable("mlstm_kernels cannot reset the state inside a sequence")
    if T % 128 and T not in (16, 32, 64):
        raise Unavailable(f"mlstm_kernels' xl_chunk kernels take T = 16, 32, 64 or a multiple of 128, not {T}")
    h, (C, n, m) = mlstm_chunkwise__xl_chunk(q, k, v, i, f, return_last_states=True, eps=EPS)
    scale = DH ** -0.5
    return h, (C * scale).detach(), (n * scale).detach(), m.reshape(m.shape[0], m.shape[1]).detach()


# fla's fused chunk kernels autotune 18 configs per head shape at their first call: collected on the
# long sequences only, which share one head shape in the full grid.
FLA_MIN_T = 1024


def fla(q, k, v, i, f, resets=None):
    """The mLSTM through fla's fused_chunk_simple_gla (chunked linear attention with a log-decay per
    step): the input gate folded into the keys unstabilised, exp(i) k, and the normaliser as an extra
    value column of ones; h = num / (max(|den|, 1) + 1e-6 exp(m)), with m the exact stabiliser (a
    running max). The same maths as long as exp(i) and the running sums stay in range (i ~ N(0, 1))."""
    from fla.ops.simple_gla import fused_chunk_simple_gla

    B, NH, T, DH = q.shape
    if resets is not None:
        raise Unavailable("fla takes resets only as variable-length segments, whose offsets need a host "
                          "sync every call")
    if T < FLA_MIN_T:
        raise Unavailable(f"fla autotunes its kernels at first use: collected at T >= {FLA_MIN_T} only")
    a = F.logsigmoid(f.float())
    A = a.cumsum(-1)
    m = A + torch.clamp(torch.cummax(i.float() - A, -1).values, min=0.0)  # max(0 + A_t, max_s i_s + A_t - A_s)
    ones = torch.ones_like(v[..., :1])
    o, state = fused_chunk_simple_gla(q.transpose(1, 2), (k * torch.exp(i)[..., None]).transpose(1, 2),
                                      torch.cat((v, ones), -1).transpose(1, 2), g=a.transpose(1, 2).contiguous(),
                                      scale=DH ** -0.5, output_final_state=True)
    o = o.transpose(1, 2).float()
    h = o[..., :DH] / (torch.clamp(o[..., DH:].abs(), min=1.0) + EPS * torch.exp(m)[..., None])
    decay = (DH ** -0.5) * torch.exp(-m[..., -1])[..., None]
    state = state.float()
    return (h.to(q.dtype), (state[..., :DH] * decay[..., None]).to(q.dtype).detach(),
            (state[..., DH] * decay).to(q.dtype).detach(), m[..., -1].to(q.dtype).detach())


def config_of(inputs) -> dict:
    q = inputs["q"]
    B, NH, T, DH = q.shape
    return config_record(mlstm=fitted(pick(T, DH, q.device, B * NH, q.dtype), q.dtype, DH, q.device, True))


def make_inputs(dims, dtype, device, seed):
    """q, k, v and the gate pre-activations ~ N(0, 1) (Cortex's benchmark), a seeded reset mask."""
    B, NH, T, DH = dims["B"], dims["NH"], dims["T"], dims["DH"]
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)

    return {"q": randn(B, NH, T, DH), "k": randn(B, NH, T, DH), "v": randn(B, NH, T, DH), "i": randn(B, NH, T),
            "f": randn(B, NH, T), "resets": resets_or_none(B, T, float(dims["resets"]), g, device)}


check_shape = dims_check("mlstm", DIMS)


GRIDS = grids_of(__file__)  # grids.toml beside this file


# Cost model of the chunkwise form with chunks of L = 64 (Cortex's and TFLA's), per row and head:
# within chunks q k^T and its product with v, 4*T*L*DH FLOPs; across chunks the state's product with
# q and its update, 4*T*DH^2; about 2.5 times that backward. Bytes: q, k, v, i, f read once, h and the
# final state written once; backward reads dh and q, k, v, i, f and writes their gradients.
def flops(dims, mode) -> float:
    B, NH, T, DH = dims["B"], dims["NH"], dims["T"], dims["DH"]
    fwd = B * NH * (4 * T * 64 * DH + 4 * T * DH * DH)
    return float(by_mode(mode, fwd, 2.5 * fwd))


def bytes_moved(dims, dtype, mode) -> int:
    B, NH, T, DH = dims["B"], dims["NH"], dims["T"], dims["DH"]
    inputs = B * NH * T * (3 * DH + 2)
    fwd = inputs + B * NH * T * DH + B * NH * (DH * DH + DH + 1)
    bwd = B * NH * T * DH + inputs + inputs
    return dtype.itemsize * by_mode(mode, fwd, bwd)


SPEC = KernelSpec(
    name="mlstm", modes=MODES, baseline="mlstm_kernels", bound="compute",
    description="xLSTM's mLSTM cell (matrix memory, exponential input gate) over a sequence with resets, "
    "chunkwise-parallel, forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("q", "k", "v", "i", "f"), grids=GRIDS,
    check_shape=check_shape, tokens=sequence_tokens, bytes_moved=bytes_moved, flops=flops,
    dtypes=(torch.bfloat16, torch.float32),
    providers=(
        Provider("triton", triton_mlstm, config=config_of, ours=True),
        Provider("cortex", cortex, peer_available("cortex"), note="Cortex's Triton mLSTM (cortexcore)"),
        Provider("mlstm_kernels", mlstm_kernels, peer_available("mlstm_kernels"),
                 note="TFLA's chunkwise kernels (mlstm_kernels triton_xl_chunk): no resets"),
        Provider("fla", fla, peer_available("fla"),
                 note="fla's fused_chunk_simple_gla with the input gate folded into the keys unstabilised and "
                      "the normaliser as a value column: the same maths while exp(i) stays in range; no resets"),
        Provider("eager", eager, note="the chunkwise form in PyTorch ops", builds=False),
    ),
    # bf16: about three times ours against float64 at B=2, NH=2, T=96, DH=32 on the CPU (6.4e-3 forward,
    # 1.0e-2 backward). fp32: the PyTorch chunkwise form 1.2e-6 forward, 2.7e-6 backward there; ours
    # 2.5e-7 forward and up to 9.2e-7 backward at gates ~ N(0, 2) (B=3, T=20, DH=32, resets at the edges).
    tolerance={torch.bfloat16: 3e-2, torch.float32: 5e-5},
    log_scale=(3,),  # m_T: log sigmoid of a large forget gate after a reset at the last step rounds near 0
    notes="The final state (C_T, n_T, m_T) is returned without gradient. The stabiliser enters h only through the "
          "1e-6 of the normaliser: our backward carries its gradient, TFLA's holds it constant (about 1e-5 of "
          "the gradients at gates ~ N(0, 2); all of di and df where every step resets or input gates are large).")
