"""Cross-entropy's split path for a few wide rows (decode / RL sampling: one to a few rows of a
128k-256k vocabulary). The rows path gives each row to one program: with one row, one SM streams the
whole row while the others idle. Here each row is cut into S segments of SEG elements, one program
each (grid rows x S), so that a row is read by S SMs at once:
  _ce_split_partials  loads its segment once and writes the segment's max m_j, sum exp(x - m_j)
                      and (label smoothing) sum x to a small fp32 buffer; program (row, 0) also
                      copies x[target] there, so that nothing later reads the logits' target
                      element (in place, the gradient kernel overwrites it);
  _ce_split_finish    (no gradient, one program) combines each row's partials into its loss and
                      writes the mean over the non-ignored rows: finish_mean's job, in the same
                      launch;
  _ce_split_grad      (gradient, grid rows x S) combines its row's partials into lse, re-reads its
                      segment (from L2: loaded evict_last by the first kernel) and writes the
                      gradient of the mean loss as the rows path does; program (0, 0) also writes
                      the per-row losses and the mean, so no finish_mean launch follows.
Partials of row r live at part[r * P:], P = 3 * S + 1: m_0..m_{S-1}, d_0..d_{S-1},
sx_0..sx_{S-1}, x[target].
Registers (ptxas for sm_90, Triton 3.6, bf16 and fp32, segments of 2048-8192): 32-52 per thread,
up to 94 where program (0, 0) of _ce_split_grad combines an [8, 64] tile of partials; no spills."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._jit.lse import LOG2E, lse2_combine
from .._jit.lse import max_log2sum
from .config import SplitConfig
from .rows import LN2, _count_valid, exact_loss, log2_softmax


@triton.jit
def _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                  SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
                  EXACT: tl.constexpr):
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
        if EXACT:
            shift, t2 = max_log2sum(m_j, d_j, 1)
        else:
            lse = lse2_combine(m_j, d_j, 1) * LN2
        x_y = tl.load(p + 3 * S, mask=valid, other=0.0)
        if SMOOTH:
            sx = tl.sum(tl.load(p[:, None] + 2 * S + sj, mask=pmask, other=0.0), 1)
        else:
            sx = 0.0
        if EXACT:
            loss = exact_loss(shift, t2, x_y, sx / V, smoothing, SMOOTH)
        elif SMOOTH:
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
                       SMOOTH: tl.constexpr, EVICT: tl.constexpr, SEG: tl.constexpr, EXACT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    y = tl.load(y_ptr + row)
    if y != ignore_index:  # an ignored row's partials are never read: skip its loads
        x_row = x_ptr + row * x_stride
        offs = j * SEG + tl.arange(0, SEG)
        mask = offs < V
        x = tl.load(x_row + offs, mask=mask, other=float("-inf"), eviction_policy=EVICT).to(tl.float32)
        m = tl.max(x, 0)
        if EXACT:  # x - max exact (see rows.log2_softmax)
            d = tl.sum(tl.exp2((x - tl.where(m == float("-inf"), 0.0, m)) * LOG2E), 0)
        else:
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
                     SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
                     EXACT: tl.constexpr):
    _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                  SMOOTH, HAS_MEAN, SBLOCK, RBLOCK, EXACT)


@triton.jit
def _ce_split_grad(x_ptr, x_stride, y_ptr, dx_ptr, dx_stride, part_ptr, P, loss_ptr, nvalid_ptr, out_ptr,
                   n_rows, V, S, ignore_index, smoothing,
                   COUNT: tl.constexpr, SMOOTH: tl.constexpr, HAS_MEAN: tl.constexpr, SEG: tl.constexpr,
                   SBLOCK: tl.constexpr, RBLOCK: tl.constexpr, YBLOCK: tl.constexpr, EXACT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    if row == 0:
        if j == 0:  # the per-row losses (and mean) of all rows: one program, no extra launch
            _split_losses(part_ptr, P, y_ptr, loss_ptr, out_ptr, n_rows, V, S, ignore_index, smoothing,
                          SMOOTH, HAS_MEAN, SBLOCK, RBLOCK, EXACT)
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
        if EXACT:
            shift, t2 = max_log2sum(m_j, d_j, 0)
        else:
            shift = 0.0
            t2 = lse2_combine(m_j, d_j, 0)
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        if SMOOTH:
            c_all = (smoothing / V) * inv_n
        else:
            c_all = 0.0
        g = tl.exp2(log2_softmax(x.to(tl.float32), shift, t2, EXACT)) * inv_n - c_all
        # The target's extra -(1 - eps) / n, folded in fp32 before the one rounding (softmax_y - 1
        # must not cancel in bf16). A compare and select per element of the one segment, instead of
        # _ce_rows' barrier and second store of the target element after its chunk loop.
        g = tl.where(offs == y, g - (1.0 - smoothing) * inv_n, g)
        tl.store(dx_ptrs, g.to(dx_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


def split_launch(logits, target, loss_rows, dlogits, ignore_index: int, label_smoothing: float, n_valid,
                 config: SplitConfig, mean_out=None) -> None:
    """loss_rows, dlogits (if given) and, if mean_out is given, the mean loss in it. Two launches:
    the partials, then the finish (no gradient) or the gradient kernel."""
    seg = config.seg
    if seg < 16 or seg & (seg - 1):
        raise ValueError(f"SplitConfig.seg must be a power of two >= 16, got {seg}")
    n_rows, V = logits.shape
    seg = min(seg, triton.next_power_of_2(V))
    S = triton.cdiv(V, seg)
    if S > 65535:  # the grid's second dimension
        raise ValueError(f"SplitConfig.seg {seg} cuts a row of {V} into {S} segments: more than 65535")
    P = 3 * S + 1
    part = torch.empty(n_rows * P, dtype=torch.float32, device=logits.device)
    has_grad = dlogits is not None
    sblock = triton.next_power_of_2(S)
    # rows per step of _split_losses: a [RBLOCK, SBLOCK] tile of at most 2048 partials per array
    rblock = max(1, min(triton.next_power_of_2(n_rows), 2048 // sblock))
    smooth = label_smoothing > 0.0
    exact = logits.dtype == torch.float32  # see rows.log2_softmax
    _ce_split_partials[(n_rows, S)](
        logits, logits.stride(0), target, part, P, V, S, ignore_index,
        SMOOTH=smooth, EVICT="evict_last" if has_grad else "evict_first", SEG=seg, EXACT=exact,
        num_warps=config.warps,
    )
    out = mean_out if mean_out is not None else loss_rows  # unused without HAS_MEAN
    if has_grad:
        _ce_split_grad[(n_rows, S)](
            logits, logits.stride(0), target, dlogits, dlogits.stride(0), part, P, loss_rows,
            n_valid if n_valid is not None else loss_rows, out, n_rows, V, S, ignore_index,
            float(label_smoothing), COUNT=n_valid is None, SMOOTH=smooth, HAS_MEAN=mean_out is not None,
            SEG=seg, SBLOCK=sblock, RBLOCK=rblock, YBLOCK=1024, EXACT=exact, num_warps=config.warps,
        )
    else:
        _ce_split_finish[(1,)](
            part, P, target, loss_rows, out, n_rows, V, S, ignore_index, float(label_smoothing),
            SMOOTH=smooth, HAS_MEAN=mean_out is not None, SBLOCK=sblock, RBLOCK=rblock, EXACT=exact, num_warps=4,
        )
