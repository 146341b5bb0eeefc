"""Cross-entropy's rows path: one program per row at a time (rows are 64 KB to 1 MB: far too wide
for registers), looping over the vocabulary in chunks of 16-32 KB with 16-byte loads:
  pass 1  online max / sum-exp in fp32 registers, kept per 16-byte line so the loop has no
          cross-thread reduction (one FMA and one ex2 per element, ~7 SASS instructions per bf16
          element); the next chunk's load is issued before the current one is used, so two
          chunks are in flight per program;
  pass 2  (gradient only) re-reads the row newest chunk first and writes
          (softmax - (1 - eps) * onehot - eps / V) / n_valid.
The gradient is computed in the forward, in the same pass over the logits (Liger's design): a
training step never needs the loss without its gradient, and the second read of each row then
comes from L2 instead of HBM. The programs resident at once (1 per SM at 128256 bf16) bound the
rows in flight, 33 MB there, within the 50 MB L2 for the re-read; pass-1 loads are marked
evict_last and the gradient stores and pass-2 loads evict_first, so the streamed-out gradient does
not push the rows waiting for their re-read out of L2. Walking pass 2 newest-first makes the
re-read start with what is most surely still in L2 when rows in flight do exceed it (256k vocab).
Without a gradient, loads evict_first (nothing is re-read). Rows of at most 64 KB held in registers
for pass 2 instead of re-read from L2 lost (8192x32000 67.1% of copy against 74.9%).

Loop bounds: chunk counts are constexpr and the row loop is a while loop: Triton 3.6's interpreter
(with numpy 2.4, triton-lang/triton#9171) cannot run a `for` whose bounds are runtime values; on the
GPU a constexpr chunk count only specialises the compile on the vocabulary size."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.device import sm_count
from .._host.prefetch import prefetch_ahead
from .._jit.lse import LOG2E, lse2_combine, lse_update
from .._jit.prefetch import prefetch_chunk
from .._jit.lse import max_log2sum
from .config import RowsConfig

LN2 = tl.constexpr(0.6931471805599453)


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
def log2_softmax(x, shift, t2, EXACT: tl.constexpr):
    """log2 of softmax(x) from the row's statistics: EXACT (fp32 logits), (x - shift) * LOG2E - t2
    with shift the row's max and t2 log2 of its sum of exp(x - max) (max_log2sum); otherwise
    x * LOG2E - t2 with t2 the row's log-sum-exp in base 2 (lse2_combine), one FMA an element, whose
    rounding of x * LOG2E (2^-24 of |x|) is below bf16's and fp16's own."""
    if EXACT:
        return (x - shift) * LOG2E - t2
    else:
        return x * LOG2E - t2


@triton.jit
def exact_loss(shift, t2, x_y, mean_x, smoothing, SMOOTH: tl.constexpr):
    """(1 - eps) * (lse - x_y) + eps * (lse - mean_j x_j) with lse = shift + t2 * LN2 (see
    log2_softmax), each lse - x formed as (shift - x) + t2 * LN2: exact near the max."""
    if SMOOTH:
        return (1.0 - smoothing) * (shift - x_y) + smoothing * (shift - mean_x) + t2 * LN2
    else:
        return (shift - x_y) + t2 * LN2


@triton.jit
def _grad_store(dx_ptrs, x, shift, t2, inv_n, c_all, mask, EXACT: tl.constexpr):
    g = tl.exp2(log2_softmax(x.to(tl.float32), shift, t2, EXACT)) * inv_n - c_all
    tl.store(dx_ptrs, g.to(dx_ptrs.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@triton.jit
def _ce_rows(x_ptr, x_stride, y_ptr, dx_ptr, dx_stride, loss_ptr, nvalid_ptr, n_rows, V,
             ignore_index, smoothing,
             HAS_GRAD: tl.constexpr, COUNT: tl.constexpr, SMOOTH: tl.constexpr, EVICT: tl.constexpr,
             N_FULL: tl.constexpr, TAIL: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr,
             YBLOCK: tl.constexpr, L2_AHEAD: tl.constexpr = 0, EXACT: tl.constexpr = False):
    # EXACT (fp32 logits): x - max formed exactly (see log2_softmax).
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
                m, d = lse_update(x, m, d, EXACT)
                if SMOOTH:
                    sx += tl.sum(tl.where(t_mask, x, 0.0), 1)
            if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
                for c in range(N_FULL - 1):
                    cur = x_next
                    x_next = tl.load(x_row + (c + 1) * BLOCK + offs2, eviction_policy=EVICT)
                    if L2_AHEAD:
                        prefetch_chunk(x_row, c + 1 + L2_AHEAD, N_FULL, BLOCK)
                    x = cur.to(tl.float32)
                    m, d = lse_update(x, m, d, EXACT)
                    if SMOOTH:
                        sx += tl.sum(x, 1)
            if N_FULL > 0:
                x = x_next.to(tl.float32)
                m, d = lse_update(x, m, d, EXACT)
                if SMOOTH:
                    sx += tl.sum(x, 1)
            # combine the lines: two block reductions per row (-inf row: NaN loss, as torch)
            # loss = (1 - eps) * (lse - x_y) + eps * mean_j (lse - x_j)
            if EXACT:
                shift, t2 = max_log2sum(m, d, 0)
                loss = exact_loss(shift, t2, x_y, tl.sum(sx, 0) / V, smoothing, SMOOTH)
            else:
                shift = 0.0
                t2 = lse2_combine(m, d, 0)
                lse = t2 * LN2
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
                        _grad_store(dx_row + c * BLOCK + offs2, cur, shift, t2, inv_n, c_all, None, EXACT)
                if TAIL:
                    x_t = tl.load(x_row + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
                if N_FULL > 0:
                    _grad_store(dx_row + offs2, x_next, shift, t2, inv_n, c_all, None, EXACT)
                if TAIL:
                    _grad_store(dx_row + t_offs, x_t, shift, t2, inv_n, c_all, t_mask, EXACT)
                # The target's term: one scalar store over what the loop wrote there (a compare per
                # element in the loop would cost instructions and registers). Folded in fp32 before
                # the one rounding, so softmax_y - 1 does not cancel in bf16. The barrier orders it
                # after the loop's store of the same element by another thread.
                tl.debug_barrier()
                g_y = tl.exp2(log2_softmax(x_y, shift, t2, EXACT)) * inv_n - c_all - c_y
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


def rows_launch(logits, target, loss_rows, dlogits, ignore_index: int, label_smoothing: float, n_valid,
                config: RowsConfig) -> None:
    """_ce_rows over all rows: per-row losses, and the gradient of the mean loss into dlogits when
    given (it may be logits itself: in place). n_valid (a device scalar) is counted in the kernel
    when not given, or once beforehand where more than 2 programs per SM would each count it."""
    n_rows, V = logits.shape
    blk = config.block
    if blk < 1 or blk & (blk - 1):
        raise ValueError(f"RowsConfig.block must be a power of two: got {blk}")
    pps = config.programs_per_sm
    grid = max(1, n_rows) if pps is None else max(1, min(n_rows, pps * sm_count(logits.device)))
    has_grad = dlogits is not None
    if has_grad and n_valid is None and grid > 2 * sm_count(logits.device):
        n_valid = (target != ignore_index).sum()  # one reduction launch, no host sync
    dx = dlogits if has_grad else logits  # unused without a gradient
    _ce_rows[(grid,)](
        logits, logits.stride(0), target, dx, dx.stride(0), loss_rows,
        n_valid if n_valid is not None else loss_rows, n_rows, V, ignore_index, float(label_smoothing),
        HAS_GRAD=has_grad, COUNT=n_valid is None, SMOOTH=label_smoothing > 0.0,
        EVICT="evict_last" if has_grad else "evict_first",
        N_FULL=V // blk, TAIL=V % blk != 0, BLOCK=blk, VEC=min(16 // logits.element_size(), blk), YBLOCK=1024,
        L2_AHEAD=prefetch_ahead(config.l2_ahead, 0, logits) if has_grad else 0,
        EXACT=logits.dtype == torch.float32, num_warps=config.warps,
    )


def finish_mean(loss_rows: torch.Tensor, target: torch.Tensor, ignore_index: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean of the per-row losses over the non-ignored rows, in `dtype` (one program)."""
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
