"""The backbones in plain PyTorch, the float64 reference: PyTorch modules, nn.RMSNorm, nn.Linear, nn.LSTM (cuDNN on the GPU), SDPA, and
Mamba's mixer with its reference scan (a sequential loop in fp32). Built from the shared weights
once per inputs (outside the timed calls); run in float64, they are the reference every provider
is checked against. `compile` is torch.compile of the same modules, block by block."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention.providers import once_per
from .common import (CONV_K, EPS, N_STATE, Arch, arch_of, causal_conv, heads, layer_states, mamba_split, scan,
                     stack_states, state_shapes, work_dtype)


class MLP(nn.Module):
    def __init__(self, a: Arch, f: dict):
        super().__init__()
        self.gate = nn.Linear(a.H, a.F, bias=False, **f)
        self.up = nn.Linear(a.H, a.F, bias=False, **f)
        self.down = nn.Linear(a.F, a.H, bias=False, **f)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LSTMMixer(nn.Module):
    def __init__(self, a: Arch, f: dict):
        super().__init__()
        self.lstm = nn.LSTM(a.H, a.H, batch_first=True, **f)

    def forward(self, x, state):
        hx = None if state is None else (state[0].unsqueeze(0), state[1].unsqueeze(0))
        y, (h, c) = self.lstm(x, hx)
        return y, (h[0], c[0])


class AttentionMixer(nn.Module):
    """Causal attention over the window; with a state (the k, v of the T - 1 frames before), one
    new frame attends to them and to itself. Returns the new frames' k and v as the state."""

    def __init__(self, a: Arch, f: dict):
        super().__init__()
        self.heads = a.heads
        self.qkv = nn.Linear(a.H, 3 * a.H, bias=False, **f)
        self.out = nn.Linear(a.H, a.H, bias=False, **f)

    def forward(self, x, state):
        q, k, v = heads(self.qkv(x), self.heads)
        keys, values = (k, v) if state is None else (torch.cat([state[0], k], 1), torch.cat([state[1], v], 1))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                           is_causal=state is None)
        return self.out(o.transpose(1, 2).reshape(x.shape)), (k, v)


class MambaMixer(nn.Module):
    """mamba_ssm's Mamba (v1) without its fused kernels: in_proj, causal conv, x_proj, dt_proj,
    the selective scan, the silu(z) gate, out_proj. State: (conv window, SSM state)."""

    def __init__(self, a: Arch, f: dict):
        super().__init__()
        self.rank = a.R
        self.in_proj = nn.Linear(a.H, 2 * a.Di, bias=False, **f)
        self.conv1d = nn.Conv1d(a.Di, a.Di, CONV_K, groups=a.Di, **f)
        self.x_proj = nn.Linear(a.Di, a.R + 2 * N_STATE, bias=False, **f)
        self.dt_proj = nn.Linear(a.R, a.Di, **f)
        self.A_log = nn.Parameter(torch.empty(a.Di, N_STATE, **f))
        self.D = nn.Parameter(torch.empty(a.Di, **f))
        self.out_proj = nn.Linear(a.Di, a.H, bias=False, **f)

    def forward(self, x, state):
        xi, z = self.in_proj(x).chunk(2, dim=-1)
        xc, conv = causal_conv(xi, None if state is None else state[0], self.conv1d.weight[:, 0], self.conv1d.bias)
        dt_in, Bm, Cm = mamba_split(self.x_proj(xc), self.rank, N_STATE)
        work = work_dtype(x)
        dt = F.softplus(self.dt_proj(dt_in).to(work))
        y, h = scan(xc, dt, -torch.exp(self.A_log.to(work)), Bm, Cm, self.D, None if state is None else state[1])
        y = (y * F.silu(z.to(work))).to(x.dtype)
        return self.out_proj(y), (conv, h)


MIXERS = {"lstm": LSTMMixer, "attention": AttentionMixer, "mamba": MambaMixer}


class Block(nn.Module):
    """x = x + mixer(norm(x)); x = x + mlp(norm(x)) (the mixer left out of the mlp net's layers)."""

    def __init__(self, kind: str, a: Arch, f: dict):
        super().__init__()
        self.mixer = MIXERS[kind](a, f) if kind != "none" else None
        self.norm_mix = nn.RMSNorm(a.H, eps=EPS, **f) if self.mixer is not None else None
        self.norm_mlp = nn.RMSNorm(a.H, eps=EPS, **f)
        self.mlp = MLP(a, f)

    def forward(self, x, state):
        new = None
        if self.mixer is not None:
            y, new = self.mixer(self.norm_mix(x), state)
            x = x + y
        return x + self.mlp(self.norm_mlp(x)), new


class Backbone(nn.Module):
    def __init__(self, a: Arch, f: dict):
        super().__init__()
        self.layers = nn.ModuleList(Block(kind, a, f) for kind in a.layout)
        self.norm_f = nn.RMSNorm(a.H, eps=EPS, **f)

    def forward(self, x, states):
        new = []
        for block, state in zip(self.layers, states):
            x, s = block(x, state)
            new.append(s)
        return self.norm_f(x), new


def state_dict(a: Arch, w) -> dict[str, torch.Tensor]:
    """The modules' parameters from the stacked weights (see common.weight_shapes)."""
    sd = {"norm_f.weight": w["norm_f"]}
    for i, (kind, j, m) in enumerate(a.slots()):
        p = f"layers.{i}."
        sd.update({p + "norm_mlp.weight": w["norm_mlp"][i], p + "mlp.gate.weight": w["w_gate"][i],
                   p + "mlp.up.weight": w["w_up"][i], p + "mlp.down.weight": w["w_down"][i]})
        if kind == "none":
            continue
        sd[p + "norm_mix.weight"] = w["norm_mix"][m]
        p += "mixer."
        if kind == "lstm":
            sd.update({p + "lstm.weight_ih_l0": w["lstm_w_ih"][j], p + "lstm.weight_hh_l0": w["lstm_w_hh"][j],
                       p + "lstm.bias_ih_l0": w["lstm_b"][j], p + "lstm.bias_hh_l0": torch.zeros_like(w["lstm_b"][j])})
        elif kind == "attention":
            sd.update({p + "qkv.weight": w["attn_qkv"][j], p + "out.weight": w["attn_out"][j]})
        else:
            names = {"in_proj.weight": "m_in", "conv1d.bias": "m_conv_b", "x_proj.weight": "m_x",
                     "dt_proj.weight": "m_dt_w", "dt_proj.bias": "m_dt_b", "A_log": "m_A_log", "D": "m_D",
                     "out_proj.weight": "m_out"}
            sd.update({p + k: w[v][j] for k, v in names.items()})
            sd[p + "conv1d.weight"] = w["m_conv_w"][j].unsqueeze(1)
    return sd


def build(a: Arch, w, dtype: torch.dtype, device) -> Backbone:
    """The modules on `device` with the weights w (no random init: made on the meta device)."""
    with torch.device("meta"):
        model = Backbone(a, {"dtype": dtype})
    model = model.to_empty(device=device)
    model.load_state_dict(state_dict(a, w))
    return model.eval().requires_grad_(False)


def run(model: Backbone, a: Arch, inputs) -> torch.Tensor | tuple:
    """A window call returns y [B, T, H]; a streaming call (y [B, 1, H], *the new state)."""
    y, new = model(inputs["x"], layer_states(a, inputs))
    return (y, *stack_states(a, new)) if a.stream else y


def _built(inputs, key: str, make) -> Backbone:
    a = arch_of(inputs)
    x = inputs["x"]
    return once_per(inputs["norm_f"], key, lambda: make(build(a, inputs, x.dtype, x.device)))


def eager(**inputs):
    return run(_built(inputs, "eager", lambda m: m), arch_of(inputs), inputs)


def reference(**inputs):
    """The eager modules in float64 (the collector upcasts the inputs)."""
    return eager(**inputs)


def compile_blocks(model: Backbone, **options) -> Backbone:
    """torch.compile of each block and the final norm, in place. Block by block, not the whole
    model: the blocks of one kind share one compiled graph (their weights are graph inputs), so a
    Mamba window (a scan of T steps, unrolled by dynamo) is compiled once per shape, not L times
    over. nn.LSTM runs as itself (dynamo does not trace RNN modules)."""
    for block in model.layers:
        block.compile(dynamic=False, **options)
    model.norm_f.compile(dynamic=False, **options)
    return model


def compiled(**options):
    """The compile provider's function: the eager modules with compile_blocks(**options)."""

    def call(**inputs):
        return run(_built(inputs, ("compile", tuple(sorted(options.items()))), lambda m: compile_blocks(m, **options)),
                   arch_of(inputs), inputs)

    return call


def prefill(a: Arch, w, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state the frames x [B, T - 1, H] leave (the modules in w's dtype, float64 for inputs)."""
    window = Arch(a.net, a.B, a.T, a.H, a.L, False)
    _, new = build(window, w, x.dtype, x.device)(x, [None] * a.L)
    states = dict(zip(a.state_names(), stack_states(window, new)))
    return {name: states[name].contiguous() for name in state_shapes(a)}
