"""The forward: online softmax over key blocks in fp32 with exp2, one query block a tile.

Scores are kept in log2 units (s * scale * log2(e)), so each probability is one exp2. Each tile
walks its key blocks in three ranges (common.key_blocks): the masked blocks at the window's
leading edge, the fully visible middle without any mask (where nearly all the work is), and the
masked blocks on the diagonal and past the end of the keys. The tile saves its rows' log-sum-exp
(log2 units) for the backward: +inf for a row that saw no key, whose output is 0, so the
backward's exp2(s - lse) is 0 there instead of NaN.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .._host.device import first_fit, sm_count
from .._host.dot import interpreter_operands
from .common import (block_d, key_blocks, load_tile, lse_offset, query_tile, rows_src, seq_spans,
                     store_tile, visible)
from . import hopper
from .config import FwdConfig, runnable


@triton.jit
def _fwd_step(acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, offs_n, offs_d, len_q, len_k, shift, window, stride_k,
              stride_v, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr, TMA: tl.constexpr):
    k = load_tile(k_src, start_n, len_k, stride_k, offs_n, offs_d, D, BLOCK_D, MASK, TMA)
    qk = tl.dot(q, tl.trans(k))
    if MASK:
        keep = visible(offs_m[:, None], start_n + offs_n[None, :], len_q, len_k, shift, window, CAUSAL, HAS_WINDOW)
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: no -inf - -inf
        p = tl.math.exp2(qk - m_use[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_tile(v_src, start_n, len_k, stride_v, offs_n, offs_d, D, BLOCK_D, MASK, TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, lo, hi, offs_m, offs_n, offs_d, len_q, len_k, shift,
                window, stride_k, stride_v, qk_scale, D: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                TMA: tl.constexpr, PIPELINE: tl.constexpr):
    """Key blocks [lo, hi): a software-pipelined tl.range on the GPU, a while loop in the interpreter
    (whose range() cannot take a bound computed from program_id under NumPy >= 2.4)."""
    if PIPELINE:
        for start_n in tl.range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, offs_n, offs_d, len_q, len_k,
                                      shift, window, stride_k, stride_v, qk_scale, D, BLOCK_D, MASK, CAUSAL,
                                      HAS_WINDOW, TMA)
    else:
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, offs_n, offs_d, len_q, len_k,
                                      shift, window, stride_k, stride_v, qk_scale, D, BLOCK_D, MASK, CAUSAL,
                                      HAS_WINDOW, TMA)
            start_n += BLOCK_N
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(tile, Q, K, V, O, R, LSE, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
              Sq, Skv, Tq, Hq, GROUP, qk_scale, window, n_mblocks, D: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
              VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr, RESIDUAL: tl.constexpr,
              R_SHIFT: tl.constexpr):
    b, h, hk, mb = query_tile(tile, n_mblocks, Hq, GROUP, CAUSAL)
    q_tok, len_q, k_tok, len_k = seq_spans(CU_Q, CU_K, b, Sq, Skv, VARLEN)
    m0 = mb * BLOCK_M
    if VARLEN:  # the grid covers the longest sequence: skip the blocks past this one's end
        if m0 < len_q:
            _fwd_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, O, R, LSE, sqb, sqt, sqh, skb, skt, skh,
                      svb, svt, svh, sob, sot, soh, Sq, Tq, qk_scale, window, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL,
                      HAS_WINDOW, VARLEN, TMA, PIPELINE, RESIDUAL, R_SHIFT)
    else:  # no branch around the loops: they stay at the kernel's top level for the compiler's passes
        _fwd_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, O, R, LSE, sqb, sqt, sqh, skb, skt, skh, svb,
                  svt, svh, sob, sot, soh, Sq, Tq, qk_scale, window, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW,
                  VARLEN, TMA, PIPELINE, RESIDUAL, R_SHIFT)


@triton.jit
def _fwd_rows(m0, b, h, hk, q_tok, len_q, k_tok, len_k, Q, K, V, O, R, LSE, sqb, sqt, sqh, skb, skt, skh, svb, svt,
              svh, sob, sot, soh, Sq, Tq, qk_scale, window, D: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
              VARLEN: tl.constexpr, TMA: tl.constexpr, PIPELINE: tl.constexpr, RESIDUAL: tl.constexpr,
              R_SHIFT: tl.constexpr):
    """Query rows [m0, m0 + BLOCK_M) of sequence b, head h (kv head hk): output and log-sum-exp;
    RESIDUAL: also the output's rounding into R (int8, laid out as O; see residual_shift)."""
    b64 = b.to(tl.int64)
    q_src = rows_src(Q, b64, q_tok, h, sqb, sqt, sqh, len_q, BLOCK_M, D, BLOCK_D, TMA)
    o_dst = rows_src(O, b64, q_tok, h, sob, sot, soh, len_q, BLOCK_M, D, BLOCK_D, TMA)
    k_src = rows_src(K, b64, k_tok, hk, skb, skt, skh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    v_src = rows_src(V, b64, k_tok, hk, svb, svt, svh, len_k, BLOCK_N, D, BLOCK_D, TMA)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(q_src, m0, len_q, sqt, tl.arange(0, BLOCK_M), offs_d, D, BLOCK_D, True, TMA)
    shift = len_k - len_q
    m_end = tl.minimum(m0 + BLOCK_M, len_q)
    lo, mid_lo, mid_hi, hi = key_blocks(m0, m_end, len_k, shift, window, BLOCK_N, CAUSAL, HAS_WINDOW)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if lo < mid_lo:  # a masked edge (often empty: skipped without a call)
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, lo, mid_lo, offs_m, offs_n, offs_d, len_q,
                                    len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N, True, CAUSAL,
                                    HAS_WINDOW, TMA, PIPELINE)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, mid_lo, mid_hi, offs_m, offs_n, offs_d, len_q,
                                len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N, False, CAUSAL,
                                HAS_WINDOW, TMA, PIPELINE)
    if mid_hi < hi:  # a masked edge (often empty: skipped without a call)
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_src, v_src, mid_hi, hi, offs_m, offs_n, offs_d, len_q,
                                    len_k, shift, window, skt, svt, qk_scale, D, BLOCK_D, BLOCK_N, True, CAUSAL,
                                    HAS_WINDOW, TMA, PIPELINE)
    empty = l_i == 0.0
    l_use = tl.where(empty, 1.0, l_i)
    o32 = acc / l_use[:, None]
    o = o32.to(O.dtype.element_ty)
    store_tile(o_dst, o, m0, len_q, sot, tl.arange(0, BLOCK_M), offs_d, D, TMA)
    if RESIDUAL:  # o's rounding as an int8 code (residual_shift), through plain pointers whatever TMA
        code = rounding_code(o32, o, R_SHIFT)
        r_dst = rows_src(R, b64, q_tok, h, sob, sot, soh, len_q, BLOCK_M, D, BLOCK_D, False)
        store_tile(r_dst, code, m0, len_q, sot, tl.arange(0, BLOCK_M), offs_d, D, False)
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_use))
    tl.store(LSE + lse_offset(b64, h, q_tok, Sq, Tq, VARLEN) + offs_m, lse, mask=offs_m < len_q)


@triton.jit
def _attn_fwd(Q, K, V, O, R, LSE, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
              Sq, Skv, Tq, Hq, GROUP, qk_scale, window, n_mblocks, n_tiles, D: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr,
              PERSISTENT: tl.constexpr, PIPELINE: tl.constexpr, RESIDUAL: tl.constexpr,
              R_SHIFT: tl.constexpr):
    if PERSISTENT:  # tiles strided over a grid sized to the GPU
        tile = tl.program_id(0)
        while tile < n_tiles:
            _fwd_tile(tile, Q, K, V, O, R, LSE, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot,
                      soh, Sq, Skv, Tq, Hq, GROUP, qk_scale, window, n_mblocks, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL,
                      HAS_WINDOW, VARLEN, TMA, PIPELINE, RESIDUAL, R_SHIFT)
            tile += tl.num_programs(0)
    else:
        _fwd_tile(tl.program_id(0), Q, K, V, O, R, LSE, CU_Q, CU_K, sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
                  sob, sot, soh, Sq, Skv, Tq, Hq, GROUP, qk_scale, window, n_mblocks, D, BLOCK_D, BLOCK_M, BLOCK_N,
                  CAUSAL, HAS_WINDOW, VARLEN, TMA, PIPELINE, RESIDUAL, R_SHIFT)


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether tensor descriptors can take these tensors: 16-byte aligned bases and strides (every
    stride but the last, contiguous one). Not so for head dims whose rows are not a multiple of 16
    bytes (D 33 in fp16) or views that start off the alignment."""
    return all(t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)


def with_tma_if_ready(config, fallback: bool, *tensors: torch.Tensor):
    """`config`, or where it asks for TMA and the tensors are not aligned for it: the same config
    without TMA when it was picked (`fallback`: a library call never asks for a config), a
    ValueError naming the limit when the caller forced it."""
    if not config.tma or tma_ready(*tensors):
        return config
    if fallback:
        return dataclasses.replace(config, tma=False)
    raise ValueError("this config's TMA path needs 16-byte aligned tensors and strides (head dim x element size a "
                     "multiple of 16 bytes); force a config with tma=False, or pass config=None")


def use_tma(*tensors: torch.Tensor) -> None:
    """Ready the TMA path (on tensors tma_ready accepts): the descriptors built on the device need
    scratch memory from an allocator on the tensors' device."""
    device = tensors[0].device
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def strides3(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, token, head) strides of a [B, S, H, D] tensor, or (0, token, head) of a packed one."""
    return (0, x.stride(0), x.stride(1)) if varlen else (x.stride(0), x.stride(1), x.stride(2))


def fallbacks(block_m: int, block_n: int, warps: int, stages: int) -> list[tuple[int, int, int, int]]:
    """(block_m, block_n, warps, stages) to fall back to, in order, where a picked config does not
    fit the device's shared memory: fewer stages, then blocks halved down to 16 rows (4 warps or
    fewer, one stage: a few KB at D 128, which any device holds)."""
    out = [(block_m, block_n, warps, s) for s in range(stages - 1, 0, -1)]
    while block_m > 16 or block_n > 16:
        block_m, block_n = max(16, block_m // 2), max(16, block_n // 2)
        out.append((block_m, block_n, min(warps, 4), 1))
    return out


def residual_shift(dtype: torch.dtype) -> int:
    """How o's rounding is kept for the backward: o32 and o (o32 rounded to the dtype) have the same
    sign, so the difference of their fp32 bit patterns is the count of fp32 steps from o to o32 (a
    count that crosses a power of two stays exact), at most half a step of the dtype: 2^15 (bf16,
    7 stored mantissa bits) or 2^12 (fp16, 10). Rounded to multiples of 2^residual_shift it fits an
    int8 (+128 clamped to 127), and the backward adds it back to o's bits: o32 to half a multiple
    (2^-16 of o in bf16, 2^-19 in fp16), a whole one where o32 lay within 1/256 of half a step of
    the dtype from o (the code saturates), half the bytes of o. Integer arithmetic, a few
    instructions an element: an earlier code relative to o (a division and its guards) took the
    forward from 154 to 232 us at B32 H16 S512 D128 causal on an H200
    (lab/results/attention_kernel_times_h200_bbc84b9.txt).
    Where o is not finite (fp16's overflow) the code is not used; an fp16 o among fp16's
    subnormals keeps at most 127 steps of its rounding. fp32: no rounding, shift 0."""
    mantissa = {torch.bfloat16: 7, torch.float16: 10}.get(dtype)
    return 0 if mantissa is None else 23 - mantissa - 8


@triton.jit
def rounding_code(o32, o, R_SHIFT: tl.constexpr):
    """The int8 code of o32 - o (o = o32 rounded): residual_shift's count of fp32 steps."""
    steps = o32.to(tl.int32, bitcast=True) - o.to(tl.float32).to(tl.int32, bitcast=True)
    steps = (steps + ((1 << R_SHIFT) >> 1)) >> R_SHIFT
    return tl.minimum(tl.maximum(steps, -128), 127).to(tl.int8)


def forward(q, k, v, causal: bool, window: int, cu_q, cu_k, max_q: int, max_k: int, scale: float,
            config: FwdConfig, fallback: bool = False, residual: bool = False):
    """(o like q, lse [Hq, tokens of q] fp32 in log2 units); with `residual`, (o, lse, r): r like o,
    o's rounding (residual_shift's int8 code), for the backward's delta (bwd.py says why). Inputs
    already checked by the caller. `fallback`: the config was picked, not forced: where the tensors
    or the device cannot take it, run a smaller one (no TMA; fewer stages or smaller blocks, as
    `fallbacks`). A config with `gluon` runs hopper.py's kernel where the inputs are in its scope
    (and no residual is asked for), the Triton kernel with the same tiles elsewhere."""
    varlen = cu_q is not None
    batch = cu_q.numel() - 1 if varlen else q.shape[0]
    hq, d = q.shape[-2], q.shape[-1]
    hkv = k.shape[-2]
    tq = q.shape[0] if varlen else q.shape[0] * q.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    r = torch.empty_like(o, dtype=torch.int8) if residual else None
    q, k, v = interpreter_operands(q, k, v)
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device)
    config = runnable(config, fallback, lambda c: "a residual or no work" if residual or not batch * hq * max_q
                      else hopper.refuses(q, k, v, causal, window, varlen, c.block_m, c.block_n))
    if config.gluon:
        hopper.forward(q, k, v, o, lse, causal, scale, config.block_m, config.block_n, config.stages)
        return o, lse
    config = with_tma_if_ready(config, fallback, q, k, v, o)
    if config.tma:
        use_tma(q, k, v, o)
    done = (o, lse, r) if residual else (o, lse)
    if batch * hq * max_q == 0:
        return done
    args = (q, k, v, o, r if residual else o, lse, cu_q, cu_k, *strides3(q, varlen), *strides3(k, varlen),
            *strides3(v, varlen), *strides3(o, varlen), max_q, max_k, tq, hq, hq // hkv, scale * 1.4426950408889634,
            window)
    flags = dict(D=d, BLOCK_D=block_d(d), CAUSAL=causal, HAS_WINDOW=window > 0, VARLEN=varlen, TMA=config.tma,
                 PERSISTENT=config.persistent > 0, PIPELINE=q.is_cuda, RESIDUAL=residual,
                 R_SHIFT=residual_shift(o.dtype))
    shapes = [(config.block_m, config.block_n, config.warps, config.stages)]
    shapes += fallbacks(*shapes[0]) if fallback else []
    n_mblocks = lambda m: triton.cdiv(max_q, m)  # noqa: E731
    launch = first_fit(_attn_fwd, (*args, n_mblocks(shapes[0][0]), n_mblocks(shapes[0][0]) * batch * hq), q.device,
                       [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s, **flags) for m, n, w, s in shapes])
    n_tiles = n_mblocks(launch["BLOCK_M"]) * batch * hq
    grid = n_tiles
    if config.persistent:
        grid = min(n_tiles, config.persistent * sm_count(q.device))
    _attn_fwd[(grid,)](*args, n_mblocks(launch["BLOCK_M"]), n_tiles, **launch)
    return done
