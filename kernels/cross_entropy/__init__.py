"""Cross-entropy: mean over the non-ignored rows of -log softmax(logits)[target], with optional
label smoothing, for language-model heads (logits [tokens, vocab], vocab 32k to 256k).

The gradient is computed in the forward, in the same pass over the logits (Liger's design): a
training step never needs the loss without its gradient, and the second read of each row then comes
from L2 instead of HBM. Backward only multiplies that gradient by the upstream scalar.

Why there is no "bwd" mode: backward does no work of its own here (nothing at all when the upstream
gradient is 1, one in-place scaling pass otherwise). Timing it alone would compare our multiply with
torch's complete softmax backward; "fwd+bwd" is the honest comparison of a training step, and "fwd"
(under no_grad) the inference/evaluation one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from .._lib import LOG2E, lse2_combine, lse_update, prefetch_ahead, prefetch_chunk, sm_count

LN2 = tl.constexpr(0.6931471805599453)

IGNORE_INDEX = -100  # PyTorch's default, and what HF trainers put on padding/prompt tokens


# ---------------------------------------------------------------------------------------------
# Triton kernels.
#
# One program per row at a time (rows are 64 KB to 1 MB: far too wide for registers), looping over
# the vocabulary in chunks of 16-32 KB with 16-byte loads:
#   pass 1  online max / sum-exp in fp32 registers, kept per 16-byte line so the loop has no
#           cross-thread reduction (one FMA and one ex2 per element, ~7 SASS instructions per bf16
#           element); the next chunk's load is issued before the current one is used, so two
#           chunks are in flight per program;
#   pass 2  (gradient only) re-reads the row newest chunk first and writes
#           (softmax - (1 - eps) * onehot - eps / V) / n_valid.
# One program a row, or with a gradient on small logits a persistent grid of 1-2 programs per SM
# (see _row_config; either way the programs resident at once, 1 per SM at 128256 bf16, bound the
# rows in flight, 33 MB there, within the 50 MB L2 for the re-read); pass-1 loads are marked
# evict_last and the gradient stores and pass-2 loads evict_first, so the streamed-out gradient does
# not push the rows waiting for their re-read out of L2. Walking pass 2 newest-first makes the
# re-read start with what is most surely still in L2 when rows in flight do exceed it (256k
# vocab). Without a gradient, loads evict_first (nothing is re-read).
# Registers (ptxas for sm_90, Triton 3.6): no-grad 8 warps 64-80/thread (3-4 programs per SM);
# gradient 16 warps 128 (1 program per SM) or 8 warps 128 (2 per SM); no spills.
#
# A few wide rows (decode, RL sampling) take the split path instead (see "Split path" below): each
# row cut into segments over a rows x segments grid, so that more than one SM reads a row.
#
# Loop bounds: chunk counts are constexpr and the row loop is a while loop: Triton 3.6's interpreter
# (with numpy 2.4, triton-lang/triton#9171) cannot run a `for` whose bounds are runtime values; on
# the GPU a constexpr chunk count only specialises the compile on the vocabulary size.


@triton.jit
def _count_valid(y_ptr, n_rows, ignore_index, YBLOCK: tl.constexpr):
    # the number of targets that are not ignore_index, as fp32 (the mean's divisor)
    cnt = tl.zeros([YBLOCK], dtype=tl.int32)
    s = 0
    while s < n_rows:
        o = s + tl.arange(0, YBLOCK)
        t = tl.load(y_ptr + o, mask=o < n_rows, other=ignore_index)
        cnt += (t != ignore_index).to(tl.int32)
        s += YBLOCK
    return tl.sum(cnt, 0).to(tl.float32)


@triton.jit
def _grad_store(dx_ptrs, x, lse2, inv_n, c_all, mask):
    g = tl.exp2(x.to(tl.float32) * LOG2E - lse2) * inv_n - c_all
    tl.store(dx_ptrs, g.to(dx_ptrs.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@triton.jit
def _ce_rows(x_ptr, x_stride, y_ptr, dx_ptr, dx_stride, loss_ptr, nvalid_ptr, n_rows, V,
             ignore_index, smoothing,
             HAS_GRAD: tl.constexpr, COUNT: tl.constexpr, SMOOTH: tl.constexpr, EVICT: tl.constexpr,
             N_FULL: tl.constexpr, TAIL: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr,
             YBLOCK: tl.constexpr, L2_AHEAD: tl.constexpr = 0):
    # A chunk is [BLOCK // VEC, VEC]: one 16-byte vector per line, lines spread over the threads.
    # Max and sum-exp are kept per line, so the chunk loop has no cross-thread reduction and no
    # barrier; the lines are combined once per row. The row is N_FULL full chunks, loaded without
    # masks, and (if TAIL) a masked partial chunk at the end, which pass 1 takes first and pass 2
    # last (so no chunk in the loops needs a per-element mask).
    offs2 = tl.arange(0, BLOCK // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs2
    t_mask = t_offs < V
    if HAS_GRAD:
        if COUNT:
            # n_valid over all targets, counted by every program: N int64 reads from L2 per program
            # (8.6 MB in all at 8192 tokens, 132 programs) instead of one more launch.
            n_valid = _count_valid(y_ptr, n_rows, ignore_index, YBLOCK)
        else:
            n_valid = tl.load(nvalid_ptr).to(tl.float32)
        inv_n = 1.0 / n_valid  # only used on valid rows, so n_valid >= 1 there
    row = tl.program_id(0)
    while row < n_rows:
        r = row.to(tl.int64)  # row * stride exceeds 2^31 at 8192 x 256000
        y = tl.load(y_ptr + r)
        x_row = x_ptr + r * x_stride
        if y == ignore_index:
            if HAS_GRAD:
                dx_row = dx_ptr + r * dx_stride
                zero = tl.zeros([BLOCK // VEC, VEC], dtype=dx_ptr.dtype.element_ty)
                for c in range(N_FULL):
                    tl.store(dx_row + c * BLOCK + offs2, zero, eviction_policy="evict_first")
                if TAIL:
                    tl.store(dx_row + t_offs, zero, mask=t_mask, eviction_policy="evict_first")
            tl.store(loss_ptr + r, 0.0)
        else:
            # An out-of-range target gives a NaN loss (no host sync to raise an error).
            bad = (y < 0) | (y >= V)
            x_y = tl.load(x_row + tl.where(bad, 0, y)).to(tl.float32)
            m = tl.full([BLOCK // VEC], float("-inf"), tl.float32)
            d = tl.zeros([BLOCK // VEC], dtype=tl.float32)
            sx = tl.zeros([BLOCK // VEC], dtype=tl.float32)
            # pass 1. Each load is issued one chunk ahead of its use: two chunks in flight.
            if TAIL:
                x_t = tl.load(x_row + t_offs, mask=t_mask, other=float("-inf"), eviction_policy=EVICT)
            if N_FULL > 0:
                x_next = tl.load(x_row + offs2, eviction_policy=EVICT)
            for k in tl.static_range(L2_AHEAD):  # chunks L2_AHEAD past the one loaded, into L2
                prefetch_chunk(x_row, k + 1, N_FULL, BLOCK)
            if TAIL:
                x = x_t.to(tl.float32)
                m, d = lse_update(x, m, d, False)
                if SMOOTH:
                    sx += tl.sum(tl.where(t_mask, x, 0.0), 1)
            if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
                for c in range(N_FULL - 1):
                    cur = x_next
                    x_next = tl.load(x_row + (c + 1) * BLOCK + offs2, eviction_policy=EVICT)
                    if L2_AHEAD:
                        prefetch_chunk(x_row, c + 1 + L2_AHEAD, N_FULL, BLOCK)
                    x = cur.to(tl.float32)
                    m, d = lse_update(x, m, d, False)
                    if SMOOTH:
                        sx += tl.sum(x, 1)
            if N_FULL > 0:
                x = x_next.to(tl.float32)
                m, d = lse_update(x, m, d, False)
                if SMOOTH:
                    sx += tl.sum(x, 1)
            # combine the lines: two block reductions per row
            lse2 = lse2_combine(m, d, 0)  # -inf row: NaN loss, as torch
            lse = lse2 * LN2
            # loss = (1 - eps) * (lse - x_y) + eps * mean_j (lse - x_j)
            if SMOOTH:
                loss = lse - (1.0 - smoothing) * x_y - smoothing * (tl.sum(sx, 0) / V)
            else:
                loss = lse - x_y
            tl.store(loss_ptr + r, tl.where(bad, float("nan"), loss))
            if HAS_GRAD:
                # pass 2: (softmax - eps / V) / n over the row, newest chunk first (see above).
                dx_row = dx_ptr + r * dx_stride
                c_y = (1.0 - smoothing) * inv_n  # the target's extra -(1 - eps) / n
                if SMOOTH:
                    c_all = (smoothing / V) * inv_n
                else:
                    c_all = 0.0
                if N_FULL > 0:
                    x_next = tl.load(x_row + (N_FULL - 1) * BLOCK + offs2, eviction_policy="evict_first")
                if N_FULL > 1:
                    for i in range(N_FULL - 1):
                        c = N_FULL - 1 - i
                        cur = x_next
                        x_next = tl.load(x_row + (c - 1) * BLOCK + offs2, eviction_policy="evict_first")
                        _grad_store(dx_row + c * BLOCK + offs2, cur, lse2, inv_n, c_all, None)
                if TAIL:
                    x_t = tl.load(x_row + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
                if N_FULL > 0:
                    _grad_store(dx_row + offs2, x_next, lse2, inv_n, c_all, None)
                if TAIL:
                    _grad_store(dx_row + t_offs, x_t, lse2, inv_n, c_all, t_mask)
                # The target's term: one scalar store over what the loop wrote there (a compare per
                # element in the loop would cost instructions and registers). Folded in fp32 before
                # the one rounding, so softmax_y - 1 does not cancel in bf16. The barrier orders it
                # after the loop's store of the same element by another thread.
                tl.debug_barrier()
                g_y = tl.exp2(x_y * LOG2E - lse2) * inv_n - c_all - c_y
                tl.store(dx_row + y, g_y.to(dx_ptr.dtype.element_ty), mask=(y >= 0) & (y < V))
        row += tl.num_programs(0)


@triton.jit
def _ce_finish(loss_ptr, y_ptr, out_ptr, n_rows, ignore_index, BLOCK: tl.constexpr):
    # One program: the mean of the per-row losses over the non-ignored rows (0/0 = NaN when all are
    # ignored, as in PyTorch), written in the output dtype. A fixed summation order: deterministic.
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    cnt = tl.zeros([BLOCK], dtype=tl.int32)
    s = 0
    while s < n_rows:
        o = s + cols
        acc += tl.load(loss_ptr + o, mask=o < n_rows, other=0.0)
        t = tl.load(y_ptr + o, mask=o < n_rows, other=ignore_index)
        cnt += (t != ignore_index).to(tl.int32)
        s += BLOCK
    mean = tl.sum(acc, 0) / tl.sum(cnt, 0).to(tl.float32)
    tl.store(out_ptr, mean.to(out_ptr.dtype.element_ty))


@triton.jit
def _scale_inplace(g_ptr, s_ptr, n_blocks, n, BLOCK: tl.constexpr):
    # g *= s for the upstream scalar s, read on the device (no host sync). s == 1 (loss.backward())
    # costs nothing: every program returns after one scalar load. Persistent grid over the blocks.
    s = tl.load(s_ptr).to(tl.float32)
    if s != 1.0:
        cols = tl.arange(0, BLOCK)
        b = tl.program_id(0)
        while b < n_blocks:
            offs = b.to(tl.int64) * BLOCK + cols
            v = tl.load(g_ptr + offs, mask=offs < n, eviction_policy="evict_first").to(tl.float32)
            tl.store(g_ptr + offs, (v * s).to(g_ptr.dtype.element_ty), mask=offs < n,
                     eviction_policy="evict_first")
            b += tl.num_programs(0)


# ---------------------------------------------------------------------------------------------
# Split path for few wide rows (decode / RL sampling: one to a few rows of a 128k-256k vocabulary).
#
# _ce_rows gives each row to one program: with one row, one SM streams the whole row while the
# others idle. Here each row is cut into S segments of SEG elements, one program each (grid
# rows x S), so that a row is read by S SMs at once:
#   _ce_split_partials  loads its segment once and writes the segment's max m_j, sum exp(x - m_j)
#                       and (label smoothing) sum x to a small fp32 buffer; program (row, 0) also
#                       copies x[target] there, so that nothing later reads the logits' target
#                       element (in place, the gradient kernel overwrites it);
#   _ce_split_finish    (no gradient, one program) combines each row's partials into its loss and
#                       writes the mean over the non-ignored rows: _ce_finish's job, in the same
#                       launch;
#   _ce_split_grad      (gradient, grid rows x S) combines its row's partials into lse, re-reads its
#                       segment (from L2: loaded evict_last by the first kernel) and writes the
#                       gradient of the mean loss as _ce_rows does; program (0, 0) also writes the
#                       per-row losses and the mean, so no _ce_finish launch follows.
# Partials of row r live at part[r * P:], P = 3 * S + 1: m_0..m_{S-1}, d_0..d_{S-1},
# sx_0..sx_{S-1}, x[target].
# Registers (ptxas for sm_90, Triton 3.6, bf16 and fp32, segments of 2048-8192): 32-52 per thread,
# up to 94 where program (0, 0) of _ce_split_grad combines an [8, 64] tile of partials; no spills.


@triton.jit
def _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                  SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # Losses of all rows, RBLOCK rows at a time (a [RBLOCK, SBLOCK] tile of partials: the rows'
    # dependent loads overlap instead of queueing one row after another), into loss_ptr; with
    # HAS_MEAN, their mean over the non-ignored rows into out_ptr (0/0 = NaN when all are ignored,
    # as torch). Loss formula and fixed summation order as in _ce_rows / _ce_finish.
    ri = tl.arange(0, RBLOCK)
    sj = tl.arange(0, SBLOCK)[None, :]
    acc = tl.zeros([RBLOCK], dtype=tl.float32)
    cnt = tl.zeros([RBLOCK], dtype=tl.int32)
    s = 0
    while s < n_rows:
        rows = s + ri
        in_rows = rows < n_rows
        y = tl.load(y_ptr + rows, mask=in_rows, other=ignore_index)
        valid = y != ignore_index  # False past n_rows too
        p = part_ptr + rows.to(tl.int64) * P
        pmask = valid[:, None] & (sj < S)
        # ignored rows (their loss is replaced by 0) get neutral partials: no -inf - -inf in them
        m_j = tl.where(valid[:, None], tl.load(p[:, None] + sj, mask=pmask, other=float("-inf")), 0.0)
        d_j = tl.where(valid[:, None], tl.load(p[:, None] + S + sj, mask=pmask, other=0.0), 1.0)
        lse = lse2_combine(m_j, d_j, 1) * LN2
        x_y = tl.load(p + 3 * S, mask=valid, other=0.0)
        if SMOOTH:
            sx = tl.sum(tl.load(p[:, None] + 2 * S + sj, mask=pmask, other=0.0), 1)
            loss = lse - (1.0 - smoothing) * x_y - smoothing * (sx / V)
        else:
            loss = lse - x_y
        bad = (y < 0) | (y >= V)  # an out-of-range target gives a NaN loss, as in _ce_rows
        loss = tl.where(valid, tl.where(bad, float("nan"), loss), 0.0)
        tl.store(loss_ptr + rows, loss, mask=in_rows)
        acc += loss
        cnt += valid.to(tl.int32)
        s += RBLOCK
    if HAS_MEAN:
        mean = tl.sum(acc, 0) / tl.sum(cnt, 0).to(tl.float32)
        tl.store(out_ptr, mean.to(out_ptr.dtype.element_ty))


@triton.jit
def _ce_split_partials(x_ptr, x_stride, y_ptr, part_ptr, P, V, S, ignore_index,
                       SMOOTH: tl.constexpr, EVICT: tl.constexpr, SEG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    y = tl.load(y_ptr + row)
    if y != ignore_index:  # an ignored row's partials are never read: skip its loads
        x_row = x_ptr + row * x_stride
        offs = j * SEG + tl.arange(0, SEG)
        mask = offs < V
        x = tl.load(x_row + offs, mask=mask, other=float("-inf"), eviction_policy=EVICT).to(tl.float32)
        m = tl.max(x, 0)
        m2 = tl.where(m == float("-inf"), 0.0, m * LOG2E)  # an all -inf segment: d = 0, no inf - inf
        d = tl.sum(tl.exp2(x * LOG2E - m2), 0)
        p = part_ptr + row * P
        tl.store(p + j, m)
        tl.store(p + S + j, d)
        if SMOOTH:
            tl.store(p + 2 * S + j, tl.sum(tl.where(mask, x, 0.0), 0))
        if j == 0:
            bad = (y < 0) | (y >= V)
            tl.store(p + 3 * S, tl.load(x_row + tl.where(bad, 0, y)).to(tl.float32))


@triton.jit
def _ce_split_finish(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                     SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                  SMOOTH, HAS_MEAN, SBLOCK, RBLOCK)


@triton.jit
def _ce_split_grad(x_ptr, x_stride, y_ptr, dx_ptr, dx_stride, part_ptr, P, loss_ptr, nvalid_ptr, out_ptr,
                   n_rows, V, S, ignore_index, smoothing,
                   COUNT: tl.constexpr, SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SEG: tl.constexpr,
                   SBLOCK: tl.constexpr, RBLOCK: tl.constexpr, YBLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    if row == 0:
        if j == 0:  # the per-row losses (and mean) of all rows: one program, no extra launch
            _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                          SMOOTH, HAS_MEAN, SBLOCK, RBLOCK)
    y = tl.load(y_ptr + row)
    offs = j * SEG + tl.arange(0, SEG)
    mask = offs < V
    dx_ptrs = dx_ptr + row * dx_stride + offs
    if y == ignore_index:
        tl.store(dx_ptrs, tl.zeros([SEG], dtype=dx_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")
    else:
        if COUNT:  # n_valid over all targets, as in _ce_rows (few rows here: a short loop)
            n_valid = _count_valid(y_ptr, n_rows, ignore_index, YBLOCK)
        else:
            n_valid = tl.load(nvalid_ptr).to(tl.float32)
        inv_n = 1.0 / n_valid  # this row is valid, so n_valid >= 1
        p = part_ptr + row * P
        sj = tl.arange(0, SBLOCK)
        m_j = tl.load(p + sj, mask=sj < S, other=float("-inf"))
        d_j = tl.load(p + S + sj, mask=sj < S, other=0.0)
        lse2 = lse2_combine(m_j, d_j, 0)
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        if SMOOTH:
            c_all = (smoothing / V) * inv_n
        else:
            c_all = 0.0
        g = tl.exp2(x.to(tl.float32) * LOG2E - lse2) * inv_n - c_all
        # The target's extra -(1 - eps) / n, folded in fp32 before the one rounding (softmax_y - 1
        # must not cancel in bf16). A compare and select per element of the one segment, instead of
        # _ce_rows' barrier and second store of the target element after its chunk loop.
        g = tl.where(offs == y, g - (1.0 - smoothing) * inv_n, g)
        tl.store(dx_ptrs, g.to(dx_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


# ---------------------------------------------------------------------------------------------
# Launchers

_CHUNK_BYTES_FWD = 16384  # 8 warps: 64 B (4 x 16 B loads) per thread per chunk, 3-4 programs per SM
_CHUNK_BYTES_GRAD_SMALL = 16384  # rows <= 128 KB: 2 programs per SM of 8 warps
_CHUNK_BYTES_GRAD_WIDE = 32768  # wider rows: 1 program per SM of 16 warps, 64 B per thread per chunk


def _row_config(V: int, elt: int, has_grad: bool, n_rows: int, device, counted: bool) -> tuple[int, int, int]:
    """(BLOCK, num_warps, programs). Each thread holds 64 bytes of a chunk (32 bf16 or 16 fp32
    elements: four 16-byte loads, twice that with the prefetched next chunk), i.e. 16-32 KB per
    program in flight. One program a row, except with a gradient on small logits (under
    _ROWS_GRID_MIN_BYTES) or when n_valid is given (`counted`: fused_linear_cross_entropy's chunks):
    there a persistent grid of 1-2 programs per SM (whose programs count n_valid themselves).
    H200 A/B (cross_entropy_ab run 2, bf16 fwd+bwd, % of copy), one program a row with n_valid
    counted once beforehand: 8192x128256 78.5% -> 83.2%, 4096x256000 68.6% -> 72.7%, 8192x32000
    (smoothing 0.1) 70.6% -> 74.9%; in the collector (run 5efc638f) also 3000x151936 74.0% -> 77.7%,
    but 1024x32000 (65 MB) 53.6 -> 59.8 us, the counting launch (see cross_entropy_rows).
    (fused_linear_cross_entropy, which passes n_valid, keeps the persistent grid; its 8192x4096x128256
    measured 43.3-43.5 ms in the collector with either grid, runs 5efc638f and 60496771, but 40.7-41.3
    ms alone in a process, flce_ab run 2: a context effect of the collector, not the grid.)"""
    if not has_grad:
        return _block_warps(_CHUNK_BYTES_FWD, V, elt) + (max(1, n_rows),)
    small = V * elt <= 131072
    block, warps = _block_warps(_CHUNK_BYTES_GRAD_SMALL if small else _CHUNK_BYTES_GRAD_WIDE, V, elt)
    if not counted and n_rows * V * elt >= _ROWS_GRID_MIN_BYTES:
        return block, warps, max(1, n_rows)
    # the rows in flight (programs x row bytes: 33 MB at 132 SMs x 128256 bf16) within L2
    return block, warps, max(1, min(n_rows, (2 if small else 1) * sm_count(device)))


def _block_warps(chunk: int, V: int, elt: int) -> tuple[int, int]:
    block = min(chunk // elt, triton.next_power_of_2(V))
    return block, max(1, min(chunk // 2048, block * elt // 2048))  # 64 B per thread = 2048 B per warp


_ROWS_GRID_MIN_BYTES = 256 << 20  # see _row_config
# Chunks past the one pass 1 loads that it also prefetches into L2 (_utils.prefetch_l2), with a
# gradient: 2. H200 A/B run 5 (cross_entropy_ab_h200_run5.txt), bf16 fwd+bwd, % of copy, none -> 1
# chunk (2): 8192x128256 82.2 -> 84.6 (88.9), 4096x256000 72.2 -> 78.5 (79.3), 8192x32000 74.0 ->
# 77.8 (77.7). The loss alone (one pass) lost with it (8192x128256 108.5 -> 103.5 (102.5)): none.
_L2_AHEAD = 2
# Rows of at most 64 KB (vocab 32000 bf16) held in registers for pass 2 instead of re-read from L2
# (one 32-warp program per SM, prefetching its next row; 64 registers, no spill) lost: fwd+bwd
# 8192x32000 67.1% of copy against 74.9%, 1024x32000 51.0% against 57.4% (cross_entropy_ab run 4,
# docs/evidence/cross_entropy_ab_h200_run4.txt; the code, at 35ad644, was reverted).


# Split path (see the split kernels): automatic for at most _SPLIT_MAX_ROWS rows of at least
# _SPLIT_MIN_ROW_BYTES. H200 A/B (benchmarks/cross_entropy_ab.py, docs/evidence/
# cross_entropy_ab_h200_run1.txt, bf16, fwd / fwd+bwd): 1x128256 7.8 / 10.5 us against 19.5 / 21.1
# on the one-program-per-row path (torch.compile 13.2 / 18.1); 16x128256 1.9x / 1.6x faster,
# 64x128256 1.2x / 1.2x (the most rows measured); 1x32000 (64000 bytes, the narrowest row
# measured) 1.3x. Segments: 4096 elements won at 1 and 4 rows, 8192 at 16 and 64 rows.
_SPLIT_MAX_ROWS = 64
_SPLIT_MIN_ROW_BYTES = 64000
_SPLIT_SEG = 4096  # elements per segment up to _SPLIT_SEG_ROWS rows: S = 32 at vocab 128256
_SPLIT_SEG_WIDE, _SPLIT_SEG_ROWS = 8192, 4  # more rows than that: fewer, longer segments


def use_split(split: bool | None, n_rows: int, V: int, elt: int) -> bool:
    """Whether the split path runs: `split` if given, else the automatic rule. Never for 0 rows
    (an empty grid)."""
    if n_rows == 0:
        return False
    if split is not None:
        return split
    return n_rows <= _SPLIT_MAX_ROWS and V * elt >= _SPLIT_MIN_ROW_BYTES


def split_segment(n_rows: int) -> int:
    """The measured default segment (see _SPLIT_SEG)."""
    return _SPLIT_SEG if n_rows <= _SPLIT_SEG_ROWS else _SPLIT_SEG_WIDE


def _split_rows(logits: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor,
                dlogits: torch.Tensor | None, ignore_index: int, label_smoothing: float,
                n_valid: torch.Tensor | None, seg: int, mean_out: torch.Tensor | None) -> None:
    """The split path: loss_rows, dlogits (if given) and, if mean_out is given, the mean loss in it.
    Two launches: the partials, then the finish (no gradient) or the gradient kernel."""
    if seg < 16 or seg & (seg - 1):
        raise ValueError(f"split_seg must be a power of two >= 16, got {seg}")
    n_rows, V = logits.shape
    elt = logits.element_size()
    seg = min(seg, triton.next_power_of_2(V))
    S = triton.cdiv(V, seg)
    if S > 65535:  # the grid's second dimension
        raise ValueError(f"split_seg {seg} cuts a row of {V} into {S} segments: more than 65535")
    P = 3 * S + 1
    part = torch.empty(n_rows * P, dtype=torch.float32, device=logits.device)
    has_grad = dlogits is not None
    warps = max(1, min(16, seg * elt // 2048))  # 64 B per thread, as in _row_config
    sblock = triton.next_power_of_2(S)
    # rows per step of _split_losses: a [RBLOCK, SBLOCK] tile of at most 2048 partials per array
    rblock = max(1, min(triton.next_power_of_2(n_rows), 2048 // sblock))
    smooth = label_smoothing > 0.0
    _ce_split_partials[(n_rows, S)](
        logits, logits.stride(0), target, part, P, V, S, ignore_index,
        SMOOTH=smooth, EVICT="evict_last" if has_grad else "evict_first", SEG=seg, num_warps=warps,
    )
    out = mean_out if mean_out is not None else loss_rows  # unused without HAS_MEAN
    if has_grad:
        _ce_split_grad[(n_rows, S)](
            logits, logits.stride(0), target, dlogits, dlogits.stride(0), part, P, loss_rows,
            n_valid if n_valid is not None else loss_rows, out, n_rows, V, S, ignore_index,
            float(label_smoothing), COUNT=n_valid is None, SMOOTH=smooth, HAS_MEAN=mean_out is not None,
            SEG=seg, SBLOCK=sblock, RBLOCK=rblock, YBLOCK=1024, num_warps=warps,
        )
    else:
        _ce_split_finish[(1,)](
            part, P, target, loss_rows, out, n_rows, V, S, ignore_index, float(label_smoothing),
            SMOOTH=smooth, HAS_MEAN=mean_out is not None, SBLOCK=sblock, RBLOCK=rblock, num_warps=4,
        )


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor,
                       dlogits: torch.Tensor | None, ignore_index: int, label_smoothing: float,
                       n_valid: torch.Tensor | None = None, block: int | None = None,
                       split: bool | None = None, split_seg: int | None = None, programs=None,
                       l2_ahead: int | None = None) -> None:
    """Per-row losses into loss_rows (fp32 [N]) and, when dlogits is given (it may be logits itself:
    in place), the gradient of the mean loss. n_valid (a device scalar) is counted in the kernel
    when not given; fused_linear_cross_entropy passes it because it calls this on chunks of rows.
    `block` overrides the chunk size of the one-program-per-row path (tests use it to run several
    chunks on small rows; it keeps the automatic rule off the split path). `split`: None = the
    automatic rule (use_split), True = always cut rows into segments of `split_seg` elements,
    False = never. `programs`: the per-row path's grid, a number of programs or "rows" (default:
    _row_config's). `l2_ahead`: chunks past the one pass 1 loads that it prefetches into L2
    (default _L2_AHEAD with a gradient, else 0; sm_90 only). With a gradient on more than 2
    programs per SM, n_valid (when not given) is counted once beforehand rather than by every
    program (each would read all N targets)."""
    n_rows, V = logits.shape
    if split is None and block is not None:
        split = False  # a chunk size is the per-row path's knob: a caller that sets it wants that path
    if use_split(split, n_rows, V, logits.element_size()):
        _split_rows(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, n_valid,
                    split_seg or split_segment(n_rows), None)
        return
    has_grad = dlogits is not None
    blk, warps, grid = _row_config(V, logits.element_size(), has_grad, n_rows, logits.device, n_valid is not None)
    if programs is not None:
        grid = n_rows if programs == "rows" else min(n_rows, programs)
    if has_grad and n_valid is None and grid > 2 * sm_count(logits.device):
        # one reduction launch (no host sync) rather than every program reading all N targets; up
        # to 2 programs per SM they count themselves (1024x32000: 53.6 us so, 59.8 with the launch)
        n_valid = (target != ignore_index).sum()
    if block is not None:
        blk, warps = block, max(1, min(warps, block // 256))
    dx = dlogits if has_grad else logits  # unused without a gradient
    _ce_rows[(grid,)](
        logits, logits.stride(0), target, dx, dx.stride(0), loss_rows,
        n_valid if n_valid is not None else loss_rows, n_rows, V, ignore_index, float(label_smoothing),
        HAS_GRAD=has_grad, COUNT=n_valid is None, SMOOTH=label_smoothing > 0.0,
        EVICT="evict_last" if has_grad else "evict_first",
        N_FULL=V // blk, TAIL=V % blk != 0, BLOCK=blk, VEC=min(16 // logits.element_size(), blk), YBLOCK=1024,
        L2_AHEAD=prefetch_ahead(l2_ahead, _L2_AHEAD if has_grad else 0, logits),
        num_warps=warps,
    )


def finish_mean(loss_rows: torch.Tensor, target: torch.Tensor, ignore_index: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty((), dtype=dtype, device=loss_rows.device)
    _ce_finish[(1,)](loss_rows, target, out, loss_rows.numel(), ignore_index, BLOCK=1024, num_warps=4)
    return out


def scale_(g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """g *= s in place (s a device scalar); nothing is read or written when s == 1."""
    n = g.numel()
    block = 4096
    n_blocks = triton.cdiv(n, block)
    programs = max(1, min(n_blocks, 4 * sm_count(g.device)))
    _scale_inplace[(programs,)](g, s, n_blocks, n, BLOCK=block, num_warps=8)
    return g


def _check(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> None:
    if logits.dim() != 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"logits must be [N, V] and target [N]: got {tuple(logits.shape)} and {tuple(target.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must be int64 or int32, got {target.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                          label_smoothing: float, need_grad: bool, split: bool | None = None,
                          split_seg: int | None = None, programs=None,
                          l2_ahead: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean loss in the logits' dtype, gradient of it or None). Never copies the logits (unless
    their last dimension is strided); the gradient is a new tensor, the logits are left intact.
    split / split_seg / programs / l2_ahead: as in cross_entropy_rows (the A/B's knobs)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    target = target.contiguous()
    loss_rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format) if need_grad else None
    n_rows, V = logits.shape
    if use_split(split, n_rows, V, logits.element_size()):
        # the split path's last launch writes the mean too: no _ce_finish launch
        out = torch.empty((), dtype=logits.dtype, device=logits.device)
        _split_rows(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, None,
                    split_seg or split_segment(n_rows), out)
        return out, dlogits
    cross_entropy_rows(logits, target, loss_rows, dlogits, ignore_index, label_smoothing, split=False,
                       programs=programs, l2_ahead=l2_ahead)
    return finish_mean(loss_rows, target, ignore_index, logits.dtype), dlogits


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, need_grad, split=None, split_seg=None,
                programs=None, l2_ahead=None):
        loss, dlogits = cross_entropy_forward(logits, target, ignore_index, label_smoothing, need_grad,
                                              split, split_seg, programs, l2_ahead)
        ctx.dlogits = dlogits
        return loss

    @staticmethod
    def backward(ctx, dloss):
        dlogits = ctx.dlogits
        if dlogits is None:
            raise RuntimeError("cross_entropy: the gradient was computed in the forward and already "
                               "consumed; a second backward through the same graph is not supported")
        ctx.dlogits = None  # scaled in place: a second backward would scale it twice
        return scale_(dlogits, dloss.reshape(())), None, None, None, None, None, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """F.cross_entropy(logits, target, ignore_index=..., label_smoothing=...) with mean reduction."""
    _check(logits, target, label_smoothing)
    # Decided here, not inside forward (where grad mode is off): under no_grad, no gradient is
    # computed even if the logits require one.
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return CrossEntropyFunction.apply(logits, target, ignore_index, float(label_smoothing), need_grad)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def cross_entropy_eager(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing)


def cross_entropy_liger(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    # forward(ctx, _input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction,
    #         softcap, return_z_loss, return_token_accuracy, return_predicted_tokens) -> 4-tuple.
    # It writes the gradient over its input (the collector hands each provider a private clone),
    # whenever the input requires grad, and syncs with the host (n_non_ignore.item()).
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    return LigerCrossEntropyFunction.apply(logits, target, None, ignore_index, 0.0, label_smoothing,
                                           "mean", None, False, False, False)[0]


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX,
              label_smoothing: float = 0.0) -> torch.Tensor:
    # loss_i = (1 - eps) * (lse_i - x_i[y_i]) + eps * mean_j (lse_i - x_ij), mean over valid rows.
    # logsumexp rather than log_softmax: no [N, V] float64 output to keep (memory at 8192 x 128k).
    valid = target != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    x_y = logits.gather(1, torch.where(valid, target, 0).unsqueeze(1)).squeeze(1)
    per_row = lse - (1.0 - label_smoothing) * x_y
    if label_smoothing:
        per_row = per_row - label_smoothing * logits.mean(dim=-1)
    return torch.where(valid, per_row, 0.0).sum() / valid.sum()


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n, v = dims["tokens"], dims["vocab"]
    logits = torch.randn((n, v), generator=g, dtype=torch.float32) * 2.0
    target = torch.randint(0, v, (n,), generator=g)
    # A trained head puts mass on the target: raise its logit by 0-12 so that rows range from
    # near-uniform (p_y ~ 1/V) to confident (p_y -> 1, where softmax - 1 cancels).
    logits[torch.arange(n), target] += torch.rand(n, generator=g) * 12.0
    ignored = torch.rand(n, generator=g) < 0.1  # padding / prompt tokens
    ignored[0] = False  # at least one row counts
    target[ignored] = IGNORE_INDEX
    return {
        "logits": logits.to(device=device, dtype=dtype),
        "target": target.to(device=device),
        "ignore_index": IGNORE_INDEX,
        "label_smoothing": float(dims.get("smoothing", 0.0)),
    }


# ---------------------------------------------------------------------------------------------
# Shape grids: tokens = batch x sequence rows of the LM head, vocab = its width; smoothing is the
# label smoothing (a string so that the label reads e.g. 4096x128256x0.1).


def _s(tokens: int, vocab: int, smoothing: str, why: str) -> Shape:
    return Shape({"tokens": tokens, "vocab": vocab, "smoothing": smoothing}, why)


QUICK = (
    _s(37, 1000, "0", "awkward: rows and vocabulary not powers of two, one masked chunk"),
    _s(6, 20011, "0.1", "prime vocabulary wider than one 16 KB chunk: two chunks, smoothing"),
    _s(1, 32000, "0", "one row, LLaMA-2 vocabulary"),
)

FULL = (
    _s(1, 128256, "0", "a single row (scoring one token): latency, not bandwidth"),
    _s(1024, 32000, "0", "LLaMA-2 / Mistral-7B vocabulary, short batch"),
    _s(8192, 32000, "0.1", "LLaMA-2 vocabulary, 8k tokens, label smoothing"),
    _s(4096, 128256, "0", "LLaMA-3 vocabulary, 4k tokens"),
    _s(8192, 128256, "0", "LLaMA-3 vocabulary, 8k tokens: the headline shape (2.1 GB of bf16 logits)"),
    _s(3000, 151936, "0.1", "Qwen2 vocabulary, awkward token count, label smoothing"),
    _s(4096, 256000, "0", "Gemma vocabulary: 512 KB bf16 rows, rows in flight exceed L2"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = bytes per logit, targets are int64):
#   fwd:      read logits once, read targets                       -> N * V * s + 8 * N
#   fwd+bwd:  read logits once, write dlogits, read targets        -> 2 * N * V * s + 8 * N
# fwd+bwd does not count a backward pass: the gradient is written in the forward. With an upstream
# gradient other than 1 (the collector draws a random one) backward scales it in place: one more
# read and write of dlogits that every fused implementation (Liger too) pays and the model does not
# count, so fwd+bwd tops out near half the copy bandwidth under that gradient, and near all of it
# for loss.backward().
# FLOPs: ~5 per logit in the forward (max, subtract, exp, add, convert), ~5 more for the gradient.


def bytes_moved(dims, dtype, mode) -> int:
    n, v = dims["tokens"], dims["vocab"]
    s = dtype.itemsize
    per = {"fwd": 1, "fwd+bwd": 2}[mode]
    return per * n * v * s + 8 * n


def flops(dims, mode) -> float:
    per = {"fwd": 5, "fwd+bwd": 10}[mode]
    return float(per * dims["tokens"] * dims["vocab"])


def check_shape(dims) -> str | None:
    eps = float(dims.get("smoothing", 0.0))
    if not 0.0 <= eps <= 1.0:
        return f"label smoothing {eps} is outside [0, 1]"
    return None


SPEC = KernelSpec(
    name="cross_entropy",
    description="mean cross-entropy of LM logits with ignore_index and label smoothing; gradient fused into the forward",
    modes=("fwd", "fwd+bwd"),
    providers=standard_providers(cross_entropy, cross_entropy_eager)
    + (Provider("liger", cross_entropy_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("logits",),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # Relative error of (loss, dlogits). bf16/fp16: the gradient is rounded once to the logits' dtype
    # and again when scaled by the upstream gradient (ours and Liger's), eager rounds log_softmax
    # before picking the target; seen up to 1e-2 / 1.8e-3 under the interpreter (whose bf16 cast
    # truncates). fp32: ours ~3e-7, but eager's log_softmax backward of the smoothing term cancels
    # over the row (seen 1.4e-5 at vocab 20k), and it is a legitimate fp32 implementation.
    tolerance={torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 5e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    check_shape=check_shape,
)
