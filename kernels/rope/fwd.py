"""RoPE's Triton kernel and its launcher: q and k rotated in one launch. The backward is the same
launch (BACKWARD=True: the transpose of the rotation, below), so this file serves both passes.

One program = BT tokens (ROWS in the code) x HB heads of q or of k, both halves of head_dim:
[BT, HB, W] tiles, W = the half of head_dim padded to a power of two. The threads of a program
cover [BT, W] once, one 16-byte vector each (VEC = 16 / element size elements), and the HB heads
repeat in registers: each thread loads its cos/sin vectors once and reuses them for HB heads, and
has 2 * HB independent 16-byte loads of q/k in flight (HB = 4: 128 bytes a thread; 102 registers
in bf16, 64 in fp32, in the sm_90 SASS). One head per thread instead (cos/sin duplicated in
registers per head) keeps a quarter of those bytes in flight for half the registers. HB is chosen
for q and for k separately (config.RoPEConfig.max_heads). Heads land in registers because the tile
is [BT, HB, W]: Triton's coalescing orders the two non-contiguous dims as written (0 before 1) and
so spreads threads over head_dim, then tokens (a [HB, BT, W] tile spreads them over heads and
converts cos/sin through shared memory: checked in the SASS).

The flat 1-D grid walks token blocks and, within a token block, the head blocks of q and then of
k: q and k share one launch, and the programs that read a token block's cos/sin rows run
together (cos/sin come from DRAM about once, then L2). Tokens are flattened over (B, T), so any
T fills tiles. Every row of D elements is contiguous, so the loads are 16-byte vectors in any
layout (HF's transposed [B, T, H, D] or a contiguous [B, H, T, D]).

cos and sin are read in full (both halves) rather than assuming HF's cat(freqs, freqs): the
kernel computes exactly the formula for any cos/sin, for 2 Bc T D of extra reads against
2 B T (Hq + Hk) D of q/k traffic (2.5% for LLaMA-3-8B with per-sequence positions).

Forward:  y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2
Backward: the transpose of that map: dx1 = dy1 c1 + dy2 s2,   dx2 = dy2 c2 - dy1 s1
i.e. the same code with (s1, s2) replaced by (-s2, -s1).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import RoPEConfig, pick


@triton.jit
def _load_cos_sin(cos_ptr, sin_ptr, off, mask, HALF: tl.constexpr, BACKWARD: tl.constexpr, CS_POLICY: tl.constexpr):
    """(cos of the first half, cos of the second, the sines they pair with) at `off`: the backward
    rotates by -angle, so its sines swap halves and change sign."""
    c1 = tl.load(cos_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    c2 = tl.load(cos_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    s1 = tl.load(sin_ptr + off, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    s2 = tl.load(sin_ptr + off + HALF, mask=mask, eviction_policy=CS_POLICY).to(tl.float32)
    if BACKWARD:
        sa = -s2
        sb = -s1
    else:
        sa = s1
        sb = s2
    return c1, c2, sa, sb


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
             HALF: tl.constexpr, W: tl.constexpr, HBQ: tl.constexpr, HBK: tl.constexpr,
             ROWS: tl.constexpr, BACKWARD: tl.constexpr, POLICY: tl.constexpr, CS_POLICY: tl.constexpr):
    # A tile row is one token's half of head_dim, W >= HALF lanes wide.
    pid = tl.program_id(0)
    tb = pid // n_blocks
    j = pid - tb * n_blocks  # head block: [0, n_qblocks) of q, then those of k
    r = tb * ROWS + tl.arange(0, ROWS)
    w = tl.arange(0, W)
    tok = r
    d = w[None, :]  # [1, W]
    bi = tok // T
    b = bi.to(tl.int64)
    t = (tok - bi * T).to(tl.int64)
    # [ROWS, 1, W]: the same thread layout as the [ROWS, HB, W] tiles (threads over rows and
    # head_dim, heads in registers), so the broadcast over heads costs nothing.
    mask = ((tok < n_tok)[:, None] & (d < HALF))[:, None, :]
    coff = ((b * sc_b + t * sc_t)[:, None] + d)[:, None, :]
    c1, c2, sa, sb = _load_cos_sin(cos_ptr, sin_ptr, coff, mask, HALF, BACKWARD, CS_POLICY)

    if j < n_qblocks:
        _rope_tile(q_ptr, qo_ptr, b * sq_b + t * sq_t, j * HBQ, sq_h, d, mask, c1, c2, sa, sb,
                   HALF=HALF, HB=HBQ, POLICY=POLICY)
    else:
        _rope_tile(k_ptr, ko_ptr, b * sk_b + t * sk_t, (j - n_qblocks) * HBK, sk_h, d, mask, c1, c2, sa, sb,
                   HALF=HALF, HB=HBK, POLICY=POLICY)


@triton.jit
def _divmod(a, n):
    q = a // n
    return q, a - q * n


@triton.jit
def _flat_tile(x_ptr, y_ptr, cos_ptr, sin_ptr, s, n_tok, T, s_b, s_t, s_h, sc_b, sc_t,
               H: tl.constexpr, HALF: tl.constexpr, VEC: tl.constexpr, HEADS_OUTER: tl.constexpr,
               BACKWARD: tl.constexpr, POLICY: tl.constexpr, CS_POLICY: tl.constexpr):
    """Slots s [SLOTS] of one tensor in its memory order: slot = (sequence, token, head, vector of
    the first half), or with HEADS_OUTER (a [B, H, T, D] layout, as autograd's gradients are)
    (sequence, head, token, vector); a thread's [VEC] x1 and its x2 HALF further, with cos/sin at
    the same place of the token's row."""
    VPH: tl.constexpr = HALF // VEC
    live = (s < n_tok * (H * VPH))[:, None]
    if HEADS_OUTER:
        bh, r = _divmod(s, T * VPH)
        t, v = _divmod(r, VPH)
        bi, h = _divmod(bh, H)
    else:
        tok, r = _divmod(s, H * VPH)
        h, v = _divmod(r, VPH)
        bi, t = _divmod(tok, T)
    b = bi.to(tl.int64)
    t = t.to(tl.int64)
    e = tl.arange(0, VEC)
    xo = tl.multiple_of(b * s_b + t * s_t + h.to(tl.int64) * s_h + v * VEC, VEC)[:, None] + e[None, :]
    co = tl.multiple_of(b * sc_b + t * sc_t + v * VEC, VEC)[:, None] + e[None, :]
    c1, c2, sa, sb = _load_cos_sin(cos_ptr, sin_ptr, co, live, HALF, BACKWARD, CS_POLICY)
    x1 = tl.load(x_ptr + xo, mask=live, eviction_policy=POLICY).to(tl.float32)
    x2 = tl.load(x_ptr + xo + HALF, mask=live, eviction_policy=POLICY).to(tl.float32)
    tl.store(y_ptr + xo, (x1 * c1 - x2 * sa).to(y_ptr.dtype.element_ty), mask=live)
    tl.store(y_ptr + xo + HALF, (x2 * c2 + x1 * sb).to(y_ptr.dtype.element_ty), mask=live)


@triton.jit
def _rope_flat(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, n_tok, T, n_qprog,
               sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sc_b, sc_t,
               HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, VEC: tl.constexpr, SLOTS: tl.constexpr,
               Q_HEADS_OUTER: tl.constexpr, K_HEADS_OUTER: tl.constexpr,
               BACKWARD: tl.constexpr, POLICY: tl.constexpr, CS_POLICY: tl.constexpr):
    # programs [0, n_qprog) walk q's slots in memory order (token, head, vector), the rest k's
    pid = tl.program_id(0)
    if pid < n_qprog:
        s = pid * SLOTS + tl.arange(0, SLOTS)
        _flat_tile(q_ptr, qo_ptr, cos_ptr, sin_ptr, s, n_tok, T, sq_b, sq_t, sq_h, sc_b, sc_t,
                   HQ, HALF, VEC, Q_HEADS_OUTER, BACKWARD, POLICY, CS_POLICY)
    else:
        s = (pid - n_qprog) * SLOTS + tl.arange(0, SLOTS)
        _flat_tile(k_ptr, ko_ptr, cos_ptr, sin_ptr, s, n_tok, T, sk_b, sk_t, sk_h, sc_b, sc_t,
                   HK, HALF, VEC, K_HEADS_OUTER, BACKWARD, POLICY, CS_POLICY)


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


def _cos_sin(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def heads_per_thread(h: int, max_heads: int) -> int:
    """The largest power of two <= max_heads that divides the head count h."""
    hb = 1
    while hb * 2 <= max_heads and h % (hb * 2) == 0:
        hb *= 2
    return hb


def tokens_per_program(config: RoPEConfig, w: int, elem_size: int, n_tok: int) -> int:
    """config.tokens, or as many tokens as the program's threads cover with one 16-byte vector each
    of a [tokens, w] tile, at most the tokens there are (rounded up to a power of two)."""
    if config.tokens:
        return config.tokens
    bt = max(1, config.warps * 32 * (16 // elem_size) // w)
    return min(bt, triton.next_power_of_2(n_tok))


def rope_apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False,
               config: RoPEConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation (or its transpose, for gradients) of q [B, Hq, T, D] and k [B, Hk, T, D] in one
    launch, into new outputs; `config=None`: config.pick's choice."""
    B, hq, T, D = q.shape
    hk = k.shape[1]
    config = config or pick(D, q.device)
    q, qo = _with_output(q)
    k, ko = _with_output(k)
    cos, sin = _cos_sin(cos, sin)
    n_tok = B * T
    sc_b = cos.stride(0) if cos.shape[0] > 1 else 0  # shared positions: every sequence reads row t
    if config.layout == "flat" and n_tok * max(q.shape[1], k.shape[1]) * (D // 2) < 2**31:  # (int32 slots)
        _launch_flat(q, k, qo, ko, cos, sin, n_tok, T, sc_b, backward, config)
        return qo, ko
    hbq, hbk = heads_per_thread(hq, config.max_heads), heads_per_thread(hk, config.max_heads)
    w = triton.next_power_of_2(D // 2)
    rows = tokens_per_program(config, w, q.element_size(), n_tok)
    n_qblocks = hq // hbq
    n_blocks = n_qblocks + hk // hbk
    grid = (triton.cdiv(n_tok, rows) * n_blocks,)
    _rope_qk[grid](
        q, k, qo, ko, cos, sin,
        n_tok, T, n_qblocks, n_blocks,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1), sc_b, cos.stride(1),
        HALF=D // 2, W=w, HBQ=hbq, HBK=hbk, ROWS=rows, BACKWARD=backward,
        POLICY=config.policy, CS_POLICY=config.cs_policy, num_warps=config.warps,
    )
    return qo, ko


def flat_vec(half: int, elem_size: int) -> int:
    """The flat layout's vector: 16 bytes, halved until it divides the half of head_dim."""
    vec = 16 // elem_size
    while half % vec:
        vec //= 2
    return vec


def _launch_flat(q, k, qo, ko, cos, sin, n_tok, T, sc_b, backward, config) -> None:
    half = q.shape[-1] // 2
    vec = flat_vec(half, q.element_size())
    slots = config.warps * 32 * config.slots
    per_tok = half // vec
    n_qprog = triton.cdiv(n_tok * q.shape[1] * per_tok, slots)
    n_kprog = triton.cdiv(n_tok * k.shape[1] * per_tok, slots)
    _rope_flat[(n_qprog + n_kprog,)](
        q, k, qo, ko, cos, sin, n_tok, T, n_qprog,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1), sc_b, cos.stride(1),
        HQ=q.shape[1], HK=k.shape[1], HALF=half, VEC=vec, SLOTS=slots,
        Q_HEADS_OUTER=q.stride(1) > q.stride(2), K_HEADS_OUTER=k.stride(1) > k.stride(2), BACKWARD=backward,
        POLICY=config.policy, CS_POLICY=config.cs_policy, num_warps=config.warps,
    )
