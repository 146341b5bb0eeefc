"""FlashAttention-3's ping-pong in Gluon for Hopper: FwdConfig(block_m=128, gluon=True)'s kernel.

A program takes 128 query rows of one (sequence, head): two consumer warpgroups of 64 rows each
share the key and value blocks that one producer warp streams in by TMA (a ring of STAGES buffers,
a `ready` and an `empty` mbarrier each: `empty` counts both consumers' releases). The consumers take
turns on the tensor cores: each issues its S_j = Q K_j^T and O += P_{j-1} V_{j-1}, then hands the
turn to the other (an mbarrier each way) and runs its softmax while the other's matmuls run, so
that the exponentials of one warpgroup hide behind the other's matmuls as well as behind its own
P V (hopper.py's overlap, kept within each consumer). Registers are moved to the consumers
(setmaxnreg: 240 each, 24 for the producer's warpgroup). Scope and layout as hopper.py's, with
query lengths in multiples of 128 (hopper.out_of_scope).
"""
from __future__ import annotations

import torch

from .hopper import LOG2E, descriptors, gl, gluon

ROWS = 64  # query rows a consumer warpgroup
MAXNREG = 168  # registers a thread at launch: 12 warps x 168 = the SM's 64K, before setmaxnreg moves them
CONSUMER_REGS = 240


def forward(q, k, v, o, lse, causal: bool, scale: float, block_n: int, stages: int):
    """Writes o and lse for inputs hopper.refuses takes with 128-row tiles."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    _attn_fwd[(Sq // (2 * ROWS), B * H)](*descriptors(q, k, v, o, ROWS, block_n), lse, Sq, Sk, H, H // Hkv,
                                         scale * LOG2E, block_n, stages, causal, CONSUMER_REGS, num_warps=4,
                                         maxnreg=MAXNREG)


if gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .hopper import _load_kv, _softmax_step

    _ROWS = gl.constexpr(ROWS)

    @gluon.jit
    def _producer(descs, bufs, bars, nums, LSE, qk_scale):
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem = bufs
        # (constants from the buffers' shapes: a worker partition's arguments are not constexpr)
        STAGES: gl.constexpr = k_smem.type.shape[0]
        BLOCK_N: gl.constexpr = k_smem.type.shape[1]
        q_bar, kv_ready, kv_empty, turns = bars
        n_blocks, first_masked, q_row0, k_row0, col, kv_col, lse0, place0 = nums
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row0, col], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(q_desc, [q_row0 + _ROWS, col], q_bar, q_smem.index(1))
        for j in range(n_blocks):
            stage = j % STAGES
            # a fresh mbarrier counts as its phase 1 complete: the first STAGES waits pass
            mbarrier.wait(kv_empty.index(stage), ((j // STAGES) & 1) ^ 1)
            _load_kv(k_desc, v_desc, kv_ready, k_smem, v_smem, j, stage, k_row0, kv_col, BLOCK_N)

    @gluon.jit
    def _turn(turns, WG: gl.constexpr, k):
        """Wait for this warpgroup's k-th turn on the tensor cores (warpgroup 0 has the first)."""
        mbarrier.wait(turns.index(WG), (k & 1) ^ (1 - WG))

    @gluon.jit
    def _step(j, p, m_i, l_i, acc, q, k_smem, v_smem, kv_ready, kv_empty, turns, zero_s, qk_scale, rows, cols,
              STAGES: gl.constexpr, BLOCK_N: gl.constexpr, WG: gl.constexpr, MASK: gl.constexpr):
        dtype: gl.constexpr = k_smem.dtype
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(kv_ready.index(stage), (j // STAGES) & 1)
        _turn(turns, WG, j)
        s_tok = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        mbarrier.arrive(turns.index(1 - WG), count=1)  # the other warpgroup's matmuls may follow ours
        s = warpgroup_mma_wait(1, deps=[s_tok, q, k_smem.index(stage)])[0]
        keep = gl.expand_dims(j * BLOCK_N + cols, 0) <= gl.expand_dims(rows, 1)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, keep, MASK)
        acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(prev), p_op])[0]
        mbarrier.arrive(kv_empty.index(prev), count=1)  # block j-1's keys and values are no longer read here
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
        return p, m_i, l_i, acc

    @gluon.jit
    def _consume(descs, bufs, bars, nums, LSE, qk_scale, WG: gl.constexpr):
        """Consumer warpgroup WG's 64 rows. Key blocks from first_masked on take the causal mask (none
        where first_masked == n_blocks); block 0 takes it where it is one of them."""
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem = bufs
        STAGES: gl.constexpr = k_smem.type.shape[0]
        BLOCK_N: gl.constexpr = k_smem.type.shape[1]
        q_bar, kv_ready, kv_empty, turns = bars
        n_blocks, first_masked, q_row0, k_row0, col, kv_col, lse0, place0 = nums
        dtype: gl.constexpr = q_desc.dtype
        D: gl.constexpr = q_desc.block_type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        q = q_smem.index(WG)
        zero_s = gl.zeros([_ROWS, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([_ROWS, D], gl.float32, o_layout)
        m_i = gl.full([_ROWS], float("-inf"), gl.float32, rows_s)
        l_i = gl.zeros([_ROWS], gl.float32, rows_s)
        r = gl.arange(0, _ROWS, layout=rows_s)
        # the rows' and keys' places in the sequence, for the causal mask (keys of block j: j * BLOCK_N + cols)
        seq_rows = place0 + WG * _ROWS + r
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

        mbarrier.wait(q_bar, 0)
        mbarrier.wait(kv_ready.index(0), 0)
        _turn(turns, WG, 0)
        s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.arrive(turns.index(1 - WG), count=1)
        s = warpgroup_mma_wait(0, deps=[s_tok, q, k_smem.index(0)])[0]
        keep = gl.expand_dims(cols, 0) <= gl.expand_dims(seq_rows, 1)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, keep | (first_masked > 0), True)
        for j in range(1, first_masked):
            p, m_i, l_i, acc = _step(j, p, m_i, l_i, acc, q, k_smem, v_smem, kv_ready, kv_empty, turns, zero_s,
                                     qk_scale, seq_rows, cols, STAGES, BLOCK_N, WG, False)
        for j in range(gl.maximum(first_masked, 1), n_blocks):
            p, m_i, l_i, acc = _step(j, p, m_i, l_i, acc, q, k_smem, v_smem, kv_ready, kv_empty, turns, zero_s,
                                     qk_scale, seq_rows, cols, STAGES, BLOCK_N, WG, True)
        last = (n_blocks - 1) % STAGES
        _turn(turns, WG, n_blocks)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        mbarrier.arrive(turns.index(1 - WG), count=1)
        acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(last), p_op])[0]
        mbarrier.arrive(kv_empty.index(last), count=1)
        acc = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
        gl.store(LSE + lse0 + WG * _ROWS + r, m_i + gl.log2(l_i))
        # the output leaves through this warpgroup's query buffer, which no matmul reads any more
        q.store(acc.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row0 + WG * _ROWS, col], q)
        tma.store_wait(0)

    @gluon.jit
    def _consumer0(descs, bufs, bars, nums, LSE, qk_scale):
        _consume(descs, bufs, bars, nums, LSE, qk_scale, 0)

    @gluon.jit
    def _consumer1(descs, bufs, bars, nums, LSE, qk_scale):
        _consume(descs, bufs, bars, nums, LSE, qk_scale, 1)

    @gluon.jit
    def _attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, SQ, SK, H, GROUP, qk_scale, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        """128 query rows of one (sequence, head): the default partition and a worker of 4 warps consume
        64 rows each, a worker of one warp produces (see the module docstring)."""
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        pid_m = gl.program_id(0)
        if CAUSAL:  # the longest rows first
            pid_m = gl.num_programs(0) - 1 - pid_m
        m0 = pid_m * (2 * _ROWS)
        dtype: gl.constexpr = q_desc.dtype
        D: gl.constexpr = q_desc.block_type.shape[1]
        q_smem = gl.allocate_shared_memory(dtype, [2, _ROWS, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a block
        for i in gl.static_range(2):
            mbarrier.init(turns.index(i), count=1)
        fence_async_shared()
        if CAUSAL:  # keys up to the tile's last row; blocks from the first row's diagonal on are masked
            n_blocks = gl.cdiv(m0 + 2 * _ROWS + SK - SQ, BLOCK_N)
            first_masked = (m0 + SK - SQ) // BLOCK_N
        else:
            n_blocks = SK // BLOCK_N
            first_masked = n_blocks
        # (the rows' places are shifted by SK - SQ: a query sees the keys up to its own place)
        nums = (n_blocks, first_masked, b * SQ + m0, b * SK, h * D, (h // GROUP) * D,
                h * (gl.num_programs(1) // H) * SQ + b * SQ + m0, m0 + SK - SQ)
        args = ((q_desc, k_desc, v_desc, o_desc), (q_smem, k_smem, v_smem), (q_bar, kv_ready, kv_empty, turns), nums,
                LSE, qk_scale)
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer, args)], [4, 1], [CONSUMER_REGS, 24])
