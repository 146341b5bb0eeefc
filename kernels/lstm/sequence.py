"""The LSTM's Triton kernels and their launchers.

Layouts (unit-major gate columns, _host.cells.unit_major: column j*4 + g is gate g of unit j):
gx [B, T, 4H] the input projection plus bias; wt [H, 4H] the recurrent weights transposed (forward);
w [4H, H] the same weights untransposed (backward); ys [B, T+1, H] with the initial h in step 0
and h_t in step t + 1 (step t reads step t's row); cs [B, T+1, H] fp32 likewise for c; act
[B, T, 4H] the gates' pre-activations, from which the backward takes each gate and its derivative
(_jit.recurrent.sigmoid_and_grad: exact at saturation, where s (1 - s) of a stored s is not);
resets [B, T] uint8.

One program owns HB hidden units of BB batch rows. Each step it multiplies the whole previous h
(read from L2, written there by all programs of its batch group) by its slice of the weights on
tensor cores, applies the resets to the rows that restart there, finishes its units' gates, and
publishes its h slice; the group's programs then wait for each other (_jit.barrier.arrive/wait)
before the next step. The backward's product dG W (dG [BB, 4H], four times h) can be split over
the programs of a block of units, which then wait twice a step (see _lstm_bwd). A persistent
launch runs the whole sequence; a stepped launch runs one step (the kernel boundary is the
barrier): the CPU interpreter's path when units are split, and the fallback where a group's
programs could not all be resident."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .._host.device import resident_programs
from .._host.cells import precise
from .._host.dot import FP64, dot_f32
from .._jit.barrier import arrive, wait
from .._jit.recurrent import (dot, join4, keep_rows, sigmoid_and_grad, sigmoid_f32, split4, tanh_and_grad,
                               tanh_f32)
from .._host.cells import fit_limit, shared_bytes_for_types
from .config import LSTMConfig


# The recurrent products are sums over H (forward) or 4H (backward) terms. In fp32 they are taken in
# float64 (DOT_F32 FP64: sm_90's DMMA) and rounded once: an fp32 chain of fused multiply-adds rounds at
# every term, and the recurrence carries that into every later step. Issue 40's H200 sweeps: dh0 of
# an LSTM of 512 units at 1.3e-6 against eager's 4.5e-7 with one chain over 4H = 2048 terms; with
# the chains blocked in tiles, 3 of 63 saturated-gate cases still over 2x eager's error (ed3b805).
# bf16 and fp16 multiply on the tensor cores in their own type, summed in fp32: their operands'
# rounding is far larger than the sum's.
@triton.jit
def _weights(w_ptr, k0, cols, cols_ok, K, stride, ROWS: tl.constexpr):
    """Rows k0 .. k0 + ROWS of the recurrent weights (rows past K zero), this program's columns."""
    k = k0 + tl.arange(0, ROWS)
    return tl.load(w_ptr + k[:, None] * stride + cols[None, :], mask=(k[:, None] < K) & cols_ok[None, :], other=0.0)


@triton.jit
def _vector(row_ptr, row_ok, k0, K, COLS: tl.constexpr):
    """Columns k0 .. k0 + COLS of the [BB, K] rows at row_ptr, loaded past L1 (other SMs wrote them
    this step)."""
    k = k0 + tl.arange(0, COLS)
    return tl.load(row_ptr + k[None, :], mask=row_ok[:, None] & (k[None, :] < K), other=0.0, cache_modifier=".cg")


@triton.jit
def _rec(row_ptr, row_ok, w_ptr, w, cols, cols_ok, K, stride, BB: tl.constexpr, N: tl.constexpr,
         BK: tl.constexpr, KP: tl.constexpr, RESIDENT: tl.constexpr, DOT_F32: tl.constexpr):
    """The [BB, K] rows at row_ptr times the weights' rows 0 .. K at this program's N columns: [BB, N],
    float64 under FP64 (the caller rounds it), else fp32. RESIDENT: w holds the weights' rows 0 .. KP
    (_weights), else they are read in BK-row tiles."""
    acc = tl.zeros((BB, N), tl.float64 if DOT_F32 == 2 else tl.float32)
    if RESIDENT:
        acc = dot(_vector(row_ptr, row_ok, 0, K, KP), w, acc, DOT_F32)
    else:
        for k0 in range(0, KP, BK):
            acc = dot(_vector(row_ptr, row_ok, k0, K, BK), _weights(w_ptr, k0, cols, cols_ok, K, stride, BK), acc,
                      DOT_F32)
    return acc


@triton.jit
def _fwd_inputs(gx_ptr, rs_ptr, rows, row_ok, r64, n, m_n, t, T, H, has_resets):
    """What the forward's step t reads that no other program writes: its input projection (in gx's
    type) and the rows it resets (keep); nothing past the last step."""
    live = t < T
    return (tl.load(gx_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], mask=m_n & live, other=0.0),
            keep_rows(rs_ptr, rows, row_ok & live, t, T, has_resets)[:, None])


@triton.jit(do_not_specialize=["B", "T", "cs_steps", "t_lo", "n_steps", "has_resets", "save"])
def _lstm_fwd(gx_ptr, wt_ptr, ys_ptr, cs_ptr, act_ptr, cn_ptr, rs_ptr, cnt_ptr, B, T, H, cs_steps, t_lo, n_steps,
              has_resets, save, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr, HP: tl.constexpr,
              RESIDENT: tl.constexpr, SYNC: tl.constexpr, DOT_F32: tl.constexpr, PRECISE: tl.constexpr,
              PREFETCH: tl.constexpr):
    # PREFETCH: step t+1's inputs (_fwd_inputs) are loaded before step t's wait and product, so that
    # their latency overlaps them (after the wait's acquire, a load could not start before it)
    pid_h, pid_b, n_h = tl.program_id(0), tl.program_id(1), tl.num_programs(0)
    rows = pid_b * BB + tl.arange(0, BB)
    row_ok = rows < B
    r64 = rows.to(tl.int64)[:, None]
    u = pid_h * HB + tl.arange(0, HB)
    n = pid_h * 4 * HB + tl.arange(0, 4 * HB)
    m_u = row_ok[:, None] & (u[None, :] < H)
    n_ok = n < 4 * H
    m_n = row_ok[:, None] & n_ok[None, :]
    tanh_col = (tl.arange(0, 4 * HB) % 4 == 2)[None, :]  # gate 2 (the cell input) is a tanh
    w = 0
    if RESIDENT:
        w = _weights(wt_ptr, 0, n, n_ok, H, 4 * H, HP)
    c = tl.load(cs_ptr + r64 * cs_steps * H + t_lo * H + u[None, :], mask=m_u, other=0.0)
    ok = pid_h >= 0
    s = 0
    if PREFETCH:
        gx, keep = _fwd_inputs(gx_ptr, rs_ptr, rows, row_ok, r64, n, m_n, t_lo, T, H, has_resets)
    while s < n_steps:
        t = t_lo + s
        if PREFETCH:
            ahead = _fwd_inputs(gx_ptr, rs_ptr, rows, row_ok, r64, n, m_n, t + 1, T, H, has_resets)
        if SYNC:
            ok = wait(cnt_ptr + pid_b, n_h * s, ok)
        if not PREFETCH:
            keep = keep_rows(rs_ptr, rows, row_ok, t, T, has_resets)[:, None]
        acc = _rec(ys_ptr + r64 * (T + 1) * H + t * H, row_ok, wt_ptr, w, n, n_ok, H, 4 * H, BB, 4 * HB, BK, HP,
                   RESIDENT, DOT_F32).to(tl.float32)
        if not PREFETCH:  # read after the product: not live across it (H 2048's streamed weights)
            gx = tl.load(gx_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], mask=m_n, other=0.0)
        acc = acc * keep + gx
        act = tl.where(tanh_col, tanh_f32(acc, PRECISE), sigmoid_f32(acc, PRECISE))
        ig, fg, gg, og = split4(act, BB, HB)
        c = fg * c * keep + ig * gg
        h = tl.where(ok, og * tanh_f32(c, PRECISE), float("nan"))
        tl.store(ys_ptr + r64 * (T + 1) * H + (t + 1) * H + u[None, :], h.to(ys_ptr.dtype.element_ty), mask=m_u)
        tl.store(cs_ptr + r64 * cs_steps * H + (t + 1) * H + u[None, :], c, mask=m_u & (save != 0))
        tl.store(act_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], acc.to(act_ptr.dtype.element_ty),
                 mask=m_n & (save != 0))
        if SYNC:
            arrive(cnt_ptr + pid_b)
        s += 1
        if PREFETCH:
            gx, keep = ahead
    if t_lo + n_steps == T:
        tl.store(cn_ptr + r64 * H + u[None, :], c.to(cn_ptr.dtype.element_ty), mask=m_u)


@triton.jit
def _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64, u, n, m_u, m_n, t, T, H, has_resets):
    """What the backward's step t reads that no other program writes: the incoming gradient of h_t
    (dy_t, plus dh_T at the last step), the gates' pre-activations (in act's type), c before the
    step as stored (before a reset) and the rows it resets (keep); zeros (keep 1) at t = -1."""
    live = t >= 0
    dh = tl.load(dy_ptr + r64 * T * H + t * H + u[None, :], mask=m_u & live, other=0.0).to(tl.float32)
    dh += tl.load(dhn_ptr + r64 * H + u[None, :], mask=m_u & (t == T - 1), other=0.0).to(tl.float32)
    return (dh, tl.load(act_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], mask=m_n & live, other=0.0),
            tl.load(cs_ptr + r64 * (T + 1) * H + t * H + u[None, :], mask=m_u & live, other=0.0),
            keep_rows(rs_ptr, rows, row_ok & live, t, T, has_resets)[:, None])


@triton.jit(do_not_specialize=["B", "T", "t_hi", "n_steps", "has_resets"])
def _lstm_bwd(dy_ptr, dhn_ptr, w_ptr, act_ptr, cs_ptr, rs_ptr, dg_ptr, dcb_ptr, dh0_ptr, part_ptr, cnt_ptr, B, T,
              H, t_hi, n_steps, has_resets, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr,
              GP: tl.constexpr, RESIDENT: tl.constexpr, SYNC: tl.constexpr, FINAL: tl.constexpr,
              DOT_F32: tl.constexpr, PRECISE: tl.constexpr, SPLIT: tl.constexpr, PHASES: tl.constexpr,
              PREFETCH: tl.constexpr):
    """Steps t_hi, t_hi - 1, ... (n_steps of them) of the reverse scan; dcb holds dc between launches
    (dc_T on entry). FINAL: one step more, t = -1, which stores dh0 (and dc0 in dcb) from step 0's dG.

    Each step, dh_t = dG_{t+1} W is a product over all 4H gate columns. SPLIT 1: a program takes
    all of them for its HB units, reading the whole [BB, 4H] dG_{t+1} (at H 2048 each program 1 MB
    a step, the step's bound). SPLIT > 1: the SPLIT programs of a block of HB units each take
    GP / SPLIT of the columns, publish their partial products (part [B, SPLIT, H], as _rec's), wait for
    each other, and each sums, in order, the partials of its own HB / SPLIT units, whose gates it
    finishes. PHASES (stepped launches, where the kernel boundary is the wait): 1 the products
    only, 2 the gates only, 3 both. PREFETCH (with the gates): step t-1's inputs (_bwd_inputs) are
    loaded before step t's waits, and c after step t-1 carried to the step before it."""
    pid, pid_b, n_p = tl.program_id(0), tl.program_id(1), tl.num_programs(0)
    EU: tl.constexpr = HB // SPLIT  # units whose gates a program finishes
    KS: tl.constexpr = GP // SPLIT  # gate columns of a program's share of the product
    ROUNDS: tl.constexpr = 2 if SPLIT > 1 else 1  # waits a step
    rows = pid_b * BB + tl.arange(0, BB)
    row_ok = rows < B
    r64 = rows.to(tl.int64)[:, None]
    blk, k_part = pid // SPLIT, pid % SPLIT
    cols = blk * HB + tl.arange(0, HB)  # the product's units
    cols_ok = cols < H
    k_lo = k_part * KS
    k_n = tl.minimum(KS, 4 * H - k_lo)  # this share's columns (none past 4H)
    u = blk * HB + k_part * EU + tl.arange(0, EU)  # the units whose gates this program finishes
    u_ok = u < H
    m_u = row_ok[:, None] & u_ok[None, :]
    n = (blk * HB + k_part * EU) * 4 + tl.arange(0, 4 * EU)
    m_n = row_ok[:, None] & (n < 4 * H)[None, :]
    w = 0
    if RESIDENT:
        w = _weights(w_ptr + k_lo * H, 0, cols, cols_ok, k_n, H, KS)
    dc = tl.load(dcb_ptr + r64 * H + u[None, :], mask=m_u, other=0.0)
    ok = pid >= 0
    s = 0
    if PREFETCH:
        if PHASES >= 2:  # c after step t_hi, the resets of the step after it, step t_hi's inputs
            c_after = tl.load(cs_ptr + r64 * (T + 1) * H + (t_hi + 1) * H + u[None, :], mask=m_u, other=0.0)
            keep_after = keep_rows(rs_ptr, rows, row_ok & (t_hi + 1 < T), t_hi + 1, T, has_resets)[:, None]
            dyx, a, c_before, keep = _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64, u, n,
                                                 m_u, m_n, t_hi, T, H, has_resets)
    while s < n_steps + FINAL:
        t = t_hi - s
        if PREFETCH:
            if PHASES >= 2:
                ahead = _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64, u, n, m_u, m_n, t - 1,
                                    T, H, has_resets)
        if SYNC:
            ok = wait(cnt_ptr + pid_b, n_p * ROUNDS * s, ok)
        # from step t + 1 (nothing past the last step): its dG through the weights
        later = row_ok & (t + 1 < T)
        dh = tl.zeros((BB, EU), tl.float32)
        if PHASES % 2 == 1:
            dh = _rec(dg_ptr + r64 * T * 4 * H + (t + 1) * 4 * H + k_lo, later, w_ptr + k_lo * H, w, cols,
                      cols_ok, k_n, H, BB, HB, BK, KS, RESIDENT, DOT_F32)
            if SPLIT > 1:  # (float64 under FP64: the partials are summed before the one rounding)
                tl.store(part_ptr + (r64 * SPLIT + k_part) * H + cols[None, :], dh,
                         mask=row_ok[:, None] & cols_ok[None, :])
            dh = dh.to(tl.float32)
        if SPLIT > 1:
            if SYNC:
                arrive(cnt_ptr + pid_b)
                ok = wait(cnt_ptr + pid_b, n_p * ROUNDS * s + n_p, ok)
            if PHASES >= 2:
                j = tl.arange(0, SPLIT)[None, :, None]
                parts = tl.load(part_ptr + (r64[:, :, None] * SPLIT + j) * H + u[None, None, :],
                                mask=m_u[:, None, :], other=0.0, cache_modifier=".cg")
                dh = tl.sum(parts, axis=1).to(tl.float32)
        if PHASES >= 2:
            if not PREFETCH:
                keep_after = keep_rows(rs_ptr, rows, later, t + 1, T, has_resets)[:, None]
            dh = dh * keep_after
            if t >= 0:
                if not PREFETCH:
                    dyx, a, c_before, keep = _bwd_inputs(dy_ptr, dhn_ptr, act_ptr, cs_ptr, rs_ptr, rows, row_ok, r64,
                                                         u, n, m_u, m_n, t, T, H, has_resets)
                    c_after = tl.load(cs_ptr + r64 * (T + 1) * H + (t + 1) * H + u[None, :], mask=m_u, other=0.0)
                dh += dyx
                zi, zf, zg, zo = split4(a.to(tl.float32), BB, EU)
                ig, dig = sigmoid_and_grad(zi, PRECISE)
                fg, dfg = sigmoid_and_grad(zf, PRECISE)
                gg, dgg = tanh_and_grad(zg, PRECISE)
                og, dog = sigmoid_and_grad(zo, PRECISE)
                c_prev = c_before * keep
                tc, dtc = tanh_and_grad(c_after, PRECISE)
                dc += dh * og * dtc
                d = join4(dc * gg * dig, dc * c_prev * dfg, dc * ig * dgg, dh * tc * dog, BB, EU)
                d = tl.where(ok, d, float("nan"))
                tl.store(dg_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], d.to(dg_ptr.dtype.element_ty), mask=m_n)
                dc = dc * fg * keep
            else:
                tl.store(dh0_ptr + r64 * H + u[None, :], tl.where(ok, dh, float("nan")).to(dh0_ptr.dtype.element_ty),
                         mask=m_u)
        if SYNC:
            arrive(cnt_ptr + pid_b)
        s += 1
        if PREFETCH:
            if PHASES >= 2:
                c_after, keep_after = c_before, keep
                dyx, a, c_before, keep = ahead
    if PHASES >= 2:
        tl.store(dcb_ptr + r64 * H + u[None, :], dc, mask=m_u)


def _persistent(kernel, args: tuple, meta: dict, config: LSTMConfig, grid: tuple, device) -> bool:
    """Whether a grid whose programs wait for each other can run as one launch: on a GPU when all of
    its programs are resident at once; on the interpreter when each batch group is one program."""
    if not config.persistent:
        return False
    if device.type != "cuda":
        return grid[0] == 1
    meta = dict(meta)
    warps = meta.pop("num_warps")
    return resident_programs(kernel, args, meta, warps, device, strict=True) >= grid[0] * grid[1]


def _fwd_meta(config: LSTMConfig, H: int, dtype, device) -> dict:
    hp = max(16, triton.next_power_of_2(H))
    return dict(BB=config.bb, HB=config.hb, BK=min(config.bk, hp), HP=hp, RESIDENT=config.resident,
                DOT_F32=dot_f32(dtype, device, FP64), PRECISE=precise(dtype), PREFETCH=config.prefetch,
                num_warps=config.warps)


def _bwd_meta(config: LSTMConfig, H: int, dtype, device) -> dict:
    gp = max(16, triton.next_power_of_2(4 * H))
    ks = gp // config.split_bwd  # a program's share of the gate columns
    return dict(BB=config.bb, HB=config.hb_bwd, BK=min(config.bk_bwd or config.bk, ks), GP=gp,
                RESIDENT=config.resident_bwd, DOT_F32=dot_f32(dtype, device, FP64), PRECISE=precise(dtype),
                SPLIT=config.split_bwd, PREFETCH=config.prefetch_bwd, num_warps=config.warps_bwd or config.warps)


def _needs(config: LSTMConfig, dtype, H: int, device, limit: int) -> tuple[int, int]:
    """Shared memory (forward, backward) of the kernels' persistent variants: a program's tile of
    recurrent weights in the products' operand type where that alone is over `limit`, else what
    the compiled kernel needs."""
    f32, u8, i32 = torch.float32, torch.uint8, torch.int32
    wide = dot_f32(dtype, device, FP64) == FP64
    part = torch.float64 if wide else f32  # the backward's partial products
    size = 8 if wide else dtype.itemsize  # the operands' type in the products
    fwd, bwd = _fwd_meta(config, H, dtype, device), _bwd_meta(config, H, dtype, device)
    floor_fwd = (fwd["HP"] if config.resident else fwd["BK"]) * 4 * config.hb * size
    floor_bwd = (bwd["GP"] // bwd["SPLIT"] if config.resident_bwd else bwd["BK"]) * config.hb_bwd * size
    need_fwd = floor_fwd if floor_fwd > limit else shared_bytes_for_types(
        _lstm_fwd, (dtype, dtype, dtype, f32, dtype, dtype, u8, i32, 1, 1, H, 1, 1, 1, 1, 1), dict(fwd, SYNC=True),
        device)
    need_bwd = floor_bwd if floor_bwd > limit else shared_bytes_for_types(
        _lstm_bwd, (dtype, dtype, dtype, dtype, f32, u8, dtype, f32, dtype, part, i32, 1, 1, H, 1, 1, 1),
        dict(bwd, SYNC=True, FINAL=True, PHASES=3), device)
    return need_fwd, need_bwd


def shrink(c: LSTMConfig, fwd: bool = True, bwd: bool = True) -> LSTMConfig | None:
    """The next smaller config `fitted` tries, for the kernels named (those over the limit):
    thinner weight tiles (16 rows at least), then fewer units a program (both kernels); None past
    the smallest."""
    bk_bwd = c.bk_bwd or c.bk
    if fwd and c.bk > 16 or bwd and bk_bwd > 16:
        return replace(c, bk=max(16, c.bk // 2) if fwd else c.bk, bk_bwd=max(16, bk_bwd // 2) if bwd else bk_bwd)
    if c.hb > 4 or c.hb_bwd > 16:
        return replace(c, hb=max(4, c.hb // 2), hb_bwd=max(16, c.hb_bwd // 2), resident=False, resident_bwd=False,
                       split_bwd=1)
    return None


@functools.lru_cache(maxsize=None)  # a launch's check is then one lookup
def fitted(config: LSTMConfig, dtype, H: int, device, picked: bool) -> LSTMConfig:
    """The config to launch: `config` where the device's shared memory holds it; a picked one that
    does not (fp32 with many batch groups: a program's weight tile 64 x 4*hb; the H200's backward
    tiles of 256 rows at 128 units a program), with thinner weight tiles in the kernel that is
    over, then fewer units a program (more programs: the stepped launches where they cannot all be
    resident); ValueError naming the limit where none fits (a forced config is not changed)."""
    shares = max(16, triton.next_power_of_2(4 * H)) // 16  # a share of the gate columns is 16 at least
    if config.split_bwd not in [2 ** i for i in range(7)] or config.hb_bwd % config.split_bwd \
            or config.split_bwd > shares:
        raise ValueError(f"lstm: split_bwd must be a power of two that divides hb_bwd ({config.hb_bwd}) and is at "
                         f"most {shares} at H={H}; got {config.split_bwd}")
    limit = fit_limit(device)
    if limit is None:
        return config
    c = config
    while True:
        need_fwd, need_bwd = _needs(c, dtype, H, device, limit)
        if max(need_fwd, need_bwd) <= limit:
            return c
        if not picked or (c := shrink(c, need_fwd > limit, need_bwd > limit)) is None:
            raise ValueError(f"lstm: the config needs at least {max(need_fwd, need_bwd)} bytes of shared memory a "
                             f"program (H={H}, {str(dtype)[6:]}), more than the {limit} bytes this GPU allows")


def lstm_fwd(gx, wt, h0, c0, resets, save: bool, config: LSTMConfig):
    """(ys, cs, act, cn) for gx [B, T, 4H], wt [H, 4H]; cs and act only when `save` (the stepped path
    keeps cs whatever `save` says)."""
    B, T, G = gx.shape
    H = G // 4
    dev, dt = gx.device, gx.dtype
    ys = torch.empty(B, T + 1, H, device=dev, dtype=dt)
    ys[:, 0] = h0
    grid = (triton.cdiv(H, config.hb), triton.cdiv(B, config.bb))
    meta = _fwd_meta(config, H, dt, dev)
    rs = resets.view(torch.uint8) if resets is not None else ys
    cn = torch.empty(B, H, device=dev, dtype=dt)
    cnt = torch.zeros(grid[1], device=dev, dtype=torch.int32)
    stand_in = torch.empty(1, device=dev, dtype=torch.float32)  # cs, sized once the path is known
    flags = (int(resets is not None), int(save))
    probe = (gx, wt, ys, stand_in, ys, cn, rs, cnt, B, T, H, T + 1, 0, T) + flags
    persistent = _persistent(_lstm_fwd, probe, dict(meta, SYNC=True), config, grid, dev)
    save = save or not persistent
    steps = T + 1 if save else 1
    cs = torch.empty(B, steps, H, device=dev, dtype=torch.float32)
    cs[:, 0] = c0
    act = torch.empty(B, T, G, device=dev, dtype=dt) if save else ys
    args = (gx, wt, ys, cs, act, cn, rs, cnt, B, T, H, steps)
    if persistent:
        _lstm_fwd[grid](*args, 0, T, flags[0], int(save), SYNC=True, **meta)
    else:
        for t in range(T):
            _lstm_fwd[grid](*args, t, 1, flags[0], 1, SYNC=False, **meta)
    return ys, (cs if save else None), (act if save else None), cn


def lstm_bwd(dy, dhn, dcn, w, act, cs, resets, config: LSTMConfig):
    """(dG [B, T, 4H] the gate pre-activation gradients, dh0, dc0) of the reverse scan."""
    B, T, G = act.shape
    H = G // 4
    dev, dt = act.device, act.dtype
    dg = torch.empty(B, T, G, device=dev, dtype=dt)
    dcb = dcn.to(torch.float32, memory_format=torch.contiguous_format, copy=True)  # the kernel writes it: never dcn
    dh0 = torch.empty(B, H, device=dev, dtype=dt)
    split = config.split_bwd
    grid = (triton.cdiv(H, config.hb_bwd) * split, triton.cdiv(B, config.bb))
    meta = _bwd_meta(config, H, dt, dev)
    rs = resets.view(torch.uint8) if resets is not None else dg
    wide = torch.float64 if meta["DOT_F32"] == FP64 else torch.float32
    part = torch.empty(B, split, H, device=dev, dtype=wide) if split > 1 else dcb  # the partial products
    cnt = torch.zeros(grid[1], device=dev, dtype=torch.int32)
    args = (dy.contiguous(), dhn.contiguous(), w, act, cs, rs, dg, dcb, dh0, part, cnt, B, T, H)
    has_resets = int(resets is not None)
    if _persistent(_lstm_bwd, args + (T - 1, T, has_resets), dict(meta, SYNC=True, FINAL=True, PHASES=3), config,
                   grid, dev):
        _lstm_bwd[grid](*args, T - 1, T, has_resets, SYNC=True, FINAL=True, PHASES=3, **meta)
    else:  # a launch a step (two where the product is split: its partials, then the gates)
        phases = (1, 2) if split > 1 else (3,)
        for t in range(T - 1, -2, -1):
            for ph in phases:
                _lstm_bwd[grid](*args, t, int(t >= 0), has_resets, SYNC=False, FINAL=t < 0, PHASES=ph, **meta)
    return dg, dh0, dcb.to(dt)
