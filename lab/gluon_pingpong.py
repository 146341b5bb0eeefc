"""A warp-specialized attention forward in Gluon for Hopper (issue 41): FlashAttention-3's ping-pong,
measured against kernels/attention/hopper.py (one warpgroup a program, two programs an SM).

A program takes 128 query rows of one (sequence, head): two consumer warpgroups of 64 rows each
share the key and value blocks that one producer warp streams in by TMA (a ring of STAGES buffers,
a `ready` and an `empty` mbarrier each: empty counts both consumers' releases). The consumers take
turns on the tensor cores: each issues its S_j = Q K_j^T and O += P_{j-1} V_{j-1}, then hands the
turn to the other (an mbarrier each way) and runs its softmax while the other's matmuls run, so
that the exponentials of one warpgroup hide behind the matmuls of the other as well as behind its
own P V (hopper.py's overlap, kept within each consumer).

    python -m lab.gluon_pingpong --check [--causal] [--shape B=4,H=16,S=4096,D=128] [--block-n 128 --stages 2]
    python -m lab.gluon_pingpong --offline [--causal]      # compile for sm_90 without a GPU

Scope: dense contiguous [B, S, H, D] bf16/fp16, S a multiple of 128 and of the key block, GQA;
causal with Sq == Skv. The rows' log-sum-exp in log2 units, [H, B * S], as kernels/attention keeps it.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
ROWS_ = 64  # query rows a consumer warpgroup
ROWS = gl.constexpr(ROWS_)


@gluon.jit
def _producer(descs, bufs, bars, nums, LSE, qk_scale):
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem = bufs
    # (constants from the buffers' shapes: a worker partition's arguments are not constexpr)
    STAGES: gl.constexpr = k_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    q_bar, kv_ready, kv_empty, turns = bars
    n_blocks, first_masked, q_row0, k_row0, col, kv_col, lse0, m0 = nums
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, col], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row0 + ROWS, col], q_bar, q_smem.index(1))
    for j in range(n_blocks):
        stage = j % STAGES
        # a fresh mbarrier counts as its phase 1 complete: the first STAGES waits pass
        mbarrier.wait(kv_empty.index(stage), ((j // STAGES) & 1) ^ 1)
        bar = kv_ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row0 + j * BLOCK_N, kv_col], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [k_row0 + j * BLOCK_N, kv_col], bar, v_smem.index(stage))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, keep, MASK: gl.constexpr):
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
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, keep, MASK)
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
    n_blocks, first_masked, q_row0, k_row0, col, kv_col, lse0, m0 = nums
    dtype: gl.constexpr = q_desc.dtype
    D: gl.constexpr = q_desc.block_type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    q = q_smem.index(WG)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([ROWS, D], gl.float32, o_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([ROWS], gl.float32, rows_s)
    r = gl.arange(0, ROWS, layout=rows_s)
    # the rows' and keys' places in the sequence, for the causal mask (keys of block j: j * BLOCK_N + cols)
    seq_rows = m0 + WG * ROWS + r
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(kv_ready.index(0), 0)
    _turn(turns, WG, 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.arrive(turns.index(1 - WG), count=1)
    s = warpgroup_mma_wait(0, deps=[s_tok, q, k_smem.index(0)])[0]
    keep = gl.expand_dims(cols, 0) <= gl.expand_dims(seq_rows, 1)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, keep | (first_masked > 0), True)
    for j in range(1, first_masked):
        p, m_i, l_i, acc = _step(j, p, m_i, l_i, acc, q, k_smem, v_smem, kv_ready, kv_empty, turns, zero_s, qk_scale,
                                 seq_rows, cols, STAGES, BLOCK_N, WG, False)
    for j in range(gl.maximum(first_masked, 1), n_blocks):
        p, m_i, l_i, acc = _step(j, p, m_i, l_i, acc, q, k_smem, v_smem, kv_ready, kv_empty, turns, zero_s, qk_scale,
                                 seq_rows, cols, STAGES, BLOCK_N, WG, True)
    last = (n_blocks - 1) % STAGES
    _turn(turns, WG, n_blocks)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    mbarrier.arrive(turns.index(1 - WG), count=1)
    acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(last), p_op])[0]
    mbarrier.arrive(kv_empty.index(last), count=1)
    acc = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    gl.store(LSE + lse0 + WG * ROWS + r, m_i + gl.log2(l_i))
    # the output leaves through this warpgroup's query buffer, which no matmul reads any more
    q.store(acc.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row0 + WG * ROWS, col], q)
    tma.store_wait(0)


@gluon.jit
def _consumer0(descs, bufs, bars, nums, LSE, qk_scale):
    _consume(descs, bufs, bars, nums, LSE, qk_scale, 0)


@gluon.jit
def _consumer1(descs, bufs, bars, nums, LSE, qk_scale):
    _consume(descs, bufs, bars, nums, LSE, qk_scale, 1)


@gluon.jit
def _attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, S, H, GROUP, qk_scale, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    pid_m = gl.program_id(0)
    if CAUSAL:  # the longest rows first
        pid_m = gl.num_programs(0) - 1 - pid_m
    m0 = pid_m * (2 * ROWS)
    dtype: gl.constexpr = q_desc.dtype
    D: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, D], q_desc.layout)
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
        n_blocks = gl.cdiv(m0 + 2 * ROWS, BLOCK_N)
        first_masked = m0 // BLOCK_N
    else:
        n_blocks = S // BLOCK_N
        first_masked = n_blocks
    nums = (n_blocks, first_masked, b * S + m0, b * S, h * D, (h // GROUP) * D, h * (gl.num_programs(1) // H) * S
            + b * S + m0, m0)
    args = ((q_desc, k_desc, v_desc, o_desc), (q_smem, k_smem, v_smem), (q_bar, kv_ready, kv_empty, turns), nums, LSE,
            qk_scale)
    gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer, args)], [4, 1], [CONSUMER_REGS, 24])


def descriptors(q, k, v, o, block_n: int):
    D = q.shape[-1]
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    rows = gl.NVMMASharedLayout.get_default_for([ROWS_, D], gdt)
    keys = gl.NVMMASharedLayout.get_default_for([block_n, D], gdt)
    flat = lambda t: t.view(t.shape[0] * t.shape[1], t.shape[2] * D)  # noqa: E731
    return (TensorDescriptor.from_tensor(flat(q), [ROWS_, D], rows),
            TensorDescriptor.from_tensor(flat(k), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(v), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(o), [ROWS_, D], rows))


def forward(q, k, v, causal=False, scale=None, block_n=128, stages=2, maxnreg=168, consumer_regs=240):
    """(o, lse) for contiguous [B, S, H, D] q and [B, S, Hkv, D] k, v; S a multiple of 128 and block_n."""
    B, S, H, D = q.shape
    if S % (2 * ROWS_) or S % block_n or not all(t.is_contiguous() for t in (q, k, v)) or H % k.shape[2]:
        raise ValueError(f"takes contiguous tensors, S a multiple of {2 * ROWS_} and {block_n}, Hkv dividing H")
    o = torch.empty_like(q)
    lse = torch.empty(H, B * S, device=q.device, dtype=torch.float32)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    _attn_fwd[(S // (2 * ROWS_), B * H)](*descriptors(q, k, v, o, block_n), lse, S, H, H // k.shape[2], scale * LOG2E,
                                        block_n, stages, causal, consumer_regs, num_warps=4, maxnreg=maxnreg)
    return o, lse


def _offline(block_n, stages, causal, maxnreg=168, consumer_regs=240, D=128):
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.compile_report import _TARGET, _resource_usage, specialise

    q = torch.empty(1, 4096, 16, D, dtype=torch.bfloat16)
    lse = torch.empty(16, 4096, dtype=torch.float32)
    args = (*descriptors(q, q, q, q, block_n), lse, 4096, 16, 1, 0.1)
    sig, const, attrs, options = specialise(_attn_fwd, args, dict(BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                                                                  CONSUMER_REGS=consumer_regs, num_warps=4,
                                                                  maxnreg=maxnreg))
    kern = triton.compile(GluonASTSource(_attn_fwd, sig, const, attrs), target=_TARGET, options=options)
    usage = _resource_usage(kern.asm["cubin"])[0]
    ptx = kern.asm["ptx"]
    print(f"sm_90 ping-pong: block_n={block_n} stages={stages} causal={causal} maxnreg={maxnreg} consumer_regs="
          f"{consumer_regs}: {usage.get('REG')} registers, stack {usage.get('STACK', 0)}, shared "
          f"{kern.metadata.shared} B, setmaxnreg {ptx.count('setmaxnreg')}, wgmma {ptx.count('wgmma.mma_async')}")
    return kern


def _check(B, H, Hkv, S, D, causal, dtype, **config) -> str:
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = forward(q, k, v, causal=causal, **config)
    q64, k64, v64 = (t.transpose(1, 2).double() for t in (q, k, v))
    k64, v64 = (t.repeat_interleave(H // Hkv, dim=1) for t in (k64, v64))
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    want = (torch.softmax(s, -1) @ v64).transpose(1, 2)
    lse64 = (torch.logsumexp(s, -1) / math.log(2)).transpose(0, 1).reshape(H, B * S)
    e_o = ((o.double() - want).abs().max() / want.abs().max()).item()
    e_l = ((lse.double() - lse64).abs().max() / lse64.abs().max()).item()
    return f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {str(dtype)[6:]}: o error {e_o:.2e}, lse error {e_l:.2e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gluon_pingpong", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=16,S=4096,D=128", help="B, H, S, D, and Hkv (default H)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--maxnreg", type=int, default=168)
    ap.add_argument("--consumer-regs", type=int, default=240)
    ap.add_argument("--check", action="store_true", help="first, the error at small shapes against float64")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    args = ap.parse_args(argv)
    config = dict(block_n=args.block_n, stages=args.stages, maxnreg=args.maxnreg, consumer_regs=args.consumer_regs)
    if args.offline:
        _offline(args.block_n, args.stages, args.causal, args.maxnreg, args.consumer_regs)
        return 0
    if args.check:
        for B, H, Hkv, S, D, causal, dtype in ((1, 2, 2, 128, 128, True, torch.bfloat16),
                                               (2, 4, 1, 384, 128, True, torch.float16),
                                               (2, 4, 2, 256, 128, False, torch.bfloat16),
                                               (1, 3, 3, 512, 128, False, torch.float16)):
            print(_check(B, H, Hkv, S, D, causal, dtype, **config), flush=True)
    dims = dict(kv.split("=") for kv in args.shape.split(","))
    B, H, S, D = (int(dims[k]) for k in "BHSD")
    Hkv = int(dims.get("Hkv", H))
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import triton.testing as tt

    from kcollect.kernels.attention import attention

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=args.causal, enable_gqa=Hkv != H)
    flops = 4 * B * H * S * S * D / (2 if args.causal else 1)
    runs = {"pingpong": lambda: forward(q, k, v, causal=args.causal, **config),
            "kcollect": lambda: attention(q, k, v, causal=args.causal), "sdpa_cudnn": cudnn}
    print(f"{args.shape} bf16 causal={args.causal} {config}:")
    for name, fn in runs.items():
        ms = tt.do_bench(fn, warmup=50, rep=300)
        print(f"  {name:<11} {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
