"""Prototypes of attention's backward kernels in Gluon for Hopper (issue 41's backward), dk/dv and
dq, to measure against kernels/attention/bwd.py's Triton `_bwd_dkdv` and `_bwd_dq` (delta stays).

A program holds a key block (BLOCK_N keys of one kv head: K and V in shared memory, dK and dV in
registers) and walks the query blocks of every query head of its group, which stream through a ring
of STAGES shared-memory buffers of Q and dO by TMA. A step issues S^T = K Q^T and dP^T = V dO^T
together, waits for S^T alone and takes P^T = exp2(S^T - lse) while dP^T is still on the tensor
cores, then issues dV += P^T dO, takes dS^T = P^T (dP^T - delta) while dV runs, and issues
dK += dS^T Q; dV and dK are waited for only at the next step, behind its S^T, so that they run
while the next step's operands arrive. Scope: dense contiguous [B, S, H, D] bf16/fp16, one length
S a multiple of the blocks, GQA, causal with square blocks; the fast backward (no `accurate`).
The dq kernel holds a query block (Q and dO in shared memory, dQ in registers) and walks its key
blocks the same way: S and dP issued together, P taken while dP runs, dQ += dS K in flight into the
next step.

    python -m lab.gluon_attention_bwd --check [--causal] [--shape B=4,H=16,S=4096,D=128,Hkv=16]
    python -m lab.gluon_attention_bwd --offline [--causal]     # compile for sm_90 without a GPU
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from kcollect.kernels.attention.hopper import LOG2E, _load_kv, descriptors
from lab.gluon_attention import reference64, shape_of


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


def dq(q, k, v, do, lse, delta, causal: bool = False, scale: float | None = None, block_m: int = 64,
       block_n: int = 64, stages: int = 2):
    """dq like q (see dkdv for lse and delta)."""
    B, S, H, D = q.shape
    if S % block_n or S % block_m or (causal and block_m % block_n) or H % k.shape[2] or not all(
            t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("the prototype takes contiguous tensors, S a multiple of the blocks, causal with query "
                         "blocks a multiple of the key blocks")
    out = torch.empty_like(q)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    q_desc, k_desc, v_desc, dq_desc = descriptors(q, k, v, out, block_m, block_n)
    do_desc = descriptors(do, k, v, do, block_m, block_n)[0]
    _dq[(S // block_m, B * H)](q_desc, k_desc, v_desc, do_desc, dq_desc, lse, delta, S, H, H // k.shape[2], scale,
                               scale * LOG2E, block_m, block_n, stages, causal, num_warps=4)
    return out


def dkdv(q, k, v, do, lse, delta, causal: bool = False, scale: float | None = None, block_n: int = 64,
         block_m: int = 64, stages: int = 2):
    """(dk, dv) like k, v, from lse and delta ([H, B * S] fp32: kcollect's forward's lse in log2
    units, and rowsum(o * do))."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    if S % block_n or S % block_m or (causal and block_m != block_n) or H % Hkv or not all(
            t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("the prototype takes contiguous tensors, S a multiple of the blocks, causal with square "
                         "blocks")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    q_desc, k_desc, v_desc, _ = descriptors(q, k, v, q, block_m, block_n)
    do_desc, dk_desc, dv_desc, _ = descriptors(do, dk, dv, do, block_m, block_n)
    _dkdv[(S // block_n, B * Hkv)](q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse, delta, S, Hkv, H // Hkv,
                                   scale, scale * LOG2E, block_n, block_m, stages, causal, num_warps=4)
    return dk, dv


def _offline(block_n, block_m, stages, causal, D=128):
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.compile_report import _TARGET, _resource_usage, specialise

    q = torch.empty(1, 4096, 16, D, dtype=torch.bfloat16)
    lse = torch.empty(16, 4096, dtype=torch.float32)
    q_desc, k_desc, v_desc, _ = descriptors(q, q, q, q, block_m, block_n)
    launches = {"dk/dv": (_dkdv, (q_desc, k_desc, v_desc, q_desc, k_desc, v_desc, lse, lse, 4096, 16, 1, 0.1, 0.1),
                          dict(BLOCK_N=block_n, BLOCK_M=block_m)),
                "dq": (_dq, (q_desc, k_desc, v_desc, q_desc, q_desc, lse, lse, 4096, 16, 1, 0.1, 0.1),
                       dict(BLOCK_M=block_m, BLOCK_N=block_n))}
    for name, (fn, args, blocks) in launches.items():
        sig, const, attrs, options = specialise(fn, args, dict(**blocks, STAGES=stages, CAUSAL=causal, num_warps=4))
        kern = triton.compile(GluonASTSource(fn, sig, const, attrs), target=_TARGET, options=options)
        usage = _resource_usage(kern.asm["cubin"])[0]
        ptx = kern.asm["ptx"]
        print(f"sm_90 {name}: block_n={block_n} block_m={block_m} stages={stages} causal={causal}: "
              f"{usage.get('REG')} registers, stack {usage.get('STACK', 0)}, shared {kern.metadata.shared} B, wgmma "
              f"{ptx.count('wgmma.mma_async')}, waits {ptx.count('wgmma.wait_group')}")


def _inputs(B, H, Hkv, S, D, causal, dtype):
    from kcollect.kernels.attention import attention_forward

    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = attention_forward(q, k, v, causal=causal)
    delta = (o.float() * do.float()).sum(-1).permute(2, 0, 1).reshape(H, B * S).contiguous()
    return q, k, v, do, lse, delta


def _check(B, H, Hkv, S, D, causal, dtype, **config) -> str:
    """dq, dk, dv against float64 autograd of softmax(q k^T / sqrt(D)) v: max error over max |grad|."""
    q, k, v, do, lse, delta = _inputs(B, H, Hkv, S, D, causal, dtype)
    dk, dv = dkdv(q, k, v, do, lse, delta, causal=causal, **config)
    dq_ = dq(q, k, v, do, lse, delta, causal=causal, **config)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    o = reference64(q64, k64, v64, causal)[1]
    grads = torch.autograd.grad(o, (q64, k64, v64), do.double())
    errs = [((g.double() - want).abs().max() / want.abs().max()).item() for g, want in zip((dq_, dk, dv), grads)]
    return (f"B{B} H{H}/{Hkv} S{S} D{D} causal={causal} {str(dtype)[6:]}: dq error {errs[0]:.2e}, dk error "
            f"{errs[1]:.2e}, dv error {errs[2]:.2e}")


def _triton_kernel_ms(q, k, v, do, causal) -> dict:
    """The Triton backward's kernels, ms a call each (torch.profiler over 20 backward calls)."""
    from torch.profiler import ProfilerActivity, profile

    from kcollect.kernels.attention import attention_backward, attention_forward

    o, lse = attention_forward(q, k, v, causal=causal)
    for _ in range(3):
        attention_backward(do, q, k, v, o, lse, causal=causal)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            attention_backward(do, q, k, v, o, lse, causal=causal)
        torch.cuda.synchronize()
    return {name: sum(e.device_time_total for e in prof.key_averages() if name in e.key) / 20 / 1000
            for name in ("_bwd_dkdv", "_bwd_dq", "_bwd_delta")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gluon_attention_bwd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=16,S=4096,D=128", help="B, H, S, D, and Hkv (default H)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="first, the error at small shapes against float64")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    args = ap.parse_args(argv)
    config = dict(block_n=args.block_n, block_m=args.block_m, stages=args.stages)
    if args.offline:
        _offline(args.block_n, args.block_m, args.stages, args.causal)
        return 0
    if args.check:
        for B, H, Hkv, S, D, causal, dtype in ((1, 2, 2, 128, 128, True, torch.bfloat16),
                                               (2, 4, 1, 320, 128, True, torch.float16),
                                               (2, 4, 2, 192, 64, False, torch.bfloat16),
                                               (1, 3, 3, 256, 128, False, torch.float16)):
            print(_check(B, H, Hkv, S, D, causal, dtype, **config), flush=True)
    B, H, Hkv, S, D = shape_of(args.shape)
    q, k, v, do, lse, delta = _inputs(B, H, Hkv, S, D, args.causal, torch.bfloat16)
    import triton.testing as tt

    flops = 4 * B * H * S * S * D / (2 if args.causal else 1)  # two matmuls (causal: half): dk/dv has 4, dq 3
    run = dict(causal=args.causal, **config)
    ms_kv = tt.do_bench(lambda: dkdv(q, k, v, do, lse, delta, **run), warmup=50, rep=300)
    ms_q = tt.do_bench(lambda: dq(q, k, v, do, lse, delta, **run), warmup=50, rep=300)
    ref = _triton_kernel_ms(q, k, v, do, args.causal)
    print(f"{args.shape} bf16 causal={args.causal} {config}: gluon dk/dv {ms_kv:.4f} ms ({2 * flops / ms_kv / 1e9:.1f} "
          f"TFLOP/s), dq {ms_q:.4f} ms ({1.5 * flops / ms_q / 1e9:.1f}); the Triton backward's kernels (profiler): "
          + ", ".join(f"{name} {ms:.4f} ms" for name, ms in ref.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
