"""What the forward and backward kernels share: where a sequence lies, which blocks of the other
side a block sees (split into masked edges and a fully visible middle), the visibility mask, and
tile loads and stores through plain pointers or tensor descriptors.

Layout: q [tokens, Hq, D] and k, v [tokens, Hkv, D] with any token and head strides (a dense
[B, S, H, D] batch is B sequences of S tokens, b * stride_b apart; a packed batch has stride_b 0
and its sequences start at cu_seqlens[b]). Head dims that are not a power of two are padded to the
next one with masked loads (D 96 -> 128): the padded columns are zeros and add nothing to the dots.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def seq_spans(CU_Q, CU_K, b, Sq, Skv, VARLEN: tl.constexpr):
    """(first query token, query length, first key token, key length) of sequence b: from
    cu_seqlens for a packed batch; 0, Sq, 0, Skv for a dense one (reached through stride_b)."""
    if VARLEN:
        q_tok = tl.load(CU_Q + b)
        len_q = tl.load(CU_Q + b + 1) - q_tok
        k_tok = tl.load(CU_K + b)
        len_k = tl.load(CU_K + b + 1) - k_tok
    else:
        q_tok = b * 0
        len_q = q_tok + Sq
        k_tok = q_tok
        len_k = q_tok + Skv
    return q_tok.to(tl.int64), len_q, k_tok.to(tl.int64), len_k


@triton.jit
def lse_offset(b64, h, q_tok, Sq, Tq, VARLEN: tl.constexpr):
    """Where sequence b's rows of head h start in an [Hq, tokens] row buffer (lse, delta)."""
    if VARLEN:
        row0 = q_tok
    else:
        row0 = b64 * Sq
    return h.to(tl.int64) * Tq + row0


@triton.jit
def visible(i, j, len_q, len_k, shift, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Query i sees key j (broadcast shapes): j < len_k, i < len_q, causal j <= i + shift, window
    j > i + shift - window, with shift = len_k - len_q (FlashAttention's bottom-right alignment)."""
    keep = (j < len_k) & (i < len_q)
    if CAUSAL:
        keep = keep & (j <= i + shift)
    if HAS_WINDOW:
        keep = keep & (j > i + shift - window)
    return keep


@triton.jit
def key_span(i, len_k, shift, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """(first, last) key that query i sees (visible's rule); last < first where it sees none."""
    last = len_k - 1 + i * 0
    if CAUSAL:
        last = tl.minimum(i + shift, last)
    first = i * 0
    if HAS_WINDOW:
        first = tl.maximum(i + shift - window + 1, first)
    return first, last


@triton.jit
def key_blocks(m0, m_end, len_k, shift, window, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_WINDOW: tl.constexpr):
    """Key blocks that query rows [m0, m_end) see, as (lo, mid_lo, mid_hi, hi): blocks [lo, mid_lo)
    and [mid_hi, hi) need the mask, [mid_lo, mid_hi) is fully visible; a range is empty where its
    bounds cross. Values are clamped at 0 before any division (integer division of negatives
    differs between the compiler and the interpreter)."""
    hi = len_k
    full_hi = len_k // BLOCK_N * BLOCK_N
    if CAUSAL:  # j <= i + shift, so j < m_end + shift; fully visible up to j <= m0 + shift
        hi = tl.minimum(hi, m_end + shift)
        full_hi = tl.minimum(full_hi, tl.maximum(m0 + shift + 1, 0) // BLOCK_N * BLOCK_N)
    lo = hi * 0
    full_lo = lo
    if HAS_WINDOW:  # j > i + shift - window: from m0's first visible key; fully from m_end - 1's
        lo = tl.maximum(m0 + shift - window + 1, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(m_end + shift - window, 0), BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    return lo, mid_lo, tl.minimum(tl.maximum(full_hi, mid_lo), hi), hi


@triton.jit
def query_blocks(n0, n_end, len_q, shift, window, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_WINDOW: tl.constexpr):
    """Query blocks that see key rows [n0, n_end): the transpose of key_blocks."""
    hi = len_q
    full_hi = len_q // BLOCK_M * BLOCK_M
    lo = hi * 0
    full_lo = lo
    if CAUSAL:  # i >= j - shift: from n0's first viewer; fully from n_end - 1's
        lo = tl.maximum(n0 - shift, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(n_end - 1 - shift, 0), BLOCK_M) * BLOCK_M
    if HAS_WINDOW:  # i < j - shift + window
        hi = tl.minimum(hi, tl.maximum(n_end - 1 - shift + window, 0))
        full_hi = tl.minimum(full_hi, tl.maximum(n0 - shift + window, 0) // BLOCK_M * BLOCK_M)
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    return lo, mid_lo, tl.minimum(tl.maximum(full_hi, mid_lo), hi), hi


@triton.jit
def query_tile(tile, n_mblocks, Hq, GROUP, CAUSAL: tl.constexpr):
    """(sequence, query head, kv head, query block) of a tile. Tiles run head-major, so the query
    blocks of one head run together and share its keys in L2; a causal head's longest rows first,
    so that the short ones fill the tail of the grid."""
    bh = tile // n_mblocks
    mb = tile % n_mblocks
    if CAUSAL:
        mb = n_mblocks - 1 - mb
    h = bh % Hq
    return bh // Hq, h, h // GROUP, mb


@triton.jit
def rows_src(PTR, b64, tok, head, sb, st, sh, length, BLOCK_R: tl.constexpr, D: tl.constexpr,
             BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """What load_tile and store_tile take for the rows of one (sequence, head): the pointer to its
    first row, or with TMA a tensor descriptor of its [length, D] rows (loads past either edge read
    zeros, stores there are dropped; built once per tile, outside the loops). The interpreter
    runs descriptors too, so the CPU tests cover this path."""
    src = PTR + b64 * sb + tok * st + head * sh
    if TMA:
        # a descriptor's dims must be at least 1: an empty sequence's is built (never read)
        src = tl.make_tensor_descriptor(src, shape=[tl.maximum(length, 1), D], strides=[st, 1],
                                        block_shape=[BLOCK_R, BLOCK_D])
    return src


@triton.jit
def load_tile(src, row0, length, stride, offs_r, offs_d, D: tl.constexpr, BLOCK_D: tl.constexpr,
              MASK_ROWS: tl.constexpr, TMA: tl.constexpr):
    """Rows [row0, row0 + BLOCK_R) x [0, BLOCK_D) of `src` (a pointer to the first row, or with TMA
    its descriptor): rows past `length` (when MASK_ROWS) and the padded head columns read as 0."""
    if TMA:
        x = src.load([row0, 0])
    else:
        rows = row0 + offs_r
        ptrs = src + rows[:, None] * stride + offs_d[None, :]
        if MASK_ROWS:
            x = tl.load(ptrs, mask=(rows < length)[:, None] & (offs_d < D)[None, :], other=0.0)
        elif D == BLOCK_D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=(offs_d < D)[None, :], other=0.0)
    return x


@triton.jit
def store_tile(dst, x, row0, length, stride, offs_r, offs_d, D: tl.constexpr, TMA: tl.constexpr):
    """Rows [row0, row0 + BLOCK_R) of x, those before `length` and the real head columns."""
    if TMA:
        dst.store([row0, 0], x)
    else:
        rows = row0 + offs_r
        tl.store(dst + rows[:, None] * stride + offs_d[None, :], x,
                 mask=(rows < length)[:, None] & (offs_d < D)[None, :])


def block_d(head_dim: int) -> int:
    """The head dim's block: the next power of two, at least 16 (the smallest dot)."""
    return max(16, triton.next_power_of_2(head_dim))
