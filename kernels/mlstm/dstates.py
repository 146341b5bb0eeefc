"""The mLSTM backward's gradients of the chunk-start states (C, n) and of the stabiliser m carried
between chunk starts: each chunk's own share (_mlstm_dlocal: a program a chunk, or a program a row
taking its chunks one by one), the reverse scan over chunks that adds the next start's where the
chunks were taken apart (_mlstm_dscan), and the next start's stabiliser share that the chunk kernel
(bwd._mlstm_dchunk) adds to a chunk's gates (_next_start_grad)."""
import triton
import triton.language as tl

from .._jit.recurrent import exp_f32
from .chunk import NEG, chunk_gates, gaps, load_tile, split_dot, store_state, to_end, weight


@triton.jit
def suffix_sum(x, PRECISE: tl.constexpr):
    """x's sums over s >= t. fp32 (PRECISE) adds in float64: where large terms cancel, an fp32
    partial sum loses the small ones added between them, and which are lost depends on the scan's
    order (the GPU's is not the interpreter's): on an H200, df 9e-4 off where eager's was 5e-6."""
    if PRECISE:
        return tl.cumsum(x.to(tl.float64), 0, reverse=True).to(tl.float32)
    else:
        return tl.cumsum(x, 0, reverse=True)


@triton.jit
def _stabiliser_grad(dmj_ptr, bh, c, T, ig, it, A, seg, tm, m_c, dm_next, L: tl.constexpr,
                     PRECISE: tl.constexpr):
    """The stabiliser's gradient in chunk c, sent to where each m_t came from: m_t is the largest of
    the chunk start's m_c + A_t and the steps' i~_s + A_t - A_s (an input gate, or at a reset the
    zeroed stabiliser: a_s > i_s). Rows whose m_t is an input gate's are left to the chunk kernel,
    which adds it to that weight's own gradient as autograd would (minus the row's weight gradients:
    exactly 0 where one weight is all of h). Here: the other rows' closed form dm_t, and at the
    chunk's last step dm_next, the next chunk start's (the same running max) as far as it is known:
    where the next chunk is another program's, the chunk kernel adds its share (_next_start_grad,
    linear in it) once _mlstm_dscan has carried it back. Returns (d i, d a, dm_c, each row's winning
    input gate, else -1 (PRECISE: -2 where the chunk start's won), and the last step's source: its
    winning step, -1 where the chunk start's won)."""
    j = tl.arange(0, L)
    valid = (j[None, :] <= j[:, None]) & (seg[None, :] == seg[:, None])
    X = tl.where(valid, it[None, :] + gaps(A), NEG)  # as the forward sums them
    src = tl.argmax(X, 1, tie_break_left=True)
    from_start = (seg == 0) & (m_c + A.to(tl.float32) >= tl.max(X, 1))
    to_a = it > ig  # the zeroed stabiliser of a reset won over the input gate
    won = (src[:, None] == j[None, :]) & ~from_start[:, None]
    by_gate = tl.max(tl.where(won & ~to_a[None, :], 1, 0), 1) > 0
    g = tl.load(dmj_ptr + bh * T + c * L + j, mask=tm & ~by_gate, other=0.0) + tl.where(j == L - 1, dm_next, 0.0)
    d_it = tl.sum(tl.where(won, g[:, None], 0.0), 0)  # over the steps t whose m_t came from s
    dA = g - d_it  # + A_t in every source, - A_s in step s's
    da = suffix_sum(dA, PRECISE) + tl.where(to_a, d_it, 0.0)  # a_l enters every A_t, t >= l
    last = tl.sum(tl.where(j == L - 1, tl.where(from_start, -1, src), 0), 0)
    if PRECISE:
        src = tl.where(by_gate, src, tl.where(from_start, -2, -1))
    else:
        src = tl.where(by_gate, src, -1)
    return tl.where(to_a, 0.0, d_it), da, tl.sum(tl.where(from_start, g, 0.0), 0), src, last


@triton.jit
def _next_start_grad(dm_next, last, ig, it, L: tl.constexpr):
    """What the next chunk start's stabiliser gradient dm_next adds to _stabiliser_grad's (d i, d a) of
    a chunk: it is the gradient of m at the chunk's last step, sent to the step `last` whose input
    gate (or reset) set it, or to the chunk start (last = -1, whose m_c + A_t takes every a_l)."""
    j = tl.arange(0, L)
    on = (j == last) & (it > ig)
    di = tl.where((j == last) & ~(it > ig), dm_next, 0.0)
    return di, tl.where(j > last, dm_next, 0.0) + tl.where(on, dm_next, 0.0)


@triton.jit
def _dlocal_chunk(q_ptr, dh_ptr, qinv_ptr, dden_ptr, dmj_ptr, i_ptr, f_ptr, rs_ptr, ms_ptr, mo_ptr, dcs_ptr, dns_ptr,
                  dms_ptr, kap_ptr, last_ptr, dim_ptr, dam_ptr, src_ptr, bh, b, c, first, dC, dn, dm_next, d, e,
                  first_block, T, DH, NC, has_resets, L: tl.constexpr, DOT_F32: tl.constexpr, PRECISE: tl.constexpr,
                  STATES: tl.constexpr):
    """_mlstm_dlocal's chunk c, with dC, dn, dm_next carried from chunk c+1 (zero where that is another
    program's; `first`: whether c is the program's first chunk). Returns them for chunk c-1. STATES:
    dC and dn too, else the stabiliser's alone (a sequence of one chunk: the chunk kernel reads the
    gradient of the next start only, and the state before the first chunk is zero, without one)."""
    ig, it, A, seg, _, tm = chunk_gates(i_ptr, f_ptr, rs_ptr, bh, b, c * L, T, has_resets, L, PRECISE)
    A_end, _ = to_end(A, L)
    row = bh * (NC + 1) + c
    m_c, m_next = tl.load(ms_ptr + row), tl.load(ms_ptr + row + 1)
    kappa = tl.where(tl.max(seg, 0) == 0, exp_f32((m_c + A_end) - m_next, PRECISE), 0.0)
    t = c * L + tl.arange(0, L)
    # dC = sum_t qw_t^T dh_t qinv_t, qinv on q's side: dh enters the product as it is (bf16,
    # exact) and qs split in two of bf16 (as chunk.dot_state). Where one key is all of the next
    # chunk's start state, whose outputs do not depend on its scale, the gradients of that key
    # and of the chunk's whole decay are what is left of v.dC + dn: with dnum = dh qinv rounded
    # and rounded again in dC, df was 4.2e3 times its norm off on issue 40's bf16 wild-gates
    # case, dk 13x; with qs rounded once and the chunk kernel's products exact, dk was still
    # 0.82 off on the CPU in the H200 sweep's case of seed 167 (eager's 0.004;
    # lab/results/mlstm_bf16_roundings_cpu_8a541c3.txt)
    if STATES:
        mj = tl.load(mo_ptr + bh * T + t, mask=tm, other=0.0)
        w = tl.where((seg == 0) & tm, weight(m_c, A, mj, PRECISE), 0.0)
        qw = load_tile(q_ptr, bh, c * L, T, DH, d, L).to(tl.float32) * w[:, None]
        qs = qw * tl.load(qinv_ptr + bh * T + t, mask=tm, other=0.0)[:, None]
        dh = load_tile(dh_ptr, bh, c * L, T, DH, e, L)
        dC = split_dot(tl.trans(qs), dh, dC * kappa, dh.dtype, DOT_F32)
        dn = dn * kappa + tl.sum(qw * tl.load(dden_ptr + bh * T + t, mask=tm, other=0.0)[:, None], 0)
        store_state(dcs_ptr, dns_ptr, row, dC, dn, DH, d, e, first_block)
    if first_block:
        dim, dam, dm_next, src, last = _stabiliser_grad(dmj_ptr, bh, c, T, ig, it, A, seg, tm, m_c, dm_next, L,
                                                        PRECISE)
        tl.store(dim_ptr + bh * T + t, dim, mask=tm)
        tl.store(dam_ptr + bh * T + t, dam, mask=tm)
        tl.store(src_ptr + bh * T + t, src, mask=tm)
        tl.store(dms_ptr + row, tl.where(first, dm_next, 0.0))
        tl.store(kap_ptr + bh * NC + c, kappa)
        tl.store(last_ptr + bh * NC + c, last)
    return dC, dn, dm_next


@triton.jit(do_not_specialize=["NH", "T", "NC", "has_resets"])
def _mlstm_dlocal(q_ptr, dh_ptr, qinv_ptr, dden_ptr, dmj_ptr, i_ptr, f_ptr, rs_ptr, ms_ptr, mo_ptr, dcs_ptr, dns_ptr,
                  dms_ptr, kap_ptr, last_ptr, dim_ptr, dam_ptr, src_ptr, NH, T, DH, NC, has_resets,
                  BY_CHUNK: tl.constexpr, L: tl.constexpr, DP: tl.constexpr, BV: tl.constexpr,
                  DOT_F32: tl.constexpr, PRECISE: tl.constexpr, STATES: tl.constexpr):
    """dcs[c] = the gradient of the state at the start of chunk c through the outputs of chunks c ..
    of this program (its own, and the next chunk start's through the chunk's decay kappa), from the
    last back. BY_CHUNK: a program a chunk, its own share, every chunk at once, and _mlstm_dscan adds
    the rest; else a program a row, the whole gradient chunk by chunk (built for sm_90 in 8 warps,
    the loop took 242 registers, one chunk straight 124). The first value block's program also
    carries the stabiliser's gradient back over its chunks (one number a chunk start), writes its
    input and forget gate parts (dim, dam), and in dms[c] the part of dm_c that the previous chunk
    has not taken (all of it at the program's first chunk, else 0), with `last`: the source of each
    chunk's last step's m. The program of the last chunk writes the zero row NC. Not STATES (one
    chunk): the stabiliser's gradient alone, by the first value block's program (launch one)."""
    bh, vb = tl.program_id(1).to(tl.int64), tl.program_id(2)
    b = bh // NH
    d, e, first_block = tl.arange(0, DP), vb * BV + tl.arange(0, BV), vb == 0
    dC = tl.zeros((DP, BV), tl.float32)
    dn = tl.zeros((DP,), tl.float32)
    dm = tl.sum(tl.zeros((L,), tl.float32), 0)
    c = tl.program_id(0) if BY_CHUNK else NC - 1
    if STATES and c == NC - 1:
        store_state(dcs_ptr, dns_ptr, bh * (NC + 1) + NC, dC, dn, DH, d, e, first_block)
        tl.store(dms_ptr + bh * (NC + 1) + NC, dm, mask=first_block)
    if BY_CHUNK:
        _dlocal_chunk(q_ptr, dh_ptr, qinv_ptr, dden_ptr, dmj_ptr, i_ptr, f_ptr, rs_ptr, ms_ptr, mo_ptr, dcs_ptr,
                      dns_ptr, dms_ptr, kap_ptr, last_ptr, dim_ptr, dam_ptr, src_ptr, bh, b, c, True, dC, dn, dm, d,
                      e, first_block, T, DH, NC, has_resets, L, DOT_F32, PRECISE, STATES)
    else:
        while c >= 0:
            dC, dn, dm = _dlocal_chunk(q_ptr, dh_ptr, qinv_ptr, dden_ptr, dmj_ptr, i_ptr, f_ptr, rs_ptr, ms_ptr, mo_ptr,
                                       dcs_ptr, dns_ptr, dms_ptr, kap_ptr, last_ptr, dim_ptr, dam_ptr, src_ptr, bh, b,
                                       c, c == 0, dC, dn, dm, d, e, first_block, T, DH, NC, has_resets, L, DOT_F32,
                                       PRECISE, STATES)
            c -= 1


@triton.jit(do_not_specialize=["NC", "W"])
def _mlstm_dscan(dcs_ptr, dns_ptr, dms_ptr, kap_ptr, last_ptr, DH, NC, W, BLOCK: tl.constexpr):
    """The reverse scan over chunks of _mlstm_dlocal's shares where it took one chunk a program, in
    place: x[c] += a_c x[c+1] from the last chunk back (x[NC] = 0); for dcs and dns a_c = kappa_c
    (the chunk's decay of the carried state), for dms a_c = 1 where the chunk start's m set the last
    step's (last = -1), else 0.
    Element-wise along the rows of a (row, head): programs 0 .. W-1 take BLOCK of dcs' DH * DH each,
    program W dns (BLOCK >= DH) and dms. Chunk c-1's share is loaded before chunk c's sum, so that
    its latency overlaps this one's."""
    bh, p = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o = tl.arange(0, BLOCK)
    if p < W:
        base = dcs_ptr + bh * (NC + 1) * DH * DH + p * BLOCK
        width = DH * DH - p * BLOCK
        stride = DH * DH
    else:
        base = dns_ptr + bh * (NC + 1) * DH
        width = DH
        stride = DH
    mask = o < width
    m_on = p == W
    mp = dms_ptr + bh * (NC + 1)
    x = tl.zeros((BLOCK,), tl.float32)  # row NC, zero (written by _mlstm_dlocal)
    dm = tl.sum(x, 0)
    c = NC - 1
    cur = tl.load(base + c * stride + o, mask=mask, other=0.0)
    cur_m = tl.load(mp + c, mask=m_on, other=0.0)
    while c >= 0:
        kappa = tl.load(kap_ptr + bh * NC + c)
        from_start = tl.load(last_ptr + bh * NC + c) < 0
        nxt = tl.load(base + (c - 1) * stride + o, mask=mask & (c > 0), other=0.0)
        nxt_m = tl.load(mp + c - 1, mask=m_on & (c > 0), other=0.0)
        x = cur + kappa * x
        dm = cur_m + tl.where(from_start, dm, 0.0)
        tl.store(base + c * stride + o, x, mask=mask)
        tl.store(mp + c, dm, mask=m_on)
        cur, cur_m = nxt, nxt_m
        c -= 1


def scan_block(DH: int) -> int:
    """_mlstm_dscan's elements a program: 512 of a state's DH * DH (4 warps), at least DH (dns)."""
    return max(512, triton.next_power_of_2(DH))
