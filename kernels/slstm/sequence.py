"""The sLSTM's Triton kernels and their launchers.

Layouts: wx [B, T, 4, NH, DH] the feed-forward pre-activations (gates i, f, z, o); r [4, NH, DH, DH]
the recurrent blocks (gate, head, out, in); b [4, NH, DH]; states [4, B, NH, DH] (y, c, n, m); ys
[B, T+1, NH, DH] with y0 in step 0; cs, ns, ms [B, T+1, NH, DH] fp32 (c, n, m after each step, the
initial ones in step 0); raw [B, T, 4, NH, DH] fp32 the gate pre-activations; resets [B, T] uint8.

One program runs one head for BB batch rows over the whole sequence: its y stays in registers, the
recurrent product is four [BB, DH] x [DH, DH] tensor-core products a step. The backward runs the
same way in reverse and carries the stabiliser's gradient too: y depends on m only through the 1e-6
of its normaliser, but the final states c_T and n_T are stabilised by m_T."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .._host.cells import precise
from .._host.dot import FP64, TF32X3, dot_f32
from .._jit.recurrent import (div_f32, dot, exp_f32, keep_rows, logsigmoid_f32, sigmoid_f32, sigmoid_grad_f32, tanh_f32,
                               tanh_grad_f32)
from .._host.cells import fit_limit, shared_bytes_for_types
from .config import SLSTMConfig

EPS = 1e-6  # Cortex's: y = o * c / (n + eps)


@triton.jit
def _block(r_ptr, g, h, NH, DH, u, k, TRANS: tl.constexpr):
    """Recurrent block (g, h) as [in, out] (TRANS, the forward's right operand) or [out, in]."""
    base = r_ptr + (g * NH + h) * DH * DH
    mask = (u < DH)[:, None] & (k < DH)[None, :]
    if TRANS:
        return tl.load(base + u[:, None] + k[None, :] * DH, mask=mask, other=0.0)  # [in=u, out=k]: R[k, u]
    else:
        return tl.load(base + u[:, None] * DH + k[None, :], mask=mask, other=0.0)


@triton.jit
def _product(a, w, r_ptr, g, h, NH, DH, u, acc, TRANS: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + a @ (recurrent block g): w itself, or with SPLIT the block read here, so that one block
    at a time sits in shared memory (the four at once do not fit past 64-wide fp32 heads, 128-wide bf16).
    fp32 (DOT_F32 2): acc and the result in float64, which the caller rounds once."""
    if SPLIT:
        w = _block(r_ptr, g, h, NH, DH, u, u, TRANS)
    if DOT_F32 == 2:
        acc = acc.to(tl.float64)
    return dot(a, w, acc, DOT_F32)


@triton.jit
def _program(B, NH, DH, BB: tl.constexpr, DP: tl.constexpr):
    """(head h, rows, row_ok, units u, the [BB, DP] mask, int64 rows [BB, 1], the [B, NH, DH] index of
    the program's states, the size of one state plane) of a program: one head, BB batch rows."""
    h, pid_b = tl.program_id(0), tl.program_id(1)
    rows = pid_b * BB + tl.arange(0, BB)
    row_ok = rows < B
    u = tl.arange(0, DP)
    r64 = rows.to(tl.int64)[:, None]
    return h, rows, row_ok, u, row_ok[:, None] & (u < DH)[None, :], r64, (r64 * NH + h) * DH + u[None, :], B * NH * DH


@triton.jit
def _gates(rawi, rawf, rawz, rawo, m_prev, first, PRECISE: tl.constexpr):
    """(ig, fg, zt, og, m_new, sigmoid(-f)) of a step: exponential input and forget gates stabilised by
    m (the first step of a row, n = 0, takes m = the input gate)."""
    logfm = m_prev + logsigmoid_f32(rawf, PRECISE)
    m_new = tl.where(first, rawi, tl.maximum(rawi, logfm))
    ig = tl.minimum(exp_f32(rawi - m_new, PRECISE), 1.0)
    fg = tl.minimum(exp_f32(logfm - m_new, PRECISE), 1.0)
    return (ig, fg, tanh_f32(rawz, PRECISE), sigmoid_f32(rawo, PRECISE), m_new, sigmoid_f32(-rawf, PRECISE))


@triton.jit
def _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t, T, NH, DH, has_resets):
    """What the forward's step t reads that does not depend on the recurrence: its four gate inputs
    (in wx's type, converted where used) and the rows it resets (keep); nothing past the last step."""
    live = m2 & (t < T)
    gx = wx_ptr + (((r64 * T + t) * 4) * NH + h) * DH + u[None, :]  # gate g at + g * NH * DH
    return (tl.load(gx, mask=live, other=0.0), tl.load(gx + NH * DH, mask=live, other=0.0),
            tl.load(gx + 2 * NH * DH, mask=live, other=0.0), tl.load(gx + 3 * NH * DH, mask=live, other=0.0),
            keep_rows(rs_ptr, rows, row_ok & (t < T), t, T, has_resets)[:, None])


@triton.jit(do_not_specialize=["B", "T", "NH", "has_resets", "save"])
def _slstm_fwd(wx_ptr, r_ptr, b_ptr, st_ptr, ys_ptr, cs_ptr, ns_ptr, ms_ptr, raw_ptr, last_ptr, rs_ptr, B, T, NH, DH,
               has_resets, save, BB: tl.constexpr, DP: tl.constexpr, RESIDENT: tl.constexpr, SPLIT: tl.constexpr,
               DOT_F32: tl.constexpr, EPS: tl.constexpr, PRECISE: tl.constexpr, PREFETCH: tl.constexpr):
    # PREFETCH: step t+1's inputs (_inputs) are loaded before step t's products, so that their latency
    # overlaps this step's work (a `while` loop is not pipelined by Triton; the backward does the same)
    h, rows, row_ok, u, m2, r64, sidx, plane = _program(B, NH, DH, BB, DP)
    y = tl.load(st_ptr + sidx, mask=m2, other=0.0).to(tl.float32)
    c = tl.load(st_ptr + plane + sidx, mask=m2, other=0.0).to(tl.float32)
    n = tl.load(st_ptr + 2 * plane + sidx, mask=m2, other=0.0).to(tl.float32)
    m = tl.load(st_ptr + 3 * plane + sidx, mask=m2, other=0.0).to(tl.float32)
    bias = b_ptr + h * DH + u
    bi = tl.load(bias, mask=u < DH, other=0.0).to(tl.float32)[None, :]
    bf = tl.load(bias + NH * DH, mask=u < DH, other=0.0).to(tl.float32)[None, :]
    bz = tl.load(bias + 2 * NH * DH, mask=u < DH, other=0.0).to(tl.float32)[None, :]
    bo = tl.load(bias + 3 * NH * DH, mask=u < DH, other=0.0).to(tl.float32)[None, :]
    ri, rf, rz, ro = 0, 0, 0, 0
    if RESIDENT:
        ri, rf = _block(r_ptr, 0, h, NH, DH, u, u, True), _block(r_ptr, 1, h, NH, DH, u, u, True)
        rz, ro = _block(r_ptr, 2, h, NH, DH, u, u, True), _block(r_ptr, 3, h, NH, DH, u, u, True)
    t = 0
    xi, xf, xz, xo, keep = _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t, T, NH, DH, has_resets)
    while t < T:
        if PREFETCH:
            ahead = _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t + 1, T, NH, DH, has_resets)
        y, c, n, m = y * keep, c * keep, n * keep, m * keep
        if RESIDENT:
            wi, wf, wz, wo = ri, rf, rz, ro
        elif SPLIT:
            wi, wf, wz, wo = 0, 0, 0, 0  # read by _product, one at a time
        else:
            wi, wf = _block(r_ptr, 0, h, NH, DH, u, u, True), _block(r_ptr, 1, h, NH, DH, u, u, True)
            wz, wo = _block(r_ptr, 2, h, NH, DH, u, u, True), _block(r_ptr, 3, h, NH, DH, u, u, True)
        yd = y.to(ys_ptr.dtype.element_ty)
        rawi = _product(yd, wi, r_ptr, 0, h, NH, DH, u, xi.to(tl.float32) + bi, True, SPLIT, DOT_F32).to(tl.float32)
        rawf = _product(yd, wf, r_ptr, 1, h, NH, DH, u, xf.to(tl.float32) + bf, True, SPLIT, DOT_F32).to(tl.float32)
        rawz = _product(yd, wz, r_ptr, 2, h, NH, DH, u, xz.to(tl.float32) + bz, True, SPLIT, DOT_F32).to(tl.float32)
        rawo = _product(yd, wo, r_ptr, 3, h, NH, DH, u, xo.to(tl.float32) + bo, True, SPLIT, DOT_F32).to(tl.float32)
        ig, fg, zt, og, m, _ = _gates(rawi, rawf, rawz, rawo, m, n == 0.0, PRECISE)
        c = fg * c + ig * zt
        n = fg * n + ig
        y = og * div_f32(c, n + EPS, PRECISE)
        step = (r64 * (T + 1) + t + 1) * NH * DH + h * DH + u[None, :]  # [B, T+1, NH, DH] at t + 1
        tl.store(ys_ptr + step, y.to(ys_ptr.dtype.element_ty), mask=m2)
        ms2 = m2 & (save != 0)
        tl.store(cs_ptr + step, c, mask=ms2)
        tl.store(ns_ptr + step, n, mask=ms2)
        tl.store(ms_ptr + step, m, mask=ms2)
        rw = raw_ptr + (((r64 * T + t) * 4) * NH + h) * DH + u[None, :]
        tl.store(rw, rawi, mask=ms2)
        tl.store(rw + NH * DH, rawf, mask=ms2)
        tl.store(rw + 2 * NH * DH, rawz, mask=ms2)
        tl.store(rw + 3 * NH * DH, rawo, mask=ms2)
        t += 1
        if PREFETCH:
            xi, xf, xz, xo, keep = ahead
        else:
            xi, xf, xz, xo, keep = _inputs(wx_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t, T, NH, DH, has_resets)
    tl.store(last_ptr + sidx, c.to(last_ptr.dtype.element_ty), mask=m2)
    tl.store(last_ptr + plane + sidx, n.to(last_ptr.dtype.element_ty), mask=m2)
    tl.store(last_ptr + 2 * plane + sidx, m.to(last_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t, T, NH, DH, has_resets):
    """What the backward's step t reads that does not depend on the recurrence: its incoming dy, its
    four gate pre-activations, the states before it (c, n, m as stored: before a reset) and the rows
    it resets (keep); zeros (keep 1) at t = -1."""
    live = m2 & (t >= 0)
    dy = tl.load(dy_ptr + ((r64 * T + t) * NH + h) * DH + u[None, :], mask=live, other=0.0).to(tl.float32)
    rw = raw_ptr + (((r64 * T + t) * 4) * NH + h) * DH + u[None, :]
    prev = (r64 * (T + 1) + t) * NH * DH + h * DH + u[None, :]
    return (dy, tl.load(rw, mask=live, other=0.0), tl.load(rw + NH * DH, mask=live, other=0.0),
            tl.load(rw + 2 * NH * DH, mask=live, other=0.0), tl.load(rw + 3 * NH * DH, mask=live, other=0.0),
            tl.load(cs_ptr + prev, mask=live, other=0.0), tl.load(ns_ptr + prev, mask=live, other=0.0),
            tl.load(ms_ptr + prev, mask=live, other=0.0),
            keep_rows(rs_ptr, rows, row_ok & (t >= 0), t, T, has_resets)[:, None])


@triton.jit(do_not_specialize=["B", "T", "NH", "has_resets"])
def _slstm_bwd(dy_ptr, dlast_ptr, r_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, dwx_ptr, dst_ptr, B, T, NH, DH,
               has_resets, BB: tl.constexpr, DP: tl.constexpr, RESIDENT: tl.constexpr, SPLIT: tl.constexpr,
               DOT_F32: tl.constexpr, EPS: tl.constexpr, PRECISE: tl.constexpr, PREFETCH: tl.constexpr):
    # PREFETCH: step t-1's inputs (_saved) are loaded before step t's products, so that their latency
    # overlaps this step's work instead of starting the next one (a `while` loop is not pipelined by
    # Triton); c and n after step t-1 are step t's states before it, carried rather than re-read.
    h, rows, row_ok, u, m2, r64, sidx, plane = _program(B, NH, DH, BB, DP)
    dc = tl.load(dlast_ptr + sidx, mask=m2, other=0.0).to(tl.float32)
    dn = tl.load(dlast_ptr + plane + sidx, mask=m2, other=0.0).to(tl.float32)
    dyr = tl.zeros((BB, DP), tl.float32)
    dm = tl.zeros((BB, DP), tl.float32)
    ri, rf, rz, ro = 0, 0, 0, 0
    if RESIDENT:
        ri, rf = _block(r_ptr, 0, h, NH, DH, u, u, False), _block(r_ptr, 1, h, NH, DH, u, u, False)
        rz, ro = _block(r_ptr, 2, h, NH, DH, u, u, False), _block(r_ptr, 3, h, NH, DH, u, u, False)
    t = T - 1
    last = (r64 * (T + 1) + T) * NH * DH + h * DH + u[None, :]
    c, n = tl.load(cs_ptr + last, mask=m2, other=0.0), tl.load(ns_ptr + last, mask=m2, other=0.0)
    dyx, rawi, rawf, rawz, rawo, cp, np_, mp, keep = _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, rows,
                                                            row_ok, r64, h, u, m2, t, T, NH, DH, has_resets)
    while t >= 0:
        if PREFETCH:
            ahead = _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr, rows, row_ok, r64, h, u, m2, t - 1, T, NH,
                           DH, has_resets)
        dy = dyr + dyx
        c_prev, n_prev, m_prev = cp * keep, np_ * keep, mp * keep
        first = n_prev == 0.0
        ig, fg, zt, og, _, sig_nf = _gates(rawi, rawf, rawz, rawo, m_prev, first, PRECISE)
        if PRECISE:  # with their derivatives from the pre-activations (_gates' zt and og then go unused)
            zt, dzt = tanh_grad_f32(rawz)
            og, dog = sigmoid_grad_f32(rawo)
        nd = n + EPS
        y_c = div_f32(og, nd, PRECISE)  # dy / dc
        dc += dy * y_c
        dn -= dy * y_c * div_f32(c, nd, PRECISE)
        dig = (dc * zt + dn) * ig  # through exp(i - m')
        dlogfm = (dc * c_prev + dn * n_prev) * fg  # through exp(f' + m - m')
        dm -= dig + dlogfm  # m' = i (first step, or i the larger) or f' + m
        i_wins = first | (rawi >= m_prev + logsigmoid_f32(rawf, PRECISE))
        di = dig + tl.where(i_wins, dm, 0.0)
        dlogfm += tl.where(i_wins, 0.0, dm)
        df = dlogfm * sig_nf
        dm = dlogfm * keep
        if PRECISE:
            dz = dc * ig * dzt
            do = dy * div_f32(c, nd, PRECISE) * dog
        else:
            dz = dc * ig * (1.0 - zt * zt)
            do = dy * div_f32(c, nd, PRECISE) * og * (1.0 - og)
        dw = dwx_ptr + (((r64 * T + t) * 4) * NH + h) * DH + u[None, :]
        ty = dwx_ptr.dtype.element_ty
        tl.store(dw, di.to(ty), mask=m2)
        tl.store(dw + NH * DH, df.to(ty), mask=m2)
        tl.store(dw + 2 * NH * DH, dz.to(ty), mask=m2)
        tl.store(dw + 3 * NH * DH, do.to(ty), mask=m2)
        dc, dn = dc * fg * keep, dn * fg * keep
        if RESIDENT:
            wi, wf, wz, wo = ri, rf, rz, ro
        elif SPLIT:
            wi, wf, wz, wo = 0, 0, 0, 0  # read by _product, one at a time
        else:
            wi, wf = _block(r_ptr, 0, h, NH, DH, u, u, False), _block(r_ptr, 1, h, NH, DH, u, u, False)
            wz, wo = _block(r_ptr, 2, h, NH, DH, u, u, False), _block(r_ptr, 3, h, NH, DH, u, u, False)
        dyr = _product(di.to(ty), wi, r_ptr, 0, h, NH, DH, u, tl.zeros((BB, DP), tl.float32), False, SPLIT, DOT_F32)
        dyr = _product(df.to(ty), wf, r_ptr, 1, h, NH, DH, u, dyr, False, SPLIT, DOT_F32)
        dyr = _product(dz.to(ty), wz, r_ptr, 2, h, NH, DH, u, dyr, False, SPLIT, DOT_F32)
        dyr = _product(do.to(ty), wo, r_ptr, 3, h, NH, DH, u, dyr, False, SPLIT, DOT_F32).to(tl.float32) * keep
        c, n = cp, np_  # after step t-1: the states before step t, as stored (before a reset)
        t -= 1
        if PREFETCH:
            dyx, rawi, rawf, rawz, rawo, cp, np_, mp, keep = ahead
        else:
            dyx, rawi, rawf, rawz, rawo, cp, np_, mp, keep = _saved(dy_ptr, raw_ptr, cs_ptr, ns_ptr, ms_ptr, rs_ptr,
                                                                    rows, row_ok, r64, h, u, m2, t, T, NH, DH,
                                                                    has_resets)
    ty = dst_ptr.dtype.element_ty
    tl.store(dst_ptr + sidx, dyr.to(ty), mask=m2)
    tl.store(dst_ptr + plane + sidx, dc.to(ty), mask=m2)
    tl.store(dst_ptr + 2 * plane + sidx, dn.to(ty), mask=m2)
    tl.store(dst_ptr + 3 * plane + sidx, dm.to(ty), mask=m2)


# fp32 heads up to this wide: the forward's products in TF32x3, not float64. On an H200 (runs at
# da9980e and the code before it, A/B/A): float64 products made the fp32 forward 12-21% slower at
# DH 64 for no smaller error (max 9.7e-8 against 9.2e-8), and 19% faster at DH 128 (the re-read path,
# whose TF32x3 products spill: 12 KB of stack against 5 KB); the backward was 1-22% faster in
# float64 at every shape, its max error 2.2e-7 -> 1.3e-7
FWD_TF32X3_UP_TO = 64


def _meta(B, NH, DH, dtype, device, config: SLSTMConfig, warps: int, forward: bool) -> tuple[tuple, dict]:
    grid = (NH, triton.cdiv(B, config.bb))
    dp = max(16, triton.next_power_of_2(DH))
    mode = TF32X3 if forward and dp <= FWD_TF32X3_UP_TO else FP64
    return grid, dict(BB=config.bb, DP=dp, RESIDENT=config.resident, SPLIT=config.split and not config.resident,
                      DOT_F32=dot_f32(dtype, device, mode), EPS=EPS, PRECISE=precise(dtype), num_warps=warps)


def _shared(config: SLSTMConfig, dtype, DH: int, device) -> int:
    """The shared memory of the forward and the backward kernel, the larger (their arguments as
    the launchers pass them: states and gate pre-activations fp32, resets uint8)."""
    f32, u8 = torch.float32, torch.uint8
    fwd = (dtype, dtype, dtype, dtype, dtype, f32, f32, f32, f32, dtype, u8, 1, 1, 1, DH, 1, 1)
    bwd = (dtype, dtype, dtype, f32, f32, f32, f32, u8, dtype, dtype, 1, 1, 1, DH, 1)
    return max(shared_bytes_for_types(_slstm_fwd, fwd, {**_meta(1, 1, DH, dtype, device, config, config.warps, True)[1],
                                                         "PREFETCH": config.prefetch}, device),
               shared_bytes_for_types(_slstm_bwd, bwd, {**_meta(1, 1, DH, dtype, device, config, config.warps_bwd, False)[1],
                                                         "PREFETCH": config.prefetch_bwd}, device))


def _floor(config: SLSTMConfig, dtype, DH: int, device) -> int:
    """Shared memory the kernels need at least: the recurrent blocks their products stage there at once
    (four, one with split), in the products' operand type (every compile measured so far is above
    it). What fits under it is compiled to be sure; what does not is not (a 256-wide fp32 head
    compiles for minutes)."""
    dp = max(16, triton.next_power_of_2(DH))
    size = 8 if dot_f32(dtype, device, FP64) else dtype.itemsize
    return (1 if config.split and not config.resident else 4) * dp * dp * size


@functools.lru_cache(maxsize=None)  # a launch's check is then one lookup
def fitted(config: SLSTMConfig, dtype, DH: int, device, picked: bool) -> SLSTMConfig:
    """The config to launch: `config` where the device's shared memory holds it; a picked one that
    does not, with its weights re-read one gate's block at a time (fp32 heads past 64, bf16 past 128);
    ValueError naming the limit where neither fits (a forced config is not changed)."""
    limit = fit_limit(device)
    if limit is None:
        return config
    split = replace(config, resident=False, split=True, prefetch=False, prefetch_bwd=False)  # re-read: as pick's
    candidates = [config] + ([split] if picked and not config.split else [])
    for c in candidates:
        need = _floor(c, dtype, DH, device)
        need = need if need > limit else _shared(c, dtype, DH, device)
        if need <= limit:
            return c
    raise ValueError(f"slstm: heads of DH={DH} in {str(dtype)[6:]} need at least {need} bytes of shared memory a "
                     f"program ({'the config given' if not picked else 'one gate block at a time'}), more than the "
                     f"{limit} bytes this GPU allows")


def slstm_fwd(wx, r, b, states, resets, save: bool, config: SLSTMConfig):
    """(ys, (cs, ns, ms, raw) or None, last [3, B, NH, DH]: c_T, n_T, m_T)."""
    B, T, _, NH, DH = wx.shape
    dev, dt = wx.device, wx.dtype
    ys = torch.empty(B, T + 1, NH, DH, device=dev, dtype=dt)
    ys[:, 0] = states[0]
    last = torch.empty(3, B, NH, DH, device=dev, dtype=dt)
    if save:
        cs, ns, ms = (torch.empty(B, T + 1, NH, DH, device=dev, dtype=torch.float32) for _ in range(3))
        cs[:, 0], ns[:, 0], ms[:, 0] = states[1], states[2], states[3]
        raw = torch.empty(B, T, 4, NH, DH, device=dev, dtype=torch.float32)
    else:
        cs = ns = ms = raw = last
    rs = resets.view(torch.uint8) if resets is not None else ys
    grid, meta = _meta(B, NH, DH, dt, dev, config, config.warps, True)
    _slstm_fwd[grid](wx, r, b, states, ys, cs, ns, ms, raw, last, rs, B, T, NH, DH, int(resets is not None), int(save),
                     PREFETCH=config.prefetch, **meta)
    return ys, ((cs, ns, ms, raw) if save else None), last


def slstm_bwd(dy, dlast, r, saved, resets, config: SLSTMConfig):
    """(dwx [B, T, 4, NH, DH], [4, B, NH, DH]: dy0, dc0, dn0, dm0)."""
    cs, ns, ms, raw = saved
    B, T, _, NH, DH = raw.shape
    dev, dt = r.device, r.dtype
    dwx = torch.empty(B, T, 4, NH, DH, device=dev, dtype=dt)
    dst = torch.empty(4, B, NH, DH, device=dev, dtype=dt)
    rs = resets.view(torch.uint8) if resets is not None else dwx
    grid, meta = _meta(B, NH, DH, dt, dev, config, config.warps_bwd, False)
    _slstm_bwd[grid](dy.contiguous(), dlast.contiguous(), r, raw, cs, ns, ms, rs, dwx, dst, B, T, NH, DH,
                     int(resets is not None), PREFETCH=config.prefetch_bwd, **meta)
    return dwx, dst
