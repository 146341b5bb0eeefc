"""The forward for Hopper in Gluon (Triton's lower-level dialect): FwdConfig.gluon's path.

Why Gluon: in Triton's own language the scores of the next key block cannot be kept in flight while
this block's softmax runs (lab/results/attention_ahead_ws_h200.txt: the compiler waits for every dot
but an accumulator chain at once), and tl.range(warp_specialize=True) does nothing on sm_90. Gluon
issues wgmma asynchronously and waits where it is told, so FlashAttention-3's overlap within a
warpgroup can be written down:

    S_j = Q K_j^T              issued
    O  += P_{j-1} V_{j-1}      issued
    wait until one wgmma is left: S_j is done
    softmax of S_j              (the tensor cores still on P V)
    wait for P V; O *= alpha_j

Keys and values stream through a ring of STAGES shared-memory buffers by TMA, one mbarrier each;
block j+STAGES-1 is loaded into the buffer that block j-1 has just left.

Programs of 128 query rows run pingpong.py's kernel instead: two such warpgroups taking turns.

Scope (`refuses` says why an input is outside it, and fwd.forward then runs the Triton kernel):
dense contiguous [B, S, H, D] bf16/fp16 tensors on sm_90, D 16-128 a power of two, Sq and Skv
multiples of the blocks (64 or 128 rows), grouped-query heads, no window; causal with Skv >= Sq
(aligned at the end) and, at 64 query rows, square blocks (only a tile's last key block, the
diagonal, is masked). It writes the rows' log-sum-exp in log2 units laid out as fwd.py's,
[Hq, B * Sq], for the backward.
"""
from __future__ import annotations

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon's Hopper API: `refuses` says so, the Triton kernel runs
    gluon = gl = None

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)


def unfit(*tensors) -> str | None:
    """Why no Gluon kernel here (this forward, hopper_bwd.py's backward) can run on these tensors
    (this Triton, their device, their layout), or None where they can."""
    if gluon is None:
        return "needs Triton's Gluon dialect with its Hopper API (Triton 3.6)"
    if not tensors[0].is_cuda or torch.cuda.get_device_capability(tensors[0].device) != (9, 0):
        return "runs on sm_90 (Hopper) only"
    if not all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in tensors):
        return "takes contiguous, 16-byte aligned tensors"
    return None


def refuses(q, k, v, causal: bool, window: int, varlen: bool, block_m: int, block_n: int) -> str | None:
    """Why the Gluon forward cannot take these inputs, or None where it can."""
    return unfit(q, k, v) or ("takes dense batches" if varlen else None) or out_of_scope(
        tuple(q.shape), k.shape[1], causal, window, block_m, block_n)


def out_of_scope(q_shape: tuple, keys: int, causal: bool, window: int, block_m: int, block_n: int) -> str | None:
    """Why a dense call of q [B, Sq, H, D] over `keys` keys is outside the kernel's scope, or None."""
    B, Sq, H, D = q_shape
    if window:
        return "takes no window"
    if keys == 0:  # (its first key block is waited for unconditionally)
        return "takes at least one key"
    if D not in HEAD_DIMS:
        return f"takes head dims {HEAD_DIMS}"
    if block_m not in (64, 128) or block_n not in (64, 128):
        return "takes blocks of 64 or 128 rows (128 query rows: pingpong.py's two warpgroups)"
    if Sq % block_m or keys % block_n:
        return f"takes lengths that are multiples of its blocks ({block_m}, {block_n})"
    if causal and keys < Sq:
        return "takes causal masks with at least as many keys as queries"
    if causal and block_m == 64 and block_n != 64:
        return "takes causal masks with square blocks at 64 query rows"
    if B * H > 65535 or B * H * Sq >= 2**31:
        return "takes at most 65535 (sequence, head) pairs and 2^31 query rows in all (its 32-bit indices)"
    return None


def forward(q, k, v, o, lse, causal: bool, scale: float, block_m: int, block_n: int, stages: int):
    """Writes o (contiguous, like q) and lse ([Hq, B * Sq] fp32, log2 units) for inputs `refuses`
    takes: 64 query rows a program in one warpgroup (4 warps) here, 128 in pingpong.py's."""
    if block_m == 128:
        from . import pingpong

        return pingpong.forward(q, k, v, o, lse, causal, scale, block_n, stages)
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    _attn_fwd[(Sq // block_m, B * H)](*descriptors(q, k, v, o, block_m, block_n), lse, Sq, Sk, H, H // Hkv,
                                      scale * LOG2E, block_m, block_n, D, stages, 4, causal, num_warps=4)


def descriptors(q, k, v, o, block_m: int, block_n: int):
    """TMA descriptors of q, k, v, o seen as [B * S, H * D]: a head's tile is rows b*S + m, columns
    h*D ... h*D + D - 1."""
    D = q.shape[-1]
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    rows = gl.NVMMASharedLayout.get_default_for([block_m, D], gdt)
    keys = gl.NVMMASharedLayout.get_default_for([block_n, D], gdt)
    flat = lambda t: t.view(t.shape[0] * t.shape[1], t.shape[2] * D)  # noqa: E731
    return (TensorDescriptor.from_tensor(flat(q), [block_m, D], rows),
            TensorDescriptor.from_tensor(flat(k), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(v), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(o), [block_m, D], rows))


if gluon is not None:
    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale, keep, MASK: gl.constexpr):
        """The online softmax of one block of scores: (p, m_new, l_new, alpha), all rows in log2
        units; MASK: scores where `keep` is false count as -inf (every row keeps one: the diagonal's)."""
        if MASK:
            s = gl.where(keep, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            p = gl.exp2(s - gl.expand_dims(m_new, 1))
        else:
            m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        return p, m_new, l_i * alpha + gl.sum(p, axis=1), alpha

    @gluon.jit
    def _load_kv(k_desc, v_desc, bars, k_smem, v_smem, block, stage, row0, col, BLOCK_N: gl.constexpr):
        bar = bars.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row0 + block * BLOCK_N, col], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [row0 + block * BLOCK_N, col], bar, v_smem.index(stage))

    @gluon.jit
    def _step(j, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc, zero_s, keep, row0,
              kv_col, qk_scale, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr):
        """Key block j's scores and block j-1's P V in flight together, then j's softmax (see the
        module docstring); returns block j's (p, m, l) and the output through block j-1, rescaled
        to j's max."""
        dtype: gl.constexpr = k_desc.dtype
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(kv_bars.index(stage), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        # the older of the two (S_j) done; P V runs on while the softmax takes its exponentials
        s = warpgroup_mma_wait(1, deps=[s_tok, q_smem, k_smem.index(stage)])[0]
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, keep, MASK)
        # (P in the deps: its registers are read by the wgmma until here, not free for the softmax's)
        acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(prev), p_op])[0]
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
        # the buffer block j-1 used is free: block j-1+STAGES goes there
        if j - 1 + STAGES < n_blocks:
            _load_kv(k_desc, v_desc, kv_bars, k_smem, v_smem, j - 1 + STAGES, prev, row0, kv_col, BLOCK_N)
        return p, m_i, l_i, acc

    @gluon.jit
    def _attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, SQ, SK, H, GROUP, qk_scale, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
                  CAUSAL: gl.constexpr):
        """One block of BLOCK_M query rows of one (sequence, head); with CAUSAL, BLOCK_M == BLOCK_N
        and SK - SQ a multiple of it, so that only the tile's last key block (the diagonal) is masked."""
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        q_row0 = b * SQ
        k_row0 = b * SK
        col = h * D
        kv_col = (h // GROUP) * D
        pid_m = gl.program_id(0)
        if CAUSAL:  # the longest rows first, so that the short ones fill the grid's tail
            pid_m = gl.num_programs(0) - 1 - pid_m
        m0 = pid_m * BLOCK_M
        dtype: gl.constexpr = q_desc.dtype

        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bars.index(i), count=1)
        fence_async_shared()

        if CAUSAL:  # keys up to the diagonal, which is (SK - SQ) / BLOCK_N blocks to the right
            n_blocks = pid_m + 1 + (SK - SQ) // BLOCK_N
        else:
            n_blocks = SK // BLOCK_N
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row0 + m0, col], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            if i < n_blocks:
                _load_kv(k_desc, v_desc, kv_bars, k_smem, v_smem, i, i, k_row0, kv_col, BLOCK_N)

        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
        # the diagonal block's mask: key column <= query row within the block
        r = gl.arange(0, BLOCK_M, layout=rows_s)
        keep = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0) <= gl.expand_dims(r, 1)

        # block 0: its scores and probabilities (its P V is issued in the next step); the diagonal
        # where it is the last
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(kv_bars.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok, q_smem, k_smem.index(0)])[0]
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, keep | (n_blocks > 1), CAUSAL)

        for j in range(1, n_blocks - 1):
            p, m_i, l_i, acc = _step(j, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc,
                                     zero_s, keep, k_row0, kv_col, qk_scale, BLOCK_N, STAGES, False)
        if n_blocks > 1:  # the last block: the diagonal when causal
            p, m_i, l_i, acc = _step(n_blocks - 1, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars,
                                     k_desc, v_desc, zero_s, keep, k_row0, kv_col, qk_scale, BLOCK_N, STAGES, CAUSAL)

        last = (n_blocks - 1) % STAGES
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(last), p_op])[0]
        acc = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
        # the rows' log-sum-exp (log2 units), laid out as fwd.py keeps it: [H, B * SQ]
        gl.store(LSE + h * (gl.num_programs(1) // H) * SQ + q_row0 + m0 + r, m_i + gl.log2(l_i))

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bars.index(i))
        o_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], o_desc.layout, acc.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row0 + m0, col], o_smem)
        tma.store_wait(0)
