"""RoPE: rotary position embedding of q and k in one launch, HF LLaMA layout (rotate_half).

    y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]   (halves of head_dim)

q [B, Hq, T, D] and k [B, Hk, T, D] may have different head counts (GQA/MQA). cos and sin are
[1, T, D] or [B, T, D] (or [T, D]), i.e. what HF's rotary-embedding module returns for explicit
position ids and what Liger's liger_rotary_pos_emb takes, so that every provider gets the same
inputs. The inputs are laid out as HF's attention makes them: the projection gives [B, T, H, D],
viewed as [B, H, T, D] through a transpose. Any layout with a contiguous head_dim works.
Gradients flow to q and k; cos and sin are constants.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

POS = ("ids", "shared")


# ---------------------------------------------------------------------------------------------
# Triton kernels.
#
# One program = BT tokens (ROWS in the code) x HB heads of q or of k, both halves of head_dim:
# [BT, HB, D/2] tiles (the default "half" layout; the "chunks" option is described at Launchers).
# The threads of a program cover [BT, D/2] once, one 16-byte vector each (VEC = 16 / element size
# elements), and the HB heads repeat in registers: each thread loads its cos/sin vectors once and
# reuses them for HB heads, and has 2 * HB independent 16-byte loads of q/k in flight (HB = 4:
# 128 bytes a thread; 102 registers in bf16, 64 in fp32, in the sm_90 SASS). One head per thread
# instead (cos/sin duplicated in registers per head) keeps a quarter of those bytes in flight for
# half the registers. HB is the largest power of two <= max_hb (2; 4 from head_dim 256) dividing
# the head count, chosen for q and for k separately, so no lane is spent on padded heads. Heads
# land in registers because the tile is [BT, HB, D/2]: Triton's coalescing orders the two
# non-contiguous dims as written (0 before 1) and so spreads threads over head_dim, then tokens
# (a [HB, BT, D/2] tile spreads them over heads and converts cos/sin through shared memory:
# checked in the SASS).
#
# The flat 1-D grid walks token blocks and, within a token block, the head blocks of q and then of
# k: q and k share one launch, and the programs that read a token block's cos/sin rows run
# together (cos/sin come from DRAM about once, then L2). Tokens are flattened over (B, T), so any
# T fills tiles. Every row of D elements is contiguous, so the loads are 16-byte vectors in any
# layout (HF's transposed [B, T, H, D] or a contiguous [B, H, T, D]).
#
# cos and sin are read in full (both halves) rather than assuming HF's cat(freqs, freqs): the
# kernel computes exactly the formula above for any cos/sin, for 2 Bc T D of extra reads against
# 2 B T (Hq + Hk) D of q/k traffic (2.5% for LLaMA-3-8B with per-sequence positions).
#
# Forward:  y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2
# Backward: the transpose of that map: dx1 = dy1 c1 + dy2 s2,   dx2 = dy2 c2 - dy1 s1
# i.e. the same code with (s1, s2) replaced by (-s2, -s1).


@triton.jit
def _rope_tile(x_ptr, y_ptr, row_off, head0, stride_h, d, mask, c1, c2, sa, sb,
               HALF: tl.constexpr, HB: tl.constexpr, POLICY: tl.constexpr):
    h = (head0 + tl.arange(0, HB)).to(tl.int64)
    offs = row_off[:, None, None] + (h * stride_h)[None, :, None] + d[:, None, :]  # [ROWS, HB, W]
    x1 = tl.load(x_ptr + offs, mask=mask, eviction_policy=POLICY).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=mask, eviction_policy=POLICY).to(tl.float32)
    tl.store(y_ptr + offs, (x1 * c1 - x2 * sa).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + offs + HALF, (x2 * c2 + x1 * sb).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_qk(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr,
             n_tok, T, n_qblocks, n_blocks,
             sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sc_b, sc_t,
             HALF: tl.constexpr, W: tl.constexpr, NC: tl.constexpr, HBQ: tl.constexpr, HBK: tl.constexpr,
             ROWS: tl.constexpr, BACKWARD: tl.constexpr, POLICY: tl.constexpr, CS_POLICY: tl.constexpr):
    # A tile row is one token's half of head_dim (NC == 1: W = HALF_P, the "half" layout) or one
    # W-wide chunk of it (the "chunks" layout: rows walk the NC = HALF / W chunks of each token in
    # turn, so a half that is not a power of two is not padded).
    pid = tl.program_id(0)
    tb = pid // n_blocks
    j = pid - tb * n_blocks  # head block: [0, n_qblocks) of q, then those of k
    r = tb * ROWS + tl.arange(0, ROWS)
    w = tl.arange(0, W)
    if NC == 1:
        tok = r
        d = w[None, :]  # [1, W]
    else:
        tok = r // NC
        d = ((r - tok * NC) * W)[:, None] + w[None, :]  # [ROWS, W]
    bi = tok // T
    b = bi.to(tl.int64)
    t = (tok - bi * T).to(tl.int64)
    # [ROWS, 1, W]: the same thread layout as the [ROWS, HB, W] tiles (threads over rows and
    # head_dim, heads in registers), so the broadcast over heads costs nothing.
    mask = ((tok < n_tok)[:, None] & (d < HALF))[:, None, :]
    coff = ((b * sc_b + t * sc_t)[:, None] + d)[:, None, :]
    c1 = tl.load(cos_ptr + coff, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    c2 = tl.load(cos_ptr + coff + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    s1 = tl.load(sin_ptr + coff, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    s2 = tl.load(sin_ptr + coff + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    if BACKWARD:
        sa = -s2
        sb = -s1
    else:
        sa = s1
        sb = s2

    if j < n_qblocks:
        _rope_tile(q_ptr, qo_ptr, b * sq_b + t * sq_t, j * HBQ, sq_h, d, mask, c1, c2, sa, sb,
                   HALF=HALF, HB=HBQ, POLICY=POLICY)
    else:
        _rope_tile(k_ptr, ko_ptr, b * sk_b + t * sk_t, (j - n_qblocks) * HBK, sk_h, d, mask, c1, c2, sa, sb,
                   HALF=HALF, HB=HBK, POLICY=POLICY)


# ---------------------------------------------------------------------------------------------
# Launchers
#
# Launch options (keywords of rope_apply and rope; the defaults are the launch the collector
# times, the others are for the GPU A/B in benchmarks/rope_ab.py):
#   num_warps  warps per program (default _WARPS)
#   max_hb     most heads per thread (a power of two; default _MAX_HB, _MAX_HB_WIDE from
#              head_dim _WIDE_HEAD)
#   tokens     tokens per program, a power of two (default: the threads cover [BT, HALF_P] once);
#              in the "chunks" layout, rows = next_pow2(tokens * NC)
#   policy     cache hint of the q/k (dq/dk) loads: "" (none), "evict_first" or "evict_last"
#   cs_policy  cache hint of the cos/sin loads (re-read by every head block of a token block;
#              default _CS_POLICY)
#   layout     "half": [BT, HB, HALF_P] tiles, a half padded to a power of two; "chunks": rows of
#              W = the largest power of two <= 16 bytes dividing HALF, NC = HALF / W rows a token,
#              no padding (D = 80: HALF = 40 is 5 chunks of 8 bf16 instead of 64 lanes, 24 masked)

_WARPS = 4
_MAX_HB = 2  # heads per thread: 2 * 2 16-byte loads in flight; more costs occupancy (registers)
_MAX_HB_WIDE = 4  # for head_dim >= _WIDE_HEAD
_WIDE_HEAD = 256
# Heads per thread, 2 rather than 4 (the default before run 4): H200 A/B runs 1-4
# (rope_ab_h200_run*.txt) 1.00-1.03x at every shape where they differ, e.g. 2x64x8x8192x128 fwd
# 95.6% -> 96.8% of copy (run 4), 3x32x32x1000x80 fwd and bwd 1.02-1.03x (runs 3, 4), but
# head_dim 256 (4x8x1x4096x256 fwd: 0.979x in run 1, 0.986x in run 4), where a program's threads
# cover only 8 tokens: there 4 heads stay. 8 warps for D = 80 (a padded half) won 3-5% in runs 2
# and 3 and lost 1-2% in run 4: not taken.
_POLICIES = ("", "evict_first", "evict_last")
# cos/sin loads hinted evict_last (they are re-read by every head block of a token block): H200 A/B
# (benchmarks/rope_ab.py, docs/evidence/rope_ab_h200_run1*.txt) 1.02-1.11x faster at every shape
# but one (1x28x4x32768x128 fwd, 0.999x); e.g. 2x64x8x8192x128 fwd 92% -> 95% of copy. The other
# options (warps, heads per thread, q/k hints, the chunks layout) won less or lost.
_CS_POLICY = "evict_last"
_LAYOUTS = ("half", "chunks")


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)


def _with_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x with a contiguous head_dim, and an output of the same strides (one set of strides for
    both in the kernel). Dense layouts (HF's transposed one included) are kept as they are."""
    y = torch.empty_like(x)
    if x.stride(-1) != 1 or not _same_layout(x, y):
        x = x.contiguous()
        y = torch.empty_like(x)
    return x, y


def _is_pow2(n) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def _heads_per_program(h: int, max_hb: int = _MAX_HB) -> int:
    """The largest power of two <= max_hb that divides the head count h."""
    hb = 1
    while hb * 2 <= max_hb and h % (hb * 2) == 0:
        hb *= 2
    return hb


def _tokens_per_program(half_p: int, elem_size: int, n_tok: int, num_warps: int = _WARPS) -> int:
    """Tokens such that the program's threads cover [BT, HALF_P] once with one 16-byte vector each."""
    vec = 16 // elem_size
    bt = max(1, num_warps * 32 * vec // half_p)
    return min(bt, triton.next_power_of_2(n_tok))


def _chunk(half: int, elem_size: int) -> int:
    """The chunks layout's row width: the largest power of two dividing half, at most 16 bytes."""
    w = 1
    while w * 2 * elem_size <= 16 and half % (w * 2) == 0:
        w *= 2
    return w


def _tile(half: int, elem_size: int, n_tok: int, layout: str, num_warps: int, tokens) -> tuple[int, int, int]:
    """(W, NC, ROWS): row width, rows per token, rows per program."""
    if layout == "half":
        w = triton.next_power_of_2(half)
        rows = tokens or _tokens_per_program(w, elem_size, n_tok, num_warps)
        return w, 1, rows
    w = _chunk(half, elem_size)
    nc = half // w
    # one chunk (at most a 16-byte vector) per thread
    rows = triton.next_power_of_2(tokens * nc) if tokens else num_warps * 32
    return w, nc, min(rows, triton.next_power_of_2(n_tok * nc))


def _check_options(num_warps, max_hb, tokens, policy, cs_policy, layout) -> None:
    if not (_is_pow2(num_warps) and _is_pow2(max_hb) and (tokens is None or _is_pow2(tokens))):
        raise ValueError(f"num_warps, max_hb and tokens must be powers of two, got {num_warps}, {max_hb}, {tokens}")
    if policy not in _POLICIES or cs_policy not in _POLICIES:
        raise ValueError(f"policy and cs_policy must be one of {_POLICIES}, got {policy!r}, {cs_policy!r}")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")


def _cos_sin(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def rope_apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               backward: bool = False, *, num_warps: int = _WARPS, max_hb: int | None = None,
               tokens: int | None = None, policy: str = "", cs_policy: str = _CS_POLICY,
               layout: str = "half", inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation (or its transpose, for gradients) of q and k in one launch; new outputs.
    The keywords are the launch options described above Launchers; the defaults are the collector's.
    `inplace` (A/B only: Liger's semantics) writes the result over q and k and returns them."""
    B, hq, T, D = q.shape
    hk = k.shape[1]
    half = D // 2
    if max_hb is None:
        max_hb = _MAX_HB_WIDE if D >= _WIDE_HEAD else _MAX_HB
    _check_options(num_warps, max_hb, tokens, policy, cs_policy, layout)
    if inplace:
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("inplace needs q and k with a contiguous head_dim")
        qo, ko = q, k  # every element is read and then written by the same thread
    else:
        q, qo = _with_output(q)
        k, ko = _with_output(k)
    cos, sin = _cos_sin(cos, sin)
    n_tok = B * T
    hbq, hbk = _heads_per_program(hq, max_hb), _heads_per_program(hk, max_hb)
    w, nc, rows = _tile(half, q.element_size(), n_tok, layout, num_warps, tokens)
    n_qblocks = hq // hbq
    n_blocks = n_qblocks + hk // hbk
    sc_b = cos.stride(0) if cos.shape[0] > 1 else 0  # shared positions: every sequence reads row t
    grid = (triton.cdiv(n_tok * nc, rows) * n_blocks,)
    _rope_qk[grid](
        q, k, qo, ko, cos, sin,
        n_tok, T, n_qblocks, n_blocks,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1), sc_b, cos.stride(1),
        HALF=half, W=w, NC=nc, HBQ=hbq, HBK=hbk, ROWS=rows, BACKWARD=backward,
        POLICY=policy, CS_POLICY=cs_policy, num_warps=num_warps,
    )
    return qo, ko


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, options):
        ctx.save_for_backward(cos, sin)
        ctx.hq, ctx.hk = q.shape[1], k.shape[1]
        ctx.options = options
        return rope_apply(q, k, cos, sin, **options)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        # an output that took no part in the loss has no gradient: rotate zeros for it
        like = dq if dq is not None else dk
        B, T, D = like.shape[0], like.shape[2], like.shape[3]
        if dq is None:
            dq = like.new_zeros((B, ctx.hq, T, D))
        if dk is None:
            dk = like.new_zeros((B, ctx.hk, T, D))
        dq, dk = rope_apply(dq, dk, cos, sin, backward=True, **ctx.options)
        return dq, dk, None, None, None


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         **options) -> tuple[torch.Tensor, torch.Tensor]:
    """options: rope_apply's launch keywords, for the forward and the backward (none: the collector's)."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be [B, H, T, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, _, T, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, T, D) or k.dtype != q.dtype:
        raise ValueError(f"q and k must share batch, sequence, head_dim and dtype: {tuple(q.shape)} {q.dtype} "
                         f"vs {tuple(k.shape)} {k.dtype}")
    if D % 2:
        raise ValueError(f"head_dim must be even for the half rotation, got {D}")
    ok = (cos.dim() == 2 and tuple(cos.shape) == (T, D)) or (
        cos.dim() == 3 and cos.shape[0] in (1, B) and tuple(cos.shape[1:]) == (T, D))
    if not ok or cos.shape != sin.shape:
        raise ValueError(f"cos and sin must be [T, D], [1, T, D] or [B, T, D] with T={T}, D={D}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    return RoPEFunction.apply(q, k, cos, sin, options)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


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


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    c = cos if cos.dim() == 3 else cos[None]
    s = sin if sin.dim() == 3 else sin[None]
    c, s = c[:, None], s[:, None]  # [B or 1, 1, T, D]: the same rotation for every head
    half = q.shape[-1] // 2

    def rotate(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c[..., :half] - x2 * s[..., :half], x2 * c[..., half:] + x1 * s[..., half:]), dim=-1)

    return rotate(q), rotate(k)


# ---------------------------------------------------------------------------------------------
# Inputs

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


# ---------------------------------------------------------------------------------------------
# Shape grids: B = sequences, Hq/Hk = query/key-value heads, T = tokens per sequence,
# D = head_dim, pos = "ids" (cos/sin [B, T, D] from per-sequence position ids) or "shared"
# (cos/sin [1, T, D], positions 0..T-1 for every sequence).


def _s(b: int, hq: int, hk: int, t: int, d: int, pos: str, why: str) -> Shape:
    return Shape({"B": b, "Hq": hq, "Hk": hk, "T": t, "D": d, "pos": pos}, why)


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


# ---------------------------------------------------------------------------------------------
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
    name="rope",
    description="rotary position embedding of q and k (HF rotate_half, GQA) in one launch, forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(rope, rope_eager)
    + (Provider("liger", rope_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "k"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # About 2-3x the error one rounding of the output gives (bf16 eps 2^-8, fp16 2^-11; doubled by
    # the CPU interpreter's truncation); cos and sin are rounded to the dtype in the inputs, which
    # the float64 reference sees too. Eager rounds q*cos and rotate_half(q)*sin before the sum.
    tolerance={torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    check_shape=check_shape,
)
