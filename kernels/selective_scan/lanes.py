"""The selective scan's lanes forward (config path "lanes"; the recurrence is in scan.py).

Each thread owns `vec` neighbouring channels with all their N states, and holds `steps` time steps
of them in registers: [steps, block_d, N] tiles with block_d = 32 * warps * vec put every lane and
warp on the channel axis, so the scan over a tile's steps and the sum over the states are loops
over the thread's own registers (one exponential, two multiplies and two fused multiply-adds a
step, channel and state; B_t and C_t are broadcast to the channels for free), where the tiles path
spreads time and states over lanes.

A thread's 16 states of 8 steps fill its registers (sm_90: 255 at D 2048, some spilled), so a warp
an SM scheduler is all that runs. `split` spreads a channel's states over that many lanes of a warp
([steps, block_d * split, N / split] tiles; each lane loads its own group's B_t and C_t): as many
more warps, a fraction of the registers (split 2 at 8 steps: 216, at 4: 128), and y_t's sum over
the states meets by shuffles between the groups' lanes. softplus(delta) is then worked out on each
of a channel's lanes, or with `share` once a channel and handed to them. The decays' exponentials
bound the kernel (16 a step and channel on the SFU, 16 results a clock an SM, against 128 for
the FMA pipe that does the rest): `poly` moves 1/poly of them to a polynomial on the FMA pipe.

Time is split into segments so that few channels still fill the GPU: a first launch scans every
segment (but the last) from a zero state and keeps its end state [D, N] and the sum of its steps
softplus(delta) [D] (its transition is exp(A * that sum)); the second starts each segment from the
ends of those before it, combined in order, and writes y. The next tile's loads are issued before
the current one is scanned. With keep_states, the state at the end of every `chunk` steps is kept
as scan.py's forward keeps it, for its backward."""
from __future__ import annotations

import math

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
def _lanes(D, BLOCK_D: tl.constexpr, VEC: tl.constexpr, SPLIT: tl.constexpr, WARPS: tl.constexpr):
    """This program's sequence b, its channels c [BLOCK_D], and per lane of its lane axis
    (BLOCK_D * SPLIT lanes) the channel d and state group g. The hints as in rtu/lanes.py
    (vectorised by VEC along the channels, lanes and warps on the channel axis). SPLIT > 1: within
    a warp the groups are blocks of its channels (lane = g * channels a warp + channel), so that
    d runs contiguous along the lanes (the hint that puts them on the lane axis is true) and a
    channel's groups are lanes of one warp (their partial sums meet by shuffles)."""
    n_db = tl.cdiv(D, BLOCK_D)
    first = (tl.program_id(0) % n_db) * BLOCK_D
    if VEC == 1:
        c = tl.multiple_of(tl.max_contiguous(tl.arange(0, BLOCK_D), 2), 1)
    else:
        c = tl.max_contiguous(tl.arange(0, BLOCK_D), VEC)
    if SPLIT == 1:
        d, g = first + c, c * 0
    else:
        CW: tl.constexpr = BLOCK_D // WARPS
        lane = tl.arange(0, BLOCK_D * SPLIT)
        r = lane % (SPLIT * CW)
        g = r // CW
        d = first + tl.multiple_of(tl.max_contiguous((lane // (SPLIT * CW)) * CW + r % CW, 2), 1)
    return tl.program_id(0) // n_db, first + c, d, g


@triton.jit
def _partials_summed(v, STEPS: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr, WARPS: tl.constexpr):
    """[steps, lanes] partial sums (a channel's state groups) as [steps, BLOCK_D] channel sums."""
    CW: tl.constexpr = BLOCK_D // WARPS
    return tl.reshape(tl.sum(tl.reshape(v, [STEPS, WARPS, SPLIT, CW]), axis=2), [STEPS, BLOCK_D])


@triton.jit
def _to_lanes(v, STEPS: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr, WARPS: tl.constexpr):
    """[steps, BLOCK_D] per channel as [steps, lanes], each channel's value on its SPLIT lanes."""
    CW: tl.constexpr = BLOCK_D // WARPS
    v = tl.broadcast_to(tl.reshape(v, [STEPS, WARPS, 1, CW]), [STEPS, WARPS, SPLIT, CW])
    return tl.reshape(v, [STEPS, BLOCK_D * SPLIT])


@triton.jit
def _rows(P, offs, t, T, md, live, EVEN: tl.constexpr):
    """The [steps, lanes] tile of P at offs (steps t), as stored: zero outside or where not live."""
    if EVEN:
        return tl.load(P + offs, mask=live, other=0.0)
    return tl.load(P + offs, mask=((t < T) & live)[:, None] & md[None, :], other=0.0)


@triton.jit
def _per_step(P, b, t, n, n3, T, N, live, EVEN_N: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr = True):
    """B_t or C_t at steps t (zero past N, past T or where not live): SPLIT 1, [steps, N_p2], which
    every thread holds whole; otherwise [steps, lanes, N_p2 / SPLIT], each lane its group's states
    n3 [1, lanes, N_p2 / SPLIT]. Loaded as [lanes, steps, states] and permuted: the coalescer puts
    a load's most contiguous axis first (the states, in each thread's registers) and, of axes as
    contiguous, the outer one next (the lanes then, not the steps)."""
    m = (t < T) & live
    if SPLIT > 1:
        n3t = tl.permute(n3, (1, 0, 2))
        if MASKED:
            v = tl.load(P + (b * T + t[None, :, None]) * N + n3t, mask=m[None, :, None] & (n3t < N), other=0.0)
        else:
            v = tl.load(P + (b * T + t[None, :, None]) * N + n3t)
        v = tl.permute(v, (1, 0, 2))
    elif EVEN_N:
        v = tl.load(P + (b * T + t[:, None]) * N + n[None, :], mask=m[:, None], other=0.0)
    else:
        v = tl.load(P + (b * T + t[:, None]) * N + n[None, :], mask=m[:, None] & (n < N)[None, :], other=0.0)
    return v


@triton.jit
def _widened(v, WIDEN: tl.constexpr, PAIRS: tl.constexpr):
    """B_t or C_t as loaded, in fp32. PAIRS: [steps, lanes, states / 2] int32, each two bf16
    states (the first in the low half): the low one shifted up, the high one masked, each as
    the fp32 it is the top half of, interleaved back in order."""
    if PAIRS:
        lo = (v << 16).to(tl.float32, bitcast=True)
        hi = (v & -65536).to(tl.float32, bitcast=True)
        return tl.reshape(tl.join(lo, hi), [v.shape[0], v.shape[1], 2 * v.shape[2]])
    else:
        return widen(v, WIDEN)


@triton.jit
def _by_lane(v, SPLIT: tl.constexpr):
    """B_t or C_t as a [steps, lanes, states] operand."""
    if SPLIT == 1:
        v = v[:, None, :]
    return v


@triton.jit
def _carry_in(EH, EDT, a, a2, b, d3, n3, d, md3, md, D, N_P2, n_seg, first, count, step, LANES: tl.constexpr,
              N_TILE: tl.constexpr, PRECISE: tl.constexpr):
    """The state entering a segment: the ends of segments first, first + step, ... (`count` of
    them) applied in that order to a zero state, each as h <- exp(A * its sum of steps) h + its
    end state (the forward: from segment 0 up; bwd_lanes.py's adjoint: from the last down)."""
    h = tl.zeros([1, LANES, N_TILE], tl.float32)
    i = 0
    while i < count:
        for u in tl.static_range(_ENDS_GROUP):
            ok = i + u < count
            j = b * n_seg + first + (i + u) * step
            e = tl.load(EH + (j * D + d3) * N_P2 + n3, mask=md3 & ok, other=0.0)
            s = tl.load(EDT + j * D + d, mask=md & ok, other=0.0)
            h = decay_of(s[None, :, None], a, a2, PRECISE) * h + e
        i += _ENDS_GROUP
    return h


@triton.jit
def _ss_fwd_lanes(X, DL, A, Bm, Cm, Dk, Z, Y, CK, EH, EDT, T, D: tl.constexpr, N, n_tiles, per_seg, n_seg, ck_every,
                  BLOCK_D: tl.constexpr, VEC: tl.constexpr, N_P2: tl.constexpr, STEPS: tl.constexpr,
                  STORE_CK: tl.constexpr, ENDS_PASS: tl.constexpr, EVEN: tl.constexpr, EVEN_N: tl.constexpr,
                  ASM: tl.constexpr, WIDEN: tl.constexpr, FAST_SOFTPLUS: tl.constexpr, PRECISE: tl.constexpr,
                  SPLIT: tl.constexpr, POLY: tl.constexpr, WARPS: tl.constexpr, SHARE: tl.constexpr,
                  PAIRS: tl.constexpr):
    """Program (sequence x channel block, segment). ENDS_PASS: the segment from a zero state,
    keeping its end state and sum of steps; otherwise from the state the earlier segments' ends
    combine to, writing y and, with STORE_CK, the state after every ck_every tiles. Steps past T
    (zero inputs) only change the states after the last tile, which no one reads. PRECISE (fp32):
    the decays, steps and gate as softplus.py's and _jit/recurrent.py's precise forms, a segment's
    sum of steps in fp64. SPLIT: lanes a channel's states are spread over (each lane N_p2 / SPLIT
    of them; y_t sums the lanes' partial sums). POLY: 1/POLY of the decays by a polynomial on the
    FMA pipe (softplus.py's exp2_mixed; not with PRECISE)."""
    NG: tl.constexpr = N_P2 // SPLIT
    CLAMP: tl.constexpr = SPLIT > 1 and EVEN and EVEN_N
    LANES: tl.constexpr = BLOCK_D * SPLIT
    b, c_ch, d, g = _lanes(D, BLOCK_D, VEC, SPLIT, WARPS)
    md = d < D
    # [1, lanes, states] operands: loaded so, they set the tiles' layout (lanes on the channels)
    d3 = d[None, :, None]
    if SPLIT == 1:
        k = tl.max_contiguous(tl.arange(0, N_P2), 1)
        n3 = k[None, None, :]
    else:
        k = tl.arange(0, NG)
        n3 = g[None, :, None] * NG + k[None, None, :]
    if PAIRS:  # B and C as int32 words of two states: [1, lanes, NG / 2] word indices, N / 2 a step
        nb = g[None, :, None] * (NG // 2) + tl.arange(0, NG // 2)[None, None, :]
        NB = N // 2
    else:
        nb = n3
        NB = N
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
        h = tl.zeros([1, LANES, NG], tl.float32)
        if PRECISE:
            dsum = tl.zeros([LANES], tl.float64)
        else:
            dsum = tl.zeros([LANES], tl.float32)
    else:
        h = _carry_in(EH, EDT, a, a2, b, d3, n3, d, md3, md, D, N_P2, n_seg, 0, seg, 1, LANES, NG, PRECISE)
        # the skip term D x_t joins one lane's partial sum of the channel's states
        dk = tl.load(Dk + d, mask=md & (g == 0), other=0.0).to(tl.float32)
    offs = rows[:, None] * D + d[None, :]
    offs_c = rows[:, None] * D + c_ch[None, :]  # y and z: one lane a channel
    at = base + c.to(tl.int64) * STEPS * D
    t0 = c * STEPS + rows
    offs_dl = offs_c if SHARE else offs
    xn = _rows(X + at, offs, t0, T, md, True, EVEN)
    dln = _rows(DL + at, offs_dl, t0, T, c_ch < D if SHARE else md, True, EVEN)
    bn = _per_step(Bm, b, t0, k, nb, T, NB, True, EVEN_N, SPLIT)
    if not ENDS_PASS:
        zn = _rows(Z + at, offs_c, t0, T, c_ch < D, True, EVEN)
        cn = _per_step(Cm, b, t0, k, nb, T, NB, True, EVEN_N, SPLIT)
    while c < end:
        # B_t and C_t widened where loaded (opaque: not after the broadcast to every thread, 4x the work)
        x, dl, bt = xn.to(tl.float32), dln.to(tl.float32), _widened(bn, WIDEN, PAIRS)
        t = c * STEPS + rows
        # the next tile's loads go out before this one is scanned
        live = c + 1 < end
        if CLAMP:  # the next tile, or past the segment this one again: in bounds, no mask
            at_n = base + tl.minimum(c + 1, end - 1).to(tl.int64) * STEPS * D
            t_n = tl.minimum(c + 1, end - 1) * STEPS + rows
            xn = tl.load(X + at_n + offs)
            dln = tl.load(DL + at_n + offs_dl)
            bn = _per_step(Bm, b, t_n, k, nb, T, NB, live, EVEN_N, SPLIT, False)
        else:
            xn = _rows(X + at + STEPS * D, offs, t + STEPS, T, md, live, EVEN)
            dln = _rows(DL + at + STEPS * D, offs_dl, t + STEPS, T, c_ch < D if SHARE else md, live, EVEN)
            bn = _per_step(Bm, b, t + STEPS, k, nb, T, NB, live, EVEN_N, SPLIT)
        if not ENDS_PASS:
            z, ct = zn.to(tl.float32), _widened(cn, WIDEN, PAIRS)
            if CLAMP:
                zn = tl.load(Z + at_n + offs_c)
                cn = _per_step(Cm, b, t_n, k, nb, T, NB, live, EVEN_N, SPLIT, False)
            else:
                zn = _rows(Z + at + STEPS * D, offs_c, t + STEPS, T, c_ch < D, live, EVEN)
                cn = _per_step(Cm, b, t + STEPS, k, nb, T, NB, live, EVEN_N, SPLIT)
        if SHARE:
            dt = _to_lanes(softplus(dl, FAST_SOFTPLUS, PRECISE), STEPS, BLOCK_D, SPLIT, WARPS)
        else:
            dt = softplus(dl, FAST_SOFTPLUS, PRECISE)
        decay = decay_of(dt[:, :, None], a, a2, PRECISE, POLY)
        inj = (dt * x)[:, :, None] * _by_lane(bt, SPLIT)
        inj = tl.where(head, inj + decay * h, inj)  # the carried state enters at the first step
        _, hs = tl.associative_scan((decay, inj), 0, first_order)
        h = tl.sum(tl.where(rows3 == STEPS - 1, hs, 0.0), axis=0)[None, :, :]
        if ENDS_PASS:
            dsum += tl.sum(dt.to(dsum.dtype), axis=0)
        else:
            yv = tl.sum(hs * _by_lane(ct, SPLIT), axis=2) + dk[None, :] * x
            if SPLIT > 1:
                yv = _partials_summed(yv, STEPS, BLOCK_D, SPLIT, WARPS)
            mask = (t < T)[:, None] & (c_ch < D)[None, :]
            tl.store(Y + at + offs_c, (yv * z * sigmoid(z, ASM, PRECISE)).to(Y.dtype.element_ty), mask=mask)
            if STORE_CK:
                if (c + 1) % ck_every == 0:
                    j = b * ((n_tiles + ck_every - 1) // ck_every) + (c + 1) // ck_every - 1
                    tl.store(CK + (j * D + d3) * N_P2 + n3, h, mask=(d3 < D) & (n3 < N_P2))
        at += STEPS * D
        c += 1
    if ENDS_PASS:
        j = b * n_seg + seg
        tl.store(EH + (j * D + d3) * N_P2 + n3, h, mask=(d3 < D) & (n3 < N_P2))
        tl.store(EDT + j * D + d, dsum.to(tl.float32), mask=md & (g == 0))


def plan(T: int, steps: int, segments: int) -> tuple[int, int, int]:
    """(tiles, tiles a segment, segments) with no empty segment."""
    n_tiles = triton.cdiv(T, steps)
    per_seg = triton.cdiv(n_tiles, max(1, min(segments, n_tiles)))
    return n_tiles, per_seg, triton.cdiv(n_tiles, per_seg)


def forward(x, delta, A, B, C, D, z, y, ck, cfg, n_p2: int) -> None:
    """Fill y (and ck, the states every cfg.chunk steps, where given) from the contiguous inputs."""
    Bsz, T, Dm = x.shape
    N = A.shape[1]
    # the states kept every chunk steps fall at a tile's end: with them, tiles of gcd(steps, chunk)
    steps = cfg.steps if ck is None else math.gcd(cfg.steps, cfg.chunk)
    if cfg.split not in (1, 2, 4, 8) or cfg.poly not in (0, 2, 4, 8):
        raise ValueError(f"the lanes path spreads a channel's states over split = 1, 2, 4 or 8 lanes (got "
                         f"{cfg.split}) and takes 1/poly of its decays by a polynomial, poly = 0, 2, 4 or 8 (got "
                         f"{cfg.poly})")
    split = min(cfg.split, n_p2)  # (a lane holds one state at least)
    if split > 1 and (cfg.block_d % cfg.warps or cfg.block_d // cfg.warps < 2):
        raise ValueError(f"split = {cfg.split}: block_d = {cfg.block_d} must share out evenly over warps = "
                         f"{cfg.warps}, 2 channels a warp at least")
    precise = x.dtype == torch.float32
    # fp32 inputs keep their precise decays; fewer states a lane than 1/poly asks for: none by it
    poly = 0 if precise or n_p2 // split < cfg.poly else cfg.poly
    n_tiles, per_seg, n_seg = plan(T, steps, cfg.segments)
    eh = torch.empty(Bsz, n_seg, Dm, n_p2, device=x.device, dtype=torch.float32)  # (unread with one segment)
    edt = torch.empty(Bsz, n_seg, Dm, device=x.device, dtype=torch.float32)
    vec = max(1, cfg.block_d * split // (32 * cfg.warps))
    pairs = split > 1 and B.dtype == C.dtype == torch.bfloat16 and N == n_p2 and n_p2 // split >= 2
    Bk, Ck = (B.view(torch.int32), C.view(torch.int32)) if pairs else (B, C)
    args = [x, delta, A, Bk, Ck, D, z, y, ck if ck is not None else eh, eh, edt, T, Dm, N, n_tiles, per_seg, n_seg,
            cfg.chunk // steps]
    meta = dict(BLOCK_D=cfg.block_d, VEC=vec, N_P2=n_p2, STEPS=steps, STORE_CK=ck is not None,
                EVEN=T % steps == 0 and Dm % cfg.block_d == 0, EVEN_N=N == n_p2, ASM=x.device.type == "cuda",
                WIDEN=widen_asm(B) and widen_asm(C), FAST_SOFTPLUS=widen_asm(delta), PRECISE=precise,
                SPLIT=split, POLY=poly, WARPS=cfg.warps, SHARE=cfg.share and split > 1, PAIRS=pairs,
                num_warps=cfg.warps)
    chains = Bsz * triton.cdiv(Dm, cfg.block_d)
    if n_seg > 1:  # the last segment's ends are never read
        _ss_fwd_lanes[(chains, n_seg - 1)](*args, ENDS_PASS=True, **meta)
    _ss_fwd_lanes[(chains, n_seg)](*args, ENDS_PASS=False, **meta)
