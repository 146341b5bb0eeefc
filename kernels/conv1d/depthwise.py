"""Depthwise causal conv1d with resets in Triton, forward and backward. Per channel f:

    y_t = bias + sum_{k < K} w[f, K-1-k] x_{t-k} alive(t, k),  alive(t, k): t-k >= 0 and no reset
    in (t-k, t]

(a reset at step s starts a new window at s: x_s counts, the steps before it do not). The
backward: dx_t = sum_k w[f, K-1-k] dy_{t+k} alive(t+k, k); dw and dbias sum over batch and time,
per program in the kernel and over programs afterwards. alive(t, k) is read from the reset flags at
steps t-k+1 .. t, a cumulative sum over the taps."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.scan import accumulator, sum_dtype
from .config import DepthwiseConfig, pick_depthwise

_MOST_Y = 65535  # programs a launch grid's second axis holds
_TAPS = 4  # widths up to this: _dw_bwd_taps, one accumulator a tap


@triton.jit
def _tile(ptr, base, t, f, T, F, alive, mf):
    m = (alive & (t >= 0) & (t < T))[:, None] & mf[None, :]
    return tl.load(ptr + base + t[:, None] * F + f[None, :], mask=m, other=0.0).to(tl.float32)


@triton.jit
def _weight(W, f, K: tl.constexpr, k: tl.constexpr, mf):
    """Tap k's weights (w[f, K-1-k]) as a [1, channels] row in fp32; zero for taps past the width."""
    return tl.load(W + f[None, :] * K + (K - 1 - k), mask=mf[None, :] & (k < K), other=0.0).to(tl.float32)


@triton.jit
def _no_reset(R, b, t, T, alive):
    """alive, cleared where step t (inside the sequence) is a reset."""
    r = tl.load(R + b * T + t, mask=(t >= 0) & (t < T), other=0)
    return alive & (r == 0)


@triton.jit
def _dw_fwd(X, W, BIAS, R, Y, T, F, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_R: tl.constexpr, CHANNELS_FIRST: tl.constexpr):
    if CHANNELS_FIRST:
        tile, block = tl.program_id(1), tl.program_id(0)
    else:
        tile, block = tl.program_id(0), tl.program_id(1)
    n_tb = tl.cdiv(T, BLOCK_T)
    b = tile // n_tb
    t = (tile % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    f = block * BLOCK_F + tl.arange(0, BLOCK_F)
    mf = f < F
    base = b.to(tl.int64) * T * F
    acc = tl.zeros([BLOCK_T, BLOCK_F], tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + f, mask=mf, other=0.0).to(tl.float32)[None, :]
    alive = t < T
    for k in tl.static_range(K):
        if HAS_R and k > 0:
            alive = _no_reset(R, b, t - k + 1, T, alive)
        w = tl.load(W + f * K + (K - 1 - k), mask=mf, other=0.0).to(tl.float32)
        acc += _tile(X, base, t - k, f, T, F, alive, mf) * w[None, :]
    m = (t < T)[:, None] & mf[None, :]
    tl.store(Y + base + t[:, None] * F + f[None, :], acc.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _program(T, F, n_span, BLOCK_F: tl.constexpr, CHANNELS_FIRST: tl.constexpr):
    """A backward program's (sequence x span index, sequence, span, channels, offset of its sequence)."""
    if CHANNELS_FIRST:
        seq, block = tl.program_id(1), tl.program_id(0)
    else:
        seq, block = tl.program_id(0), tl.program_id(1)
    b = seq // n_span
    return seq, b, seq % n_span, block * BLOCK_F + tl.arange(0, BLOCK_F), b.to(tl.int64) * T * F


@triton.jit
def _dw_bwd(X, W, R, DY, DX, PART, T, F, n_span, K: tl.constexpr, K_P2: tl.constexpr, SPAN: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr, HAS_R: tl.constexpr, ACC: tl.constexpr,
            CHANNELS_FIRST: tl.constexpr):
    """Program (sequence b x span of SPAN steps, channel block): dx over the span, and its sums of
    dw (PART[.., j, f] for tap j) and dbias (PART[.., K, f]), in ACC (fp64 for fp32 inputs: an fp32
    sum of a few dozen terms that cancel came out at 2-9x eager's error, see _jit/scan.py's
    accumulator). For any width; _dw_bwd_taps is the faster one to width 4. A tile holds every
    tap's shifted rows at once, [taps, steps, channels], with the taps in each thread's registers:
    dx sums over them there, and the products for dw and dbias add up element by element over the
    span, summed across threads once at its end (not a barrier and a shared-memory round trip a
    tile and tap)."""
    seq, b, span, f, base = _program(T, F, n_span, BLOCK_F, CHANNELS_FIRST)
    mf = f < F
    taps = tl.arange(0, K_P2)
    k3 = taps[:, None, None]
    f3 = f[None, None, :]
    mf3 = mf[None, None, :]
    w3 = tl.load(W + f3 * K + (K - 1 - k3), mask=mf3 & (k3 < K), other=0.0).to(tl.float32)
    acc_w = tl.zeros([K_P2, BLOCK_T, BLOCK_F], ACC)
    acc_b = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    for t0 in range(span * SPAN, tl.minimum((span + 1) * SPAN, T), BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        back = t[None, :] - taps[:, None]  # [taps, steps]: x_{t-k}, in y_t's window
        ahead = t[None, :] + taps[:, None]  # dy_{t+k}, whose window holds x_t
        ok_back = (taps[:, None] < K) & (back >= 0) & (t < T)[None, :]
        ok_ahead = (taps[:, None] < K) & (ahead < T)
        if HAS_R:  # a reset in (t-k, t] (steps t-j, j < k) ends x_{t-k}'s reach; one in (t, t+k] x_t's
            r_back = tl.load(R + b * T + back, mask=(back >= 0) & (back < T), other=0).to(tl.int32)
            r_ahead = tl.load(R + b * T + ahead, mask=(taps[:, None] > 0) & (ahead < T), other=0).to(tl.int32)
            ok_back &= tl.cumsum(r_back, axis=0) - r_back == 0
            ok_ahead &= tl.cumsum(r_ahead, axis=0) == 0
        dy3 = tl.load(DY + base + ahead[:, :, None] * F + f3, mask=ok_ahead[:, :, None] & mf3, other=0.0)
        x3 = tl.load(X + base + back[:, :, None] * F + f3, mask=ok_back[:, :, None] & mf3, other=0.0)
        dy3 = dy3.to(tl.float32)
        dx = tl.sum(dy3 * w3, axis=0)
        dy = tl.sum(tl.where(k3 == 0, dy3, 0.0), axis=0)  # dy_t: tap 0's rows (in registers)
        acc_b += dy.to(ACC)
        acc_w += dy.to(ACC)[None, :, :] * x3.to(ACC)
        m = (t < T)[:, None] & mf[None, :]
        tl.store(DX + base + t[:, None] * F + f[None, :], dx.to(DX.dtype.element_ty), mask=m)
    part = PART + (seq * (K + 1)) * F + f
    tl.store(part[None, :] + (K - 1 - taps[:, None]) * F, tl.sum(acc_w, axis=1),
             mask=(taps < K)[:, None] & mf[None, :])
    tl.store(part + K * F, tl.sum(acc_b, axis=0), mask=mf)


@triton.jit
def _dw_bwd_taps(X, W, R, DY, DX, PART, T, F, n_span, K: tl.constexpr, SPAN: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_F: tl.constexpr, HAS_R: tl.constexpr, ACC: tl.constexpr, CHANNELS_FIRST: tl.constexpr):
    """_dw_bwd for K <= 4 with [steps, channels] tiles, as the forward's: each tap's products for dw
    in an accumulator of its own (a0 .. a3), summed over steps once at the span's end. On the H200
    _dw_bwd took 1.3x-5x its time at widths 3 and 4, by its tiles (lab/results/conv1d_bwd_ab_h200.txt)."""
    seq, b, span, f, base = _program(T, F, n_span, BLOCK_F, CHANNELS_FIRST)
    mf = f < F
    # the taps' weights before the loop, [1, channels] as the tiles hold them: loaded in it, each
    # crossed from its load's layout into the tile's through shared memory, two barriers a tap and tile
    w0 = _weight(W, f, K, 0, mf)
    w1 = _weight(W, f, K, 1, mf)
    w2 = _weight(W, f, K, 2, mf)
    w3 = _weight(W, f, K, 3, mf)
    a0 = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    a1 = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    a2 = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    a3 = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    ab = tl.zeros([BLOCK_T, BLOCK_F], ACC)
    for t0 in range(span * SPAN, tl.minimum((span + 1) * SPAN, T), BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        inside = t < T
        dy = _tile(DY, base, t, f, T, F, inside, mf)
        ab += dy.to(ACC)
        dx = tl.zeros([BLOCK_T, BLOCK_F], tl.float32)
        back = inside  # x_{t-k} in y_t's window
        ahead = inside  # x_t in y_{t+k}'s window
        for k in tl.static_range(K):
            if HAS_R and k > 0:
                back = _no_reset(R, b, t - k + 1, T, back)
                ahead = _no_reset(R, b, t + k, T, ahead)
            p = dy.to(ACC) * _tile(X, base, t - k, f, T, F, back, mf).to(ACC)
            if k == 0:
                a0 += p
                w = w0
            elif k == 1:
                a1 += p
                w = w1
            elif k == 2:
                a2 += p
                w = w2
            else:
                a3 += p
                w = w3
            dx += _tile(DY, base, t + k, f, T, F, ahead, mf) * w
        m = inside[:, None] & mf[None, :]
        tl.store(DX + base + t[:, None] * F + f[None, :], dx.to(DX.dtype.element_ty), mask=m)
    part = PART + (seq * (K + 1)) * F + f
    tl.store(part + (K - 1) * F, tl.sum(a0, axis=0), mask=mf)
    if K > 1:
        tl.store(part + (K - 2) * F, tl.sum(a1, axis=0), mask=mf)
    if K > 2:
        tl.store(part + (K - 3) * F, tl.sum(a2, axis=0), mask=mf)
    if K > 3:
        tl.store(part + (K - 4) * F, tl.sum(a3, axis=0), mask=mf)
    tl.store(part + K * F, tl.sum(ab, axis=0), mask=mf)


def depthwise_forward(x, weight, bias, resets, config: DepthwiseConfig | None = None, fallback: bool = False):
    """y [B, T, F]. (`fallback`, as mix_forward's, has nothing to do here: the depthwise kernels use
    no shared memory, compiled for sm_90 at the default tiles and widths 4 and 8.)"""
    B, T, F = x.shape
    K = weight.shape[-1]
    cfg = config or pick_depthwise(B, T, F, K, x.device)
    y = torch.empty_like(x)
    grid = (B * triton.cdiv(T, cfg.block_t), triton.cdiv(F, cfg.block_f))
    first = cfg.channels_first and grid[0] <= _MOST_Y
    if first:
        grid = grid[::-1]
    r = resets.view(torch.uint8) if resets is not None else x
    _dw_fwd[grid](x, weight, bias if bias is not None else x, r, y, T, F, K=K, BLOCK_T=cfg.block_t,
                  BLOCK_F=cfg.block_f, HAS_BIAS=bias is not None, HAS_R=resets is not None, CHANNELS_FIRST=first,
                  num_warps=cfg.warps)
    return y


def depthwise_backward(dy, x, weight, resets, config: DepthwiseConfig | None = None, fallback: bool = False):
    """(dx, dweight like weight, dbias [F] sums, fp64 for fp32 x, fp32 otherwise)."""
    B, T, F = x.shape
    K = weight.shape[-1]
    cfg = config or pick_depthwise(B, T, F, K, x.device)
    span = max(cfg.bwd_block_t, min(cfg.bwd_span, triton.next_power_of_2(T)))
    n_span = triton.cdiv(T, span)
    dx = torch.empty_like(x)
    acc = accumulator(x.dtype)
    part = torch.empty(B * n_span, K + 1, F, device=x.device, dtype=sum_dtype(x.dtype))
    grid = (B * n_span, triton.cdiv(F, cfg.bwd_block_f))
    first = cfg.bwd_channels_first and grid[0] <= _MOST_Y
    if first:
        grid = grid[::-1]
    r = resets.view(torch.uint8) if resets is not None else x
    args = (x, weight, r, dy.contiguous(), dx, part, T, F, n_span)
    meta = dict(K=K, SPAN=span, BLOCK_T=cfg.bwd_block_t, BLOCK_F=cfg.bwd_block_f, HAS_R=resets is not None, ACC=acc,
                CHANNELS_FIRST=first, num_warps=cfg.bwd_warps)
    if K <= _TAPS:
        _dw_bwd_taps[grid](*args, **meta)
    else:
        _dw_bwd[grid](*args, K_P2=triton.next_power_of_2(K), **meta)
    sums = part.sum(0)
    return dx, sums[:K].t().reshape(weight.shape).to(weight.dtype), sums[K]
