"""Channel-mixing (groups=1) causal conv1d with resets in Triton, forward and backward: Cortex's
channel-mixing conv1d. With W[o, i, j] (PyTorch's layout) and seg the episode index of each step
(the running count of resets):

    y[t, o]  = bias[o] + sum_{k < K, i} x[t-k, i] W[o, i, K-1-k] [t-k >= 0, seg[t-k] = seg[t]]
    dx[t, i] = sum_{k, o} dy[t+k, o] W[o, i, K-1-k] [t+k < T, seg[t+k] = seg[t]]
    dW[o, i, K-1-k] = sum_{b, t} dy[t, o] x[t-k, i] [t-k >= 0, seg[t-k] = seg[t]]

The forward and dx are one kernel: a matrix product whose reduction runs over K taps x channel
blocks of rows shifted by -k (forward) or +k (dx), masked where the shift crosses a reset. The
weights are read as [K, reduction channels, output channels] copies (W permuted once a call, a
K * F^2 copy next to the 2 B T F^2 K multiply-adds). Loop trip counts are constexpr: Triton's
pipeliner needs a for loop, and its CPU interpreter cannot take a runtime bound in one."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import first_fit
from .._host.dot import interpreter_operands
from .._jit.scan import sum_dtype
from .config import MixConfig, pick_mix


@triton.jit
def _rows_mask(SEG, b, t, src, T, HAS_R: tl.constexpr):
    """Rows of output step t that read step src: inside the sequence and, with resets, in t's episode."""
    m = (t < T) & (src >= 0) & (src < T)
    if HAS_R:
        here = tl.load(SEG + b * T + t, mask=t < T, other=0)
        there = tl.load(SEG + b * T + src, mask=m, other=-1)
        m = m & (here == there)
    return m


@triton.jit
def _mix_gemm(SRC, WK, BIAS, SEG, OUT, T, F_RED: tl.constexpr, F_OUT: tl.constexpr, K: tl.constexpr,
              SHIFT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr,
              STAGES: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_R: tl.constexpr, PREC: tl.constexpr):
    """OUT[b, t, o] = bias + sum_{k, i} SRC[b, t + SHIFT*k, i] WK[K-1-k, i, o], masked as above."""
    n_tb = tl.cdiv(T, BLOCK_T)
    b = tl.program_id(0) // n_tb
    t = (tl.program_id(0) % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    ii = tl.arange(0, BLOCK_I)
    mo = o < F_OUT
    src_base = b.to(tl.int64) * T * F_RED
    n_ib: tl.constexpr = (F_RED + BLOCK_I - 1) // BLOCK_I
    acc = tl.zeros([BLOCK_T, BLOCK_O], tl.float32)
    for r in tl.range(0, K * n_ib, num_stages=STAGES):
        k = r // n_ib
        i = (r - k * n_ib) * BLOCK_I + ii
        mi = i < F_RED
        src = t + SHIFT * k
        rows = _rows_mask(SEG, b, t, src, T, HAS_R)
        a = tl.load(SRC + src_base + src[:, None] * F_RED + i[None, :], mask=rows[:, None] & mi[None, :], other=0.0)
        w = tl.load(WK + ((K - 1 - k) * F_RED + i[:, None]) * F_OUT + o[None, :], mask=mi[:, None] & mo[None, :],
                    other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PREC)
    if HAS_BIAS:
        acc += tl.load(BIAS + o, mask=mo, other=0.0).to(tl.float32)[None, :]
    m = (t < T)[:, None] & mo[None, :]
    tl.store(OUT + b.to(tl.int64) * T * F_OUT + t[:, None] * F_OUT + o[None, :], acc.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _mix_dw(X, DY, SEG, DW, T, F_IN: tl.constexpr, F_OUT: tl.constexpr, K: tl.constexpr, STEPS: tl.constexpr,
            BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr, STAGES: tl.constexpr,
            HAS_R: tl.constexpr, PREC: tl.constexpr):
    """Program (tap k x output block x input block): dW[o, i, K-1-k] over all STEPS = B x time blocks."""
    n_ob: tl.constexpr = (F_OUT + BLOCK_O - 1) // BLOCK_O
    n_ib: tl.constexpr = (F_IN + BLOCK_I - 1) // BLOCK_I
    pid = tl.program_id(0)
    k = pid // (n_ob * n_ib)
    o = (pid // n_ib % n_ob) * BLOCK_O + tl.arange(0, BLOCK_O)
    i = (pid % n_ib) * BLOCK_I + tl.arange(0, BLOCK_I)
    mo, mi = o < F_OUT, i < F_IN
    n_tb = tl.cdiv(T, BLOCK_T)
    acc = tl.zeros([BLOCK_O, BLOCK_I], tl.float32)
    for r in tl.range(0, STEPS, num_stages=STAGES):
        b = r // n_tb
        t = (r - b * n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = _rows_mask(SEG, b, t, t - k, T, HAS_R)
        g = tl.load(DY + b.to(tl.int64) * T * F_OUT + t[None, :] * F_OUT + o[:, None],
                    mask=(t < T)[None, :] & mo[:, None], other=0.0)
        a = tl.load(X + b.to(tl.int64) * T * F_IN + (t - k)[:, None] * F_IN + i[None, :],
                    mask=rows[:, None] & mi[None, :], other=0.0)
        acc = tl.dot(g, a, acc, input_precision=PREC)
    tl.store(DW + (o[:, None] * F_IN + i[None, :]) * K + (K - 1 - k), acc.to(DW.dtype.element_ty),
             mask=mo[:, None] & mi[None, :])


def _precision(dtype) -> str | None:
    # fp32 inputs: three TF32 products (about fp32's accuracy) instead of one (TF32's 10-bit mantissa)
    return "tf32x3" if dtype == torch.float32 else None


def _segments(resets):
    return None if resets is None else torch.cumsum(resets, dim=1, dtype=torch.int32)


def _tiles(a: int, b: int, c: int, warps: int, stages: int, fallback: bool) -> list[tuple]:
    """The tiles (three blocks, warps, stages) to try in order: the config's, then, for a picked
    config (`fallback`), fewer stages and smaller blocks, for a device whose shared memory the
    config does not fit (the fp32 forward's 128 x 128 x 64 tiles in 3 stages, compiled for sm_90:
    131584 bytes; an sm_86 or sm_89 program may use 101376)."""
    out = [(a, b, c, warps, stages)]
    if fallback:
        out += [(a, b, c, warps, s) for s in range(stages - 1, 0, -1)]
        out += [(min(a, n), min(b, n), min(c, n), min(warps, 4), 1) for n in (64, 32, 16)]
    return list(dict.fromkeys(out))


def _gemm(src, wk, bias, seg, shift: int, f_out: int, cfg: MixConfig, fallback: bool = False):
    B, T, F_red = src.shape
    out = torch.empty(B, T, f_out, device=src.device, dtype=src.dtype)
    src, wk = interpreter_operands(src, wk)
    args = (src, wk, bias if bias is not None else src, seg if seg is not None else src, out, T)
    flags = dict(F_RED=F_red, F_OUT=f_out, K=wk.shape[0], SHIFT=shift, HAS_BIAS=bias is not None,
                 HAS_R=seg is not None, PREC=_precision(src.dtype))
    tiles = _tiles(cfg.block_t, cfg.block_o, cfg.block_i, cfg.warps, cfg.stages, fallback)
    launch = first_fit(_mix_gemm, args, src.device, [dict(BLOCK_T=t, BLOCK_O=o, BLOCK_I=i, STAGES=s, num_warps=w,
                                                          **flags) for t, o, i, w, s in tiles])
    grid = (B * triton.cdiv(T, launch["BLOCK_T"]), triton.cdiv(f_out, launch["BLOCK_O"]))
    _mix_gemm[grid](*args, **launch)
    return out


def mix_forward(x, weight, bias, resets, config: MixConfig | None = None, fallback: bool = False):
    """y [B, T, F_out]. `fallback`: the config was picked, not forced: smaller tiles where the device
    cannot take its own (config=None is picked here, and falls back)."""
    B, T, F = x.shape
    fallback = fallback or config is None
    cfg = config or pick_mix(B, T, F, weight.shape[-1], x.device)
    return _gemm(x, weight.permute(2, 1, 0).contiguous(), bias, _segments(resets), -1, weight.shape[0], cfg, fallback)


def mix_backward(dy, x, weight, resets, config: MixConfig | None = None, fallback: bool = False):
    """(dx, dweight like weight, dbias [F_out], fp64 for fp32 dy, fp32 otherwise); `fallback` as
    mix_forward's."""
    B, T, F = x.shape
    F_out, F_in, K = weight.shape
    fallback = fallback or config is None
    cfg = config or pick_mix(B, T, F, K, x.device)
    dy = dy.contiguous()
    seg = _segments(resets)
    dx = _gemm(dy, weight.permute(2, 0, 1).contiguous(), None, seg, 1, F_in, cfg, fallback)
    dw = torch.empty_like(weight)
    x, dy = interpreter_operands(x, dy)
    tiles = _tiles(cfg.dw_block_o, cfg.dw_block_i, cfg.dw_block_t, cfg.dw_warps, cfg.dw_stages, fallback)
    flags = dict(F_IN=F_in, F_OUT=F_out, K=K, HAS_R=seg is not None, PREC=_precision(x.dtype))
    args = (x, dy, seg if seg is not None else x, dw, T)
    launch = first_fit(_mix_dw, args, x.device,
                       [dict(BLOCK_O=o, BLOCK_I=i, BLOCK_T=t, STAGES=s, num_warps=w, STEPS=B * triton.cdiv(T, t),
                             **flags) for o, i, t, w, s in tiles])
    grid = (K * triton.cdiv(F_out, launch["BLOCK_O"]) * triton.cdiv(F_in, launch["BLOCK_I"]),)
    _mix_dw[grid](*args, **launch)
    return dx, dw, dy.sum(dim=(0, 1), dtype=sum_dtype(dy.dtype))  # fp64 for fp32, as the depthwise kernel's
