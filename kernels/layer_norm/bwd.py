"""LayerNorm's backward kernels and their launcher. dx needs two row sums, c1 = mean(xhat * w * dy) and
c2 = mean(w * dy); dw and db are column sums over all rows. Programs keep their dw/db partials in
fp32 registers while they stride over their rows, write one partial row each to a small
[programs, 2, N] buffer, and _ln_sum_partials sums them (still in L2; a single program writes dw
and db itself). Rows that fit in registers with their accumulators (about 5 fp32 registers an
element) are read once; wider rows on the GPU are held in segments by programs that wait for each
other's sums (coop), elsewhere read twice (row sums, then column blocks, as PyTorch does)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.coop import coop_plan
from .._host.device import resident_programs, sm_count
from .._host.prefetch import prefetch_ahead
from .._jit.coop import coop_program, publish2, wait_total2
from .._jit.prefetch import prefetch_rows, prefetch_segment
from .._host.rows import align, persistent_grid
from .._jit.rows import col_mask, row_start
from .config import SUM_BLOCK_C, SUM_BLOCK_G, BackwardConfig, BwdRowsConfig, ColsConfig, CoopConfig, pick_backward
from .fwd import load_rows


@triton.jit
def _add_pair(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit(do_not_specialize=["iters"])
def _ln_bwd_rows(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, M, N, iters,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr, POLICY: tl.constexpr,
                 FUSED_SUMS: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # Rows in registers: whole-row tiles on a persistent grid, as rms_norm's _bwd_rows; c1 and c2 are
    # reduced from the same registers (one read of x and dy), with FUSED_SUMS in one reduction over
    # the pair (one exchange between warps, not two). Each program strides over `iters` row tiles with its dw/db
    # partials in fp32 registers and writes them once, as its row of the [programs, 2, N] partial
    # buffer (or, with one program, straight into the [2N] result: the store casts to its dtype).
    # The next tile's x, dy, mean and rstd are loaded before this tile's reductions wait on its data.
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    cmask = col_mask(cols, N, N_ALIGN)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    rows0 = pid * ROWS + tl.arange(0, ROWS)
    x = load_rows(x_ptr, rows0, cols, M, N, N_ALIGN, POLICY)
    dy = load_rows(dy_ptr, rows0, cols, M, N, N_ALIGN, POLICY)
    mean = tl.load(mean_ptr + rows0, mask=rows0 < M, other=0.0)
    rstd = tl.load(rstd_ptr + rows0, mask=rows0 < M, other=0.0)
    i = 0
    while i < iters:
        rows = pid * ROWS + i * step + tl.arange(0, ROWS)
        i += 1
        rmask = rows < M
        if L2_AHEAD:  # the tile L2_AHEAD past the next one into L2 (_jit.prefetch.prefetch_l2)
            prefetch_rows(x_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
            prefetch_rows(dy_ptr, pid * ROWS + (i + L2_AHEAD) * step, ROWS, M, N)
        # past the last tile the rows are >= M: fully masked, no traffic
        x_next = load_rows(x_ptr, rows + step, cols, M, N, N_ALIGN, POLICY)
        dy_next = load_rows(dy_ptr, rows + step, cols, M, N, N_ALIGN, POLICY)
        mean_next = tl.load(mean_ptr + rows + step, mask=rows + step < M, other=0.0)
        rstd_next = tl.load(rstd_ptr + rows + step, mask=rows + step < M, other=0.0)
        # masked rows and columns load 0 (x, dy, mean, rstd), so they add nothing to dw, db, c1, c2
        xhat = (x.to(tl.float32) - mean[:, None]) * rstd[:, None]
        dyf = dy.to(tl.float32)
        dw += dyf * xhat
        db += dyf
        # dy * w rounded once (an explicit fma, which the compiler leaves alone) and used as that
        # value in the sums and in dx: as a plain product the compiler fuses it unrounded into dx's
        # subtraction, and at N = 1 (xhat = 0, N * wdy - s2 = 0) dx kept its rounding error where
        # it is exactly 0. N * wdy - s2 rather than wdy - s2 / N: no division to round before the
        # cancellation; the one division is rstd / N, per row.
        wdy = tl.fma(dyf, w[None, :], 0.0)
        if FUSED_SUMS:
            s1, s2 = tl.reduce((xhat * wdy, wdy), 1, _add_pair)
        else:
            s1 = tl.sum(xhat * wdy, axis=1)
            s2 = tl.sum(wdy, axis=1)
        dx = (wdy * N - (xhat * s1[:, None] + s2[:, None])) * (rstd / N)[:, None]
        offs = row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
        x = x_next
        dy = dy_next
        mean = mean_next
        rstd = rstd_next
    part = part_ptr + row_start(pid, 2 * N, N_ALIGN)
    tl.store(part + cols, tl.sum(dw, axis=0), mask=cmask)
    tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)


@triton.jit(do_not_specialize=["iters"])
def _ln_bwd_coop(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, slot_ptr, M, N, S, iters,
                 SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # Wide rows on the GPU, one launch: rms_norm's _bwd_coop with layer_norm's two row sums (c1, c2,
    # _jit.coop.publish2 / wait_total2). Program (group g, segment s) keeps columns [s*SEG, (s+1)*SEG)
    # of x and dy for rows g, g+G, ...; in step i it loads row i+1, publishes row i's partial sums
    # and finishes row i-1 (still in registers: re-read from L2 as rms_norm's coop does, it lost
    # here) with the totals published a step ago. Its dw and db partials stay in fp32 registers and
    # are written once, as row g of the [G, 2, N] buffer.
    G, g, seg, cols = coop_program(S, SEG)
    cm = col_mask(cols, N, N_ALIGN)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0)
    dw = tl.zeros([SEG], dtype=tl.float32)
    db = tl.zeros([SEG], dtype=tl.float32)
    x = tl.load(x_ptr + row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    dy = tl.load(dy_ptr + row_start(g, N, N_ALIGN) + cols, mask=cm & (g < M), other=0.0)
    # (not `xp = x`: Triton 3.6 carries a name through a while loop only if the body gives it a
    # value other than the one it entered with, and `xp = x` in the body would look like no change)
    xp = tl.zeros_like(x)
    dyp = tl.zeros_like(dy)
    mean_p = tl.load(mean_ptr + g, mask=g < M, other=0.0)  # (float tensors for the loop)
    rstd_p = tl.load(rstd_ptr + g, mask=g < M, other=0.0)
    i = 0
    while i <= iters:  # step i: publish row i (past the end at i = iters: zeros), finish row i - 1
        row = g + i * G
        nxt = row_start(row + G, N, N_ALIGN) + cols
        x_next = tl.load(x_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        dy_next = tl.load(dy_ptr + nxt, mask=cm & (row + G < M), other=0.0)
        if L2_AHEAD:  # the row L2_AHEAD steps past x_next into L2 (_jit.prefetch.prefetch_l2)
            prefetch_segment(x_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
            prefetch_segment(dy_ptr, row + (1 + L2_AHEAD) * G, M, N, seg, SEG)
        mean = tl.load(mean_ptr + row, mask=row < M, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        # masked columns: dy = w = 0, so xhat's value there adds nothing
        xhat = (x.to(tl.float32) - mean) * rstd
        dyf = dy.to(tl.float32)
        wdy = dyf * w.to(tl.float32)
        dw += dyf * xhat
        db += dyf
        publish2(slot_ptr, row, seg, S, tl.sum(xhat * wdy, axis=0), tl.sum(wdy, axis=0))
        if i > 0:
            prow = row - G
            c1, c2 = wait_total2(slot_ptr, prow, S, S_BLOCK)
            xhat_p = (xp.to(tl.float32) - mean_p) * rstd_p
            dx = (dyp.to(tl.float32) * w.to(tl.float32) - (xhat_p * (c1 / N) + c2 / N)) * rstd_p
            tl.store(dx_ptr + row_start(prow, N, N_ALIGN) + cols, dx.to(dx_ptr.dtype.element_ty),
                     mask=cm & (prow < M))
        xp = x
        dyp = dy
        mean_p = mean
        rstd_p = rstd
        x = x_next
        dy = dy_next
        i += 1
    part = part_ptr + row_start(g, 2 * N, N_ALIGN)
    tl.store(part + cols, dw, mask=cm)
    tl.store(part + N + cols, db, mask=cm)


@triton.jit
def _ln_bwd_row_sums(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, c_ptr, M, N,
                     CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    # Wide rows, pass 1 of 2: c1 = mean(xhat * w * dy) -> c[row], c2 = mean(w * dy) -> c[M + row].
    # Vector accumulators, reduced once at the end (one cross-warp reduction per row, not per chunk).
    row = tl.program_id(0)
    base = row_start(row, N, N_ALIGN)
    offs = tl.arange(0, CHUNK)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    acc1 = tl.zeros([CHUNK], dtype=tl.float32)
    acc2 = tl.zeros([CHUNK], dtype=tl.float32)
    start = 0
    while start < N:
        cols = start + offs
        mask = col_mask(cols, N, N_ALIGN)
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        wdy = w * dy  # 0 where masked, so xhat's value there does not matter
        acc1 += (x - mean) * rstd * wdy
        acc2 += wdy
        start += CHUNK
    tl.store(c_ptr + row, tl.sum(acc1, axis=0) / N)
    tl.store(c_ptr + M + row, tl.sum(acc2, axis=0) / N)


@triton.jit
def _ln_bwd_cols(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, c_ptr, dx_ptr, part_ptr, M, N, G,
                 ROWS: tl.constexpr, BLOCK_C: tl.constexpr, N_ALIGN: tl.constexpr):
    # Wide rows, pass 2 of 2. Program (g, j): rows g*ROWS.. strided by G*ROWS, columns of block j;
    # c1, c2 come from _ln_bwd_row_sums. Loads hinted evict_last (see config.py).
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = col_mask(cols, N, N_ALIGN)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    db = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    r0 = g * ROWS
    while r0 < M:
        rows = r0 + tl.arange(0, ROWS)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        offs = row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = (x - mean[:, None]) * rstd[:, None]
        wdy = w[None, :] * dy  # 0 wherever masked
        c1 = tl.load(c_ptr + rows, mask=rmask, other=0.0)
        c2 = tl.load(c_ptr + M + rows, mask=rmask, other=0.0)
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
        r0 += G * ROWS
    part = part_ptr + row_start(g, 2 * N, N_ALIGN)
    tl.store(part + cols, tl.sum(dw, axis=0), mask=cmask)
    tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)


@triton.jit
def _ln_sum_partials(part_ptr, out_ptr, G, n2, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                     N_ALIGN: tl.constexpr):
    # out[c] = sum_g part[g, c] over the [G, 2N] partials (dw then db), cast to the weight dtype.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = col_mask(cols, n2, N_ALIGN)
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    g0 = 0
    while g0 < G:
        gs = g0 + tl.arange(0, BLOCK_G)
        mask = (gs < G)[:, None] & cmask[None, :]
        acc += tl.load(part_ptr + row_start(gs, n2, N_ALIGN)[:, None] + cols[None, :], mask=mask, other=0.0)
        g0 += BLOCK_G
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cmask)


def sum_partials(partial: torch.Tensor, out: torch.Tensor, groups: int) -> None:
    """out = column sums of the [groups, 2N] partials (SUM_BLOCK_G rows a load, SUM_BLOCK_C columns a
    program)."""
    n2 = out.numel()
    _ln_sum_partials[(triton.cdiv(n2, SUM_BLOCK_C),)](partial, out, groups, n2, BLOCK_G=SUM_BLOCK_G,
                                                      BLOCK_C=SUM_BLOCK_C, N_ALIGN=align(n2), num_warps=4)


def _rows(config: BwdRowsConfig, dy, x, weight, mean, rstd, dx, out) -> None:
    M, N = x.shape
    if config.block_n < N or config.rows & (config.rows - 1):
        raise ValueError(f"{config} must cover the row of {N} elements, with a power-of-two number of rows")
    meta = dict(ROWS=config.rows, BLOCK_N=config.block_n, N_ALIGN=align(N), POLICY=config.policy,
                FUSED_SUMS=config.fused_sums, L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, x, dy))
    # the partial buffer stands in for itself by mean (fp32, same pointer properties)
    resident = resident_programs(_ln_bwd_rows, (x, dy, weight, mean, rstd, dx, mean, M, N, 1), meta, config.warps,
                                 x.device)
    grid, iters = persistent_grid(triton.cdiv(M, config.rows), resident)
    # one program (a few rows: decode) writes dw and db itself, saving the summing launch
    part = out if grid == 1 else torch.empty((grid, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd_rows[(grid,)](x, dy, weight, mean, rstd, dx, part, M, N, iters, num_warps=config.warps, **meta)
    if grid > 1:
        sum_partials(part, out, grid)


def _coop(config: CoopConfig, dy, x, weight, mean, rstd, dx, out) -> bool:
    """False where not even one group of its programs fits (see _host.coop.coop_plan)."""
    M, N = x.shape
    # (mean: an fp32 stand-in for the dw/db partials, sized by the plan)
    plan = coop_plan(_ln_bwd_coop, (x, dy, weight, mean, rstd, dx, mean), M, N, config.seg, config.seg,
                     config.warps, 2, N_ALIGN=align(N), L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, x, dy))
    if plan is None:
        return False
    groups, iters, S, slots, meta = plan
    partial = torch.empty((groups, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd_coop[(groups * S,)](x, dy, weight, mean, rstd, dx, partial, slots, M, N, S, iters,
                                num_warps=config.warps, **meta)
    sum_partials(partial, out, groups)
    return True


def _cols(config: ColsConfig, dy, x, weight, mean, rstd, dx, out) -> None:
    M, N = x.shape
    sums = torch.empty(2 * M, dtype=torch.float32, device=x.device)
    _ln_bwd_row_sums[(M,)](x, dy, weight, mean, rstd, sums, M, N, CHUNK=config.sums_chunk, N_ALIGN=align(N),
                           num_warps=max(4, min(16, config.sums_chunk // 512)))
    # ~groups_per_sm programs per SM in all; with few rows, at least one per SM, and each program
    # takes several row tiles where possible so that the partial buffer stays small next to x and dy
    sms, n_col_blocks = sm_count(x.device), triton.cdiv(N, config.block_c)
    row_tiles = triton.cdiv(M, config.rows)
    groups = max(1, min(row_tiles, triton.cdiv(config.groups_per_sm * sms, n_col_blocks),
                        max(triton.cdiv(sms, n_col_blocks), triton.cdiv(row_tiles, 8))))
    partial = torch.empty((groups, 2, N), dtype=torch.float32, device=x.device)
    _ln_bwd_cols[(groups, n_col_blocks)](x, dy, weight, mean, rstd, sums, dx, partial, M, N, groups,
                                         ROWS=config.rows, BLOCK_C=config.block_c, N_ALIGN=align(N),
                                         num_warps=config.warps)
    sum_partials(partial, out, groups)


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor, config: BackwardConfig | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx, dw, db); dw and db in the weight's dtype, summed in fp32. `config`: the launch (a
    config of .config); None: pick_backward's. A coop config falls back to ColsConfig() where not
    even one group of its programs fits."""
    M, N = x.shape
    dx = torch.empty_like(x)
    out = torch.empty(2 * N, dtype=weight.dtype, device=x.device)
    config = config or pick_backward(M, N, x.dtype, x.device)
    tensors = (dy, x, weight, mean, rstd, dx, out)
    if isinstance(config, BwdRowsConfig):
        _rows(config, *tensors)
    elif isinstance(config, CoopConfig):
        if not _coop(config, *tensors):
            _cols(ColsConfig(), *tensors)
    elif isinstance(config, ColsConfig):
        _cols(config, *tensors)
    else:
        raise ValueError(f"not a backward config of layer_norm: {config!r}")
    return dx, out[:N], out[N:]
