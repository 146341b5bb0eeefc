"""The backward for Hopper in Gluon: BwdConfig.gluon's dk/dv and dq kernels (delta stays bwd.py's).

A dk/dv program holds a key block (64 keys of one kv head: K and V in shared memory, dK and dV in
registers) and walks the query blocks of every query head of its group, which stream through a ring
of STAGES shared-memory buffers of Q and dO by TMA. A step issues S^T = K Q^T and dP^T = V dO^T
together, waits for S^T alone and takes P^T = exp2(S^T - lse) while dP^T is still on the tensor
cores, then issues dV += P^T dO, takes dS^T = P^T (dP^T - delta) while dV runs, and issues
dK += dS^T Q; dV and dK are waited for only at the next step, behind its S^T, so that they run
while the next step's operands arrive. A dq program holds a query block (Q and dO in shared memory,
dQ in registers) and walks its key blocks the same way: S and dP issued together, P taken while dP
runs, dQ += dS K in flight into the next step. One warpgroup a program, 64x64 tiles, 2 stages (3
were 11-43% slower on the H200: lab/results/gluon_attention_bwd_h200.txt).

Scope (`refuses` says why an input is outside it; bwd.backward then runs the Triton kernels): sm_90,
dense contiguous 16-byte aligned bf16/fp16, D 64 or 128, as many keys as queries (S a multiple of 64),
causal or not, no window, GQA, the fast backward (not attention(accurate=True)'s).
"""
from __future__ import annotations

from .hopper import LOG2E, descriptors, gl, gluon, unfit

BLOCK = 64  # query and key rows of a step (dS^T's registers: 64x64 in one warpgroup)
STAGES = 2
HEAD_DIMS = (64, 128)

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_init, warpgroup_mma_wait)

    from .hopper import _load_kv


def refuses(q, k, v, do, causal: bool, window: int, varlen: bool, accurate: bool) -> str | None:
    """Why the Gluon backward cannot take these inputs, or None where it can."""
    return unfit(q, k, v, do) or out_of_scope(tuple(q.shape), k.shape[1], window, varlen, accurate)


def out_of_scope(q_shape: tuple, keys: int, window: int = 0, varlen: bool = False,
                 accurate: bool = False) -> str | None:
    """Why a call of q [B, S, H, D] (packed: `varlen`) over `keys` keys is outside the kernels' scope,
    or None; `accurate`: attention(accurate=True)'s backward is asked for."""
    if varlen or window or accurate:
        return "takes dense batches without a window, the fast backward"
    B, S, H, D = q_shape
    if D not in HEAD_DIMS:
        return f"takes head dims {HEAD_DIMS}"
    if keys != S or S % BLOCK or S == 0:
        return f"takes as many keys as queries, a multiple of {BLOCK}"
    if B * H > 65535 or B * H * S >= 2**31:
        return "takes at most 65535 (sequence, head) pairs and 2^31 query rows in all (its 32-bit indices)"
    return None


def backward(q, k, v, do, lse, delta, dq, dk, dv, causal: bool, scale: float):
    """Writes dq, dk, dv (contiguous, like q, k, v) from lse and delta ([Hq, B * S] fp32: the
    forward's log-sum-exp in log2 units, and rowsum(o * do)) for inputs `refuses` takes."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    q_desc, k_desc, v_desc, dq_desc = descriptors(q, k, v, dq, BLOCK, BLOCK)
    do_desc, dk_desc, dv_desc, _ = descriptors(do, dk, dv, do, BLOCK, BLOCK)
    _dkdv[(S // BLOCK, B * Hkv)](q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse, delta, S, Hkv, H // Hkv,
                                 scale, scale * LOG2E, BLOCK, BLOCK, STAGES, causal, num_warps=4)
    _dq[(S // BLOCK, B * H)](q_desc, k_desc, v_desc, do_desc, dq_desc, lse, delta, S, H, H // Hkv, scale,
                             scale * LOG2E, BLOCK, BLOCK, STAGES, causal, num_warps=4)


if gluon is not None:
    @gluon.jit
    def _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, it, stage, n_m, m_lo, hq0, b_row, BLOCK_M: gl.constexpr,
                  D: gl.constexpr):
        """Query block `it` of the program's walk (head hq0 + it // n_m, block m_lo + it % n_m) into `stage`."""
        bar = bars.index(stage)
        row = b_row + (m_lo + it % n_m) * BLOCK_M
        col = (hq0 + it // n_m) * D
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row, col], bar, q_smem.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, col], bar, do_smem.index(stage))


    @gluon.jit
    def _dkdv(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, S, HKV, GROUP, scale, qk_scale,
              BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        pid_n = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // HKV
        hk = bh % HKV
        n0 = pid_n * BLOCK_N
        b_row = b * S
        rows_total = (gl.num_programs(1) // HKV) * S  # B * S: a head's stride in LSE and DELTA
        dtype: gl.constexpr = q_desc.dtype
        D: gl.constexpr = q_desc.block_type.shape[1]
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        cols_layout: gl.constexpr = gl.SliceLayout(0, st_layout)

        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()

        m_lo = pid_n if CAUSAL else 0  # (square blocks: a causal key block is seen from its own query block on)
        n_m = S // BLOCK_M - m_lo
        n_iter = GROUP * n_m
        hq0 = hk * GROUP
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b_row + n0, hk * D], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [b_row + n0, hk * D], kv_bar, v_smem)
        for i in gl.static_range(STAGES):
            if i < n_iter:
                _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, i, i, n_m, m_lo, hq0, b_row, BLOCK_M, D)

        zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        # dK and dV stay in flight from one step into the next (async accumulators carried by the loop), and
        # with them the registers of P^T and dS^T that they read: carried too, so that no value of the next
        # step is given those registers before the wait that ends them
        dk = warpgroup_mma_init(gl.zeros([BLOCK_N, D], gl.float32, kv_layout))
        dv = warpgroup_mma_init(gl.zeros([BLOCK_N, D], gl.float32, kv_layout))
        p_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)
        ds_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)
        cols = gl.arange(0, BLOCK_M, layout=cols_layout)
        keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        mbarrier.wait(kv_bar, 0)
        for it in range(n_iter):
            stage = it % STAGES
            mbarrier.wait(bars.index(stage), (it // STAGES) & 1)
            q = q_smem.index(stage)
            do = do_smem.index(stage)
            st_tok = warpgroup_mma(k_smem, q.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            dpt_tok = warpgroup_mma(v_smem, do.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            # S^T, and the previous step's dV and dK (issued before it) done: that step's buffers are free
            st, dv, dk, p_op, ds_op = warpgroup_mma_wait(1, deps=[st_tok, dv, dk, p_op, ds_op, k_smem, q])[:5]
            if it > 0:
                if it - 1 + STAGES < n_iter:
                    _load_qdo(q_desc, do_desc, bars, q_smem, do_smem, it - 1 + STAGES, (it - 1) % STAGES, n_m, m_lo,
                              hq0, b_row, BLOCK_M, D)
            m0 = (m_lo + it % n_m) * BLOCK_M
            row = (hq0 + it // n_m) * rows_total + b_row + m0
            lse = gl.load(LSE + row + cols)
            delta = gl.load(DELTA + row + cols)
            p = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:  # a query sees the keys up to its own place (from indices: no mask kept across steps)
                p = gl.where(gl.expand_dims(keys, 1) <= gl.expand_dims(m0 + cols, 0), p, 0.0)
            dpt = warpgroup_mma_wait(0, deps=[dpt_tok, v_smem, do])[0]
            p_op = gl.convert_layout(p.to(dtype), op_layout)
            dv = warpgroup_mma(p_op, do, dv, is_async=True)
            ds = p * (dpt - gl.expand_dims(delta, 0))
            ds_op = gl.convert_layout(ds.to(dtype), op_layout)
            dk = warpgroup_mma(ds_op, q, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=[dv, dk, p_op, ds_op])[:2]
        dk = dk * scale
        mbarrier.invalidate(kv_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        # out through K's and V's buffers, which no matmul reads any more
        k_smem.store(dk.to(dtype))
        v_smem.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [b_row + n0, hk * D], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [b_row + n0, hk * D], v_smem)
        tma.store_wait(0)


    @gluon.jit
    def _dq(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, S, H, GROUP, scale, qk_scale, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """dQ of BLOCK_M query rows of one (sequence, head) over its key blocks: S and dP issued together,
        P taken while dP runs, dQ += dS K carried in flight into the next step (as _dkdv's dV and dK)."""
        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        if CAUSAL:  # the longest rows first
            pid_m = gl.num_programs(0) - 1 - pid_m
        m0 = pid_m * BLOCK_M
        b_row = b * S
        dtype: gl.constexpr = q_desc.dtype
        D: gl.constexpr = q_desc.block_type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        kv_col = (h // GROUP) * D

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()

        n_blocks = (m0 + BLOCK_M) // BLOCK_N if CAUSAL else S // BLOCK_N
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b_row + m0, h * D], q_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [b_row + m0, h * D], q_bar, do_smem)
        for i in gl.static_range(STAGES):
            if i < n_blocks:
                _load_kv(k_desc, v_desc, bars, k_smem, v_smem, i, i, b_row, kv_col, BLOCK_N)

        rows = m0 + gl.arange(0, BLOCK_M, layout=rows_layout)
        row = h * (gl.num_programs(1) // H) * S + b_row
        lse = gl.load(LSE + row + rows)
        delta = gl.load(DELTA + row + rows)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, dq_layout))
        ds_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, op_layout)
        mbarrier.wait(q_bar, 0)
        for j in range(n_blocks):
            stage = j % STAGES
            mbarrier.wait(bars.index(stage), (j // STAGES) & 1)
            k = k_smem.index(stage)
            v = v_smem.index(stage)
            s_tok = warpgroup_mma(q_smem, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(do_smem, v.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s, dq, ds_op = warpgroup_mma_wait(1, deps=[s_tok, dq, ds_op, q_smem, k])[:3]
            if j > 0:  # the previous step's dQ (issued before S) done: its buffers are free
                if j - 1 + STAGES < n_blocks:
                    _load_kv(k_desc, v_desc, bars, k_smem, v_smem, j - 1 + STAGES, (j - 1) % STAGES, b_row, kv_col,
                             BLOCK_N)
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
            if CAUSAL:
                p = gl.where(gl.expand_dims(j * BLOCK_N + cols, 0) <= gl.expand_dims(rows, 1), p, 0.0)
            dp = warpgroup_mma_wait(0, deps=[dp_tok, do_smem, v])[0]
            ds = p * (dp - gl.expand_dims(delta, 1))
            ds_op = gl.convert_layout(ds.to(dtype), op_layout)
            dq = warpgroup_mma(ds_op, k, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq, ds_op])[0]
        dq = dq * scale
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        q_smem.store(dq.to(dtype))  # out through Q's buffer, which no matmul reads any more
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [b_row + m0, h * D], q_smem)
        tma.store_wait(0)
