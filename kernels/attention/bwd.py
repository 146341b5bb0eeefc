"""The backward: delta = rowsum(o * do), then dk/dv over key blocks and dq over query blocks.

With S = scale * q k^T, P = softmax(S) (recomputed from the forward's log-sum-exp, one exp2 per
element), dP = do v^T and dS = P * (dP - delta): dv = P^T do, dk = scale * dS^T q,
dq = scale * dS k. The dk/dv kernel holds a key block of one kv head and walks the query blocks
of every query head of its group, so grouped-query attention sums dk and dv over the group in
registers, with no atomics and no [Hq]-sized buffers. The dq kernel holds a query block and walks
its key blocks: it recomputes P and dP (7 matmuls a block pair in all, not 5), yet dq added by the
dk/dv kernel with fp32 atomics was 1.7-2.3x slower on an H200
(lab/results/attention_fused_dq_h200.txt). Both split their walk into masked edges and a mask-free
middle (common.py).

The accurate backward (attention's `accurate`, by default on rows of at most ACCURATE_KEYS keys)
adds the three measures below (o's rounding kept, dq shifted, rows of one key); without them it is
FlashAttention-2/3's. On an H200 at 6fed409 (bf16 fwd+bwd D128 causal,
lab/results/attention_delta_h200_6fed409.txt) o's rounding kept cost 6-10% at S 512-4096, the dq
shift 1-2% more, and the rows of one key 4-24% more (their compare and select in dk/dv: 112 -> 153
us of 265 at B4 S1024, attention_kernel_times_h200_6fed409.txt).

With accurate=True, delta = rowsum(do * o) takes o as the forward summed it, in fp32: for bf16/fp16
the training forward also stores o's rounding (o in fp32 minus o stored, as an int8 count of fp32
steps: fwd.residual_shift) and _bwd_delta adds it back. From the rounded o alone (FlashAttention-2/3's
way), the rounding (about |do| |o| 2^-9 in bf16) enters every dS of the row: where dP - delta
cancels (a row whose probability sits almost all on one key: few keys, a tight window, a large
scale; or values close to o), it exceeds the true dS, and dq/dk were 2-3x past eager's error
(eager's softmax backward takes delta from its own rounded P, consistently). float64 replays of
this backward (lab/attention_replay.py) on the CPU sweep's 10 cases over the gate
(lab/results/awkward_cpu_seed1129_528b9e4.txt) put all the excess there: bf16 B3 Sq16 Skv2 D1
scale 3: dq 0.14 from the rounded o, 0.0021 from o in fp32 (eager 0.044); rounding P and dS to
the dtype before their products, as the GPU does, adds at most 0.0022 to any part. The cost: one
int8 tensor of o's shape (half o's bytes) written by the forward's epilogue and read by
_bwd_delta, kept between them; no loop changes for it (yet the H200's times above). Inference (no
gradient asked for) stores none.

dq is taken shifted by a key of the row (_dq_rows, BwdConfig.dq_shift), so that what
is left of delta's rounding, the forward's p rounded before p @ v, and dS rounded before the dot
are not multiplied by the keys' common part (fp16 Sq1 Skv257 D1 window 2 scale 3: dq 0.0048 ->
0.00037, gate 0.0025; a float64 replay of the GPU's roundings of a bf16 case whose two keys are
0.0039 apart: 0.68 -> 0.0018, gate 0.02).

Rows of one key: a row that sees a single key (the first visible row of a causal sequence, a
window of one, a sequence of one key) has softmax 1 there, and its exact dS is 0; a row whose
other keys hold under about 2^-24 of the probability is the same to within roundings. But dS =
p (dP - delta) takes dP from the dot and delta from o: the two differ by their roundings (about
2^-24 |do| |v|), and where every row is such (Sq 64 over Skv 2, causal, scale 3: float64's dk is
4e-10) dq and dk were that rounding alone, 2,100x float64's norm off on the interpreter (eager's
exact 0 is 1x). So: a row of one key or none stores dq 0 and gives dk no dS (exact, from the
mask's arithmetic: key_span); the dk/dv kernel gives no dS to a key whose probability is within
ONE_HOT_ULPS |lse| of 1 (the backward's score may be some ulps off the forward's, so not p == 1);
and the dq kernel shifts by that key where the row has one (else by the last visible key), so
that its dS, rounding alone, is multiplied by 0. Each costs a compare and select per element a
block (dk/dv: p against the row's bound; dq: the same, and a row max of the key's index); the dq
kernel's gather of the shift's key is as before. BwdConfig.one_key switches all of it.

What is left over the gate (2 of the 41 cases in lab/results/attention_delta_cpu_04c072d.txt), as
no fp32 flash backward avoids it: rows whose second key has a probability under fp32's 2^-24
(1e-8 in a bf16 packed case at scale 3), whose true dS is below the fp32 rounding of dP and delta
themselves (dk 2.12 relative, 1.1e-6 off a float64 dk of norm 5.2e-7); and gradients that the
rounding of the upstream gradient to the dtype alone moves past the gate (fp16 packed D33 window 5
scale 3: the exact gradient of the fp16 do is 0.0048 from float64's, gate 0.0025; ours is 0.0030
from that exact gradient and eager 0.0037, but eager's lands 0.0012 from float64's).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import first_fit
from .._host.dot import interpreter_operands
from .common import (block_d, key_blocks, key_span, load_tile, lse_offset, query_blocks, query_tile, rows_src,
                     seq_spans, store_tile, visible)
from . import hopper_bwd
from .config import BwdConfig
from .fwd import fallbacks, residual_shift, strides3, use_tma, with_tma_if_ready

# A key whose recomputed probability is within this times the row's |lse| (log2 units, at least 1)
# of 1 holds all of its row's to within a few fp32 roundings of its score (the backward's score of
# the key may be some ulps off the forward's): the module docstring's rows of one key
ONE_HOT_ULPS = tl.constexpr(2.0 ** -22)


@triton.jit
def _one_hot_bound(lse):
    """The probability from which a key holds all of its row's (ONE_HOT_ULPS)."""
    return 1.0 - ONE_HOT_ULPS * tl.maximum(tl.abs(lse), 1.0)


@triton.jit
def _bwd_delta(O, R, DO, DELTA, sob, sot, soh, sdb, sdt, sdh, Sq, T, D: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_T: tl.constexpr, VARLEN: tl.constexpr, RESIDUAL: tl.constexpr,
               R_SHIFT: tl.constexpr):
    """delta[h, t] = sum_d o * do over the rows t of head h (a dense row t is sequence t // Sq);
    RESIDUAL: o as the forward summed it, the stored o with its rounding's code R (laid out as O)
    added back (fwd.residual_shift)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1).to(tl.int64)
    t64 = t.to(tl.int64)
    if VARLEN:
        b, i = t64 * 0, t64
    else:
        b, i = t64 // Sq, t64 % Sq
    offs_d = tl.arange(0, BLOCK_D)
    mask = (t < T)[:, None] & (offs_d < D)[None, :]
    o = tl.load(O + (b * sob + i * sot + h * soh)[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    if RESIDUAL:
        code = tl.load(R + (b * sob + i * sot + h * soh)[:, None] + offs_d[None, :], mask=mask, other=0)
        bits = o.to(tl.int32, bitcast=True) + (code.to(tl.int32) << R_SHIFT)
        o = tl.where(tl.abs(o) < float("inf"), bits.to(tl.float32, bitcast=True), o)
    do = tl.load(DO + (b * sdb + i * sdt + h * sdh)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + h * T + t64, delta, mask=t < T)


@triton.jit
def _rows_stats(LSE_h, DELTA_h, rows, len_q, MASK: tl.constexpr):
    """lse and delta of query rows; a row past the sequence reads lse = +inf (probability 0)."""
    if MASK:
        lse = tl.load(LSE_h + rows, mask=rows < len_q, other=float("inf"))
        delta = tl.load(DELTA_h + rows, mask=rows < len_q, other=0.0)
    else:
        lse = tl.load(LSE_h + rows)
        delta = tl.load(DELTA_h + rows)
    return lse, delta


@triton.jit
def _dkdv_step(dk, dv, k, v, q_src, do_src, LSE_h, DELTA_h, start_m, offs_n, offs_m, offs_d, len_q, len_k, shift,
               window, sqt, sdt, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, TMA: tl.constexpr, ONE_KEY: tl.constexpr):
    q = load_tile(q_src, start_m, len_q, sqt, offs_m, offs_d, D, BLOCK_D, MASK, TMA)
    rows = start_m + offs_m
    lse, delta = _rows_stats(LSE_h, DELTA_h, rows, len_q, MASK)
    p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])  # [keys, queries]
    if MASK:
        keep = visible(rows[None, :], offs_n[:, None], len_q, len_k, shift, window, CAUSAL, HAS_WINDOW)
        p_t = tl.where(keep, p_t, 0.0)
    do = load_tile(do_src, start_m, len_q, sdt, offs_m, offs_d, D, BLOCK_D, MASK, TMA)
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    p_ds = p_t
    if ONE_KEY:  # dS 0 where the row's probability is all on one key (the module docstring's rows of one key)
        if MASK:
            first, last = key_span(rows, len_k, shift, window, CAUSAL, HAS_WINDOW)
            below = tl.where(first == last, 0.0, _one_hot_bound(lse))
        else:  # each row of a mask-free block sees all of its keys, 16 or more rows: a row of one key
            # there sees the sequence's only key (a causal row i + shift = 0, or any, where len_k is 1)
            below = tl.where(len_k == 1, 0.0, _one_hot_bound(lse))
        p_ds = tl.where(p_t < below[None, :], p_t, 0.0)
    ds_t = p_ds * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_src, do_src, LSE_h, DELTA_h, lo, hi, offs_n, offs_m, offs_d, len_q, len_k, shift,
                 window, sqt, sdt, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, TMA: tl.constexpr,
                 PIPELINE: tl.constexpr, ONE_KEY: tl.constexpr):
    """Query blocks [lo, hi) (tl.range on the GPU, a while loop in the interpreter: see fwd._fwd_blocks)."""
    if PIPELINE:
        for start_m in tl.range(lo, hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, LSE_h, DELTA_h, start_m, offs_n, offs_m, offs_d, len_q,
                                len_k, shift, window, sqt, sdt, qk_scale, D, BLOCK_D, MASK, CAUSAL, HAS_WINDOW, TMA,
                                ONE_KEY)
    else:
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, LSE_h, DELTA_h, start_m, offs_n, offs_m, offs_d, len_q,
                                len_k, shift, window, sqt, sdt, qk_scale, D, BLOCK_D, MASK, CAUSAL, HAS_WINDOW, TMA,
                                ONE_KEY)
            start_m += BLOCK_M
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt,
              sdh, Sq, Skv, Tq, Hkv, GROUP, scale, qk_scale, window, n_nblocks, D: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr,
              ONE_KEY: tl.constexpr):
    # dk, dv are laid out like k, v (contiguous): their strides are k's when k is contiguous,
    # which the launcher ensures
    tile = tl.program_id(0)
    bh = tile // n_nblocks
    nb = tile % n_nblocks  # causal: the first key blocks are seen by the most queries, and come first
    b = bh // Hkv
    hk = bh % Hkv
    q_tok, len_q, k_tok, len_k = seq_spans(CU_Q, CU_K, b, Sq, Skv, VARLEN)
    n0 = nb * BLOCK_N
    if VARLEN:  # the grid covers the longest sequence: skip the blocks past this one's end
        if n0 < len_k:
            _dkdv_rows(n0, b, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DK, DV, sqb, sqt, sqh, skb,
                       skt, skh, svb, svt, svh, sdb, sdt, sdh, Sq, Tq, GROUP, scale, qk_scale, window, D, BLOCK_D,
                       BLOCK_N, BLOCK_M, CAUSAL, HAS_WINDOW, VARLEN, TMA, PIPELINE, ONE_KEY)
    else:  # no branch around the loops (see fwd._fwd_tile)
        _dkdv_rows(n0, b, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DK, DV, sqb, sqt, sqh, skb, skt,
                   skh, svb, svt, svh, sdb, sdt, sdh, Sq, Tq, GROUP, scale, qk_scale, window, D, BLOCK_D, BLOCK_N,
                   BLOCK_M, CAUSAL, HAS_WINDOW, VARLEN, TMA, PIPELINE, ONE_KEY)


@triton.jit
def _dkdv_rows(n0, b, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DK, DV, sqb, sqt, sqh, skb, skt, skh,
               svb, svt, svh, sdb, sdt, sdh, Sq, Tq, GROUP, scale, qk_scale, window, D: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_WINDOW: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr,
               ONE_KEY: tl.constexpr):
    """dk, dv of key rows [n0, n0 + BLOCK_N) of sequence b, kv head hk, over every query head of its group."""
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k_src = rows_src(K, b64, k_tok, hk, skb, skt, skh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    v_src = rows_src(V, b64, k_tok, hk, svb, svt, svh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    dk_dst = rows_src(DK, b64, k_tok, hk, skb, skt, skh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    dv_dst = rows_src(DV, b64, k_tok, hk, svb, svt, svh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    k = load_tile(k_src, n0, len_k, skt, offs_r, offs_d, D, BLOCK_D, True, TMA)
    v = load_tile(v_src, n0, len_k, svt, offs_r, offs_d, D, BLOCK_D, True, TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    shift = len_k - len_q
    n_end = tl.minimum(n0 + BLOCK_N, len_k)
    lo, mid_lo, mid_hi, hi = query_blocks(n0, n_end, len_q, shift, window, BLOCK_M, CAUSAL, HAS_WINDOW)
    h = hk * GROUP
    while h < hk * GROUP + GROUP:  # every query head of the group into the same dk, dv
        q_src = rows_src(Q, b64, q_tok, h, sqb, sqt, sqh, len_q, BLOCK_M, D, BLOCK_D, TMA)
        do_src = rows_src(DO, b64, q_tok, h, sdb, sdt, sdh, len_q, BLOCK_M, D, BLOCK_D, TMA)
        row0 = lse_offset(b64, h, q_tok, Sq, Tq, VARLEN)
        lse_h, delta_h = LSE + row0, DELTA + row0
        if lo < mid_lo:  # a masked edge (often empty: skipped without a call)
            dk, dv = _dkdv_blocks(dk, dv, k, v, q_src, do_src, lse_h, delta_h, lo, mid_lo, offs_n, offs_m, offs_d,
                                  len_q, len_k, shift, window, sqt, sdt, qk_scale, D, BLOCK_D, BLOCK_M, True,
                                  CAUSAL, HAS_WINDOW, TMA, PIPELINE, ONE_KEY)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_src, do_src, lse_h, delta_h, mid_lo, mid_hi, offs_n, offs_m, offs_d,
                              len_q, len_k, shift, window, sqt, sdt, qk_scale, D, BLOCK_D, BLOCK_M, False, CAUSAL,
                              HAS_WINDOW, TMA, PIPELINE, ONE_KEY)
        if mid_hi < hi:  # a masked edge (often empty: skipped without a call)
            dk, dv = _dkdv_blocks(dk, dv, k, v, q_src, do_src, lse_h, delta_h, mid_hi, hi, offs_n, offs_m, offs_d,
                                  len_q, len_k, shift, window, sqt, sdt, qk_scale, D, BLOCK_D, BLOCK_M, True,
                                  CAUSAL, HAS_WINDOW, TMA, PIPELINE, ONE_KEY)
        h += 1
    store_tile(dk_dst, (dk * scale).to(DK.dtype.element_ty), n0, len_k, skt, offs_r, offs_d, D, TMA)
    store_tile(dv_dst, dv.to(DV.dtype.element_ty), n0, len_k, svt, offs_r, offs_d, D, TMA)


@triton.jit
def _dq_step(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, start_n, offs_m, offs_n, offs_d, len_q, len_k, shift,
             window, skt, svt, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, TMA: tl.constexpr, SHIFT: tl.constexpr,
             ONE_KEY: tl.constexpr):
    k = load_tile(k_src, start_n, len_k, skt, offs_n, offs_d, D, BLOCK_D, MASK, TMA)
    p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
    if MASK:
        keep = visible(offs_m[:, None], start_n + offs_n[None, :], len_q, len_k, shift, window, CAUSAL, HAS_WINDOW)
        p = tl.where(keep, p, 0.0)
    v = load_tile(v_src, start_n, len_k, svt, offs_n, offs_d, D, BLOCK_D, MASK, TMA)
    ds = (p * (tl.dot(do, tl.trans(v)) - delta[:, None])).to(k.dtype)
    if SHIFT:  # the rows' sums of dS as the dot takes it (see _dq_rows): ds @ [1 0 ... 0] on the
        # tensor cores, each row's sum in column 0 (no conversion, add and shuffles a block)
        first_col = (tl.arange(0, 16)[None, :] == offs_n[:, None] * 0).to(k.dtype)
        e = tl.dot(ds, first_col, e)
        if ONE_KEY:  # and the key holding all of the row's probability (rows of one key)
            dom = tl.maximum(dom, tl.max(tl.where(p >= one_hot[:, None], start_n + offs_n[None, :], -1), 1))
    return tl.dot(ds, k, dq), e, dom


@triton.jit
def _dq_blocks(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, lo, hi, offs_m, offs_n, offs_d, len_q, len_k,
               shift, window, skt, svt, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, TMA: tl.constexpr,
               PIPELINE: tl.constexpr, SHIFT: tl.constexpr, ONE_KEY: tl.constexpr):
    """Key blocks [lo, hi) (tl.range on the GPU, a while loop in the interpreter)."""
    if PIPELINE:
        for start_n in tl.range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            dq, e, dom = _dq_step(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, start_n, offs_m, offs_n,
                                  offs_d, len_q, len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, MASK, CAUSAL,
                                  HAS_WINDOW, TMA, SHIFT, ONE_KEY)
    else:
        start_n = lo
        while start_n < hi:
            dq, e, dom = _dq_step(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, start_n, offs_m, offs_n,
                                  offs_d, len_q, len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, MASK, CAUSAL,
                                  HAS_WINDOW, TMA, SHIFT, ONE_KEY)
            start_n += BLOCK_N
    return dq, e, dom


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,
            Sq, Skv, Tq, Hq, GROUP, scale, qk_scale, window, n_mblocks, D: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
            VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr, SHIFT: tl.constexpr,
            ONE_KEY: tl.constexpr):
    # dq is laid out like q (contiguous, as the launcher ensures)
    b, h, hk, mb = query_tile(tl.program_id(0), n_mblocks, Hq, GROUP, CAUSAL)
    q_tok, len_q, k_tok, len_k = seq_spans(CU_Q, CU_K, b, Sq, Skv, VARLEN)
    m0 = mb * BLOCK_M
    if VARLEN:  # the grid covers the longest sequence: skip the blocks past this one's end
        if m0 < len_q:
            _dq_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DQ, sqb, sqt, sqh, skb, skt,
                     skh, svb, svt, svh, sdb, sdt, sdh, Sq, Tq, scale, qk_scale, window, D, BLOCK_D, BLOCK_M, BLOCK_N,
                     CAUSAL, HAS_WINDOW, VARLEN, TMA, PIPELINE, SHIFT, ONE_KEY)
    else:  # no branch around the loops (see fwd._fwd_tile)
        _dq_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DQ, sqb, sqt, sqh, skb, skt, skh,
                 svb, svt, svh, sdb, sdt, sdh, Sq, Tq, scale, qk_scale, window, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL,
                 HAS_WINDOW, VARLEN, TMA, PIPELINE, SHIFT, ONE_KEY)


@triton.jit
def _dq_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, DO, LSE, DELTA, DQ, sqb, sqt, sqh, skb, skt, skh, svb,
             svt, svh, sdb, sdt, sdh, Sq, Tq, scale, qk_scale, window, D: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr, SHIFT: tl.constexpr,
             ONE_KEY: tl.constexpr):
    """dq of query rows [m0, m0 + BLOCK_M) of sequence b, head h (kv head hk).

    SHIFT: dq = scale sum_j dS_j (k_j - c), c a key the row sees, instead of scale sum_j dS_j k_j:
    the same where the dS of a row sum to 0, as softmax's do; but the rounding of dS to the dtype
    before the dot (and what is left of delta's) need not, and that sum times the keys' common
    part is then dq's error, past the true dq where the row's keys nearly coincide (bf16 D1, two
    keys 0.0039 apart: dq 0.68 off in a float64 replay of the GPU's roundings, 0.0018 shifted).
    Taken as dq - e c, with e the rows' sums of dS as the dot took them. c is the row's last
    visible key, or with ONE_KEY the key holding all of its probability where there is one (whose
    dS is then rounding alone: the module docstring's rows of one key). ONE_KEY: a row of one key
    or none stores dq 0."""
    b64 = b.to(tl.int64)
    offs_r = tl.arange(0, BLOCK_M)
    offs_m = m0 + offs_r
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_src = rows_src(Q, b64, q_tok, h, sqb, sqt, sqh, len_q, BLOCK_M, D, BLOCK_D, TMA)
    dq_dst = rows_src(DQ, b64, q_tok, h, sqb, sqt, sqh, len_q, BLOCK_M, D, BLOCK_D, TMA)
    do_src = rows_src(DO, b64, q_tok, h, sdb, sdt, sdh, len_q, BLOCK_M, D, BLOCK_D, TMA)
    k_src = rows_src(K, b64, k_tok, hk, skb, skt, skh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    v_src = rows_src(V, b64, k_tok, hk, svb, svt, svh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    q = load_tile(q_src, m0, len_q, sqt, offs_r, offs_d, D, BLOCK_D, True, TMA)
    do = load_tile(do_src, m0, len_q, sdt, offs_r, offs_d, D, BLOCK_D, True, TMA)
    row0 = lse_offset(b64, h, q_tok, Sq, Tq, VARLEN)
    lse, delta = _rows_stats(LSE + row0, DELTA + row0, offs_m, len_q, True)
    shift = len_k - len_q
    m_end = tl.minimum(m0 + BLOCK_M, len_q)
    lo, mid_lo, mid_hi, hi = key_blocks(m0, m_end, len_k, shift, window, BLOCK_N, CAUSAL, HAS_WINDOW)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    e = tl.zeros([BLOCK_M, 16], dtype=tl.float32)  # the rows' sums of dS in column 0 (_dq_step)
    dom = tl.full([BLOCK_M], -1, dtype=tl.int32)
    one_hot = _one_hot_bound(lse)
    if lo < mid_lo:  # a masked edge (often empty: skipped without a call)
        dq, e, dom = _dq_blocks(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, lo, mid_lo, offs_m,
                                offs_n, offs_d, len_q, len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N,
                                True, CAUSAL, HAS_WINDOW, TMA, PIPELINE, SHIFT, ONE_KEY)
    dq, e, dom = _dq_blocks(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, mid_lo, mid_hi, offs_m,
                            offs_n, offs_d, len_q, len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N, False,
                            CAUSAL, HAS_WINDOW, TMA, PIPELINE, SHIFT, ONE_KEY)
    if mid_hi < hi:  # a masked edge (often empty: skipped without a call)
        dq, e, dom = _dq_blocks(dq, e, dom, one_hot, q, do, lse, delta, k_src, v_src, mid_hi, hi, offs_m,
                                offs_n, offs_d, len_q, len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N,
                                True, CAUSAL, HAS_WINDOW, TMA, PIPELINE, SHIFT, ONE_KEY)
    first, last = key_span(offs_m, len_k, shift, window, CAUSAL, HAS_WINDOW)
    if SHIFT:  # (plain pointers: a gather of one key row per query row, which descriptors do not take)
        key = tl.where(dom >= 0, dom, last)
        seen = (offs_m < len_q) & (last >= first)
        c = tl.load(K + b64 * skb + (k_tok + tl.maximum(key, 0))[:, None] * skt + hk * skh + offs_d[None, :],
                    mask=seen[:, None] & (offs_d < D)[None, :], other=0.0)
        dq -= tl.sum(e, 1)[:, None] * c.to(tl.float32)
    if ONE_KEY:
        dq = tl.where((last > first)[:, None], dq, 0.0)
    store_tile(dq_dst, (dq * scale).to(DQ.dtype.element_ty), m0, len_q, sqt, offs_r, offs_d, D, TMA)


def _fits(kernel, args, device, block_a: int, block_b: int, warps: int, stages: int, fallback: bool, names,
          flags) -> dict:
    """The launch keywords of a backward kernel: its config's blocks, or with `fallback` the first of
    fwd.fallbacks that fits the device's shared memory."""
    shapes = [(block_a, block_b, warps, stages)] + (fallbacks(block_a, block_b, warps, stages) if fallback else [])
    return first_fit(kernel, args, device, [dict(zip(names, (a, b)), num_warps=w, num_stages=s, **flags)
                                            for a, b, w, s in shapes])


def backward(do, q, k, v, o, lse, causal: bool, window: int, cu_q, cu_k, max_q: int, max_k: int, scale: float,
             config: BwdConfig, fallback: bool = False,
             residual=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) like (q, k, v). q, k, v, o contiguous; lse (and `residual`, o's rounding, where
    kept) from forward(). `fallback`: the config was picked, not forced (see fwd.forward)."""
    varlen = cu_q is not None
    batch = cu_q.numel() - 1 if varlen else q.shape[0]
    hq, hkv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    tq = lse.shape[1]
    if do.stride(-1) != 1:  # the kernels read a head's row as contiguous (an expanded or transposed gradient)
        do = do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    q, k, v, do = interpreter_operands(q, k, v, do)
    delta = torch.empty_like(lse)
    config = with_tma_if_ready(config, fallback, q, k, v, do, dq, dk, dv)
    if config.tma:
        use_tma(q, k, v, do, dq, dk, dv)
    if tq == 0 or batch == 0:
        return dq, dk.zero_(), dv.zero_()
    bd = block_d(d)
    block_t = 64
    _bwd_delta[(triton.cdiv(tq, block_t), hq)](o, o if residual is None else residual, do, delta, *strides3(o, varlen),
                                               *strides3(do, varlen), max(max_q, 1), tq, D=d, BLOCK_D=bd,
                                               BLOCK_T=block_t, VARLEN=varlen, RESIDUAL=residual is not None,
                                               R_SHIFT=residual_shift(o.dtype),
                                               num_warps=4)
    if config.gluon and hopper_bwd.refuses(q, k, v, do, causal, window, varlen, residual is not None or config.one_key
                                           or config.dq_shift) is None:
        hopper_bwd.backward(q, k, v, do, lse, delta, dq, dk, dv, causal, scale)
        return dq, dk, dv
    common = (cu_q, cu_k, *strides3(q, varlen), *strides3(k, varlen), *strides3(v, varlen), *strides3(do, varlen),
              max_q, max_k, tq)
    flags = dict(D=d, BLOCK_D=bd, CAUSAL=causal, HAS_WINDOW=window > 0, VARLEN=varlen, TMA=config.tma,
                 PIPELINE=q.is_cuda, ONE_KEY=config.one_key)
    qk_scale = scale * 1.4426950408889634
    args = (q, k, v, do, lse, delta, dk, dv, *common, hkv, hq // hkv, scale, qk_scale, window)
    launch = _fits(_bwd_dkdv, (*args, triton.cdiv(max_k, config.kv_n)), q.device, config.kv_n, config.kv_m,
                   config.kv_warps, config.kv_stages, fallback, ("BLOCK_N", "BLOCK_M"), flags)
    n_nblocks = triton.cdiv(max_k, launch["BLOCK_N"])
    _bwd_dkdv[(n_nblocks * batch * hkv,)](*args, n_nblocks, **launch)
    args = (q, k, v, do, lse, delta, dq, *common, hq, hq // hkv, scale, qk_scale, window)
    launch = _fits(_bwd_dq, (*args, triton.cdiv(max_q, config.q_m)), q.device, config.q_m, config.q_n,
                   config.q_warps, config.q_stages, fallback, ("BLOCK_M", "BLOCK_N"),
                   {**flags, "SHIFT": config.dq_shift})
    n_mblocks = triton.cdiv(max_q, launch["BLOCK_M"])
    _bwd_dq[(n_mblocks * batch * hq,)](*args, n_mblocks, **launch)
    return dq, dk, dv
