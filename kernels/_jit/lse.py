"""Online log-sum-exp over rows streamed in chunks (cross_entropy, softmax)."""
from __future__ import annotations

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------
# Online log-sum-exp over a row streamed in chunks of [L, VEC] (one 16-byte vector per line, the
# lines spread over the threads): max and sum of exp are kept per line, so the chunk loop has no
# cross-thread reduction and no barrier, and the lines are combined once per row. Base-2 units:
# exp(x - m) = exp2(x * LOG2E - m * LOG2E), one ex2 per element. Used by cross_entropy's row path
# and softmax's lines forward.

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def lse_update(x, m, d, EXACT: tl.constexpr):
    """(m, d) per line after chunk x [L, VEC] (fp32, -inf where masked): m the running max, d the
    running sum of exp(x - m). A line's old sum is rescaled by exp2((m - new max) * LOG2E): 0 while
    the line has seen only -inf, whatever the new max. (Rescaling by a max stored as 0 for such a
    line, as before, overflowed to 0 * inf = NaN once the line's first finite values were below
    about -88: exp2(88 * LOG2E) is past fp32's range.) The new max is used as 0 while it is -inf,
    so that no -inf - -inf appears.
    EXACT: exp2((x - max) * LOG2E), x - max exact near the max whatever x's magnitude (softmax of
    fp32 scores of 1e4); otherwise exp2(x * LOG2E - max * LOG2E), one FMA per element, whose
    rounding of x * LOG2E (2^-24 of |x|) is negligible for logits of tens (cross-entropy)."""
    m_new = tl.maximum(m, tl.max(x, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if EXACT:
        d = d * tl.exp2((m - m_safe) * LOG2E) + tl.sum(tl.exp2((x - m_safe[:, None]) * LOG2E), 1)
    else:
        m2 = m_safe * LOG2E
        d = d * tl.exp2(m * LOG2E - m2) + tl.sum(tl.exp2(x * LOG2E - m2[:, None]), 1)
    return m_new, d


@triton.jit
def lse2_combine(m, d, AXIS: tl.constexpr):
    """Log-sum-exp in base-2 units (log2 of sum exp(x), i.e. lse * LOG2E) along AXIS of partial
    (max, sum of exp(x - max)) pairs: lse_update's lines, or a split row's segments. A part that saw
    only -inf (m = -inf, d = 0) adds exp2(-inf) * 0 = 0; all -inf gives NaN, as torch does."""
    m2 = tl.max(m, AXIS) * LOG2E
    return m2 + tl.log2(tl.sum(d * tl.exp2(m * LOG2E - tl.expand_dims(m2, AXIS)), AXIS))


@triton.jit
def max_log2sum(m, d, AXIS: tl.constexpr):
    """lse2_combine's two parts kept apart: (max, log2 of sum d * exp(m - max)) along AXIS, so that
    a log-softmax in base 2, (x - max) * LOG2E - log2sum, keeps x - max exact whatever x's
    magnitude (fp32 logits of thousands, where x * LOG2E rounds to 2^-24 of |x|). A part that saw
    only -inf adds 0; all -inf gives NaN, as torch does."""
    mx = tl.max(m, AXIS)
    return mx, tl.log2(tl.sum(d * tl.exp2((m - tl.expand_dims(mx, AXIS)) * LOG2E), AXIS))
