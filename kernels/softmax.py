"""Row softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))), forward and backward
(dx = y * (dy - sum(dy * y)))."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kcollect.spec import KernelSpec, Provider, Shape, peer_available, standard_providers

from ._utils import sm_count


# ---------------------------------------------------------------------------------------------
# Triton kernels.
#
# Rows that fit in registers (next_pow2(N) <= 16384): one program holds a tile of ROWS whole rows
# (~16 KB per input tensor, so narrow rows still give each program enough loads in flight) and does
# max, exp, sum and the write in one read of x. The backward is the same with y and dy.
#
# Wider rows are split into segments of SEG elements (16 KB). A row's softmax needs statistics of
# the whole row before any element can be written, and a row of 128k-256k elements is far too large
# for one program to hold or to stream at full speed alone (one SM cannot keep enough bytes in
# flight, and rows open on every SM at once no longer fit in L2 for their second read). So the
# work is a queue of items, taken in order by a persistent grid through an atomic counter:
#   stats item (row, seg):  read the segment; publish its (max, sum of exp) -- bwd: sum(dy * y) --
#                           packed in one int64 slot written with one atomic exchange
#   write item (row, seg):  read all slots of the row (spinning while any is still unpublished),
#                           merge them, re-read the segment and write y (dx)
# Items are ordered so that a row's write items come about one grid's worth of items after its
# stats items (see _split_item): the stats are then almost always published already, and the
# segment read again is still in L2 (the open rows total ~10 MB, not the whole tensor). DRAM sees
# one read of x and one write of y, as in the register path.
# Deadlock freedom: a write item waits only on items earlier in the queue, which were taken by
# programs that are running (a program only takes an item while it runs) and stats items never
# wait; so the earliest unfinished item always progresses, whatever the number of programs
# resident -- even the interpreter's one-program-at-a-time execution.
#
# Row starts and column masks go through _row_start/_col_mask with N_ALIGN, the largest power of
# two dividing N, so that rows of e.g. 5000 elements still get 16-byte loads (the JIT only marks
# ints divisible by 16). Loops with runtime bounds are `while` loops: under NumPy 2.4 the
# interpreter cannot use its 1-element scalars as `range` bounds.


@triton.jit
def _row_start(row, N, N_ALIGN: tl.constexpr):
    # row * N in int64, written so that the compiler sees it is a multiple of N_ALIGN
    return row.to(tl.int64) * (N // N_ALIGN) * N_ALIGN


@triton.jit
def _col_mask(cols, N, N_ALIGN: tl.constexpr):
    # cols < N, written so that the compiler sees it is constant over runs of N_ALIGN columns
    return cols // N_ALIGN < N // N_ALIGN


@triton.jit
def _softmax_fwd(x_ptr, y_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, N_ALIGN: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & _col_mask(cols, N, N_ALIGN)[None, :]
    offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
    rmask = rows < M
    m = tl.where(rmask, tl.max(x, axis=1), 0.0)  # padding rows: no -inf - -inf (per-row ops: free)
    e = tl.exp(x - m[:, None])  # 0 where masked
    y = e * (1.0 / tl.where(rmask, tl.sum(e, axis=1), 1.0))[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd(y_ptr, dy_ptr, dx_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 N_ALIGN: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & _col_mask(cols, N, N_ALIGN)[None, :]
    offs = _row_start(rows, N, N_ALIGN)[:, None] + cols[None, :]
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_item(t, M, S, LAG):
    # Item t -> (row, segment, is_write). The queue is a sequence of phases of S items (the S
    # segments of one row, one kind): stats of rows 0..LAG-1; then stats of row LAG+k and writes of
    # row k alternately; then the writes of the last LAG rows. Writes of a row thus come
    # (2 * LAG + 1) * S items after its stats (LAG is chosen so that this is about one grid).
    q = t // S
    seg = t - q * S
    k = q - LAG
    in_head = q < LAG
    in_tail = q >= 2 * M - LAG
    odd = (k % 2) == 1
    row = tl.where(in_head, q, tl.where(in_tail, q - M, tl.where(odd, k // 2, LAG + k // 2)))
    is_write = in_tail | ((q >= LAG) & odd)
    return row, seg, is_write


@triton.jit
def _pack(hi, lo):
    # Two fp32 into one int64 (hi word, lo word), so that a slot is published by one atomic.
    # A slot reads as unpublished while its lo word is 0xFFFFFFFF (the fill value -1); lo is a sum
    # of exps (>= 0) or 0, and a NaN with that exact bit pattern is replaced by the canonical NaN.
    hi_bits = hi.to(tl.int32, bitcast=True).to(tl.int64) << 32
    lo_bits = lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    lo_bits = tl.where(lo_bits == 0xFFFFFFFF, 0x7FC00000, lo_bits)
    return hi_bits | lo_bits


@triton.jit
def _pack_hi(hi):
    # One fp32 in the hi word, lo word 0 (published)
    return hi.to(tl.int32, bitcast=True).to(tl.int64) << 32


@triton.jit
def _hi(packed):
    return (packed >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _lo(packed):
    return (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _wait_row(slots, sidx, S):
    # The S slots of one row, once all are published. Atomic reads: the values are the payload, so
    # no further memory ordering is needed.
    valid = sidx < S
    packed = tl.atomic_add(slots + sidx, 0, mask=valid)
    pending = tl.sum((valid & ((packed & 0xFFFFFFFF) == 0xFFFFFFFF)).to(tl.int32), axis=0)
    while pending > 0:
        packed = tl.atomic_add(slots + sidx, 0, mask=valid)
        pending = tl.sum((valid & ((packed & 0xFFFFFFFF) == 0xFFFFFFFF)).to(tl.int32), axis=0)
    return packed


@triton.jit
def _take(queue, t, ISOLATE: tl.constexpr):
    # The next item: from the queue counter, or (ISOLATE == 2) at a fixed stride with no atomic
    if ISOLATE == 2:
        nxt = t + tl.num_programs(0)
    else:
        nxt = tl.atomic_add(queue, 1) + 1
    return nxt


@triton.jit
def _softmax_fwd_split(x_ptr, y_ptr, slot_ptr, M, N, S, LAG,
                       SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr,
                       ISOLATE: tl.constexpr = 0):
    # ISOLATE measures what the queue costs, for timing only (the output is then WRONG): 1 = write
    # items read the slots once instead of spinning until published; 2 = also no queue counter
    # (item t goes to program t % grid).
    offs = tl.arange(0, SEG)
    sidx = tl.arange(0, S_BLOCK)
    n_items = 2 * M * S
    queue = slot_ptr + M * S  # the counter sits after the slots; starts at -1
    t = _take(queue, tl.program_id(0).to(tl.int64) - tl.num_programs(0), ISOLATE)
    while t < n_items:
        row, seg, is_write = _split_item(t, M, S, LAG)
        base = _row_start(row, N, N_ALIGN)
        cols = seg * SEG + offs
        mask = _col_mask(cols, N, N_ALIGN)
        slots = slot_ptr + row.to(tl.int64) * S
        # In both branches: issue the segment's load, then claim the next item, so that the
        # atomic's round trip (and the barrier that broadcasts its result) overlaps the load.
        if is_write:
            x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf"),
                        eviction_policy="evict_first").to(tl.float32)
            nxt = _take(queue, t, ISOLATE)
            if ISOLATE == 0:
                packed = _wait_row(slots, sidx, S)
            else:
                packed = tl.load(slots + sidx, mask=sidx < S, other=0)
            m_i = tl.where(sidx < S, _hi(packed), -float("inf"))
            s_i = tl.where(sidx < S, _lo(packed), 0.0)
            m = tl.max(m_i, axis=0)
            s = tl.sum(s_i * tl.exp(m_i - m), axis=0)
            y = tl.exp(x - m) * (1.0 / s)
            tl.store(y_ptr + base + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            # keep the segment in L2 for its write item
            x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf"),
                        eviction_policy="evict_last").to(tl.float32)
            nxt = _take(queue, t, ISOLATE)
            m = tl.max(x, axis=0)
            s = tl.sum(tl.exp(x - m), axis=0)
            s = tl.where(m == -float("inf"), 0.0, s)  # a segment all -inf (masked scores) adds 0
            tl.atomic_xchg(slots + seg, _pack(m, s))
        t = nxt


@triton.jit
def _softmax_bwd_split(y_ptr, dy_ptr, dx_ptr, slot_ptr, M, N, S, LAG,
                       SEG: tl.constexpr, S_BLOCK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, SEG)
    sidx = tl.arange(0, S_BLOCK)
    n_items = 2 * M * S
    queue = slot_ptr + M * S
    t = tl.atomic_add(queue, 1) + 1
    while t < n_items:
        row, seg, is_write = _split_item(t, M, S, LAG)
        base = _row_start(row, N, N_ALIGN)
        cols = seg * SEG + offs
        mask = _col_mask(cols, N, N_ALIGN)
        slots = slot_ptr + row.to(tl.int64) * S
        if is_write:
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            nxt = tl.atomic_add(queue, 1) + 1  # after the loads, as in the forward
            packed = _wait_row(slots, sidx, S)
            dot = tl.sum(tl.where(sidx < S, _hi(packed), 0.0), axis=0)
            dx = y * (dy - dot)
            tl.store(dx_ptr + base + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        else:
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            nxt = tl.atomic_add(queue, 1) + 1
            tl.atomic_xchg(slots + seg, _pack_hi(tl.sum(y * dy, axis=0)))
        t = nxt


# Row streaming (an A/B variant for wide rows, not the default): each program owns whole rows and
# streams each row twice in chunks of CHUNK elements, with no queue, atomics or slots. Pass 1 reads
# the row (evict_last, to keep it in L2) for its statistics; pass 2 reads it again and writes. Pass
# 2 runs the chunks in reverse order, so that it starts with those read last, the likeliest still in
# L2 if the rows in flight (programs x row bytes) overflow it. The grid is M programs, or a
# persistent grid of a few programs per SM to bound the rows in flight.


@triton.jit
def _softmax_fwd_stream(x_ptr, y_ptr, M, N, CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        # online max and sum of exp, one rescale per chunk (one exp per element). The next chunk's
        # load is issued before this chunk's two block reductions, so that their barriers do not
        # leave the program with no bytes in flight (past the row end it is fully masked: no traffic).
        m = -float("inf")
        s = 0.0
        c = 0
        nxt = tl.load(x_ptr + base + offs, mask=_col_mask(offs, N, N_ALIGN), other=-float("inf"),
                      eviction_policy="evict_last")
        while c < n_chunks:
            x = nxt.to(tl.float32)
            cols = (c + 1) * CHUNK + offs
            nxt = tl.load(x_ptr + base + cols, mask=_col_mask(cols, N, N_ALIGN), other=-float("inf"),
                          eviction_policy="evict_last")
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: add 0, no NaN
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
            c += 1
        r = 1.0 / s
        while c > 0:
            c -= 1
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf"),
                        eviction_policy="evict_first").to(tl.float32)
            tl.store(y_ptr + base + cols, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


@triton.jit
def _softmax_bwd_stream(y_ptr, dy_ptr, dx_ptr, M, N, CHUNK: tl.constexpr, N_ALIGN: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(N, CHUNK)
    row = tl.program_id(0)
    while row < M:
        base = _row_start(row, N, N_ALIGN)
        acc = tl.zeros((CHUNK,), tl.float32)  # per-lane partial sums of y * dy: one reduction per row
        c = 0
        while c < n_chunks:
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += y * dy
            c += 1
        dot = tl.sum(acc, axis=0)
        while c > 0:
            c -= 1
            cols = c * CHUNK + offs
            mask = _col_mask(cols, N, N_ALIGN)
            y = tl.load(y_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_ptr + base + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)
        row += tl.num_programs(0)


# ---------------------------------------------------------------------------------------------
# Launchers

_TILE_BYTES = 16384      # bytes per input tensor per program in the register path
_MAX_BLOCK = 16384       # widest row kept in registers (16 warps, 32 elements per thread)
_SEG_BYTES = 16384       # bytes per input tensor per work item of the split path
# bf16 forward items run 16 warps at ~40 registers (3 programs fit an SM), fp32 and the backward
# fewer registers or warps; programs beyond what fits simply start later and find the queue shorter
_SPLIT_PROGRAMS_PER_SM = 4


def _align(n: int) -> int:
    """The largest power of two (up to 16) dividing n: a constexpr hint for 16-byte loads."""
    return min(16, n & -n)


def _warps(tile: int, max_warps: int = 16) -> int:
    """~16 elements per thread: enough loads in flight per thread without spilling. Up to 16 warps
    by default; max_warps=32 (an A/B variant) lets a 32768-element tile run 32 warps (1024 threads:
    the hardware then caps a thread at 64 registers)."""
    return max(4, min(max_warps, tile // 512))


def _fused_launch(kernel, tensors, M: int, N: int, elem: int, max_warps: int) -> None:
    block = triton.next_power_of_2(N)
    rows = max(1, min(_TILE_BYTES // (block * elem), triton.next_power_of_2(M)))
    kernel[(triton.cdiv(M, rows),)](*tensors, M, N, ROWS=rows, BLOCK_N=block, N_ALIGN=_align(N),
                                    num_warps=_warps(rows * block, max_warps))


def _split_launch(kernel, tensors, M: int, N: int, elem: int, device, seg: int | None, max_warps: int,
                  programs_per_sm: int | None, **isolate) -> None:
    seg = seg or _SEG_BYTES // elem
    S = triton.cdiv(N, seg)
    programs = min((programs_per_sm or _SPLIT_PROGRAMS_PER_SM) * sm_count(device), 2 * M * S)
    lag = min(M, triton.cdiv(programs, 2 * S))
    # one slot per (row, segment), then the queue counter; -1 = unpublished / counter before item 0
    slots = torch.full((M * S + 1,), -1, dtype=torch.int64, device=device)
    kernel[(programs,)](*tensors, slots, M, N, S, lag, SEG=seg, S_BLOCK=triton.next_power_of_2(S),
                        N_ALIGN=_align(N), num_warps=_warps(seg, max_warps), **isolate)


def _stream_launch(kernel, tensors, M: int, N: int, elem: int, device, seg: int | None, max_warps: int,
                   programs_per_sm: int | None) -> None:
    chunk = seg or _SEG_BYTES // elem
    programs = M if programs_per_sm is None else min(M, programs_per_sm * sm_count(device))
    kernel[(programs,)](*tensors, M, N, CHUNK=chunk, N_ALIGN=_align(N), num_warps=_warps(chunk, max_warps))


# Keywords of softmax_forward / softmax_backward. Defaults are the production choice; the others
# exist for the tests (small rows through the wide-row paths) and for GPU A/B runs:
#   max_block        widest row (next power of two) kept in registers; wider rows take `wide`
#   max_warps        most warps per program (16; 32 lets one program hold 32768 elements at 32 each)
#   wide             wide-row path: "split" (work queue over segments) or "stream" (row streaming)
#   seg              elements per split segment / stream chunk (a power of two; default 16 KB)
#   programs_per_sm  persistent grid size: split default 4; stream default None = one program per row
#   isolate          split forward only, timing isolation, WRONG output: 1 = no spin-wait for the
#                    row's stats, 2 = also no queue counter (see _softmax_fwd_split)
_PATHS = {"split": (_split_launch, _softmax_fwd_split, _softmax_bwd_split),
          "stream": (_stream_launch, _softmax_fwd_stream, _softmax_bwd_stream)}


def softmax_forward(x: torch.Tensor, *, max_block: int = _MAX_BLOCK, seg: int | None = None,
                    max_warps: int = 16, wide: str = "split", programs_per_sm: int | None = None,
                    isolate: int = 0) -> torch.Tensor:
    """x [M, N] contiguous -> y. Keywords: see the comment above _PATHS."""
    M, N = x.shape
    y = torch.empty_like(x)
    if triton.next_power_of_2(N) <= max_block:
        _fused_launch(_softmax_fwd, (x, y), M, N, x.element_size(), max_warps)
    else:
        launch, kernel, _ = _PATHS[wide]
        extra = {"ISOLATE": isolate} if isolate else {}
        launch(kernel, (x, y), M, N, x.element_size(), x.device, seg, max_warps, programs_per_sm, **extra)
    return y


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, *, max_block: int = _MAX_BLOCK,
                     seg: int | None = None, max_warps: int = 16, wide: str = "split",
                     programs_per_sm: int | None = None) -> torch.Tensor:
    M, N = y.shape
    dx = torch.empty_like(y)
    if triton.next_power_of_2(N) <= max_block:
        _fused_launch(_softmax_bwd, (y, dy, dx), M, N, y.element_size(), max_warps)
    else:
        launch, _, kernel = _PATHS[wide]
        launch(kernel, (y, dy, dx), M, N, y.element_size(), y.device, seg, max_warps, programs_per_sm)
    return dx


# ---------------------------------------------------------------------------------------------
# Autograd wrapper


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = softmax_forward(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(dy.contiguous(), y)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x [..., N]."""
    if x.numel() == 0:
        raise ValueError(f"x must not be empty: got shape {tuple(x.shape)}")
    n = x.shape[-1]
    return SoftmaxFunction.apply(x.reshape(-1, n).contiguous()).view(x.shape)


# ---------------------------------------------------------------------------------------------
# Baselines and peers


def softmax_eager(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def softmax_liger(x: torch.Tensor) -> torch.Tensor:
    # Liger keeps the whole row in registers: it refuses rows wider than 65536 (RuntimeError)
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    return LigerSoftmaxFunction.apply(x)


# ---------------------------------------------------------------------------------------------
# Reference: plain maths, float64


def reference(x: torch.Tensor) -> torch.Tensor:
    # Shifting by a per-row constant changes nothing mathematically (detached, it adds no gradient
    # path) and keeps exp finite for any logits.
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values.detach())
    return e / e.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(dims, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = dims["M"], dims["N"]
    # logits / attention scores: each row with its own spread (std 1 to 4), so some rows are flat
    # and some are dominated by a few entries
    x = torch.randn(m, n, generator=g) * (1.0 + 3.0 * torch.rand(m, 1, generator=g))
    return {"x": x.to(device=device, dtype=dtype)}


# ---------------------------------------------------------------------------------------------
# Shape grids: M = rows (tokens, or heads x queries), N = softmax width.


_s = Shape.rows


QUICK = (
    _s(64, 1024, "small, power of two: several rows per program"),
    _s(37, 1000, "awkward: rows and width not powers of two, width only 8-aligned"),
    _s(3, 40000, "wide rows: the split path (3 segments of 16 KB per row)"),
)

FULL = (
    _s(4096, 4096, "4k x 4k, the classic softmax benchmark shape"),
    _s(32768, 4096, "32k rows of 4096: 256 MB bf16, far beyond L2"),
    _s(65536, 2048, "attention scores: 32 heads x 2048 queries over 2048 keys"),
    _s(3000, 5000, "awkward: rows and width not powers of two, width only 8-aligned"),
    _s(4096, 32000, "LLaMA-2 / Mistral vocabulary over 4k tokens: split path, 4 segments per row"),
    _s(2048, 65536, "65536-wide rows, where torch.compile falls to half its bandwidth"),
    _s(2048, 128256, "LLaMA-3 vocabulary over 2k tokens (250 KB rows in bf16)"),
    _s(1024, 262144, "262144-wide rows (512 KB bf16): far wider than any one program can hold"),
    _s(1, 128256, "one row: a single decode step over the LLaMA-3 vocabulary"),
)


# ---------------------------------------------------------------------------------------------
# Cost model (minimum traffic; s = element size):
#   fwd:      read x; write y                -> 2 * M * N * s
#   bwd:      read y, dy; write dx           -> 3 * M * N * s
#   fwd+bwd:  the sum of the two             -> 5 * M * N * s
# Both of our paths move exactly this (the split path's second read of a segment hits L2); its
# int64 slots (8 bytes per 16 KB segment) are negligible. FLOPs per element: fwd 5 (max, subtract,
# exp, sum, scale), bwd 4 (product, sum, subtract, product).


def bytes_moved(dims, dtype, mode) -> int:
    per = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode]
    return per * dims["M"] * dims["N"] * dtype.itemsize


def flops(dims, mode) -> float:
    per = {"fwd": 5, "bwd": 4, "fwd+bwd": 9}[mode]
    return float(per * dims["M"] * dims["N"])


SPEC = KernelSpec(
    name="softmax",
    description="row softmax over the last dim (rows up to 262144 wide), forward and backward",
    modes=("fwd", "bwd", "fwd+bwd"),
    providers=standard_providers(softmax, softmax_eager)
    + (Provider("liger", softmax_liger, peer_available("liger_kernel")),),
    baseline="torch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x",),
    grids={"quick": QUICK, "full": FULL},
    bytes_moved=bytes_moved,
    flops=flops,
    bound="memory",
    # One rounding of the output to the storage dtype; the backward also inherits the rounding of
    # the saved y. Measured on the CPU: bf16 <= 4.7e-3 fwd, 8.1e-3 bwd for ours (the interpreter
    # truncates on every cast, ~2x round-to-nearest) and 4.6e-3 for PyTorch's; fp16 <= 5.6e-4;
    # fp32 <= 3e-7 for ours, 2e-6 for PyTorch's CPU kernel (its vectorised exp) forward; PyTorch's
    # fp32 backward at 40000-wide rows reached 1.01e-5 in CI (y * (dy - sum(dy * y)) cancels: the
    # error grows with the row), so fp32 allows 4e-5: 250x under a 1% mistake.
    tolerance={torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 4e-5},
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
)
