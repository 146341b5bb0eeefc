"""A prototype attention forward in Gluon for Hopper (issue 41), to measure against kernels/attention.

Why Gluon: in Triton's own language the scores of the next key block cannot be kept in flight while
this block's softmax runs (lab/results/attention_ahead_ws_h200.txt: the compiler waits for every dot
but an accumulator chain at once), and tl.range(warp_specialize=True) does nothing on sm_90. Gluon
(Triton 3.6+, triton.experimental.gluon) issues wgmma asynchronously and waits where it is told, so
FlashAttention-3's overlap within a warpgroup can be written down:

    S_j = Q K_j^T              issued
    O  += P_{j-1} V_{j-1}      issued
    wait until one wgmma is left: S_j is done
    softmax of S_j              (the tensor cores still on P V)
    wait for P V; O *= alpha_j

Keys and values stream through a ring of STAGES shared-memory buffers by TMA, one mbarrier each;
block j+STAGES-1 is loaded into the buffer that block j-1 has just left.

Scope of the prototype: dense [B, S, H, D] bf16/fp16 tensors (contiguous), S a multiple of both
blocks, GQA (k and v with fewer heads), causal with square blocks (only a tile's last key block is
masked), the rows' log-sum-exp for a backward; no window, no varlen, no backward. Run on a GPU:

    python -m lab.gluon_attention --check [--causal] [--shape B=4,H=16,S=4096,D=128,Hkv=16] [--block-n 64]

checks o and lse against float64 at a few small shapes and times one shape beside attention() and
SDPA's cuDNN backend.
Without a GPU, `--offline` compiles it for sm_90 (registers, shared memory, SASS size).
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


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, keep, MASK: gl.constexpr):
    """The online softmax of one block of scores: (p, m_new, l_new, alpha), all rows in log2 units;
    MASK: scores where `keep` is false count as -inf (every row keeps one: the diagonal's)."""
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
def _step(j, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc, zero_s, keep, row0, kv_col,
          qk_scale, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr):
    """Key block j's scores and block j-1's P V in flight together, then j's softmax (see the module
    docstring); returns block j's (p, m, l) and the output through block j-1, rescaled to j's max."""
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
def _attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE, S, H, GROUP, qk_scale, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
              CAUSAL: gl.constexpr):
    """One block of BLOCK_M query rows of one (sequence, head); with CAUSAL, BLOCK_M == BLOCK_N, so
    that only the tile's last key block (the diagonal) needs the mask."""
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    row0 = b * S
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

    if CAUSAL:
        n_blocks = pid_m + 1
    else:
        n_blocks = S // BLOCK_N
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + m0, col], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        if i < n_blocks:
            _load_kv(k_desc, v_desc, kv_bars, k_smem, v_smem, i, i, row0, kv_col, BLOCK_N)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
    # the diagonal block's mask: key column <= query row within the block
    r = gl.arange(0, BLOCK_M, layout=rows_s)
    keep = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0) <= gl.expand_dims(r, 1)

    # block 0: its scores and probabilities (its P V is issued in the next step); the diagonal where it is the last
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(kv_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok, q_smem, k_smem.index(0)])[0]
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, keep | (n_blocks > 1), CAUSAL)

    for j in range(1, n_blocks - 1):
        p, m_i, l_i, acc = _step(j, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars, k_desc, v_desc,
                                 zero_s, keep, row0, kv_col, qk_scale, BLOCK_N, STAGES, False)
    if n_blocks > 1:  # the last block: the diagonal when causal
        p, m_i, l_i, acc = _step(n_blocks - 1, n_blocks, p, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bars, k_desc,
                                 v_desc, zero_s, keep, row0, kv_col, qk_scale, BLOCK_N, STAGES, CAUSAL)

    last = (n_blocks - 1) % STAGES
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[o_tok, v_smem.index(last), p_op])[0]
    acc = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    # the rows' log-sum-exp (log2 units), laid out as kcollect's forward keeps it: [H, B * S]
    gl.store(LSE + h * (gl.num_programs(1) // H) * S + row0 + m0 + r, m_i + gl.log2(l_i))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bars.index(i))
    o_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], o_desc.layout, acc.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0 + m0, col], o_smem)
    tma.store_wait(0)


def _descriptors(q, k, v, o, block_m: int, block_n: int):
    B, S, H, D = q.shape
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[q.dtype]
    rows = gl.NVMMASharedLayout.get_default_for([block_m, D], gdt)
    keys = gl.NVMMASharedLayout.get_default_for([block_n, D], gdt)
    flat = lambda t: t.view(B * S, t.shape[2] * D)  # noqa: E731  (a head's tile: rows b*S + m, columns h*D ...)
    return (TensorDescriptor.from_tensor(flat(q), [block_m, D], rows),
            TensorDescriptor.from_tensor(flat(k), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(v), [block_n, D], keys),
            TensorDescriptor.from_tensor(flat(o), [block_m, D], rows))


def forward(q, k, v, causal: bool = False, scale: float | None = None, block_m: int = 64, block_n: int = 64,
            stages: int = 3, warps: int = 4):
    """(o, lse): softmax(scale q k^T, causal mask) v for contiguous [B, S, H, D] q and [B, S, Hkv, D] k, v
    (Hkv dividing H), and each row's log-sum-exp in log2 units laid out [H, B * S] (kcollect's)."""
    B, S, H, D = q.shape
    if (S % block_m or S % block_n or not all(t.is_contiguous() for t in (q, k, v)) or H % k.shape[2]
            or (causal and block_m != block_n)):
        raise ValueError(f"the prototype takes contiguous tensors with S a multiple of {block_m} and {block_n}, "
                         "Hkv dividing H, and causal only with square blocks")
    o = torch.empty_like(q)
    lse = torch.empty(H, B * S, device=q.device, dtype=torch.float32)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    descs = _descriptors(q, k, v, o, block_m, block_n)
    _attn_fwd[(S // block_m, B * H)](*descs, lse, S, H, H // k.shape[2], scale * LOG2E, block_m, block_n, D, stages,
                                     warps, causal, num_warps=warps)
    return o, lse


def _offline(block_m, block_n, stages, warps, causal=False, D=128):
    """Compile for sm_90 on this machine, no GPU: what the kernel needs."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.compile_report import _TARGET, _resource_usage, specialise

    q = torch.empty(1, 4096, 16, D, dtype=torch.bfloat16)
    lse = torch.empty(16, 4096, dtype=torch.float32)
    args = (*_descriptors(q, q, q, q, block_m, block_n), lse, 4096, 16, 1, 0.1)
    sig, const, attrs, options = specialise(_attn_fwd, args, dict(BLOCK_M=block_m, BLOCK_N=block_n, D=D, STAGES=stages,
                                                                  WARPS=warps, CAUSAL=causal, num_warps=warps))
    k = triton.compile(GluonASTSource(_attn_fwd, sig, const, attrs), target=_TARGET, options=options)
    usage = _resource_usage(k.asm["cubin"])[0]
    print(f"sm_90: block_m={block_m} block_n={block_n} stages={stages} warps={warps} causal={causal}: "
          f"{usage.get('REG')} registers, stack {usage.get('STACK', 0)}, shared {k.metadata.shared} B, "
          f"PTX wgmma {k.asm['ptx'].count('wgmma.mma_async')}, waits {k.asm['ptx'].count('wgmma.wait_group')}")
    return k


def _check(B, H, Hkv, S, D, causal, dtype, **config) -> str:
    """The prototype's o and lse against float64 on fresh random inputs: max errors over max |o|, |lse|."""
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
    ap = argparse.ArgumentParser(prog="python -m lab.gluon_attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=16,S=4096,D=128", help="B, H, S, D, and Hkv (default H)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="first, the error at small awkward shapes (GQA, causal, fp16)")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    args = ap.parse_args(argv)
    config = dict(block_m=args.block_m, block_n=args.block_n, stages=args.stages, warps=args.warps)
    if args.offline:
        _offline(args.block_m, args.block_n, args.stages, args.warps, args.causal)
        return 0
    if args.check:
        for B, H, Hkv, S, D, causal, dtype in ((1, 2, 2, 64, 128, True, torch.bfloat16),
                                               (2, 4, 1, 320, 128, True, torch.float16),
                                               (2, 4, 2, 192, 64, False, torch.bfloat16),
                                               (1, 3, 3, 256, 128, False, torch.float16)):
            print(_check(B, H, Hkv, S, D, causal, dtype, **config), flush=True)
    dims = dict(kv.split("=") for kv in args.shape.split(","))
    B, H, S, D = (int(dims[k]) for k in "BHSD")
    Hkv = int(dims.get("Hkv", H))
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kcollect.kernels.attention import attention

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=args.causal, enable_gqa=Hkv != H)
    import triton.testing as tt
    flops = 4 * B * H * S * S * D / (2 if args.causal else 1)
    runs = {"gluon": lambda: forward(q, k, v, causal=args.causal, **config),
            "triton": lambda: attention(q, k, v, causal=args.causal), "sdpa_cudnn": cudnn}
    print(f"{args.shape} bf16 causal={args.causal}:")
    for name, fn in runs.items():
        ms = tt.do_bench(fn, warmup=50, rep=300)
        print(f"  {name:<11} {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
