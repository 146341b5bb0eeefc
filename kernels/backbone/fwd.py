"""The kcollect backbone's forward (inference only): the blocks of naive.py built from our kernels. The residual add is fused
with the next RMSNorm (add_rms_norm: the residual stream is carried beside the sublayers' outputs,
as in mamba_ssm's Block), the MLP's gate is swiglu, attention is our flash attention (causal, the
window of T frames), the LSTM is our persistent LSTM and Mamba's scan our selective scan. Matmuls
are cuBLAS (F.linear), as in the other providers."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kcollect.spec import Unavailable

from ..add_rms_norm import add_rms_norm
from ..attention import attention
from ..attention.step import attention_decode
from ..conv1d.step import causal_conv_step
from ..lstm import lstm
from ..lstm.step import lstm_step
from ..rms_norm import rms_norm
from ..selective_scan import selective_scan
from ..selective_scan.step import selective_state_update
from ..swiglu import swiglu
from .common import EPS, N_STATE, Arch, arch_of, causal_conv, heads, layer_states, mamba_split, stack_states, work_dtype


def mlp(x, w, i):
    return F.linear(swiglu(F.linear(x, w["w_gate"][i]), F.linear(x, w["w_up"][i])), w["w_down"][i])


def lstm_mixer(x, w, j, state, a: Arch):
    if state is not None:  # one streamed frame: a cell step, no persistent launch
        h, c = lstm_step(x[:, 0], state[0], state[1], w["lstm_w_ih"][j], w["lstm_w_hh"][j], w["lstm_b"][j])
        return h[:, None], (h, c)
    h0, c0 = x.new_zeros(a.B, a.H), x.new_zeros(a.B, a.H)
    y, h, c = lstm(x, h0, c0, w["lstm_w_ih"][j], w["lstm_w_hh"][j], w["lstm_b"][j])
    return y, (h, c)


def attention_mixer(x, w, j, state, a: Arch):
    q, k, v = heads(F.linear(x, w["attn_qkv"][j]), a.heads)
    if state is not None:  # one streamed frame over the cached T - 1 and itself, the cache read in place
        o = attention_decode(q[:, 0], state[0], state[1], k[:, 0], v[:, 0], window=a.T)
    else:  # window = T: the frames of the window
        o = attention(q, k, v, causal=True, window=a.T)
    return F.linear(o.reshape(x.shape), w["attn_out"][j]), (k, v)


def mamba_mixer(x, w, j, state, a: Arch):
    xi, z = F.linear(x, w["m_in"][j]).chunk(2, dim=-1)
    if state is not None:  # one streamed frame: the conv window and the scan's state each move a step
        xc, conv = causal_conv_step(state[0], xi[:, 0], w["m_conv_w"][j], w["m_conv_b"][j])
        dt_in, Bm, Cm = mamba_split(F.linear(xc, w["m_x"][j]), a.R, N_STATE)
        delta = F.linear(dt_in, w["m_dt_w"][j], w["m_dt_b"][j])
        y, h = selective_state_update(state[1], xc, delta, w["m_A_log"][j], Bm, Cm, w["m_D"][j], z[:, 0], A_log=True)
        return F.linear(y, w["m_out"][j])[:, None], (conv, h)
    xc, _ = causal_conv(xi, None, w["m_conv_w"][j], w["m_conv_b"][j])
    dt_in, Bm, Cm = mamba_split(F.linear(xc, w["m_x"][j]), a.R, N_STATE)
    delta = F.linear(dt_in, w["m_dt_w"][j], w["m_dt_b"][j])
    A = -torch.exp(w["m_A_log"][j].to(work_dtype(x)))
    return F.linear(selective_scan(xc, delta, A, Bm, Cm, w["m_D"][j], z), w["m_out"][j]), None


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
