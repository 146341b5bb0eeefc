"""Mamba-1's selective scan in Triton, forward and backward. Per sequence, channel d and state n:

    dt_t = softplus(delta_t[d])
    h_t[d, n] = exp(dt_t A[d, n]) h_{t-1}[d, n] + dt_t B_t[n] x_t[d]          (h_0 = 0, fp32)
    y_t[d] = (sum_n C_t[n] h_t[d, n] + D[d] x_t[d]) * silu(z_t[d])

Each chunk of time is one tl.associative_scan of (decay, input) pairs over a [chunk, block_d, N]
tile, the state carried from chunk to chunk in registers. The backward walks the chunks from the
last: it recomputes h_{t-1} from the state the forward kept at the chunk before (a scan of the
steps shifted by one, whose first row is that state), then scans the adjoint
g_t = gy_t C_t + exp(dt_{t+1} A) g_{t+1} in reverse (gy = dy * silu(z), the gradient of the
gated sum). dB and dC sum over channels, which programs split: they are added atomically into
fp32 buffers (fp64 for fp32 inputs); dA and dD are per-program sums added up afterwards."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.lse import LOG2E
from .._jit.recurrent import sigmoid_f32
from .._jit.scan import accumulator, first_order, row_of, sum_dtype, sum_of_products
from . import bwd_lanes, lanes
from .config import SelectiveScanConfig, pick
from .softplus import decay as decay_of, softplus


@triton.jit
def _dt(DL, offs, m2, PRECISE: tl.constexpr):
    """delta and softplus(delta) (0 where masked: a decay of 1 and no input)."""
    dl = tl.load(DL + offs, mask=m2, other=0.0).to(tl.float32)
    return dl, tl.where(m2, softplus(dl, PRECISE=PRECISE), 0.0)


@triton.jit
def _step_tiles(X, DL, Bm, t, d, n, T, D, N, base, md, mn, PRECISE: tl.constexpr):
    """x, delta and softplus(delta) [chunk, block_d], B_t [chunk, N] at steps t (zero outside the
    sequence)."""
    inside = (t >= 0) & (t < T)
    m2 = inside[:, None] & md[None, :]
    offs = base + t[:, None] * D + d[None, :]
    x = tl.load(X + offs, mask=m2, other=0.0).to(tl.float32)
    dl, dt = _dt(DL, offs, m2, PRECISE)
    bt = tl.load(Bm + (base // D) * N + t[:, None] * N + n[None, :], mask=inside[:, None] & mn[None, :],
                 other=0.0).to(tl.float32)
    return x, dl, dt, bt


@triton.jit
def _ss_fwd(X, DL, A, Bm, Cm, Dk, Z, Y, CK, T, D, N,
            BLOCK_D: tl.constexpr, N_P2: tl.constexpr, CHUNK: tl.constexpr, STORE_CK: tl.constexpr,
            PRECISE: tl.constexpr):
    n_db = tl.cdiv(D, BLOCK_D)
    b = tl.program_id(0) // n_db
    d = (tl.program_id(0) % n_db) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, N_P2)
    md, mn = d < D, n < N
    a = tl.load(A + d[:, None] * N + n[None, :], mask=md[:, None] & mn[None, :], other=0.0).to(tl.float32)
    a2 = a * LOG2E
    dk = tl.load(Dk + d, mask=md, other=0.0).to(tl.float32)
    rows = tl.arange(0, CHUNK)
    base = b.to(tl.int64) * T * D
    n_chunks = tl.cdiv(T, CHUNK)
    h = tl.zeros([BLOCK_D, N_P2], tl.float32)
    c = 0
    while c < n_chunks:
        t = c * CHUNK + rows
        x, dl, dt, bt = _step_tiles(X, DL, Bm, t, d, n, T, D, N, base, md, mn, PRECISE)
        decay = decay_of(dt[:, :, None], a[None, :, :], a2[None, :, :], PRECISE)
        P, Hs = tl.associative_scan((decay, (dt * x)[:, :, None] * bt[:, None, :]), 0, first_order)
        hs = Hs + P * h[None, :, :]
        m2 = (t < T)[:, None] & md[None, :]
        ct = tl.load(Cm + (base // D) * N + t[:, None] * N + n[None, :], mask=(t < T)[:, None] & mn[None, :],
                     other=0.0).to(tl.float32)
        offs = base + t[:, None] * D + d[None, :]
        zt = tl.load(Z + offs, mask=m2, other=0.0).to(tl.float32)
        yv = tl.sum(hs * ct[:, None, :], axis=2) + dk[None, :] * x
        tl.store(Y + offs, (yv * zt * sigmoid_f32(zt, PRECISE)).to(Y.dtype.element_ty), mask=m2)
        h = row_of(hs, rows[:, None, None], CHUNK - 1)
        if STORE_CK:
            ck = CK + ((b * n_chunks + c) * D + d[:, None]) * N_P2 + n[None, :]
            tl.store(ck, h, mask=md[:, None])
        c += 1


@triton.jit
def _ss_bwd(X, DL, A, Bm, Cm, Dk, Z, DY, CK, DX, DDL, DZ, DA, DD, DB, DC, T, D, N,
            BLOCK_D: tl.constexpr, N_P2: tl.constexpr, CHUNK: tl.constexpr, PRECISE: tl.constexpr,
            ACC: tl.constexpr):
    n_db = tl.cdiv(D, BLOCK_D)
    b = tl.program_id(0) // n_db
    d = (tl.program_id(0) % n_db) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, N_P2)
    md, mn = d < D, n < N
    mdn = md[:, None] & mn[None, :]
    a = tl.load(A + d[:, None] * N + n[None, :], mask=mdn, other=0.0).to(tl.float32)
    a2 = a * LOG2E
    dk = tl.load(Dk + d, mask=md, other=0.0).to(tl.float32)
    rows = tl.arange(0, CHUNK)
    base = b.to(tl.int64) * T * D
    n_chunks = tl.cdiv(T, CHUNK)
    g = tl.zeros([BLOCK_D, N_P2], tl.float32)  # the adjoint entering from the chunk after
    acc_a = tl.zeros([BLOCK_D, N_P2], ACC)
    acc_d = tl.zeros([BLOCK_D], ACC)
    c = n_chunks - 1
    while c >= 0:
        t = c * CHUNK + rows
        # h_{t-1}: the steps shifted by one, the first row the state kept at the chunk before
        prev = tl.load(CK + ((b * n_chunks + c - 1) * D + d[:, None]) * N_P2 + n[None, :],
                       mask=md[:, None] & (c > 0), other=0.0)
        xs, _, dts, bs = _step_tiles(X, DL, Bm, t - 1, d, n, T, D, N, base, md, mn, PRECISE)
        head = (rows == 0)[:, None, None]
        decay_s = tl.where(head, 0.0, decay_of(dts[:, :, None], a[None, :, :], a2[None, :, :], PRECISE))
        inj_s = tl.where(head, prev[None, :, :], (dts * xs)[:, :, None] * bs[:, None, :])
        _, hp = tl.associative_scan((decay_s, inj_s), 0, first_order)
        x, dl, dt, bt = _step_tiles(X, DL, Bm, t, d, n, T, D, N, base, md, mn, PRECISE)
        decay = decay_of(dt[:, :, None], a[None, :, :], a2[None, :, :], PRECISE)
        hs = decay * hp + (dt * x)[:, :, None] * bt[:, None, :]
        inside = t < T
        m2 = inside[:, None] & md[None, :]
        mtn = inside[:, None] & mn[None, :]
        offs = base + t[:, None] * D + d[None, :]
        ct = tl.load(Cm + (base // D) * N + t[:, None] * N + n[None, :], mask=mtn, other=0.0).to(tl.float32)
        zt = tl.load(Z + offs, mask=m2, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=m2, other=0.0).to(tl.float32)
        sz = sigmoid_f32(zt, PRECISE)
        yv = tl.sum(hs * ct[:, None, :], axis=2) + dk[None, :] * x
        tl.store(DZ + offs, (dy * yv * sz * (1.0 + zt * (1.0 - sz))).to(DZ.dtype.element_ty), mask=m2)
        gy = dy * zt * sz
        acc_d += sum_of_products(gy, x, ACC)
        tl.atomic_add(DC + (base // D) * N + t[:, None] * N + n[None, :],
                      sum_of_products(gy[:, :, None], hs, ACC, 1), mask=mtn)
        _, dtn = _dt(DL, offs + D, ((t + 1) < T)[:, None] & md[None, :], PRECISE)
        decay_n = decay_of(dtn[:, :, None], a[None, :, :], a2[None, :, :], PRECISE)
        Pr, G = tl.associative_scan((decay_n, gy[:, :, None] * ct[:, None, :]), 0, first_order, reverse=True)
        gs = G + Pr * g[None, :, :]
        g = row_of(gs, rows[:, None, None], 0)
        gb = tl.sum(gs * bt[:, None, :], axis=2)
        tl.store(DX + offs, (dt * gb + dk[None, :] * gy).to(DX.dtype.element_ty), mask=m2)
        gdh = gs * decay * hp
        ddt = x * gb + tl.sum(gdh * a[None, :, :], axis=2)
        tl.store(DDL + offs, (ddt * sigmoid_f32(dl, PRECISE)).to(DDL.dtype.element_ty), mask=m2)
        tl.atomic_add(DB + (base // D) * N + t[:, None] * N + n[None, :],
                      sum_of_products(gs, (dt * x)[:, :, None], ACC, 1), mask=mtn)
        acc_a += sum_of_products(gdh, dt[:, :, None], ACC)
        c -= 1
    tl.store(DA + (b * D + d[:, None]) * N + n[None, :], acc_a, mask=mdn)
    tl.store(DD + b * D + d, acc_d, mask=md)


def _n_p2(N: int) -> int:
    return max(2, triton.next_power_of_2(N))


def selective_scan_forward(x, delta, A, B, C, D, z, config: SelectiveScanConfig | None = None,
                           keep_states: bool = False):
    """(y [B, T, D] like x, the states at chunk ends [B, chunks, D, N_p2] fp32 or None)."""
    Bsz, T, Dm = x.shape
    N = A.shape[1]
    cfg = config or pick(Bsz, T, Dm, N, x.device)
    n_chunks = triton.cdiv(T, cfg.chunk)
    y = torch.empty_like(x)
    ck = torch.empty(Bsz, n_chunks, Dm, _n_p2(N), device=x.device, dtype=torch.float32) if keep_states else None
    if cfg.path == "lanes":
        if y.numel():
            lanes.forward(x, delta, A, B, C, D, z, y, ck, cfg, _n_p2(N))
        return y, ck
    grid = (Bsz * triton.cdiv(Dm, cfg.block_d),)
    _ss_fwd[grid](x, delta, A, B, C, D, z, y, ck if ck is not None else y, T, Dm, N, BLOCK_D=cfg.block_d,
                  N_P2=_n_p2(N), CHUNK=cfg.chunk, STORE_CK=keep_states, PRECISE=x.dtype == torch.float32,
                  num_warps=cfg.warps)
    return y, ck


def selective_scan_backward(dy, x, delta, A, B, C, D, z, states, config: SelectiveScanConfig | None = None):
    """(dx, ddelta, dA, dB, dC, dD, dz) from the upstream gradient and the states the forward kept
    (with the same config's chunk)."""
    Bsz, T, Dm = x.shape
    N = A.shape[1]
    cfg = config or pick(Bsz, T, Dm, N, x.device)
    if states.shape[1] != triton.cdiv(T, cfg.chunk):
        raise ValueError(f"states kept every {triton.cdiv(T, states.shape[1])} steps, the backward's chunk is {cfg.chunk}")
    dy = dy.contiguous()
    dx, ddl, dz = torch.empty_like(x), torch.empty_like(delta), torch.empty_like(z)
    if cfg.bwd_path == "lanes":
        dA, dB, dC, dD = bwd_lanes.backward(dy, x, delta, A, B, C, D, z, states, dx, ddl, dz, cfg, _n_p2(N))
        return dx, ddl, dA, dB, dC, dD, dz
    # the parameters' sums (dA, dD over batch and time, dB, dC over channel blocks) in fp64 for fp32
    # inputs (_jit/scan.py's accumulator: eager's error), added atomically in any order
    acc = accumulator(x.dtype)
    sums = sum_dtype(x.dtype)
    dA = torch.empty(Bsz, Dm, N, device=x.device, dtype=sums)
    dD = torch.empty(Bsz, Dm, device=x.device, dtype=sums)
    dB = torch.zeros(Bsz, T, N, device=x.device, dtype=sums)
    dC = torch.zeros(Bsz, T, N, device=x.device, dtype=sums)
    grid = (Bsz * triton.cdiv(Dm, cfg.bwd_block_d),)
    _ss_bwd[grid](x, delta, A, B, C, D, z, dy, states, dx, ddl, dz, dA, dD, dB, dC, T, Dm, N,
                  BLOCK_D=cfg.bwd_block_d, N_P2=_n_p2(N), CHUNK=cfg.chunk, PRECISE=x.dtype == torch.float32,
                  ACC=acc, num_warps=cfg.bwd_warps)
    return (dx, ddl, dA.sum(0).to(A.dtype), dB.to(B.dtype), dC.to(C.dtype), dD.sum(0).to(D.dtype), dz)
