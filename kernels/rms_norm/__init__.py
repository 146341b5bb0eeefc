"""RMSNorm: y = x * rsqrt(mean(x^2, -1) + eps) * w, the normalisation of LLaMA-style models.

Forward and backward (gradients for x and w), over rows of any width: rows up to 16384 elements
are held in registers; wider rows, in the forward, by one program in bf16 (up to 65536 on the GPU)
or in segments over several programs; in the backward, on the GPU, in segments over programs that
wait for each other's partial sums, elsewhere in column blocks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import (coop_plan, coop_program, l2_bytes, last_to_arrive, lines_launch, on_sm90, prefetch_ahead,
                     prefetch_rows, prefetch_segment, publish, row_settings, sm_count, wait_total, widen, widen_asm)
from .._lib import resident_programs as _resident_programs


# ---------------------------------------------------------------------------------------------
# Triton kernels. The same kernels serve add_rms_norm (h = x + residual, y = rms_norm(h)): the
# constexpr HAS_RES adds the residual in the forward and writes h, HAS_DH adds h's own upstream
# gradient in the backward. With the flags off, the code for them is not generated.
#
# Register path (rows up to MAX_REG_BLOCK): a program owns a tile of ROWS x BLOCK_N elements
# (ROWS > 1 only for rows narrower than MIN_TILE, so that every program still moves a few KB) and
# strides over the tiles of the matrix. The grid is persistent, sized to what the GPU keeps
# resident (see _resident_programs), and each program loads its next tile before it reduces the
# current one, so that every warp has a load in flight at all times, not only between its launch
# and its reduction. w is loaded once per program. Math in fp32, one rounding per output.
#
# Wider rows: _fwd_packed, _fwd_split (or _fwd_chunked); _bwd_coop (or _bwd_row_dot then _bwd_cols).
#
# Loops are `while` loops: Triton 3.6's interpreter cannot take a runtime bound in range() under
# NumPy >= 2.4 (its scalars are 1-element arrays); a while loop compiles to the same code.


@triton.jit
def _load_tile(ptr, rows, cols, M, N, policy: tl.constexpr):
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return tl.load(ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0,
                   eviction_policy=policy)


@triton.jit
def _store_tile(ptr, val, rows, cols, M, N):
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], val.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_input(x, r, h_ptr, rows, cols, M, N, HAS_RES: tl.constexpr):
    """The fp32 values that get normalised: x, or with a residual h = x + r, rounded to its dtype
    first and stored (the norm sees the h that is returned and that the backward reads back)."""
    if HAS_RES:
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        _store_tile(h_ptr, h, rows, cols, M, N)
        return h.to(tl.float32)
    else:
        return x.to(tl.float32)


@triton.jit(do_not_specialize=["iters"])  # one binary whatever the trip count
def _fwd_rows(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, M, N, eps, iters,
              BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
              HAS_RES: tl.constexpr, STORE_RSTD: tl.constexpr, PREFETCH: tl.constexpr = True,
              X_POLICY: tl.constexpr = "evict_last", L2_AHEAD: tl.constexpr = 0):
    # Columns [0, BLOCK_N), plus [BLOCK_N, BLOCK_N + BLOCK_B) when BLOCK_B > 0 (see _tile: a
    # 5120-wide row is 4096 + 1024, not 8192 with 3072 lanes masked off). Suffix b: that segment.
    # PREFETCH off (rows of 4096 and narrower): each tile is loaded at the top of its own iteration,
    # as in Liger; with one tile per program the prefetch only ever loads a fully masked tile.
    # X_POLICY: the cache hint of the x (and residual) loads. evict_last, though each is read once:
    # measured on the H200 it beat evict_first by 0-8% (add_rms_norm 32768x4096: 92.0% -> 99.7% of
    # copy; rms_norm 16384x5120: 85.6% -> 91.8%; docs/evidence/rms_norm_ab_h200_run2.txt) and no
    # hint; we have not found out why.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if BLOCK_B > 0:
        colsb = BLOCK_N + tl.arange(0, BLOCK_B)
        wb = tl.load(w_ptr + colsb, mask=colsb < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if PREFETCH:
        rows = pid * ROWS + tl.arange(0, ROWS)
        x = _load_tile(x_ptr, rows, cols, M, N, X_POLICY)
        r = _load_tile(r_ptr, rows, cols, M, N, X_POLICY) if HAS_RES else x  # else: unused
        if BLOCK_B > 0:
            xb = _load_tile(x_ptr, rows, colsb, M, N, X_POLICY)
            rb = _load_tile(r_ptr, rows, colsb, M, N, X_POLICY) if HAS_RES else xb

    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        if L2_AHEAD:  # the tile L2_AHEAD past the next one into L2 (_utils.prefetch_l2)
            prefetch_rows(x_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
            if HAS_RES:
                prefetch_rows(r_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
        if PREFETCH:
            # the next tile's loads are issued before this tile's reduction waits on its data
            x_next = _load_tile(x_ptr, rows + step, cols, M, N, X_POLICY)
            if HAS_RES:
                r_next = _load_tile(r_ptr, rows + step, cols, M, N, X_POLICY)
            if BLOCK_B > 0:
                xb_next = _load_tile(x_ptr, rows + step, colsb, M, N, X_POLICY)
                if HAS_RES:
                    rb_next = _load_tile(r_ptr, rows + step, colsb, M, N, X_POLICY)
        else:
            x = _load_tile(x_ptr, rows, cols, M, N, X_POLICY)
            r = _load_tile(r_ptr, rows, cols, M, N, X_POLICY) if HAS_RES else x
            if BLOCK_B > 0:
                xb = _load_tile(x_ptr, rows, colsb, M, N, X_POLICY)
                rb = _load_tile(r_ptr, rows, colsb, M, N, X_POLICY) if HAS_RES else xb

        xf = _fwd_input(x, r, h_ptr, rows, cols, M, N, HAS_RES)
        ss = tl.sum(xf * xf, axis=1)
        if BLOCK_B > 0:
            xbf = _fwd_input(xb, rb, h_ptr, rows, colsb, M, N, HAS_RES)
            ss += tl.sum(xbf * xbf, axis=1)
        rstd = tl.math.rsqrt(ss / N + eps)
        _store_tile(y_ptr, xf * rstd[:, None] * w[None, :], rows, cols, M, N)
        if BLOCK_B > 0:
            _store_tile(y_ptr, xbf * rstd[:, None] * wb[None, :], rows, colsb, M, N)
        if STORE_RSTD:
            tl.store(rstd_ptr + rows, rstd, mask=rows < M)

        if PREFETCH:
            x = x_next
            if HAS_RES:
                r = r_next
            if BLOCK_B > 0:
                xb = xb_next
                if HAS_RES:
                    rb = rb_next


@triton.jit(do_not_specialize=["iters"])
def _fwd_chunked(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, M, N, eps, iters,
                 CHUNK: tl.constexpr, HAS_RES: tl.constexpr, STORE_RSTD: tl.constexpr):
    # One row at a time per program, two passes over the row: the sum of squares (which also
    # writes h = x + residual), then the normalisation. The second pass re-reads the row (x, or
    # the h just written) from L2: the grid is persistent and capped so that the rows in flight
    # (one per program) fit in L2, and the second pass walks the chunks backwards so that it
    # starts with the ones touched last. HBM traffic stays the minimum (read x [and residual]
    # once, write y [and h] once) as long as L2 keeps the row.
    pid = tl.program_id(0)
    cols = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    src_ptr = h_ptr if HAS_RES else x_ptr
    i = 0
    while i < iters:
        row = pid + i * tl.num_programs(0)
        i += 1
        live = row < M  # the last sweep may run past the end: all masked, no traffic
        base = row.to(tl.int64) * N
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        # x is read again in pass 2 unless h replaces it there
        x_policy: tl.constexpr = "evict_first" if HAS_RES else "evict_last"
        x = tl.load(x_ptr + base + cols, mask=(cols < N) & live, other=0.0, eviction_policy=x_policy)
        if HAS_RES:
            r = tl.load(r_ptr + base + cols, mask=(cols < N) & live, other=0.0, eviction_policy="evict_first")
        start = 0
        while start < N:
            c = start + cols
            cm = (c < N) & live
            start += CHUNK
            x_next = tl.load(x_ptr + base + start + cols, mask=(start + cols < N) & live, other=0.0,
                             eviction_policy=x_policy)
            if HAS_RES:
                r_next = tl.load(r_ptr + base + start + cols, mask=(start + cols < N) & live, other=0.0,
                                 eviction_policy="evict_first")
                h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
                tl.store(h_ptr + base + c, h, mask=cm, eviction_policy="evict_last")
                xf = h.to(tl.float32)
                r = r_next
            else:
                xf = x.to(tl.float32)
            acc += xf * xf
            x = x_next
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
        j = n_chunks
        while j > 0:
            j -= 1
            c = j * CHUNK + cols
            cm = (c < N) & live
            xf = tl.load(src_ptr + base + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + c, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
            tl.store(y_ptr + base + c, (xf * rstd * w).to(y_ptr.dtype.element_ty), mask=cm)
        if STORE_RSTD:
            tl.store(rstd_ptr + row, rstd, mask=live)


@triton.jit
def _masked_load(ptr, mask, policy: tl.constexpr):
    # mask None: an unmasked load (a mask the compiler cannot see through would cost the 16-byte width)
    if mask is None:
        return tl.load(ptr, eviction_policy=policy)
    else:
        return tl.load(ptr, mask=mask, other=0.0, eviction_policy=policy)


@triton.jit
def _fwd_lines_load(x_ptr, r_ptr, h_ptr, offs, mask, HAS_RES: tl.constexpr):
    # pass 1's chunk: x, or with a residual h = x + r, stored (evict_last: pass 2 re-reads it)
    if HAS_RES:
        x = _masked_load(x_ptr + offs, mask, "evict_first")
        r = _masked_load(r_ptr + offs, mask, "evict_first")
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + offs, h, mask=mask, eviction_policy="evict_last")
        return h
    else:
        return _masked_load(x_ptr + offs, mask, "evict_last")


@triton.jit
def _sum_sq(v):
    return tl.sum(v.to(tl.float32) * v.to(tl.float32), 1)


@triton.jit
def _fwd_lines(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, M, N, eps, N_FULL: tl.constexpr,
               TAIL: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr, HAS_RES: tl.constexpr,
               STORE_RSTD: tl.constexpr, W_AHEAD: tl.constexpr):
    # Wide rows, softmax's lines path (_softmax_fwd_lines) for the sum of squares: chunks of
    # [BLOCK // VEC, VEC] (a 16-byte vector a line), the sum kept per line (no block reduction in the
    # loop), pass 1's next chunk loaded before the current one is used; pass 2 re-reads the row (x, or
    # the h pass 1 wrote) from L2 newest chunk first, its next chunk loaded before the current one is
    # stored, and w's too if W_AHEAD (else w at its use: w is one row for all rows, always in L2, and
    # its prefetched chunks cost registers). N_FULL unmasked chunks, and a masked one if TAIL (pass 1 first, pass 2
    # last). Programs stride over the rows.
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = t_offs < N
    src_ptr = h_ptr if HAS_RES else x_ptr
    row = tl.program_id(0)
    while row < M:
        base = row.to(tl.int64) * N
        x_row, r_row, h_row, y_row = x_ptr + base, r_ptr + base, h_ptr + base, y_ptr + base
        acc = tl.zeros([L], dtype=tl.float32)
        if TAIL:
            acc += _sum_sq(_fwd_lines_load(x_row, r_row, h_row, t_offs, t_mask, HAS_RES))
        if N_FULL > 0:
            nxt = _fwd_lines_load(x_row, r_row, h_row, offs, None, HAS_RES)
        if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
            for c in range(N_FULL - 1):
                cur = nxt
                nxt = _fwd_lines_load(x_row, r_row, h_row, (c + 1) * BLOCK + offs, None, HAS_RES)
                acc += _sum_sq(cur)
        if N_FULL > 0:
            acc += _sum_sq(nxt)
        rstd = tl.math.rsqrt(tl.sum(acc, 0) / N + eps)
        if N_FULL > 0:
            v = tl.load(src_ptr + base + (N_FULL - 1) * BLOCK + offs, eviction_policy="evict_first")
            if W_AHEAD:
                w = tl.load(w_ptr + (N_FULL - 1) * BLOCK + offs, eviction_policy="evict_last")
        if N_FULL > 1:
            for j in range(N_FULL - 1):
                c = N_FULL - 1 - j
                cur = v
                v = tl.load(src_ptr + base + (c - 1) * BLOCK + offs, eviction_policy="evict_first")
                if W_AHEAD:
                    w_cur = w
                    w = tl.load(w_ptr + (c - 1) * BLOCK + offs, eviction_policy="evict_last")
                else:
                    w_cur = tl.load(w_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                y = cur.to(tl.float32) * rstd * w_cur.to(tl.float32)
                tl.store(y_row + c * BLOCK + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            v_t = tl.load(src_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
            w_t = tl.load(w_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
        if N_FULL > 0:
            if not W_AHEAD:
                w = tl.load(w_ptr + offs, eviction_policy="evict_last")
            y = v.to(tl.float32) * rstd * w.to(tl.float32)
            tl.store(y_row + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            y = v_t.to(tl.float32) * rstd * w_t.to(tl.float32)
            tl.store(y_row + t_offs, y.to(y_ptr.dtype.element_ty), mask=t_mask, eviction_policy="evict_first")
        if STORE_RSTD:
            tl.store(rstd_ptr + row, rstd)
        row += tl.num_programs(0)


@triton.jit
def _fwd_split(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, part_ptr, count_ptr, N, eps, S,
               SEG: tl.constexpr, S_BLOCK: tl.constexpr, HAS_RES: tl.constexpr, STORE_RSTD: tl.constexpr):
    # Wide rows, one launch (see _utils.last_to_arrive): program (row, segment) loads its SEG
    # elements (x, or with a residual h = x + r, stored here), stores their sum of squares, and the
    # last of the row's S programs computes rstd and writes the whole row of y from L2.
    pid = tl.program_id(0)
    row = pid // S
    seg = pid % S
    base = row.to(tl.int64) * N
    offs = tl.arange(0, SEG)
    cols = seg * SEG + offs
    mask = cols < N
    if HAS_RES:
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        r = tl.load(r_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + base + cols, h, mask=mask, eviction_policy="evict_last")
        xf = h.to(tl.float32)
    else:
        xf = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(part_ptr + pid, tl.sum(xf * xf, axis=0))
    if last_to_arrive(count_ptr + row, S):
        j = tl.arange(0, S_BLOCK)
        # volatile: from L2, not from a line of this SM's L1 loaded before the others stored
        parts = tl.load(part_ptr + row * S + j, mask=j < S, other=0.0, volatile=True)
        rstd = tl.math.rsqrt(tl.sum(parts, axis=0) / N + eps)
        src_ptr = h_ptr if HAS_RES else x_ptr
        # the row again, from L2 (.cg: h was stored by other SMs), the next segment's load issued
        # before this one's store
        v = tl.load(src_ptr + base + offs, mask=offs < N, other=0.0, cache_modifier=".cg")
        c = 0
        while c < S:
            cols = c * SEG + offs
            c += 1
            nxt = tl.load(src_ptr + base + c * SEG + offs, mask=c * SEG + offs < N, other=0.0,
                          cache_modifier=".cg")
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
            tl.store(y_ptr + base + cols, (v.to(tl.float32) * rstd * w).to(y_ptr.dtype.element_ty), mask=cols < N)
            v = nxt
        if STORE_RSTD:
            tl.store(rstd_ptr + row, rstd)


@triton.jit
def _fwd_packed(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, N, eps, BLOCK: tl.constexpr,
                HAS_RES: tl.constexpr, STORE_RSTD: tl.constexpr, ASM: tl.constexpr):
    # Wide rows (up to 65536) in registers, one row per program, held in their own dtype (x, or
    # with a residual h = x + r, stored here) and widened at each use (ASM: _utils.widen; a 64K bf16
    # row is then 32 registers a thread at 32 warps, half of what fp32 would take).
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    if HAS_RES:
        r = tl.load(r_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        x = (widen(x, ASM) + widen(r, ASM)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + base + cols, x, mask=mask)
    a = widen(x, ASM)
    rstd = tl.math.rsqrt(tl.sum(a * a, axis=0) / N + eps)
    # rstd > 0 (always; or NaN, and then y is NaN anyway) ties the w load to the reduction: w's
    # registers are not taken while the row is still being reduced
    w = tl.load(w_ptr + cols, mask=cols < tl.where(rstd > 0.0, N, 0), other=0.0, eviction_policy="evict_last")
    tl.store(y_ptr + base + cols, (widen(x, ASM) * rstd * widen(w, ASM)).to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(rstd_ptr + row, rstd)


@triton.jit(do_not_specialize=["iters"])
def _bwd_rows(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, dx_ptr, part_ptr, M, N, iters,
              BLOCK_N: tl.constexpr, ROWS: tl.constexpr, HAS_DH: tl.constexpr, PREFETCH: tl.constexpr = True,
              POLICY: tl.constexpr = "evict_last", RSTD_AHEAD: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0):
    # dx = rstd * (m - xhat * mean(m * xhat)) [+ dh] with xhat = x * rstd, m = dy * w;
    # dw = sum over rows of dy * xhat, accumulated in fp32 registers over all the tiles this
    # program visits and written once, as row `pid` of the [programs, N] partial buffer.
    # One column block (unlike the forward: a second block costs the backward more registers
    # than the masked lanes do, for the same loads in flight; ptxas -v, sm_90).
    # PREFETCH off (16384 wide): no next tile in registers, as in Liger; fewer registers and
    # spills, but nothing in flight while a program reduces. RSTD_AHEAD (with PREFETCH): the next
    # tile's rstd loaded with its x and dy.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        rows = pid * ROWS + tl.arange(0, ROWS)
        x = _load_tile(x_ptr, rows, cols, M, N, POLICY)
        dy = _load_tile(dy_ptr, rows, cols, M, N, POLICY)
        if HAS_DH:
            dh = _load_tile(dh_ptr, rows, cols, M, N, POLICY)
        if RSTD_AHEAD:
            rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        if L2_AHEAD:  # the tile L2_AHEAD past the next one into L2 (_utils.prefetch_l2)
            prefetch_rows(x_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
            prefetch_rows(dy_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
            if HAS_DH:
                prefetch_rows(dh_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
        if PREFETCH:
            x_next = _load_tile(x_ptr, rows + step, cols, M, N, POLICY)
            dy_next = _load_tile(dy_ptr, rows + step, cols, M, N, POLICY)
            if HAS_DH and BLOCK_N < 16384:  # 16384 wide: issued after the reduction, fewer spills
                dh_next = _load_tile(dh_ptr, rows + step, cols, M, N, POLICY)
        else:
            x = _load_tile(x_ptr, rows, cols, M, N, POLICY)
            dy = _load_tile(dy_ptr, rows, cols, M, N, POLICY)
            if HAS_DH:
                dh = _load_tile(dh_ptr, rows, cols, M, N, POLICY)
        if RSTD_AHEAD:
            rstd_next = tl.load(rstd_ptr + rows + step, mask=rows + step < M, other=0.0)
        else:
            rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        # (this order of the terms: 64 registers for fp32 at 4096 wide, two programs per SM;
        # computing the dot before the dw term takes 79, one program)
        xhat = x.to(tl.float32) * rstd[:, None]
        dyf = dy.to(tl.float32)
        acc += dyf * xhat
        if BLOCK_N >= 16384:
            # at one 32-warp program per SM (64 registers a thread at most) w is re-read from
            # L1 every row instead of held: 40 bytes of spills per thread instead of 126 (bf16)
            m = dyf * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        else:
            m = dyf * w[None, :]
        c = tl.sum(m * xhat, axis=1) / N
        dx = (m - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH:
            if PREFETCH and BLOCK_N >= 16384:
                dh_next = _load_tile(dh_ptr, rows + step, cols, M, N, POLICY)
            dx += dh.to(tl.float32)
            if PREFETCH:
                dh = dh_next
        _store_tile(dx_ptr, dx, rows, cols, M, N)
        if PREFETCH:
            x = x_next
            dy = dy_next
        if RSTD_AHEAD:
            rstd = rstd_next
    tl.store(part_ptr + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cols < N)


@triton.jit(do_not_specialize=["iters"])
def _bwd_coop(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, dx_ptr, dwp_ptr, slot_ptr, M, N, S, iters,
              SEG: tl.constexpr, S_BLOCK: tl.constexpr, HAS_DH: tl.constexpr, W_AT_USE: tl.constexpr = False,
              RELOAD: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0):
    # Wide rows held by S co-resident programs (_utils.publish / wait_total): program (group g,
    # segment s) keeps columns [s*SEG, (s+1)*SEG) of x and dy for rows g, g+G, g+2G, ... (G groups).
    # In step i it loads row i+1's segment, publishes row i's partial of sum(m * xhat) and then
    # finishes row i-1 (its x and dy re-read from L2 with RELOAD, else still in registers) with the
    # total its partners published a step ago, so that it seldom waits at all (waiting for row i
    # itself: 40-45% of copy at 1024x65536, against 56-68% deferred;
    # docs/evidence/rms_norm_ab_h200_run14.txt). Its columns' dw partial stays in fp32 registers over
    # all its rows and is written once, as row g of [G, N].
    G, g, seg, cols = coop_program(S, SEG)
    cm = cols < N
    if not W_AT_USE:  # (else loaded at each use, from L1: registers for the cap)
        w = tl.load(w_ptr + cols, mask=cm, other=0.0)
    acc = tl.zeros([SEG], dtype=tl.float32)
    x = tl.load(x_ptr + g.to(tl.int64) * N + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + g.to(tl.int64) * N + cols, mask=cm & (g < M), other=0.0)
    # (not `xp = x`: Triton 3.6 carries a name through a while loop only if the body gives it a
    # value other than the one it entered with, and `xp = x` in the body would look like no change)
    xp = tl.zeros_like(x)
    dyp = tl.zeros_like(dy)
    rstd_p = tl.load(rstd_ptr + g, mask=g < M, other=0.0)  # (a float tensor for the loop)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = (row + G).to(tl.int64) * N + cols
        x_next = tl.load(x_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        dy_next = tl.load(dy_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_utils.prefetch_l2)
            prefetch_segment(x_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            prefetch_segment(dy_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            if HAS_DH:
                prefetch_segment(dh_ptr, row + L2_AHEAD * G, M, N, seg, SEG)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        xhat = x.to(tl.float32) * rstd
        dyf = dy.to(tl.float32)
        acc += dyf * xhat
        if W_AT_USE:
            w = tl.load(w_ptr + cols, mask=cm, other=0.0)
        publish(slot_ptr, row, seg, S, tl.sum(dyf * w.to(tl.float32) * xhat, axis=0))
        if i > 0:
            prow = row - G
            here = prow.to(tl.int64) * N + cols
            live = cm & (prow < M)
            if RELOAD:  # row i-1 again, from L2 (loaded a step ago), issued before the wait
                xp = tl.load(x_ptr + here, mask=live, other=0.0)
                dyp = tl.load(dy_ptr + here, mask=live, other=0.0)
            c = wait_total(slot_ptr, prow, S, S_BLOCK) / N
            if W_AT_USE:
                w = tl.load(w_ptr + cols, mask=cm, other=0.0)
            xhat_p = xp.to(tl.float32) * rstd_p
            dx = (dyp.to(tl.float32) * w.to(tl.float32) - xhat_p * c) * rstd_p
            if HAS_DH:
                dx += tl.load(dh_ptr + here, mask=live, other=0.0).to(tl.float32)
            tl.store(dx_ptr + here, dx.to(dx_ptr.dtype.element_ty), mask=live)
        if not RELOAD:
            xp = x
            dyp = dy
        rstd_p = rstd
        x = x_next
        dy = dy_next
        i += 1
    tl.store(dwp_ptr + g.to(tl.int64) * N + cols, acc, mask=cm)


@triton.jit
def _bwd_row_dot(x_ptr, w_ptr, dy_ptr, rstd_ptr, c_ptr, M, N, CHUNK: tl.constexpr):
    # Wide rows, pass 1 of 2: c = mean(m * xhat) per row, the only cross-column quantity dx needs.
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    start = 0
    while start < N:
        c = start + cols
        start += CHUNK
        cm = c < N
        x = tl.load(x_ptr + base + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + base + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + c, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += dy * w * x
    rstd = tl.load(rstd_ptr + row)
    tl.store(c_ptr + row, tl.sum(acc, axis=0) * rstd / N)


@triton.jit(do_not_specialize=["iters"])
def _bwd_cols(x_ptr, w_ptr, dy_ptr, dh_ptr, rstd_ptr, c_ptr, dx_ptr, part_ptr, M, N, iters,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HAS_DH: tl.constexpr):
    # Wide rows, pass 2 of 2: program (column block, row group) walks its rows in BLOCK_R x BLOCK_C
    # tiles, writes dx and keeps its columns' dw partial in fp32 registers (partial row = group).
    cb = tl.program_id(0)
    g = tl.program_id(1)
    step = tl.num_programs(1) * BLOCK_R
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    i = 0
    while i < iters:
        rows = g * BLOCK_R + i * step + tl.arange(0, BLOCK_R)
        i += 1
        x = _load_tile(x_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        dy = _load_tile(dy_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        c = tl.load(c_ptr + rows, mask=rows < M, other=0.0)
        xhat = x * rstd[:, None]
        acc += dy * xhat
        dx = (dy * w[None, :] - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH:
            dx += _load_tile(dh_ptr, rows, cols, M, N, "evict_first").to(tl.float32)
        _store_tile(dx_ptr, dx, rows, cols, M, N)
    tl.store(part_ptr + g.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cols < N)


@triton.jit
def _sum_partials(part_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # dw = column sums of the [P, N] fp32 partial buffer (still in L2: it was just written), cast once.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    start = 0
    while start < P:
        acc += _load_tile(part_ptr, start + tl.arange(0, BLOCK_P), cols, P, N, "evict_first")
        start += BLOCK_P
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < N)


# ---------------------------------------------------------------------------------------------
# Launchers

# Widest row (next power of two) a program keeps in registers: 32 warps x 32 threads x 16 elements.
MAX_REG_BLOCK = 16384
# Rows narrower than this are packed several to a program.
MIN_TILE = 2048
# Elements per thread per tile, chosen with ptxas's register counts for sm_90 (Triton 3.6) so that
# each SM holds ~30-64 KB of prefetched loads (Little's law at 3-4.8 TB/s and ~1 us of loaded
# latency needs ~20-30 KB per SM): 16 in the forward (tile, prefetch and w in registers, 48-64
# registers with _FWD_MAXNREG: 5 programs of 8 warps per SM at 4096 wide in bf16); 8 in the
# backward, which also holds dy, its prefetch and the dw accumulator (64 registers: 2 programs of
# 16 warps at 4096 wide); 16 (2-byte types) in the backward with dh, whose 80 registers at 8 per
# thread would leave one program per SM. No spills, except the backward at 16384 wide (one 32-warp
# program per SM, 64 registers at most), which therefore runs without the prefetch (below).
FWD_PER_THREAD = 16
BWD_PER_THREAD = 8
# The register-path backward loads the next tile's rstd with its x and dy (RSTD_AHEAD), where before
# its arithmetic waited on it: H200 A/B run 26 (rms_norm_ab_h200_run26.txt), bf16 bwd, % of copy:
# 32768x4096 93.6% -> 94.8%, 8192x4096 76.9% -> 78.9%, 4096x8192 74.6% -> 77.0%, 16384x5120 75.1% ->
# 75.9% (16384 wide has no prefetch: unchanged). Same registers (sm_90). With dh (add_rms_norm, 16
# elements a thread) it lost (run 27, rms_norm_ab_h200_run27.txt): 3000x3584 65.6% -> 63.4%,
# 8192x4096 85.8% -> 84.5%, 999x5003 23.6% -> 22.9%, 4096x8192 the same; so only without dh.
# layer_norm's backward gained more from the same change (_BWD_STATS_AHEAD).
RSTD_AHEAD = True
# Partial rows a load of _sum_partials (see rms_norm_backward's end): 512, one load for the 264
# partial rows of 2 programs per SM, instead of 128 (three in a row): H200 A/B run 29
# (rms_norm_ab_h200_run29.txt), bf16 bwd, % of copy: 32768x4096 94.8% -> 95.2%, 8192x4096 79.4% ->
# 80.0%, 3000x3584 55.9% -> 57.4%; add_rms_norm 3000x3584 65.2% -> 66.7%, 8192x4096 85.7% -> 86.5%.
SUM_ROWS = 512
# Register caps for the forward on sm_90 (Hopper), (HAS_RES, element size) -> {(BLOCK_N, BLOCK_B):
# maxnreg}: ptxas (Triton 3.6) allocates a few registers more than it needs, which at these sizes
# costs a resident program per SM; each cap here is the smallest that buys one more program (e.g.
# 4096 wide, 2-byte types: 56-64 -> 48 registers, 4 -> 5 programs of 8 warps; 5120: 80 -> 64,
# 3 -> 4) with at most one register spilled. Measured with ptxas -v for STORE_RSTD on and off;
# other GPUs get no cap.
_FWD_MAXNREG = {
    (False, 2): {(1024, 0): 48, (2048, 0): 48, (4096, 0): 48, (2048, 512): 64, (2048, 1024): 72,
                 (4096, 1024): 64},
    (False, 4): {(1024, 0): 56, (2048, 0): 64, (4096, 0): 56, (8192, 0): 64, (2048, 512): 72},
    (True, 2): {(1024, 0): 64, (4096, 0): 64, (8192, 0): 64, (2048, 512): 80, (4096, 1024): 80},
    (True, 4): {(1024, 0): 72, (2048, 0): 80, (4096, 0): 80, (2048, 512): 96},
}
# Prefetch of the next tile (GPU A/B, H200, bf16, benchmarks/rms_norm_ab.py; docs/evidence): the
# forward prefetches only rows wider than 4096 (at 4096 the 48-register cap leaves 5 programs per
# SM, which hide each other's latency better than a prefetched tile did; at 5120 and 8192 the
# prefetch won); the backward not at 16384 wide, where the prefetched tiles spill (ptxas: 88 bytes
# of stack per thread with dh, 24 without the prefetch) and cost more than they hide. Nor rows
# whose width is not a multiple of a 16-byte vector (999x5003): every load is then scalar and
# converted through shared memory, and the prefetched tile spills under the register caps (ptxas,
# sm_90: 136 bytes of stack per thread with a residual, 80 without; none without the prefetch).
# Warps of the forward where the A/B found fewer than _tile's better (docs/evidence/
# rms_norm_ab_h200_run3.txt, bf16): (has residual, row block) -> warps. 4096 wide without a residual:
# 4 warps (32 elements per thread, 96 registers, no cap) 92% -> 98% of copy at 32768x4096, 81% -> 86%
# at 8192x4096; with a residual or at 8192 wide, halving did nothing or lost.
_FWD_WARPS = {(False, 4096): 4}
# The backward's loads are hinted evict_last (rms_norm bwd 32768x4096 88% -> 94%, 2048x16384 72% ->
# 75%; add_rms_norm unchanged), as the forward's are (see X_POLICY).
CHUNK_BYTES = 32768  # chunk of a wide row in _fwd_chunked: 32 warps x 32 bytes per thread
# The forward's path for rows wider than MAX_REG_BLOCK: "split" (_fwd_split, segments of
# SPLIT_SEG_BYTES, 16 warps) or "chunked" (_fwd_chunked). H200 A/B (benchmarks/rms_norm_ab.py,
# docs/evidence/rms_norm_ab_h200_run5.txt), bf16 fwd 1024x65536: rms_norm 63.2% of copy chunked ->
# 70.5% split, add_rms_norm 82.3% -> 84.1%; 8 KB segments gained less, 32 KB with 8 warps the same.
# (Commit 9618b80 capped the segment at 8192 elements by mistake: its collector run 4e9b878f timed
# that, 63.8% and 79.5%; rms_norm_ab_h200_run6.txt has both again, with either CUDA allocator.)
# (The same one-launch scheme for softmax and layer_norm lost to their streaming paths: 28-55% and
# 48-63% of copy against 62-77% and 72%, docs/evidence/softmax_ab_h200_run5.txt and
# layer_norm_ab_h200_run6.txt; the last program's serial pass over the row is the price.)
# Since run 9 (rms_norm_ab_h200_run9.txt), bf16 rows up to PACKED_MAX_BLOCK on the GPU take
# "packed" (_fwd_packed: the row in one 32-warp program's registers, kept bf16 and widened at each
# use, _utils.widen): 1024x65536 rms_norm 70.4% -> 76.7% of copy, add_rms_norm 84.0% -> 88.4%.
# Other dtypes, and the CPU (no PTX), keep WIDE: widened to fp32 the row spills; so do fewer rows
# than SMs (one program a row would leave SMs idle).
WIDE = "split"
# Without a residual, rows too wide for registers take "lines" (_fwd_lines) where a row per SM at
# least is there: H200 A/B runs 16-18 (rms_norm_ab_h200_run16/17/18.txt), bf16 fwd 1024x65536, 88.2%
# of copy with w loaded at its use and the wide rows' chunks (64 KB of 32 warps, from 128 KB rows:
# LINES_NARROW_ROW_BYTES), one program a row (_utils.lines_launch; one per SM 83.7-84.1%, two 86.2%),
# against 76.3-76.6% packed and 70.1% split; w prefetched a chunk ahead
# as x is (LINES_W_AHEAD) cost registers: 16 KB chunks of 8 warps 61.9% (139 registers, 1 program
# per SM), 64 KB of 32 warps 67.0% (80 bytes of spill a thread). With a residual packed stays: 88.4%
# against 86.8% for the best lines launch.
LINES_W_AHEAD = False
LINES_NARROW_ROW_BYTES = 65536
PACKED_MAX_BLOCK = 65536
SPLIT_SEG_BYTES = 32768
# The backward's path for rows wider than MAX_REG_BLOCK on the GPU: _bwd_coop, a row's segments in
# the registers of programs that wait for each other (_utils.publish / wait_total), with segments
# of COOP_SEG elements and COOP_WARPS warps a program. H200 A/B, bf16 bwd 1024x65536
# (benchmarks/rms_norm_ab.py, docs/evidence/rms_norm_ab_h200_run15.txt, twice): rms_norm 52.2% of
# copy (_bwd_row_dot then _bwd_cols, which read x and dy twice) -> 67.8%, add_rms_norm 55.5% ->
# 68.8%; segments of 4096 and 8192 elements (at 4 and 8 warps) 58-68% and 53-54%, 2048 at 8 warps
# 58-60%; the same again in docs/evidence/coop_ab_h200_run16.txt (69.9%, 70.7%). Rows of 16384 stay
# in registers (75.4% against 61.3% coop, run 16). The forward keeps _fwd_packed: the same scheme
# measured 74-78% and 80-84% of copy there, against 76% and 88% (runs 13-14). On the CPU, and where
# a group does not fit, _bwd_cols.
COOP_SEG = 2048
COOP_WARPS = 4
# Register caps of _bwd_coop on sm_90, (has dh, w at use, reload, segment, warps) -> maxnreg. Held
# in registers, the row finished a step late (reload off) takes 168 registers a thread at 4 warps
# uncapped (3 programs per SM; ptxas, Triton 3.6), 128 fits 4 (16 bytes of stack; with dh 40,
# unless w is loaded at its uses, W_AT_USE: none). H200 A/B runs 22-23 (rms_norm_ab_h200_run22.txt,
# run23.txt), bf16 bwd, % of copy: rms_norm 1024x65536 69.0% -> 71.6% / 71.8%, 2048x65536 73.0% ->
# 76.2%; add_rms_norm 1024x65536 69.9% -> 73.7% with w at use; 96 and 80 registers (5 and 6
# programs, more spill) 40-51%.
# Re-read from L2 instead (RELOAD, the default since runs 24-25: it was loaded a step ago, and its
# loads are issued before the wait for its row's total), the row costs no registers across the
# step: 128 registers uncapped without dh, 164 with dh and w held, 128 capped there without spill.
# Runs 24-25 (rms_norm_ab_h200_run24.txt, run25.txt), against the held row capped at 128: rms_norm
# 1024x65536 71.7 / 72.4% -> 73.7 / 74.3%, 2048x65536 76.1 / 76.9% -> 78.3 / 79.0%, 4096x65536
# 79.1% -> 81.0%; add_rms_norm 1024x65536 74.4% -> 78.2% with w held (71.2-71.8% with w at its
# uses). Capped at 96 or 80 (5 or 6 programs, with spills) 43-59%. layer_norm's coop lost with
# the same change (layer_norm.py, _BWD_COOP_SEG). The next row's rstd loaded with its x and dy
# (as RSTD_AHEAD in the register path) gained nothing (run 28, rms_norm_ab_h200_run28.txt: 74.7%
# against 74.4%, 78.9% against 79.1%, add_rms_norm 78.1% either way); not kept.
COOP_MAXNREG = {(False, False, False, 2048, 4): 128, (True, True, False, 2048, 4): 128,
                (False, False, True, 2048, 4): 128, (True, False, True, 2048, 4): 128}
COOP_RELOAD = True
# Tiles past the next one that the register paths' persistent grids prefetch into L2
# (_utils.prefetch_l2): none. H200 A/B run 32 (rms_norm_ab_h200_run32.txt), bf16, % of copy, none
# -> 1 tile (2): fwd 4096x8192 84.6 -> 80.1 (74.3), 16384x5120 91.6 -> 85.0 (74.8); bwd 32768x4096
# 95.2 -> 94.1 (82.6), 8192x4096 80.0 -> 80.9 (73.1), 4096x8192 77.7 -> 73.6 (72.0), 3000x3584
# 57.3 -> 60.4 (57.0); add_rms_norm bwd 2.5-5 points slower at every shape. (layer_norm's
# backward gained: layer_norm._BWD_ROWS_L2_AHEAD.)
FWD_L2_AHEAD = 0
BWD_ROWS_L2_AHEAD = 0
# Rows past the one a coop step loads that it also prefetches into L2 (_utils.prefetch_l2), without
# dh: 1. H200 A/B run 31 (rms_norm_ab_h200_run31.txt), bf16 bwd, % of copy, none -> 1 row (2 rows):
# 1024x65536 73.6 -> 74.5 (73.1), 2048x65536 78.1 -> 79.1 (77.1). With dh (add_rms_norm, whose
# prefetch also takes dh) it lost: 1024x65536 77.6 -> 72.4 (66.8), so none there.
COOP_L2_AHEAD = 1
# What holds coop below copy speed, measured (bf16 bwd, % of copy): rows a group, in part: 1024x65536
# 68.9%, 2048x65536 72.8%, 4096x65536 74.3% (run 20: 16, 32 and 64 rows a group of 32 programs,
# whose pipeline's first and last steps are half used; softmax's coop 78.7%, 82.4%, 84.0% at the
# same shapes, softmax_ab_h200_run15.txt). Not the load of each row's rstd, on which the publish
# waits: loaded a step ahead it measured 69.9% / 73.8% against 69.4% / 73.3% (run 21), and it cost
# layer_norm's coop 10 points at 4096x16384 (layer_norm_ab_h200_run17.txt); not kept.
# The forward's lines structure in the backward lost (rms_norm_ab_h200_run19.txt, 1024x65536): one
# program a row, pass 2 re-reading x and dy from L2 and adding dy * xhat into fp32 dw partial rows
# with vector reductions in L2 (red.global.add.v4.f32, as dw cannot stay in a program's registers),
# took 38-45% of copy for rms_norm and 46-51% for add_rms_norm over chunks, warps, 1-16 partial rows
# and grids, against 69.9% and 70.6% coop. The reductions add 4 bytes of L2 traffic per element to
# the 6 bytes of HBM traffic of a bf16 backward, and contend: one partial row 38.0%, four 42.6%.
# It is not kept.
DOT_CHUNK = 8192  # chunk of a wide row in _bwd_row_dot: 16 warps x 16 elements
COLS_TILE = (4, 1024)  # BLOCK_R x BLOCK_C of _bwd_cols, 8 warps: 64 registers, 4 programs per SM


def _tile(n: int, per_thread: int, split: bool = True) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_B, ROWS, num_warps) of the register path. A row is one power-of-two block,
    or (split, the forward) two when that wastes fewer lanes: 5120 = 4096 + 1024 (all lanes live)
    rather than 8192 (37.5% masked off, registers and occupancy spent on nothing); 3584 stays 4096
    (2048 + 2048 would waste as much). BLOCK_B = 0: one block."""
    block_n = triton.next_power_of_2(n)
    block_b = 0
    if split and block_n > n and triton.next_power_of_2(n - block_n // 2) < block_n // 2:
        block_n //= 2
        block_b = triton.next_power_of_2(n - block_n)
    rows = max(1, MIN_TILE // block_n)
    per_program = rows * (block_n + block_b) // (32 * per_thread)
    warps = min(32, max(4, 1 << (per_program.bit_length() - 1) if per_program else 4))
    return block_n, block_b, rows, warps


def _in_registers(n: int, max_block: int) -> bool:
    return triton.next_power_of_2(n) <= max_block


def _coop_cap(device: torch.device, has_dh: bool, w_at_use: bool, reload: bool, seg: int | None,
              warps: int | None, cap: int | None) -> dict:
    """The register cap of a _bwd_coop launch, as launch keywords: `cap` if given (0: none), else
    COOP_MAXNREG's for this launch on sm_90."""
    if cap is None and on_sm90(device):
        cap = COOP_MAXNREG.get((has_dh, w_at_use, reload, seg or COOP_SEG, warps or COOP_WARPS))
    return {"maxnreg": cap} if cap else {}


def _fwd_maxnreg(device: torch.device, has_res: bool, elem: int, block_n: int, block_b: int) -> int | None:
    if not on_sm90(device):
        return None
    return _FWD_MAXNREG[(has_res, elem)].get((block_n, block_b))


def _fwd_prefetch(n: int, elem: int, block: int) -> bool:
    """Prefetch the next tile in the forward: rows wider than 4096 whose width is a whole number of
    16-byte vectors (see the note at _FWD_WARPS)."""
    return block > 4096 and n * elem % 16 == 0


def _fwd_persistent(n: int, has_res: bool) -> bool:
    """Persistent grid or one tile per program, for the forward. Measured on the H200 with
    benchmarks/rms_norm_grid_ab.py (bf16, GB/s, 2026-11-22): one tile per program wins with a
    residual (8192x4096: 3650 against 3488) and at exactly 4096 wide (32768x4096: 3870 against
    3540); the persistent grid wins at 8192 and 16384 wide (2048x16384: 3337 against 2573); the
    other widths of the grid tie within 5%."""
    return not has_res and n != 4096


def _persistent_grid(tiles: int, resident: int) -> tuple[int, int]:
    """(programs, tiles per program) for `tiles` units of work striped over at most `resident`
    programs. Fewest programs for the same number of sweeps, so that the last sweep is as full as
    it can be (528 slots, 8192 tiles: 512 programs x 16 tiles, rather than 528 programs of which
    272 do a 16th tile while the other 256 idle)."""
    per = triton.cdiv(tiles, resident)
    return triton.cdiv(tiles, per), per


def _chunked_programs(device: torch.device, row_bytes: int) -> int:
    """One 32-warp program per SM, fewer if the rows they hold would not fit in ~3/4 of L2."""
    return min(sm_count(device), max(1, 3 * l2_bytes(device) // 4 // row_bytes))


def _wide_default(x: torch.Tensor, n: int, has_res: bool) -> str:
    """With a row for every SM at least (fewer rows, one program each, would leave SMs idle that the
    split's segments use): "lines" without a residual, "packed" with one for bf16 on the GPU up to
    PACKED_MAX_BLOCK (see the notes at WIDE); else WIDE."""
    if x.shape[0] < sm_count(x.device):
        return WIDE
    if not has_res:
        return "lines"
    return "packed" if widen_asm(x) and triton.next_power_of_2(n) <= PACKED_MAX_BLOCK else WIDE


def _as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.reshape(-1, n).contiguous()


def _check(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> None:
    if w.dim() != 1 or x.dim() == 0 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"weight must be [N] with N = x.shape[-1]: x {tuple(x.shape)}, w {tuple(w.shape)}")
    if x.numel() == 0:
        raise ValueError(f"empty input {tuple(x.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"x and residual must match: {tuple(x.shape)} {x.dtype} vs "
                         f"{tuple(residual.shape)} {residual.dtype}")


def rms_norm_forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None,
                     need_rstd: bool = True, max_block: int = MAX_REG_BLOCK, persistent: bool | None = None,
                     *, rows: int | None = None, num_warps: int | None = None, split: bool | None = None,
                     maxnreg: bool | None = None, prefetch: bool | None = None, liger_like: bool = False,
                     x_policy: str = "evict_last", wide: str | None = None, split_seg: int | None = None,
                     split_warps: int | None = None, lines_chunk: int | None = None, lines_programs=None,
                     lines_w_ahead: bool | None = None, l2_ahead: int | None = None):
    """(y, h, rstd). With a residual, h = x + residual (returned, and normalised in place of x);
    otherwise h is None. rstd: fp32 [rows], None unless need_rstd. `max_block` is the widest row
    kept in registers; the tests lower it to run the wide-row paths on small shapes.

    Register-path knobs for GPU A/Bs (None: the default choice): `rows` per program (a power of
    two), `num_warps`, `split` (a second column block, see _tile), `maxnreg` (the sm_90 register cap
    of _FWD_MAXNREG: it was measured for _tile's own tiles, so other tiles never get one), `prefetch`
    of the next tile, `persistent` grid. `liger_like` changes the defaults to Liger's forward: one
    row per program, BLOCK = next_pow2(N), Liger's num_warps (_utils.row_settings), no register
    cap, one tile per program, no prefetch. `x_policy`: the cache hint of the x loads ("" = none).
    `l2_ahead`: tiles past the next one that the persistent grid prefetches into L2 (default
    FWD_L2_AHEAD; sm_90 only).
    Wider rows: `wide` = "chunked" (_fwd_chunked), "split" (_fwd_split, with `split_seg`
    elements and `split_warps` warps per program), "packed" (_fwd_packed, `split_warps` warps) or
    "lines" (_fwd_lines: `lines_chunk` elements a chunk, `lines_programs` per SM or "rows",
    `split_warps` warps, defaults _utils.lines_launch; `lines_w_ahead`: w's next chunk prefetched
    too, default LINES_W_AHEAD); default: _wide_default."""
    _check(x, w, residual)
    if wide not in (None, "split", "chunked", "packed", "lines"):
        raise ValueError(f"wide must be 'split', 'chunked', 'packed' or 'lines', got {wide!r}")
    N = x.shape[-1]
    x2 = _as_rows(x, N)
    M = x2.shape[0]
    w = w.contiguous()
    y = torch.empty_like(x2)
    has_res = residual is not None
    r2 = _as_rows(residual, N) if has_res else x2  # x2, y: stand-ins for pointers the flags leave unused
    h = torch.empty_like(x2) if has_res else y
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if need_rstd else y
    if _in_registers(N, max_block):
        if liger_like:
            split = False if split is None else split
            rows = 1 if rows is None else rows
            num_warps = row_settings(N)[1] if num_warps is None else num_warps
            maxnreg = False if maxnreg is None else maxnreg
            prefetch = False if prefetch is None else prefetch
            persistent = False if persistent is None else persistent
        block_n, block_b, rows0, warps0 = _tile(N, FWD_PER_THREAD, split=split is not False)
        rows = rows or rows0
        warps = num_warps or (_FWD_WARPS.get((has_res, block_n + block_b), warps0) if rows == rows0 else warps0)
        if rows & (rows - 1) or rows * (block_n + block_b) > MAX_REG_BLOCK:
            raise ValueError(f"rows per program must be a power of two, at most {MAX_REG_BLOCK} elements: {rows}")
        default_tile = (block_n, block_b, rows, warps) == _tile(N, FWD_PER_THREAD)
        cap = (_fwd_maxnreg(x.device, has_res, x2.element_size(), block_n, block_b)
               if maxnreg is not False and default_tile else None)
        meta = dict(BLOCK_N=block_n, BLOCK_B=block_b, ROWS=rows, HAS_RES=has_res, STORE_RSTD=need_rstd,
                    PREFETCH=_fwd_prefetch(N, x2.element_size(), block_n + block_b) if prefetch is None else prefetch,
                    maxnreg=cap,
                    X_POLICY=x_policy)
        ahead = prefetch_ahead(l2_ahead, FWD_L2_AHEAD, x2, r2)
        if ahead:
            meta["L2_AHEAD"] = ahead
        args = (x2, r2, h, w, y, rstd, M, N, eps)
        tiles = triton.cdiv(M, rows)
        if persistent is None:
            persistent = _fwd_persistent(N, has_res)
        if persistent:
            grid, iters = _persistent_grid(tiles, _resident_programs(_fwd_rows, args + (1,), meta, warps, x.device))
        else:  # one tile per program (its prefetch of a tile past the end is fully masked: no traffic)
            grid, iters = tiles, 1
        _fwd_rows[(grid,)](*args, iters, num_warps=warps, **meta)
    elif (path := wide or _wide_default(x2, N, has_res)) == "packed":
        block = triton.next_power_of_2(N)
        _fwd_packed[(M,)](x2, r2, h, w, y, rstd, N, eps, BLOCK=block, HAS_RES=has_res, STORE_RSTD=need_rstd,
                          ASM=widen_asm(x2), num_warps=split_warps or max(4, min(32, block // 2048)))
    elif path == "lines":
        grid, meta = lines_launch(M, N, x2.element_size(), x.device, lines_chunk, lines_programs, split_warps,
                                  narrow_row_bytes=LINES_NARROW_ROW_BYTES)
        _fwd_lines[(grid,)](x2, r2, h, w, y, rstd, M, N, eps, HAS_RES=has_res, STORE_RSTD=need_rstd,
                            W_AHEAD=LINES_W_AHEAD if lines_w_ahead is None else lines_w_ahead, **meta)
    elif path == "split":
        # (a lowered max_block, as in the tests, lowers the segment with it)
        seg = split_seg or min(SPLIT_SEG_BYTES // x2.element_size(), triton.next_power_of_2(max_block))
        S = triton.cdiv(N, seg)
        part = torch.empty(M * S, dtype=torch.float32, device=x.device)
        count = torch.zeros(M, dtype=torch.int32, device=x.device)
        _fwd_split[(M * S,)](x2, r2, h, w, y, rstd, part, count, N, eps, S, SEG=seg,
                             S_BLOCK=triton.next_power_of_2(S), HAS_RES=has_res, STORE_RSTD=need_rstd,
                             num_warps=split_warps or max(4, min(16, seg * x2.element_size() // 2048)))
    else:
        chunk = min(CHUNK_BYTES // x2.element_size(), triton.next_power_of_2(max_block) // 2)
        grid = min(M, _chunked_programs(x.device, N * x2.element_size()))
        _fwd_chunked[(grid,)](x2, r2, h, w, y, rstd, M, N, eps, triton.cdiv(M, grid), CHUNK=chunk,
                              HAS_RES=has_res, STORE_RSTD=need_rstd,
                              num_warps=max(4, min(32, chunk * x2.element_size() // 1024)))
    return y.view(x.shape), (h.view(x.shape) if has_res else None), (rstd if need_rstd else None)


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                      dh: torch.Tensor | None = None, max_block: int = MAX_REG_BLOCK,
                      *, num_warps: int | None = None, prefetch: bool | None = None,
                      cols_tile: tuple[int, int] | None = None, policy: str = "evict_last",
                      wide: str | None = None, coop_seg: int | None = None, coop_warps: int | None = None,
                      coop_maxnreg: int | None = None, coop_w_at_use: bool | None = None,
                      coop_reload: bool | None = None, rstd_ahead: bool | None = None,
                      sum_rows: int = SUM_ROWS, coop_l2_ahead: int | None = None,
                      rows_l2_ahead: int | None = None):
    """(dx, dw) for y = rms_norm(x) * w; with dh (add_rms_norm: x is h, dh the gradient reaching h
    directly), dx includes it.

    Knobs for GPU A/Bs (defaults: the current choice): `num_warps` and `prefetch` of the register
    path (_bwd_rows), the cache `policy` of its loads and `rstd_ahead` (with the prefetch: the next
    tile's rstd loaded with its x and dy, default RSTD_AHEAD without dh); rows wider than
    `max_block` (the tests lower it) take `wide` = "cols" (_bwd_row_dot then _bwd_cols, whose
    (BLOCK_R, BLOCK_C) is `cols_tile`, 8 warps) or "coop" (_bwd_coop, `coop_seg` elements and `coop_warps` warps a
    program, `coop_maxnreg` registers a thread at most, 0 for no cap, default COOP_MAXNREG's;
    `coop_w_at_use`: w loaded at each use instead of held (default: with dh where the row is held);
    `coop_reload`: the row finished a step late re-read from L2 instead of held in registers
    (default COOP_RELOAD); `coop_l2_ahead`: rows past the one loaded that each step prefetches into
    L2, 0 for none (default COOP_L2_AHEAD without dh, else 0; sm_90 only)); `rows_l2_ahead`: tiles
    past the next one that the register path prefetches into L2 (default BWD_ROWS_L2_AHEAD);
    `sum_rows`: partial rows a load of the dw sum (_sum_partials); default "coop" on the GPU (where
    a group of its programs fits), "cols" elsewhere."""
    if wide not in (None, "cols", "coop"):
        raise ValueError(f"wide must be 'cols' or 'coop', got {wide!r}")
    N = x.shape[-1]
    x2 = _as_rows(x, N)
    dy2 = _as_rows(dy, N)
    M = x2.shape[0]
    w = w.contiguous()
    has_dh = dh is not None
    dh2 = _as_rows(dh, N) if has_dh else dy2
    dx = torch.empty_like(x2)
    # (the coop path's, see COOP_MAXNREG)
    reload = COOP_RELOAD if coop_reload is None else coop_reload
    w_at_use = (has_dh and not reload) if coop_w_at_use is None else coop_w_at_use
    if _in_registers(N, max_block):
        per_thread = 16 if has_dh and x2.element_size() == 2 else BWD_PER_THREAD
        block_n, _, rows, warps = _tile(N, per_thread, split=False)
        warps = num_warps or warps
        meta = dict(BLOCK_N=block_n, ROWS=rows, HAS_DH=has_dh,
                    PREFETCH=block_n < 16384 if prefetch is None else prefetch, POLICY=policy)
        if (RSTD_AHEAD and not has_dh) if rstd_ahead is None else rstd_ahead:  # (only with the prefetch)
            meta["RSTD_AHEAD"] = meta["PREFETCH"]
        ahead = prefetch_ahead(rows_l2_ahead, BWD_ROWS_L2_AHEAD, x2, dy2, dh2)
        if ahead:
            meta["L2_AHEAD"] = ahead
        # the partial buffer's size depends on the answer: rstd (fp32 too) stands in for it
        resident = _resident_programs(_bwd_rows, (x2, w, dy2, dh2, rstd, dx, rstd, M, N, 1), meta, warps, x.device)
        grid, iters = _persistent_grid(triton.cdiv(M, rows), resident)
        if grid == 1:  # a few rows (decode): the one program writes dw itself (the store casts)
            dw = torch.empty_like(w)
            _bwd_rows[(1,)](x2, w, dy2, dh2, rstd, dx, dw, M, N, iters, num_warps=warps, **meta)
            return dx.view(x.shape), dw
        part = torch.empty((grid, N), dtype=torch.float32, device=x.device)
        _bwd_rows[(grid,)](x2, w, dy2, dh2, rstd, dx, part, M, N, iters, num_warps=warps, **meta)
    elif (wide or ("coop" if x.is_cuda else "cols")) == "coop" and (plan := coop_plan(
            _bwd_coop, (x2, w, dy2, dh2, rstd, dx, rstd), M, N, coop_seg, COOP_SEG, coop_warps or COOP_WARPS, 1,
            HAS_DH=has_dh, W_AT_USE=w_at_use, RELOAD=reload,
            L2_AHEAD=prefetch_ahead(coop_l2_ahead, 0 if has_dh else COOP_L2_AHEAD, x2, dy2, dh2),
            **_coop_cap(x.device, has_dh, w_at_use, reload, coop_seg, coop_warps, coop_maxnreg))) is not None:
        # (rstd: an fp32 stand-in for the dw partials, sized by the plan)
        groups, iters, S, slots, meta = plan
        part = torch.empty((groups, N), dtype=torch.float32, device=x.device)
        _bwd_coop[(groups * S,)](x2, w, dy2, dh2, rstd, dx, part, slots, M, N, S, iters,
                                 num_warps=coop_warps or COOP_WARPS, **meta)
    else:
        c = torch.empty(M, dtype=torch.float32, device=x.device)
        dot_chunk = min(DOT_CHUNK, triton.next_power_of_2(max_block) // 2)
        _bwd_row_dot[(M,)](x2, w, dy2, rstd, c, M, N, CHUNK=dot_chunk, num_warps=max(4, min(16, dot_chunk // 512)))
        block_r, block_c = cols_tile or COLS_TILE
        block_c = min(block_c, triton.next_power_of_2(max_block) // 4)
        n_cb = triton.cdiv(N, block_c)
        meta = dict(BLOCK_R=block_r, BLOCK_C=block_c, HAS_DH=has_dh)
        resident = _resident_programs(_bwd_cols, (x2, w, dy2, dh2, rstd, c, dx, rstd, M, N, 1), meta, 8, x.device)
        # as many row groups as fill the resident slots, each group at least 4 tiles deep
        groups = max(1, min(resident // n_cb, triton.cdiv(M, 4 * block_r)))
        part = torch.empty((groups, N), dtype=torch.float32, device=x.device)
        _bwd_cols[(n_cb, groups)](x2, w, dy2, dh2, rstd, c, dx, part, M, N, triton.cdiv(M, groups * block_r),
                                  num_warps=8, **meta)
    dw = torch.empty_like(w)
    # Tiles of 4096 fp32: with hundreds of partial rows, SUM_ROWS rows x 4096 / SUM_ROWS columns,
    # i.e. N / 8 programs with 16 KB of loads in flight each, one load for all the L2-resident
    # partials (3 us for the whole launch before, with 128 rows a load: torch.profiler, run 29's
    # session); with few partial rows (small M, or the interpreter), wider and fewer.
    block_p = min(sum_rows, triton.next_power_of_2(part.shape[0]))
    block_n = 4096 // block_p
    _sum_partials[(triton.cdiv(N, block_n),)](part, dw, part.shape[0], N, BLOCK_P=block_p, BLOCK_N=block_n,
                                              num_warps=4)
    return dx.view(x.shape), dw


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, _, rstd = rms_norm_forward(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x, w, rstd)
        return dx, dw, None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return RMSNormFunction.apply(x, w, eps)
    return rms_norm_forward(x, w, eps, need_rstd=False)[0]  # inference: no rstd to keep


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def rms_norm_eager(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """HF LlamaRMSNorm: statistics and normalisation in fp32, cast back, then the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rms_norm_torch_fused(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PyTorch's own RMSNorm (a fused CUDA kernel on GPU)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def rms_norm_liger(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # (X, W, eps, offset, casting_mode, in_place): no Gemma offset, LLaMA casting, and Liger's
    # default in_place=True (dx is written over the upstream gradient: the gate checks the first
    # call, the timed repeats only see changed values, not changed work).
    return LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", True)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # hidden states: unit-scale features with a per-token scale spread over two orders of magnitude
    # (rstd differs from row to row, as between tokens of a real residual stream)
    x = torch.randn((m, n), generator=g) * torch.exp(torch.randn((m, 1), generator=g))
    w = 1.0 + 0.3 * torch.randn(n, generator=g)  # trained norm weights scatter around one
    return {"x": x.to(device=device, dtype=dtype), "w": w.to(device=device, dtype=dtype), "eps": 1e-6}


# ---------------------------------------------------------------------------------------------
# Shape grids: M = tokens, N = hidden size.


_s = Shape.rows


QUICK = (
    _s(64, 1024, "small, power of two: several rows per program"),
    _s(37, 1000, "awkward: rows and width not powers of two, tail masked"),
    _s(3, 20000, "rows wider than the register block: the wide-row paths"),
)

FULL = (
    _s(1, 4096, "a single token (decode): launch latency dominates"),
    _s(1024, 2048, "small model (Qwen2-1.5B width), short batch: latency-bound"),
    _s(8192, 4096, "LLaMA-3-8B, 8k tokens"),
    _s(32768, 4096, "LLaMA-3-8B, 32k tokens: the largest, far beyond L2"),
    _s(16384, 5120, "LLaMA-2-13B / Qwen-14B width"),
    _s(4096, 8192, "LLaMA-3-70B width"),
    _s(2048, 16384, "LLaMA-3-405B width: the widest row kept in registers"),
    _s(3000, 3584, "awkward token count, Qwen2-7B width (not a power of two: masked tail)"),
    _s(999, 5003, "odd width: rows not 16-byte aligned, no vector loads for anyone"),
    _s(1024, 65536, "very wide rows: forward in two passes of prefetched chunks (lines), backward in coop segments"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic, s = element size; rstd is our own M*4-byte side output, not counted):
#   fwd:      read x, w; write y                     -> (2*M*N + N) * s
#   bwd:      read x, dy, w; write dx, dw            -> (3*M*N + 2*N) * s
#   fwd+bwd:  the two passes                         -> (5*M*N + 3*N) * s
# What our kernels move beyond that: the backward's fp32 [programs, N] dw partials (written and
# summed while in L2); for rows wider than MAX_REG_BLOCK the backward reads x and dy twice
# (5*M*N*s instead of 3*M*N*s, see _bwd_row_dot / _bwd_cols).
# FLOPs: fwd 4 per element (square, sum, scale, weight); bwd 9 (xhat, m, dot, dx, dw).


def bytes_moved(dims, dtype, mode) -> int:
    m, n = dims["M"], dims["N"]
    fwd = 2 * m * n + n
    bwd = 3 * m * n + 2 * n
    per = {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]
    return per * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 4, "bwd": 9, "fwd+bwd": 13}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="rms_norm",
    description="x * rsqrt(mean(x^2) + eps) * w over the last dimension, forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(rms_norm, rms_norm_eager)
    + (
        Provider("torch_fused", rms_norm_torch_fused),
        Provider("liger", rms_norm_liger, peer_available("liger_kernel")),
    ),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "w"),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # Measured worst over seeds and the test shapes: bf16 3.9e-3 (ours in the interpreter, whose
    # fp32->bf16 cast truncates; eager 3.4e-3: it rounds h before the weight, then dy * w, ...),
    # fp16 4.4e-4, fp32 1.2e-7. bf16/fp16 ~2.5-3x above that; fp32 leaves room for the longer
    # fp32 sums of the full grid (65536-wide rows, dw over 32k rows) in every provider.
    tolerance={torch.bfloat16: 1e-2, torch.float16: 1.5e-3, torch.float32: 1e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
