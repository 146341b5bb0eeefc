"""What the collector needs to measure rope: providers, the float64 reference, inputs, grids, the
cost model and the tolerance."""
from __future__ import annotations

import torch

from kcollect.spec import Provider, peer_available, standard_providers

from .._lib import config_record
from .._lib.spec_kit import module_spec, shape_maker
from . import pick, rope

POS = ("ids", "shared")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_eager(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """HF LLaMA's apply_rotary_pos_emb (unsqueeze_dim=1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def rope_liger(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # Liger rotates q and k in place (its outputs are views of its inputs) and reads only the
    # first half of cos/sin (it assumes cat(freqs, freqs)); it copies q/k (and dq/dk) first when
    # their physical layout is not [B, T, H, D].
    from liger_kernel.ops.rope import LigerRopeFunction

    return LigerRopeFunction.apply(q, k, cos, sin)


def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Plain maths in float64 (the tests import it)."""
    c = cos if cos.dim() == 3 else cos[None]
    s = sin if sin.dim() == 3 else sin[None]
    c, s = c[:, None], s[:, None]  # [B or 1, 1, T, D]: the same rotation for every head
    half = q.shape[-1] // 2

    def rotate(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c[..., :half] - x2 * s[..., :half], x2 * c[..., half:] + x1 * s[..., half:]), dim=-1)

    return rotate(q), rotate(k)


ROPE_THETA = 500000.0  # LLaMA-3


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, hq, hk, T, D = dims["B"], dims["Hq"], dims["Hk"], dims["T"], dims["D"]
    # HF layout: the projections give [B, T, H, D]; attention views them as [B, H, T, D].
    q = torch.randn((B, T, hq, D), generator=g, dtype=torch.float32).transpose(1, 2)
    k = torch.randn((B, T, hk, D), generator=g, dtype=torch.float32).transpose(1, 2)
    if dims["pos"] == "ids":
        # explicit position ids, a different offset per sequence (continued or packed sequences)
        position_ids = torch.randint(0, 8192, (B, 1), generator=g) + torch.arange(T)
    else:
        position_ids = torch.arange(T)[None]  # [1, T]: every sequence starts at 0
    # HF's rotary embedding: cos/sin of position * inv_freq, duplicated over the two halves
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    out = {"q": q, "k": k, "cos": emb.cos(), "sin": emb.sin()}
    return {name: t.to(device=device, dtype=dtype) for name, t in out.items()}


def config_of(inputs) -> dict:
    return config_record(rope=pick(inputs["q"].shape[-1], inputs["q"].device))


# Shape grids: B = sequences, Hq/Hk = query/key-value heads, T = tokens per sequence,
# D = head_dim, pos = "ids" (cos/sin [B, T, D] from per-sequence position ids) or "shared"
# (cos/sin [1, T, D], positions 0..T-1 for every sequence).


_s = shape_maker("B", "Hq", "Hk", "T", "D", "pos")


QUICK = (
    _s(2, 4, 2, 8, 16, "ids", "tiny GQA, per-sequence positions"),
    _s(3, 6, 3, 5, 24, "shared", "awkward: heads 6/3 (one head per tile), T=5, half-dim 12 padded to 16"),
    _s(1, 2, 1, 17, 64, "ids", "MQA, token count not a multiple of the token block"),
)

FULL = (
    _s(1, 32, 8, 1, 128, "ids", "one token (decode), LLaMA-3-8B heads: launch latency dominates"),
    _s(4, 32, 8, 4096, 128, "ids", "LLaMA-3-8B, 4 x 4k tokens: the published comparison point"),
    _s(1, 32, 32, 4096, 128, "shared", "LLaMA-2-7B (MHA), positions shared by the batch as in Liger's benchmark"),
    _s(2, 64, 8, 8192, 128, "ids", "LLaMA-3-70B, 2 x 8k: the largest q"),
    _s(1, 28, 4, 32768, 128, "ids", "Qwen2-7B at 32k context: head counts not powers of two"),
    _s(8, 14, 2, 2048, 64, "ids", "Qwen2-0.5B: head_dim 64, 14/2 heads"),
    _s(4, 8, 1, 4096, 256, "shared", "Gemma-2B: MQA, head_dim 256"),
    _s(3, 32, 32, 1000, 80, "ids", "awkward: head_dim 80 (half 40 padded to 64), B=3, T=1000"),
)


# Cost model (minimum traffic, s = element size). Counted: q and k read once and written once
# (fwd: q, k -> rotated q, k; bwd: dq, dk in -> dq, dk out), cos and sin read once each, in full
# (Bc x T x D each, Bc = B for "ids", 1 for "shared"):
#   fwd = bwd = s * (2 * B * T * (Hq + Hk) * D + 2 * Bc * T * D);   fwd+bwd = the two passes
# FLOPs: 3 per element of q and k (two multiplies and an add per output).


def _elements(dims) -> tuple[int, int]:
    qk = dims["B"] * dims["T"] * (dims["Hq"] + dims["Hk"]) * dims["D"]
    cs = (dims["B"] if dims["pos"] == "ids" else 1) * dims["T"] * dims["D"]
    return qk, cs


def check_shape(dims) -> str | None:
    if dims["D"] % 2:
        return f"head_dim must be even, got {dims['D']}"
    if dims["pos"] not in POS:
        return f"pos must be one of {POS}, got {dims['pos']!r}"
    if min(dims["B"], dims["Hq"], dims["Hk"], dims["T"]) < 1:
        return "B, Hq, Hk and T must be positive"
    return None


def bytes_moved(dims, dtype, mode) -> int:
    qk, cs = _elements(dims)
    one_pass = (2 * qk + 2 * cs) * dtype.itemsize
    return one_pass * (2 if mode == "fwd+bwd" else 1)


def flops(dims, mode) -> float:
    qk, _ = _elements(dims)
    return float(3 * qk * (2 if mode == "fwd+bwd" else 1))


SPEC = module_spec(
    globals(), "rope",
    "rotary position embedding of q and k (HF rotate_half, GQA) in one launch, forward and backward",
    providers=standard_providers(rope, rope_eager, config_of)
    + (Provider("liger", rope_liger, peer_available("liger_kernel")),),
    grad_inputs=("q", "k"),
    # About 2-3x the error one rounding of the output gives (bf16 eps 2^-8, fp16 2^-11; doubled by
    # the CPU interpreter's truncation); cos and sin are rounded to the dtype in the inputs, which
    # the float64 reference sees too. Eager rounds q*cos and rotate_half(q)*sin before the sum.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
)
