"""What the mLSTM's chunk kernels share: the gates of a chunk (log forget gates and their running sum,
segments between resets), tile loads, the state scans' program and their stores."""
import triton
import triton.language as tl

from .._jit.recurrent import dot, exp_f32, logsigmoid_f32

NEG = tl.constexpr(-1e30)  # the log-weight of what does not exist (a padded step, a pair across a reset)
# Heads narrower than 32 columns are padded to 32: built by Triton 3.6 for sm_90 at 16 columns, the
# fp32 chunk kernels gave gradients off by O(1) on an H200 (17 of 28 narrow-head cases, dq 0.09
# where eager's error was 8e-7; 1 of 28 at 32, a DH 1 case where eager's is 100%), while the
# interpreter passed the same cases (lab/results/mlstm_width_ab_h200_90e3254.txt).
MIN_COLUMNS = 32


def padded(DH: int) -> int:
    """The head's columns as the kernels tile them: a power of two, at least MIN_COLUMNS."""
    return max(MIN_COLUMNS, triton.next_power_of_2(DH))


@triton.jit
def chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, t0, T, has_resets, L: tl.constexpr, PRECISE: tl.constexpr):
    """(i, i~, A, seg, f, in-range) of the chunk's L steps from t0: A the running sum of the log forget
    gates, seg the running count of resets, i~ the input gate where a reset at that step lets the
    zeroed stabiliser (log-weight a_t) win the max. Steps past T: no input (i = NEG), no decay.
    PRECISE (fp32): A in float64. The weights need A_t - A_s, and with strong forget gates A runs to
    hundreds within a chunk, where fp32's rounding (3e-5 at 300) would be the weights' error;
    `gaps` and `to_end` take the differences in float64 and round them once."""
    t = t0 + tl.arange(0, L)
    tm = t < T
    i = tl.load(i_ptr + bh * T + t, mask=tm, other=NEG).to(tl.float32)
    f = tl.load(f_ptr + bh * T + t, mask=tm, other=0.0).to(tl.float32)
    # log1p's accurate form in every dtype: with a forget gate near 1 the stabiliser m is a sum of
    # log forget gates of -1e-9 and so on, which log(1 + e) rounds to 0 (m, a returned state, was then
    # all wrong, not just rounded); the gates are L values a chunk, beside L x DH x DH products
    a = tl.where(tm, logsigmoid_f32(f, True), 0.0)
    r = tl.load(rs_ptr + b * T + t, mask=tm & (has_resets != 0), other=0).to(tl.int32)
    it = tl.where(r > 0, tl.maximum(i, a), i)
    if PRECISE:
        A = tl.cumsum(a.to(tl.float64), 0)
    else:
        A = tl.cumsum(a, 0)
    return i, it, A, tl.cumsum(r, 0), f, tm


@triton.jit
def split_dot(a, b, acc, LOW: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + a @ b for an fp32 `a` and `b` in the low-precision type LOW: `a` rounded to LOW, and
    (LOW not fp32) what that rounding left out in a second product, so that `a` errs by LOW's
    rounding squared, not once. The forward's chunk states are sums of gate-weighted keys whose
    terms may cancel: the state of one head of width 1 after 16 steps of typical gates, 0.0073,
    came out 0.0085 with the weighted keys rounded once (eager 0.0073), and the gate gradients,
    which take the states' inner products, followed (di, df 0.033 where eager's are 0.0037). The
    second product does not depend on acc, so it stays off the scan's carried state: the forward's
    state scan took no longer on the H200. Not every product of the backward is split: all of them
    cost 12-15% of a kernel and passed no more cases (lab/results/mlstm_split_dot_h200_b3277e6.txt);
    those with a chunk-start state or its gradient are (dot_state)."""
    hi = a.to(LOW)
    if LOW != tl.float32:
        acc += dot((a - hi.to(tl.float32)).to(LOW), b, tl.zeros(acc.shape, tl.float32), DOT_F32)
    return dot(hi, b, acc, DOT_F32)


@triton.jit
def dot_state(q, C, acc, DOT_F32: tl.constexpr):
    """acc + q @ C for q in its own type and an fp32 chunk-start state C (or its gradient), split as
    split_dot splits (C's rounding to q's type, then what it left out). Where one key is nearly all
    of C and q is nearly orthogonal to it, q C and q n (fp32) cancel alike in h = q C / q n, and C
    rounded to bf16 once left h 7.6% off at one step, dq 500x its size (issue 40's H200 sweep of
    seed 166: bf16 dq and dk 0.26 off where eager's were 0.002; 0.008 and 0.015 split). The
    backward's every product with C or dC is split so (inputs x10, seed 167: dq 1.2 off on the CPU
    with the others rounded once, 0.006 with all split; eager's 0.004)."""
    hi = C.to(q.dtype)
    if q.dtype != tl.float32:  # into the same accumulator: no second [L, BV] tile held
        acc = dot(q, (C - hi.to(tl.float32)).to(q.dtype), acc, DOT_F32)
    return dot(q, hi, acc, DOT_F32)


@triton.jit
def gaps(A):
    """[L, L] fp32: A_t - A_s (row t, column s)."""
    return (A[:, None] - A[None, :]).to(tl.float32)


@triton.jit
def to_end(A, L: tl.constexpr):
    """(A_end, A_end - A) in fp32: the chunk's whole log decay, and each step's to the chunk's end."""
    A_end = tl.sum(tl.where(tl.arange(0, L) == L - 1, A, 0.0), 0)
    return A_end.to(tl.float32), (A_end - A).to(tl.float32)


@triton.jit
def weight(x, decay, m, PRECISE: tl.constexpr):
    """exp(x + decay - m), a gate weight: x an input gate or a stabiliser, decay a difference of A,
    m the stabiliser it is taken against. PRECISE (fp32): the exponent summed in float64 and rounded
    once. With input gates near 30, x + decay rounded to fp32 is 1e-6 off (its ulp 1.9e-6), and
    where a row's normaliser cancels (issue 40's large-input-gate case: 14-fold) that error in the
    weights' ratios was 10x eager's in dk, di and df; their exponents are differences of order 1."""
    if PRECISE:
        return exp_f32(((x.to(tl.float64) + decay.to(tl.float64)) - m.to(tl.float64)).to(tl.float32), PRECISE)
    else:
        return exp_f32((x + decay) - m, PRECISE)


@triton.jit
def load_tile(ptr, bh, t0, T, DH, cols, L: tl.constexpr):
    """[L, len(cols)] rows t0.. of a [B*NH, T, DH] tensor, zero past T and DH."""
    t = t0 + tl.arange(0, L)
    mask = (t < T)[:, None] & (cols < DH)[None, :]
    return tl.load(ptr + (bh * T + t)[:, None] * DH + cols[None, :], mask=mask, other=0.0)


@triton.jit
def load_state(ptr, row, DH, rows, cols):
    """[len(rows), len(cols)] block of the DH x DH fp32 state `row` of a [*, DH, DH] tensor."""
    mask = (rows < DH)[:, None] & (cols < DH)[None, :]
    return tl.load(ptr + row * DH * DH + rows[:, None] * DH + cols[None, :], mask=mask, other=0.0)


@triton.jit
def scan_program(NH, DP: tl.constexpr, BV: tl.constexpr):
    """(bh, b, d, e, first) of a state-scan program: one (row, head) bh of batch row b, state rows d,
    value columns e (BV of them), first: whether its columns are the first (it also writes n)."""
    bh, vb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    return bh, bh // NH, tl.arange(0, DP), vb * BV + tl.arange(0, BV), vb == 0


@triton.jit
def store_state(cs_ptr, ns_ptr, row, C, n, DH, d, e, first):
    """The [DP, BV] block C of the state `row` of a [*, DH, DH] tensor, and n [DP] where `first`."""
    tl.store(cs_ptr + row * DH * DH + d[:, None] * DH + e[None, :], C, mask=(d < DH)[:, None] & (e < DH)[None, :])
    tl.store(ns_ptr + row * DH + d, n, mask=(d < DH) & first)


@triton.jit
def scores64(q_ptr, k_ptr, bh, t0, T, DH, scale, L: tl.constexpr):
    """[L, L] fp32: scale q_t . k_s of the chunk's steps from t0, summed in float64 and rounded once
    (the fp32 kernels' S). h_t is a ratio of sums weighted by S, and where those sums cancel, the
    gradients of i and f amplify S's rounding: an fp32 chain of DH fused multiply-adds (the GPU's
    IEEE tl.dot) leaves 1-2 ulp, which put di and df of issue 40's B3 DH24 T3 case (x_scale 10)
    at 1.4e-6 on an H200 (eager 1.1e-7); a correctly rounded S, the same in the forward and the
    backward, takes it to eager's (tests/test_awkward_cells.py). One column of q and of k a step:
    DH rank-1 updates of L x L float64 products."""
    t = t0 + tl.arange(0, L)
    tm = t < T
    rows = (bh * T + t) * DH
    acc = tl.zeros((L, L), tl.float64)
    for d in range(DH):
        qd = tl.load(q_ptr + rows + d, mask=tm, other=0.0).to(tl.float64)
        kd = tl.load(k_ptr + rows + d, mask=tm, other=0.0).to(tl.float64)
        acc += qd[:, None] * kd[None, :]
    return (acc * scale).to(tl.float32)
