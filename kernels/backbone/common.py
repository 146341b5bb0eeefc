"""What the backbones' builds share (naive.py's PyTorch modules and fwd.py's path through our kernels):
the architecture as data (sizes derived from the shape's dims, which mixer each layer has, the weights
and carried state every provider shares and their initialisation), and the pieces of the Mamba mixer
(below).

Dims: net (mlp, lstm, attention, mamba, jamba), B (streams), T (the window of frames), H (hidden),
L (layers), stream (0: the whole window is recomputed; 1: one new frame with the state carried
from the T - 1 frames before it).

Every layer is a pre-norm residual block, x = x + sublayer(rms_norm(x)), in the order
  mlp:       [MLP]                      (no mixing in time: each frame alone)
  lstm:      [LSTM, MLP]
  attention: [attention, MLP]           (causal over the window: a frame sees the T frames up to it)
  mamba:     [Mamba mixer, MLP]         (mamba_ssm's Block with an MLP)
  jamba:     mamba's, except layer L // 2, which is attention's (needs L >= 2)
and a final rms_norm. MLP: SwiGLU, F = 2H. Attention: heads of 64 (one head below H = 64), no
positional encoding (the Mamba layers of jamba carry order; attention alone sees a set of the
frames before it, which keeps the cache a plain window). Mamba-1: inner Di = 2H, state N = 16,
depthwise causal conv of width 4, dt rank ceil(H / 16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F

NETS = ("mlp", "lstm", "attention", "mamba", "jamba")
EPS = 1e-5
N_STATE, CONV_K = 16, 4

# Names of the carried state, in the order a streaming call takes and returns them.
STATE = {"lstm": ("lstm_h", "lstm_c"), "mamba": ("conv_state", "ssm_state"), "attention": ("k_cache", "v_cache")}


@dataclass(frozen=True)
class Arch:
    net: str
    B: int
    T: int
    H: int
    L: int
    stream: bool

    @classmethod
    def of(cls, dims: Mapping) -> "Arch":
        return cls(str(dims["net"]), int(dims["B"]), int(dims["T"]), int(dims["H"]), int(dims["L"]),
                   bool(dims["stream"]))

    @property
    def F(self) -> int:  # MLP width
        return 2 * self.H

    @property
    def Di(self) -> int:  # Mamba's inner width
        return 2 * self.H

    @property
    def R(self) -> int:  # Mamba's dt rank
        return math.ceil(self.H / 16)

    @property
    def heads(self) -> int:
        return max(1, self.H // 64)

    @property
    def hd(self) -> int:
        return self.H // self.heads

    @property
    def frames(self) -> int:  # frames a call computes
        return 1 if self.stream else self.T

    @property
    def layout(self) -> tuple[str, ...]:
        """The mixer of each layer ('none' for the MLP-only layers of the mlp net)."""
        if self.net == "mlp":
            return ("none",) * self.L
        if self.net == "jamba":
            return tuple("attention" if i == self.L // 2 else "mamba" for i in range(self.L))
        return (self.net,) * self.L

    def count(self, kind: str) -> int:
        return self.layout.count(kind)

    def kinds(self) -> tuple[str, ...]:
        """The mixers present, in STATE's order (the order of the state tensors)."""
        return tuple(k for k in STATE if k in self.layout)

    def state_names(self) -> tuple[str, ...]:
        return tuple(n for k in self.kinds() for n in STATE[k])

    def slots(self) -> list[tuple[str, int, int]]:
        """Per layer: (mixer, its index among that mixer's layers, its index among the layers with
        a mixer), which pick the layer's slices of the stacked weights and state."""
        seen: dict[str, int] = {}
        out, mixers = [], 0
        for kind in self.layout:
            out.append((kind, seen.get(kind, 0), mixers))
            seen[kind] = seen.get(kind, 0) + 1
            mixers += kind != "none"
        return out


def arch_of(inputs: Mapping) -> Arch:
    """The Arch of a provider's inputs (the plain values net, window and stream, the rest from the
    tensors' shapes)."""
    x = inputs["x"]
    return Arch(inputs["net"], x.shape[0], inputs["window"], x.shape[2], inputs["norm_mlp"].shape[0],
                bool(inputs["stream"]))


def layer_states(a: Arch, inputs: Mapping) -> list[tuple | None]:
    """Each layer's slice of the carried state (None: a window call, or a layer without state)."""
    if not a.stream:
        return [None] * a.L
    return [None if kind == "none" else tuple(inputs[n][j] for n in STATE[kind]) for kind, j, _ in a.slots()]


def stack_states(a: Arch, new: list[tuple | None]) -> tuple:
    """The layers' new states stacked per name, in state_names() order."""
    out = []
    for kind in a.kinds():
        mine = [s for (k, _, _), s in zip(a.slots(), new) if k == kind]
        out.extend(torch.stack([s[i] for s in mine]) for i in range(len(STATE[kind])))
    return tuple(out)


def weight_shapes(a: Arch) -> dict[str, tuple[int, ...]]:
    """Every weight, stacked over the layers that have it (its first dim)."""
    H, L = a.H, a.L
    s: dict[str, tuple[int, ...]] = {
        "norm_mlp": (L, H), "w_gate": (L, a.F, H), "w_up": (L, a.F, H), "w_down": (L, H, a.F), "norm_f": (H,)}
    mixers = L - a.count("none")
    if mixers:
        s["norm_mix"] = (mixers, H)
    if n := a.count("lstm"):
        s.update(lstm_w_ih=(n, 4 * H, H), lstm_w_hh=(n, 4 * H, H), lstm_b=(n, 4 * H))
    if n := a.count("attention"):
        s.update(attn_qkv=(n, 3 * H, H), attn_out=(n, H, H))
    if n := a.count("mamba"):
        Di, N = a.Di, N_STATE
        s.update(m_in=(n, 2 * Di, H), m_conv_w=(n, Di, CONV_K), m_conv_b=(n, Di), m_x=(n, a.R + 2 * N, Di),
                 m_dt_w=(n, Di, a.R), m_dt_b=(n, Di), m_A_log=(n, Di, N), m_D=(n, Di), m_out=(n, H, Di))
    return s


def state_shapes(a: Arch) -> dict[str, tuple[int, ...]]:
    """The state a streaming call takes: what the T - 1 frames before the new one left."""
    s: dict[str, tuple[int, ...]] = {}
    if n := a.count("lstm"):
        s.update(lstm_h=(n, a.B, a.H), lstm_c=(n, a.B, a.H))
    if n := a.count("mamba"):
        s.update(conv_state=(n, a.B, a.Di, CONV_K - 1), ssm_state=(n, a.B, a.Di, N_STATE))
    if n := a.count("attention"):
        s.update(k_cache=(n, a.B, a.T - 1, a.heads, a.hd), v_cache=(n, a.B, a.T - 1, a.heads, a.hd))
    return s


def make_weights(a: Arch, g: torch.Generator) -> dict[str, torch.Tensor]:
    """float64 on the CPU, drawn from g: Linear weights of variance 1 / fan-in, the residual
    branches' output projections scaled down by sqrt(2L) (GPT-2's rule, so the residual stream
    stays of order one over the depth), norms near 1, Mamba's A, D and dt bias as Mamba initialises
    them (S4D-real A = 1..N, dt log-uniform in [1e-3, 0.1]), jittered so that nothing is special."""

    def randn(shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    out_scale = (2 * a.L) ** -0.5
    w = {}
    for name, shape in weight_shapes(a).items():
        fan_in = shape[-1]
        if name.startswith("norm"):
            w[name] = 1 + randn(shape, 0.1)
        elif name in ("w_down", "attn_out", "m_out"):
            w[name] = randn(shape, fan_in ** -0.5 * out_scale)
        elif name == "lstm_b":
            b = randn(shape, 0.1)
            b[:, a.H:2 * a.H] += 1.0  # forget gate open at the start (the usual LSTM bias)
            w[name] = b
        elif name == "m_conv_b":
            w[name] = randn(shape, 0.1)
        elif name == "m_dt_b":
            dt = torch.exp(torch.rand(shape, generator=g, dtype=torch.float64) * math.log(100) + math.log(1e-3))
            w[name] = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
        elif name == "m_A_log":
            w[name] = torch.log(torch.arange(1, N_STATE + 1, dtype=torch.float64)).expand(shape) + randn(shape, 0.05)
        elif name == "m_D":
            w[name] = 1 + randn(shape, 0.1)
        else:
            w[name] = randn(shape, fan_in ** -0.5)
    return w


# ---------------------------------------------------------------------------------------------
# The pieces of the Mamba mixer that the eager modules and the kcollect path share: the causal
# depthwise conv with its carried window, and the selective scan as a sequential loop (mamba_ssm's
# selective_scan_ref, with an initial state and the last state returned for streaming).


def work_dtype(t: torch.Tensor) -> torch.dtype:
    """The scan's state and maths: fp32, or float64 for the reference."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def causal_conv(x: torch.Tensor, state: torch.Tensor | None, w: torch.Tensor, b: torch.Tensor):
    """silu(depthwise causal conv) of x [B, T, Di] with w [Di, K], b [Di], continuing from `state`
    [B, Di, K - 1] (the K - 1 inputs before x; zeros when None). Returns (out [B, T, Di], the new
    state: the last K - 1 inputs)."""
    k = w.shape[-1]
    xt = x.transpose(1, 2)
    full = F.pad(xt, (k - 1, 0)) if state is None else torch.cat([state.to(xt.dtype), xt], dim=-1)
    out = F.conv1d(full, w.unsqueeze(1), b, groups=w.shape[0])
    return F.silu(out).transpose(1, 2), full[..., full.shape[-1] - (k - 1):]


def scan(x, dt, A, Bm, Cm, D, h0=None):
    """h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t . h_t + D x_t, step by step.
    x, dt [B, T, Di] (dt after softplus); A [Di, N]; Bm, Cm [B, T, N]; D [Di]; h0 [B, Di, N] or None
    (zeros). Returns (y [B, T, Di], h_T) in the work dtype (fp32, float64 for float64 inputs)."""
    work = work_dtype(x)
    x, dt, A, Bm, Cm, D = (v.to(work) for v in (x, dt, A, Bm, Cm, D))
    decay = torch.exp(dt.unsqueeze(-1) * A)  # [B, T, Di, N]
    drive = (dt * x).unsqueeze(-1) * Bm.unsqueeze(2)
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1]) if h0 is None else h0.to(work)
    ys = []
    for t in range(x.shape[1]):
        h = decay[:, t] * h + drive[:, t]
        ys.append(torch.bmm(h, Cm[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(ys, dim=1) + x * D, h


def mamba_split(dbc: torch.Tensor, rank: int, n: int):
    """x_proj's output -> (dt input [.., R], B [.., N], C [.., N])."""
    return dbc.split([rank, n, n], dim=-1)


def heads(qkv: torch.Tensor, n_heads: int):
    """[B, T, 3H] -> q, k, v [B, T, heads, head dim] (views, FlashAttention's layout)."""
    b, t, three_h = qkv.shape
    return qkv.view(b, t, 3, n_heads, three_h // (3 * n_heads)).unbind(2)
