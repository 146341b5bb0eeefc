"""The selective scan's lanes forward (config path "lanes"; the recurrence is in scan.py).

Each thread owns `vec` neighbouring channels with all their N states, and holds `steps` time steps
of them in registers: [steps, block_d, N] tiles with block_d = 32 * warps * vec put every lane and
warp on the channel axis, so the scan over a tile's steps and the sum over the states are loops
over the thread's own registers (one exponential, two multiplies and two fused multiply-adds a
step, channel and state; B_t and C_t are broadcast to the channels for free), where the tiles path
spreads time and states over lanes.

Time is split into segments so that few channels still fill the GPU: a first launch scans every
segment (but the last) from a zero state and keeps its end state [D, N] and the sum of its steps
softplus(delta) [D] (its transition is exp(A * that sum)); the second starts each segment from the
ends of those before it, combined in order, and writes y. The next tile's loads are issued before
the current one is scanned. With keep_states, the state at the end of every `chunk` steps is kept
as scan.py's forward keeps it, for its backward."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.lse import LOG2E
from .._jit.scan import first_order, sigmoid
from .._host.device import widen_asm
from .._jit.widen import widen
from .softplus import decay as decay_of, softplus

_ENDS_GROUP = tl.constexpr(4)  # segments combined per round trip (their loads are independent)


@triton.jit
def _lanes(D, BLOCK_D: tl.constexpr, VEC: tl.constexpr):
    """This program's sequence b and channels d (`VEC` neighbours a thread; the hints as in
    rtu/lanes.py: vectorised by VEC along the channels, lanes and warps on the channel axis)."""
    n_db = tl.cdiv(D, BLOCK_D)
    if VEC == 1:
        lanes = tl.multiple_of(tl.max_contiguous(tl.arange(0, BLOCK_D), 2), 1)
    else:
        lanes = tl.max_contiguous(tl.arange(0, BLOCK_D), VEC)
    return tl.program_id(0) // n_db, (tl.program_id(0) % n_db) * BLOCK_D + lanes


@triton.jit
def _rows(P, offs, t, T, md, live, EVEN: tl.constexpr):
    """The [steps, block_d] tile of P at offs (steps t), as stored: zero outside or where not live."""
    if EVEN:
        return tl.load(P + offs, mask=live, other=0.0)
    return tl.load(P + offs, mask=((t < T) & live)[:, None] & md[None, :], other=0.0)


@triton.jit
def _per_step(P, b, t, n, T, N, live, EVEN_N: tl.constexpr):
    """B_t or C_t, [steps, N_p2] (zero past N, past T or where not live)."""
    m = (t < T) & live
    if EVEN_N:
        return tl.load(P + (b * T + t[:, None]) * N + n[None, :], mask=m[:, None], other=0.0)
    return tl.load(P + (b * T + t[:, None]) * N + n[None, :], mask=m[:, None] & (n < N)[None, :], other=0.0)


@triton.jit
def _carry_in(EH, EDT, a, a2, b, d3, n3, d, md3, md, D, N_P2, n_seg, count, BLOCK_D: tl.constexpr,
              N_TILE: tl.constexpr, PRECISE: tl.constexpr):
    """The state entering a segment: the ends of the `count` segments before it applied in order
    to a zero state, each as h <- exp(A * its sum of steps) h + its end state."""
    h = tl.zeros([1, BLOCK_D, N_TILE], tl.float32)
    i = 0
    while i < count:
        for u in tl.static_range(_ENDS_GROUP):
            ok = i + u < count
            j = b * n_seg + i + u
            e = tl.load(EH + (j * D + d3) * N_P2 + n3, mask=md3 & ok, other=0.0)
            s = tl.load(EDT + j * D + d, mask=md & ok, other=0.0)
            h = decay_of(s[None, :, None], a, a2, PRECISE) * h + e
        i += _ENDS_GROUP
    return h


@triton.jit
def _ss_fwd_lanes(X, DL, A, Bm, Cm, Dk, Z, Y, CK, EH, EDT, T, D: tl.constexpr, N, n_tiles, per_seg, n_seg, ck_every,
                  BLOCK_D: tl.constexpr, VEC: tl.constexpr, N_P2: tl.constexpr, STEPS: tl.constexpr,
                  STORE_CK: tl.constexpr, ENDS_PASS: tl.constexpr, EVEN: tl.constexpr, EVEN_N: tl.constexpr,
                  ASM: tl.constexpr, WIDEN: tl.constexpr, FAST_SOFTPLUS: tl.constexpr, PRECISE: tl.constexpr):
    """Program (sequence x channel block, segment). ENDS_PASS: the segment from a zero state,
    keeping its end state and sum of steps; otherwise from the state the earlier segments' ends
    combine to, writing y and, with STORE_CK, the state after every ck_every tiles. Steps past T
    (zero inputs) only change the states after the last tile, which no one reads. PRECISE (fp32):
    the decays, steps and gate as softplus.py's and _jit/recurrent.py's precise forms, a segment's
    sum of steps in fp64."""
    b, d = _lanes(D, BLOCK_D, VEC)
    n = tl.max_contiguous(tl.arange(0, N_P2), 1)
    md = d < D
    # [1, block_d, N] operands: loaded so, they set the tiles' layout (lanes on the channels)
    d3 = d[None, :, None]
    n3 = n[None, None, :]
    md3 = (d3 < D) & (n3 < N)
    a = tl.load(A + d3 * N + n3, mask=md3, other=0.0).to(tl.float32)
    a2 = a * LOG2E
    rows = tl.arange(0, STEPS)
    rows3 = rows[:, None, None]
    head = rows3 == 0
    base = b.to(tl.int64) * T * D
    seg = tl.program_id(1)
    c = seg * per_seg
    end = tl.minimum(c + per_seg, n_tiles)
    if ENDS_PASS:
        h = tl.zeros([1, BLOCK_D, N_P2], tl.float32)
        if PRECISE:
            dsum = tl.zeros([BLOCK_D], tl.float64)
        else:
            dsum = tl.zeros([BLOCK_D], tl.float32)
    else:
        h = _carry_in(EH, EDT, a, a2, b, d3, n3, d, md3, md, D, N_P2, n_seg, seg, BLOCK_D, N_P2, PRECISE)
        dk = tl.load(Dk + d, mask=md, other=0.0).to(tl.float32)
    offs = rows[:, None] * D + d[None, :]
    at = base + c.to(tl.int64) * STEPS * D
    t0 = c * STEPS + rows
    xn = _rows(X + at, offs, t0, T, md, True, EVEN)
    dln = _rows(DL + at, offs, t0, T, md, True, EVEN)
    bn = _per_step(Bm, b, t0, n, T, N, True, EVEN_N)
    if not ENDS_PASS:
        zn = _rows(Z + at, offs, t0, T, md, True, EVEN)
        cn = _per_step(Cm, b, t0, n, T, N, True, EVEN_N)
    while c < end:
        # B_t and C_t widened where loaded (opaque: not after the broadcast to every thread, 4x the work)
        x, dl, bt = xn.to(tl.float32), dln.to(tl.float32), widen(bn, WIDEN)
        t = c * STEPS + rows
        # the next tile's loads go out before this one is scanned
        live = c + 1 < end
        xn = _rows(X + at + STEPS * D, offs, t + STEPS, T, md, live, EVEN)
        dln = _rows(DL + at + STEPS * D, offs, t + STEPS, T, md, live, EVEN)
        bn = _per_step(Bm, b, t + STEPS, n, T, N, live, EVEN_N)
        if not ENDS_PASS:
            z, ct = zn.to(tl.float32), widen(cn, WIDEN)
            zn = _rows(Z + at + STEPS * D, offs, t + STEPS, T, md, live, EVEN)
            cn = _per_step(Cm, b, t + STEPS, n, T, N, live, EVEN_N)
        dt = softplus(dl, FAST_SOFTPLUS, PRECISE)
        decay = decay_of(dt[:, :, None], a, a2, PRECISE)
        inj = (dt * x)[:, :, None] * bt[:, None, :]
        inj = tl.where(head, inj + decay * h, inj)  # the carried state enters at the first step
        _, hs = tl.associative_scan((decay, inj), 0, first_order)
        h = tl.sum(tl.where(rows3 == STEPS - 1, hs, 0.0), axis=0)[None, :, :]
        if ENDS_PASS:
            dsum += tl.sum(dt.to(dsum.dtype), axis=0)
        else:
            yv = tl.sum(hs * ct[:, None, :], axis=2) + dk[None, :] * x
            mask = (t < T)[:, None] & md[None, :]
            tl.store(Y + at + offs, (yv * z * sigmoid(z, ASM, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            if STORE_CK:
                if (c + 1) % ck_every == 0:
                    j = b * ((n_tiles + ck_every - 1) // ck_every) + (c + 1) // ck_every - 1
                    tl.store(CK + (j * D + d3) * N_P2 + n3, h, mask=(d3 < D) & (n3 < N_P2))
        at += STEPS * D
        c += 1
    if ENDS_PASS:
        j = b * n_seg + seg
        tl.store(EH + (j * D + d3) * N_P2 + n3, h, mask=(d3 < D) & (n3 < N_P2))
        tl.store(EDT + j * D + d, dsum.to(tl.float32), mask=md)


def plan(T: int, steps: int, segments: int) -> tuple[int, int, int]:
    """(tiles, tiles a segment, segments) with no empty segment."""
    n_tiles = triton.cdiv(T, steps)
    per_seg = triton.cdiv(n_tiles, max(1, min(segments, n_tiles)))
    return n_tiles, per_seg, triton.cdiv(n_tiles, per_seg)


def forward(x, delta, A, B, C, D, z, y, ck, cfg, n_p2: int) -> None:
    """Fill y (and ck, the states every cfg.chunk steps, where given) from the contiguous inputs."""
    Bsz, T, Dm = x.shape
    N = A.shape[1]
    if cfg.chunk % cfg.steps:
        raise ValueError(f"the lanes path keeps states every chunk = {cfg.chunk} steps: a multiple of its tile, "
                         f"steps = {cfg.steps}")
    n_tiles, per_seg, n_seg = plan(T, cfg.steps, cfg.segments)
    eh = torch.empty(Bsz, n_seg, Dm, n_p2, device=x.device, dtype=torch.float32)  # (unread with one segment)
    edt = torch.empty(Bsz, n_seg, Dm, device=x.device, dtype=torch.float32)
    vec = max(1, cfg.block_d // (32 * cfg.warps))
    args = [x, delta, A, B, C, D, z, y, ck if ck is not None else eh, eh, edt, T, Dm, N, n_tiles, per_seg, n_seg,
            cfg.chunk // cfg.steps]
    meta = dict(BLOCK_D=cfg.block_d, VEC=vec, N_P2=n_p2, STEPS=cfg.steps, STORE_CK=ck is not None,
                EVEN=T % cfg.steps == 0 and Dm % cfg.block_d == 0, EVEN_N=N == n_p2, ASM=x.device.type == "cuda",
                WIDEN=widen_asm(B) and widen_asm(C), FAST_SOFTPLUS=widen_asm(delta), PRECISE=x.dtype == torch.float32,
                num_warps=cfg.warps)
    chains = Bsz * triton.cdiv(Dm, cfg.block_d)
    if n_seg > 1:  # the last segment's ends are never read
        _ss_fwd_lanes[(chains, n_seg - 1)](*args, ENDS_PASS=True, **meta)
    _ss_fwd_lanes[(chains, n_seg)](*args, ENDS_PASS=False, **meta)
