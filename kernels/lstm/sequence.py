"""The LSTM's Triton kernels and their launchers.

Layouts (unit-major gate columns, _host.cells.unit_major: column j*4 + g is gate g of unit j):
gx [B, T, 4H] the input projection plus bias; wt [H, 4H] the recurrent weights transposed (forward);
w [4H, H] the same weights untransposed (backward); ys [B, T+1, H] with the initial h in step 0
and h_t in step t + 1 (step t reads step t's row); cs [B, T+1, H] fp32 likewise for c; act
[B, T, 4H] the gate activations the backward reads; resets [B, T] uint8.

One program owns HB hidden units of BB batch rows. Each step it multiplies the whole previous h
(read from L2, written there by all programs of its batch group) by its slice of the weights on
tensor cores, applies the resets to the rows that restart there, finishes its units' gates, and
publishes its h slice; the group's programs then wait for each other (_jit.barrier.arrive/wait)
before the next step. A persistent launch runs the whole sequence; a stepped launch runs one step
(the kernel boundary is the barrier): the CPU interpreter's path when units are split, and the
fallback where a group's programs could not all be resident."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .._host.device import resident_programs
from .._host.cells import precise
from .._host.dot import dot_f32
from .._jit.barrier import arrive, wait
from .._jit.recurrent import dot, join4, keep_rows, sigmoid_f32, split4, tanh_f32
from .._host.cells import fit_limit, shared_bytes_for_types
from .config import LSTMConfig


@triton.jit
def _rec_fwd(hrow, wt_ptr, w, row_ok, n, n_ok, H, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr,
             HP: tl.constexpr, RESIDENT: tl.constexpr, DOT_F32: tl.constexpr):
    """h_prev @ W[:, this program's gate columns]: [BB, 4*HB] fp32. h rows at hrow (loaded past L1:
    other SMs wrote them this step)."""
    acc = tl.zeros((BB, 4 * HB), tl.float32)
    if RESIDENT:
        k = tl.arange(0, HP)
        h = tl.load(hrow + k[None, :], mask=row_ok[:, None] & (k[None, :] < H), other=0.0, cache_modifier=".cg")
        acc = dot(h, w, acc, DOT_F32)
    else:
        for k0 in range(0, HP, BK):
            k = k0 + tl.arange(0, BK)
            h = tl.load(hrow + k[None, :], mask=row_ok[:, None] & (k[None, :] < H), other=0.0,
                        cache_modifier=".cg")
            wk = tl.load(wt_ptr + k[:, None] * (4 * H) + n[None, :], mask=(k[:, None] < H) & n_ok[None, :],
                         other=0.0)
            acc = dot(h, wk, acc, DOT_F32)
    return acc


@triton.jit(do_not_specialize=["B", "T", "cs_steps", "t_lo", "n_steps", "has_resets", "save"])
def _lstm_fwd(gx_ptr, wt_ptr, ys_ptr, cs_ptr, act_ptr, cn_ptr, rs_ptr, cnt_ptr, B, T, H, cs_steps, t_lo, n_steps,
              has_resets, save, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr, HP: tl.constexpr,
              RESIDENT: tl.constexpr, SYNC: tl.constexpr, DOT_F32: tl.constexpr, PRECISE: tl.constexpr):
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
        k = tl.arange(0, HP)
        w = tl.load(wt_ptr + k[:, None] * (4 * H) + n[None, :], mask=(k[:, None] < H) & n_ok[None, :], other=0.0)
    c = tl.load(cs_ptr + r64 * cs_steps * H + t_lo * H + u[None, :], mask=m_u, other=0.0)
    ok = pid_h >= 0
    s = 0
    while s < n_steps:
        t = t_lo + s
        if SYNC:
            ok = wait(cnt_ptr + pid_b, n_h * s, ok)
        keep = keep_rows(rs_ptr, rows, row_ok, t, T, has_resets)[:, None]
        acc = _rec_fwd(ys_ptr + r64 * (T + 1) * H + t * H, wt_ptr, w, row_ok, n, n_ok, H, BB, HB, BK, HP, RESIDENT,
                       DOT_F32)
        acc = acc * keep + tl.load(gx_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], mask=m_n, other=0.0)
        act = tl.where(tanh_col, tanh_f32(acc, PRECISE), sigmoid_f32(acc, PRECISE))
        ig, fg, gg, og = split4(act, BB, HB)
        c = fg * c * keep + ig * gg
        h = tl.where(ok, og * tanh_f32(c, PRECISE), float("nan"))
        tl.store(ys_ptr + r64 * (T + 1) * H + (t + 1) * H + u[None, :], h.to(ys_ptr.dtype.element_ty), mask=m_u)
        tl.store(cs_ptr + r64 * cs_steps * H + (t + 1) * H + u[None, :], c, mask=m_u & (save != 0))
        tl.store(act_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=m_n & (save != 0))
        if SYNC:
            arrive(cnt_ptr + pid_b)
        s += 1
    if t_lo + n_steps == T:
        tl.store(cn_ptr + r64 * H + u[None, :], c.to(cn_ptr.dtype.element_ty), mask=m_u)


@triton.jit
def _rec_bwd(drow, w_ptr, w, mask_row, u, u_ok, H, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr,
             GP: tl.constexpr, RESIDENT: tl.constexpr, DOT_F32: tl.constexpr):
    """dG[step] @ W[:, this program's units]: [BB, HB] fp32, the gradient the step hands its h input."""
    acc = tl.zeros((BB, HB), tl.float32)
    if RESIDENT:
        k = tl.arange(0, GP)
        d = tl.load(drow + k[None, :], mask=mask_row[:, None] & (k[None, :] < 4 * H), other=0.0,
                    cache_modifier=".cg")
        acc = dot(d, w, acc, DOT_F32)
    else:
        for k0 in range(0, GP, BK):
            k = k0 + tl.arange(0, BK)
            d = tl.load(drow + k[None, :], mask=mask_row[:, None] & (k[None, :] < 4 * H), other=0.0,
                        cache_modifier=".cg")
            wk = tl.load(w_ptr + k[:, None] * H + u[None, :], mask=(k[:, None] < 4 * H) & u_ok[None, :], other=0.0)
            acc = dot(d, wk, acc, DOT_F32)
    return acc


@triton.jit(do_not_specialize=["B", "T", "t_hi", "n_steps", "has_resets"])
def _lstm_bwd(dy_ptr, dhn_ptr, w_ptr, act_ptr, cs_ptr, rs_ptr, dg_ptr, dcb_ptr, dh0_ptr, cnt_ptr, B, T, H, t_hi,
              n_steps, has_resets, BB: tl.constexpr, HB: tl.constexpr, BK: tl.constexpr, GP: tl.constexpr,
              RESIDENT: tl.constexpr, SYNC: tl.constexpr, FINAL: tl.constexpr, DOT_F32: tl.constexpr,
              PRECISE: tl.constexpr):
    """Steps t_hi, t_hi - 1, ... (n_steps of them) of the reverse scan; dcb holds dc between launches
    (dc_T on entry). FINAL: also dh0 (and dc0 in dcb) once step 0's dG is complete."""
    pid_h, pid_b, n_h = tl.program_id(0), tl.program_id(1), tl.num_programs(0)
    rows = pid_b * BB + tl.arange(0, BB)
    row_ok = rows < B
    r64 = rows.to(tl.int64)[:, None]
    u = pid_h * HB + tl.arange(0, HB)
    u_ok = u < H
    m_u = row_ok[:, None] & u_ok[None, :]
    n = pid_h * 4 * HB + tl.arange(0, 4 * HB)
    m_n = row_ok[:, None] & (n < 4 * H)[None, :]
    w = 0
    if RESIDENT:
        k = tl.arange(0, GP)
        w = tl.load(w_ptr + k[:, None] * H + u[None, :], mask=(k[:, None] < 4 * H) & u_ok[None, :], other=0.0)
    dc = tl.load(dcb_ptr + r64 * H + u[None, :], mask=m_u, other=0.0)
    ok = pid_h >= 0
    s = 0
    while s < n_steps:
        t = t_hi - s
        if SYNC:
            ok = wait(cnt_ptr + pid_b, n_h * s, ok)
        # from step t + 1 (nothing past the last step): its dG through the weights, cut where it restarted
        later = row_ok & (t + 1 < T)
        dh = _rec_bwd(dg_ptr + r64 * T * 4 * H + (t + 1) * 4 * H, w_ptr, w, later, u, u_ok, H, BB, HB, BK, GP,
                      RESIDENT, DOT_F32)
        dh = dh * keep_rows(rs_ptr, rows, later, t + 1, T, has_resets)[:, None]
        dh += tl.load(dy_ptr + r64 * T * H + t * H + u[None, :], mask=m_u, other=0.0).to(tl.float32)
        dh += tl.load(dhn_ptr + r64 * H + u[None, :], mask=m_u & (t == T - 1), other=0.0).to(tl.float32)
        ig, fg, gg, og = split4(tl.load(act_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], mask=m_n,
                                        other=0.0).to(tl.float32), BB, HB)
        keep = keep_rows(rs_ptr, rows, row_ok, t, T, has_resets)[:, None]
        c_prev = tl.load(cs_ptr + r64 * (T + 1) * H + t * H + u[None, :], mask=m_u, other=0.0) * keep
        tc = tanh_f32(tl.load(cs_ptr + r64 * (T + 1) * H + (t + 1) * H + u[None, :], mask=m_u, other=0.0), PRECISE)
        dc += dh * og * (1.0 - tc * tc)
        d = join4(dc * gg * ig * (1.0 - ig), dc * c_prev * fg * (1.0 - fg), dc * ig * (1.0 - gg * gg),
                  dh * tc * og * (1.0 - og), BB, HB)
        d = tl.where(ok, d, float("nan"))
        tl.store(dg_ptr + r64 * T * 4 * H + t * 4 * H + n[None, :], d.to(dg_ptr.dtype.element_ty), mask=m_n)
        dc = dc * fg * keep
        if SYNC:
            arrive(cnt_ptr + pid_b)
        s += 1
    if FINAL:
        if SYNC:
            ok = wait(cnt_ptr + pid_b, n_h * n_steps, ok)
        dh0 = _rec_bwd(dg_ptr + r64 * T * 4 * H, w_ptr, w, row_ok, u, u_ok, H, BB, HB, BK, GP, RESIDENT, DOT_F32)
        dh0 = dh0 * keep_rows(rs_ptr, rows, row_ok, 0, T, has_resets)[:, None]
        tl.store(dh0_ptr + r64 * H + u[None, :], tl.where(ok, dh0, float("nan")).to(dh0_ptr.dtype.element_ty),
                 mask=m_u)
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
                DOT_F32=dot_f32(dtype, device), PRECISE=precise(dtype), num_warps=config.warps)


def _bwd_meta(config: LSTMConfig, H: int, dtype, device) -> dict:
    gp = max(16, triton.next_power_of_2(4 * H))
    return dict(BB=config.bb, HB=config.hb_bwd, BK=min(config.bk_bwd or config.bk, gp), GP=gp,
                RESIDENT=config.resident_bwd, DOT_F32=dot_f32(dtype, device), PRECISE=precise(dtype),
                num_warps=config.warps_bwd or config.warps)


def _shared(config: LSTMConfig, dtype, H: int, device) -> int:
    """The shared memory of the forward and the backward kernel (persistent variants), the larger."""
    f32, u8, i32 = torch.float32, torch.uint8, torch.int32
    fwd = (dtype, dtype, dtype, f32, dtype, dtype, u8, i32, 1, 1, H, 1, 1, 1, 1, 1)
    bwd = (dtype, dtype, dtype, dtype, f32, u8, dtype, f32, dtype, i32, 1, 1, H, 1, 1, 1)
    return max(shared_bytes_for_types(_lstm_fwd, fwd, dict(_fwd_meta(config, H, dtype, device), SYNC=True), device),
               shared_bytes_for_types(_lstm_bwd, bwd, dict(_bwd_meta(config, H, dtype, device), SYNC=True, FINAL=True), device))


def _floor(config: LSTMConfig, dtype, H: int, device) -> int:
    """Shared memory the kernels need at least: a program's tile of recurrent weights, which the
    products stage there, in their operand type (what fits under it is compiled to be sure)."""
    size = 4 if dot_f32(dtype, device) else dtype.itemsize
    fwd, bwd = _fwd_meta(config, H, dtype, device), _bwd_meta(config, H, dtype, device)
    rows_fwd = fwd["HP"] if config.resident else fwd["BK"]
    rows_bwd = bwd["GP"] if config.resident_bwd else bwd["BK"]
    return max(rows_fwd * 4 * config.hb, rows_bwd * config.hb_bwd) * size


def shrink(c: LSTMConfig) -> LSTMConfig | None:
    """The next smaller config `fitted` tries: thinner weight tiles (both kernels' halved together,
    16 rows at least), then fewer units a program; None past the smallest."""
    if max(c.bk, c.bk_bwd) > 16:
        return replace(c, bk=max(16, c.bk // 2), bk_bwd=max(16, c.bk_bwd // 2) if c.bk_bwd else 0)
    if c.hb > 4 or c.hb_bwd > 16:
        return replace(c, hb=max(4, c.hb // 2), hb_bwd=max(16, c.hb_bwd // 2), resident=False, resident_bwd=False)
    return None


@functools.lru_cache(maxsize=None)  # a launch's check is then one lookup
def fitted(config: LSTMConfig, dtype, H: int, device, picked: bool) -> LSTMConfig:
    """The config to launch: `config` where the device's shared memory holds it; a picked one that
    does not (fp32 with many batch groups: a program's weight tile 64 x 4*hb), with thinner weight
    tiles, then fewer units a program (more programs: the stepped launches where they cannot all be
    resident); ValueError naming the limit where none fits (a forced config is not changed)."""
    limit = fit_limit(device)
    if limit is None:
        return config
    candidates, c = [config], config
    while picked and (c := shrink(c)) is not None:
        candidates.append(c)
    for c in candidates:
        need = _floor(c, dtype, H, device)
        need = need if need > limit else _shared(c, dtype, H, device)
        if need <= limit:
            return c
    raise ValueError(f"lstm: the config needs at least {need} bytes of shared memory a program (H={H}, "
                     f"{str(dtype)[6:]}), "
                     f"more than the {limit} bytes this GPU allows")


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
    grid = (triton.cdiv(H, config.hb_bwd), triton.cdiv(B, config.bb))
    meta = _bwd_meta(config, H, dt, dev)
    rs = resets.view(torch.uint8) if resets is not None else dg
    cnt = torch.zeros(grid[1], device=dev, dtype=torch.int32)
    args = (dy.contiguous(), dhn.contiguous(), w, act, cs, rs, dg, dcb, dh0, cnt, B, T, H)
    has_resets = int(resets is not None)
    if _persistent(_lstm_bwd, args + (T - 1, T, has_resets), dict(meta, SYNC=True, FINAL=True), config, grid, dev):
        _lstm_bwd[grid](*args, T - 1, T, has_resets, SYNC=True, FINAL=True, **meta)
    else:
        for t in range(T - 1, -1, -1):
            _lstm_bwd[grid](*args, t, 1, has_resets, SYNC=False, FINAL=False, **meta)
        _lstm_bwd[grid](*args, -1, 0, has_resets, SYNC=False, FINAL=True, **meta)
    return dg, dh0, dcb.to(dt)
