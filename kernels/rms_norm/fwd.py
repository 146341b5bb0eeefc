"""RMSNorm's forward kernels and their launcher. The same kernels serve add_rms_norm (h = x +
residual, y = rms_norm(h)): the constexpr HAS_RES loads the residual, rounds h to the input dtype,
stores it and normalises it (the norm sees the h that is returned and that the backward reads
back). With the flag off, the code for it is not generated. Math in fp32, one rounding per output.

Loops with a runtime bound are `while` loops: Triton 3.6's interpreter cannot take a runtime bound
in range() under NumPy >= 2.4 (its scalars are 1-element arrays); a while loop compiles the same."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import resident_programs, widen_asm
from .._jit.coop import last_to_arrive
from .._jit.widen import widen
from .._host.rows import lines_grid, LinesConfig, persistent_grid
from .config import ForwardConfig, PackedConfig, RowsConfig, SplitConfig, pick_forward


@triton.jit
def load_tile(ptr, rows, cols, M, N, policy: tl.constexpr):
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return tl.load(ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0,
                   eviction_policy=policy)


@triton.jit
def store_tile(ptr, val, rows, cols, M, N):
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], val.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_input(x, r, h_ptr, rows, cols, M, N, HAS_RES: tl.constexpr):
    """The fp32 values that get normalised: x, or with a residual h = x + r, rounded and stored."""
    if HAS_RES:
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        store_tile(h_ptr, h, rows, cols, M, N)
        return h.to(tl.float32)
    else:
        return x.to(tl.float32)


@triton.jit(do_not_specialize=["iters"])  # one binary whatever the trip count
def _fwd_rows(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, M, N, eps, iters,
              BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
              HAS_RES: tl.constexpr, STORE_RSTD: tl.constexpr, PREFETCH: tl.constexpr = True):
    # Rows in registers: a program owns a tile of ROWS x (BLOCK_N + BLOCK_B) elements and strides
    # over the tiles (a persistent grid, or one tile per program); w is loaded once per program.
    # Columns [0, BLOCK_N), plus [BLOCK_N, BLOCK_N + BLOCK_B) when BLOCK_B > 0 (config.tile: a
    # 5120-wide row is 4096 + 1024, not 8192 with 3072 lanes masked off). Suffix b: that segment.
    # PREFETCH: the next tile's loads are issued before this tile's reduction waits on its data, so
    # that every warp has a load in flight at all times. x (and the residual) are hinted evict_last,
    # though each is read once: it beat evict_first by 0-8% on the H200 (add_rms_norm 32768x4096:
    # 92.0% -> 99.7% of copy) and no hint; we have not found out why.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if BLOCK_B > 0:
        colsb = BLOCK_N + tl.arange(0, BLOCK_B)
        wb = tl.load(w_ptr + colsb, mask=colsb < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if PREFETCH:
        rows = pid * ROWS + tl.arange(0, ROWS)
        x = load_tile(x_ptr, rows, cols, M, N, "evict_last")
        r = load_tile(r_ptr, rows, cols, M, N, "evict_last") if HAS_RES else x  # else: unused
        if BLOCK_B > 0:
            xb = load_tile(x_ptr, rows, colsb, M, N, "evict_last")
            rb = load_tile(r_ptr, rows, colsb, M, N, "evict_last") if HAS_RES else xb

    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        if PREFETCH:  # past the last tile the rows are >= M: fully masked, no traffic
            x_next = load_tile(x_ptr, rows + step, cols, M, N, "evict_last")
            if HAS_RES:
                r_next = load_tile(r_ptr, rows + step, cols, M, N, "evict_last")
            if BLOCK_B > 0:
                xb_next = load_tile(x_ptr, rows + step, colsb, M, N, "evict_last")
                if HAS_RES:
                    rb_next = load_tile(r_ptr, rows + step, colsb, M, N, "evict_last")
        else:
            x = load_tile(x_ptr, rows, cols, M, N, "evict_last")
            r = load_tile(r_ptr, rows, cols, M, N, "evict_last") if HAS_RES else x
            if BLOCK_B > 0:
                xb = load_tile(x_ptr, rows, colsb, M, N, "evict_last")
                rb = load_tile(r_ptr, rows, colsb, M, N, "evict_last") if HAS_RES else xb

        xf = _fwd_input(x, r, h_ptr, rows, cols, M, N, HAS_RES)
        ss = tl.sum(xf * xf, axis=1)
        if BLOCK_B > 0:
            xbf = _fwd_input(xb, rb, h_ptr, rows, colsb, M, N, HAS_RES)
            ss += tl.sum(xbf * xbf, axis=1)
        rstd = tl.math.rsqrt(ss / N + eps)
        store_tile(y_ptr, xf * rstd[:, None] * w[None, :], rows, cols, M, N)
        if BLOCK_B > 0:
            store_tile(y_ptr, xbf * rstd[:, None] * wb[None, :], rows, colsb, M, N)
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
               STORE_RSTD: tl.constexpr):
    # Wide rows, the lines scheme of softmax's forward for the sum of squares: chunks of
    # [BLOCK // VEC, VEC] (a 16-byte vector a line), the sum kept per line (no block reduction in the
    # loop), pass 1's next chunk loaded before the current one is used; pass 2 re-reads the row (x, or
    # the h pass 1 wrote) from L2 newest chunk first, its next chunk loaded before the current one is
    # stored, and w at its use (one row for all rows, always in L2: prefetched a chunk ahead it cost
    # registers, 61.9-67.0% of copy against 88.2%). N_FULL unmasked chunks, and a masked one if TAIL
    # (pass 1 first, pass 2 last). Programs stride over the rows.
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
        if N_FULL > 1:
            for j in range(N_FULL - 1):
                c = N_FULL - 1 - j
                cur = v
                v = tl.load(src_ptr + base + (c - 1) * BLOCK + offs, eviction_policy="evict_first")
                w_cur = tl.load(w_ptr + c * BLOCK + offs, eviction_policy="evict_last")
                y = cur.to(tl.float32) * rstd * w_cur.to(tl.float32)
                tl.store(y_row + c * BLOCK + offs, y.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        if TAIL:
            v_t = tl.load(src_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
            w_t = tl.load(w_ptr + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
        if N_FULL > 0:
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
    # Wide rows, one launch (see _jit.coop.last_to_arrive): program (row, segment) loads its SEG
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
    # with a residual h = x + r, stored here) and widened at each use (ASM: _jit.widen.widen; a 64K bf16
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


def as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.reshape(-1, n).contiguous()


def check_inputs(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> None:
    if w.dim() != 1 or x.dim() == 0 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"weight must be [N] with N = x.shape[-1]: x {tuple(x.shape)}, w {tuple(w.shape)}")
    if x.numel() == 0:
        raise ValueError(f"empty input {tuple(x.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"x and residual must match: {tuple(x.shape)} {x.dtype} vs "
                         f"{tuple(residual.shape)} {residual.dtype}")


def _rows(config: RowsConfig, args: tuple, meta: dict, M: int, N: int, device) -> None:
    if config.block_n + config.block_b < N or config.rows & (config.rows - 1):
        raise ValueError(f"{config} must cover the row of {N} elements, with a power-of-two number of rows")
    meta.update(BLOCK_N=config.block_n, BLOCK_B=config.block_b, ROWS=config.rows, PREFETCH=config.prefetch,
                maxnreg=config.maxnreg)
    tiles = triton.cdiv(M, config.rows)
    if config.persistent:
        grid, iters = persistent_grid(tiles, resident_programs(_fwd_rows, args + (1,), meta, config.warps, device))
    else:  # one tile per program (its prefetch of a tile past the end is fully masked: no traffic)
        grid, iters = tiles, 1
    _fwd_rows[(grid,)](*args, iters, num_warps=config.warps, **meta)


def rms_norm_forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None,
                     need_rstd: bool = True, config: ForwardConfig | None = None):
    """(y, h, rstd). With a residual, h = x + residual (returned, and normalised in place of x);
    otherwise h is None. rstd: fp32 [rows], None unless need_rstd. `config`: the launch (a config of
    .config or _host.rows.LinesConfig); None: pick_forward's."""
    check_inputs(x, w, residual)
    N = x.shape[-1]
    x2 = as_rows(x, N)
    M = x2.shape[0]
    w = w.contiguous()
    y = torch.empty_like(x2)
    has_res = residual is not None
    r2 = as_rows(residual, N) if has_res else x2  # x2, y: stand-ins for pointers the flags leave unused
    h = torch.empty_like(x2) if has_res else y
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if need_rstd else y
    config = config or pick_forward(M, N, x.dtype, has_res, x.device)
    args = (x2, r2, h, w, y, rstd)
    flags = dict(HAS_RES=has_res, STORE_RSTD=need_rstd)
    if isinstance(config, RowsConfig):
        _rows(config, args + (M, N, eps), flags, M, N, x.device)
    elif isinstance(config, LinesConfig):
        grid, meta = lines_grid(config, M, N, x2.element_size(), x.device)
        _fwd_lines[(grid,)](*args, M, N, eps, **flags, **meta)
    elif isinstance(config, PackedConfig):
        if config.block < N:
            raise ValueError(f"{config} holds rows of up to {config.block} elements, not {N}")
        _fwd_packed[(M,)](*args, N, eps, BLOCK=config.block, ASM=widen_asm(x2), num_warps=config.warps, **flags)
    elif isinstance(config, SplitConfig):
        S = triton.cdiv(N, config.seg)
        part = torch.empty(M * S, dtype=torch.float32, device=x.device)
        count = torch.zeros(M, dtype=torch.int32, device=x.device)
        _fwd_split[(M * S,)](*args, part, count, N, eps, S, SEG=config.seg, S_BLOCK=triton.next_power_of_2(S),
                             num_warps=config.warps, **flags)
    else:
        raise ValueError(f"not a forward config of rms_norm: {config!r}")
    return y.view(x.shape), (h.view(x.shape) if has_res else None), (rstd if need_rstd else None)
