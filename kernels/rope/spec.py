"""What the collector needs to measure rope: providers, the float64 reference, inputs, grids, the
cost model and the tolerance."""
from __future__ import annotations

import torch

from kcollect.spec import MODES, KernelSpec, Provider, peer_available, standard_providers

from .._host.config import config_record
from .._spec.kit import FLOATS, drawn_on_device, grids_of
from . import pick, rope
from .naive import reference

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


ROPE_THETA = 500000.0  # LLaMA-3


@drawn_on_device
def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
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


SPEC = KernelSpec(
    name="rope", modes=MODES, baseline="torch", bound="memory",
    description="rotary position embedding of q and k (HF rotate_half, GQA) in one launch, forward and backward",
    reference=reference, make_inputs=make_inputs, grad_inputs=("q", "k"), grids=grids_of(__file__),
    check_shape=check_shape, bytes_moved=bytes_moved, flops=flops, dtypes=FLOATS,
    providers=standard_providers(rope, rope_eager, config_of)
    + (Provider("liger", rope_liger, peer_available("liger_kernel")),),
    # About 2-3x the error one rounding of the output gives (bf16 eps 2^-8, fp16 2^-11; doubled by
    # the CPU interpreter's truncation); cos and sin are rounded to the dtype in the inputs, which
    # the float64 reference sees too. Eager rounds q*cos and rotate_half(q)*sin before the sum.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5})
