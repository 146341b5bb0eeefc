"""The kcollect backbone: the blocks of eager.py built from our kernels. The residual add is fused
with the next RMSNorm (add_rms_norm: the residual stream is carried beside the sublayers' outputs,
as in mamba_ssm's Block), the MLP's gate is swiglu, attention is our flash attention (causal, the
window of T frames), the LSTM is our persistent LSTM and Mamba's scan our selective scan. Matmuls
are cuBLAS (F.linear), as in the other providers."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import Unavailable

from .._lib import config_record
from ..add_rms_norm import add_rms_norm
from ..attention import attention
from ..attention import pick as attention_pick
from ..lstm import lstm, pick as lstm_pick
from ..rms_norm import rms_norm
from ..selective_scan import pick as scan_pick, selective_scan
from ..swiglu import swiglu
from .arch import EPS, N_STATE, Arch, arch_of, layer_states, stack_states
from .blocks import causal_conv, heads, mamba_split, scan, work_dtype


def mlp(x, w, i):
    return F.linear(swiglu(F.linear(x, w["w_gate"][i]), F.linear(x, w["w_up"][i])), w["w_down"][i])


def lstm_mixer(x, w, j, state, a: Arch):
    h0, c0 = state if state is not None else (x.new_zeros(a.B, a.H), x.new_zeros(a.B, a.H))
    y, h, c = lstm(x, h0, c0, w["lstm_w_ih"][j], w["lstm_w_hh"][j], w["lstm_b"][j])
    return y, (h, c)


def attention_mixer(x, w, j, state, a: Arch):
    q, k, v = heads(F.linear(x, w["attn_qkv"][j]), a.heads)
    keys, values = (k, v) if state is None else (torch.cat([state[0], k], 1), torch.cat([state[1], v], 1))
    # window = T: the frames of the window; a streamed frame (aligned at the end) sees all T keys
    o = attention(q, keys, values, causal=True, window=a.T)
    return F.linear(o.reshape(x.shape), w["attn_out"][j]), (k, v)


def mamba_mixer(x, w, j, state, a: Arch):
    xi, z = F.linear(x, w["m_in"][j]).chunk(2, dim=-1)
    xc, conv = causal_conv(xi, None if state is None else state[0], w["m_conv_w"][j], w["m_conv_b"][j])
    dt_in, Bm, Cm = mamba_split(F.linear(xc, w["m_x"][j]), a.R, N_STATE)
    delta = F.linear(dt_in, w["m_dt_w"][j], w["m_dt_b"][j])
    work = work_dtype(x)
    A = -torch.exp(w["m_A_log"][j].to(work))
    if state is None:
        return F.linear(selective_scan(xc, delta, A, Bm, Cm, w["m_D"][j], z), w["m_out"][j]), None
    # one frame from a carried state: the scan op takes no initial state, so the step is PyTorch's
    y, h = scan(xc, F.softplus(delta.to(work)), A, Bm, Cm, w["m_D"][j], state[1])
    y = (y * F.silu(z.to(work))).to(x.dtype)
    return F.linear(y, w["m_out"][j]), (conv, h)


MIXERS = {"lstm": lstm_mixer, "attention": attention_mixer, "mamba": mamba_mixer}


def _norm(hidden, residual, w):
    """(new residual, normalised input of the next sublayer)."""
    if residual is None:
        return hidden, rms_norm(hidden, w, EPS)
    return add_rms_norm(hidden, residual, w, EPS)


def kcollect(**inputs):
    a = arch_of(inputs)
    x = inputs["x"]
    if "attention" in a.layout and x.dtype not in (torch.bfloat16, torch.float16):
        raise Unavailable(f"our attention kernel takes bfloat16 and float16, not {x.dtype}")
    hidden, residual, new = x, None, []
    for (kind, j, m), state in zip(a.slots(), layer_states(a, inputs)):
        s = None
        if kind != "none":
            residual, normed = _norm(hidden, residual, inputs["norm_mix"][m])
            hidden, s = MIXERS[kind](normed, inputs, j, state, a)
        residual, normed = _norm(hidden, residual, inputs["norm_mlp"][len(new)])
        hidden = mlp(normed, inputs, len(new))
        new.append(s)
    _, y = add_rms_norm(hidden, residual, inputs["norm_f"], EPS)
    return (y, *stack_states(a, new)) if a.stream else y


def config_of(inputs) -> dict:
    """The configs our attention, LSTM and selective scan launch with (the scan only over a window:
    a streamed frame steps the carried state in PyTorch)."""
    a, device = arch_of(inputs), inputs["x"].device
    return config_record(
        attention=attention_pick(a.hd, True, a.frames, device, 1).fwd if "attention" in a.layout else None,
        lstm=lstm_pick(a.B, a.H, device) if "lstm" in a.layout else None,
        selective_scan=scan_pick(a.B, a.T, a.Di, N_STATE, device) if "mamba" in a.layout and not a.stream else None)
