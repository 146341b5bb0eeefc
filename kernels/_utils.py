"""Launch heuristics shared by every kernel file (one place, like Liger's ops/utils.py)."""
from __future__ import annotations

import warnings

import triton
import triton.language as tl

# Largest row a single program keeps in registers; wider rows are processed in chunks.
MAX_FUSED_SIZE = 65536


def row_settings(n: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a program that holds one row of n elements in registers:
    the block is the next power of two; warps grow with it so that each thread holds at most
    about 16-32 elements (more spills registers, fewer leaves memory parallelism on the table)."""
    block = triton.next_power_of_2(n)
    if block > MAX_FUSED_SIZE:
        raise ValueError(f"row of {n} elements is wider than {MAX_FUSED_SIZE}")
    if block >= 32768:
        warps = 32
    elif block >= 8192:
        warps = 16
    elif block >= 2048:
        warps = 8
    else:
        warps = 4
    return block, warps


def elementwise_settings(n: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for flat elementwise kernels: 8 elements per thread (one 16-byte
    load per tensor in bf16), 1024 per program. Measured on the H200 against 4096 / 8 warps
    (benchmarks/elementwise_ab.py, docs/evidence/elementwise_ab_h200_run1.txt, and the collector's
    runs 9e1dbe21 and 7555c5b9): the one-row decode shapes 1.03-1.25x faster, gelu fwd 8192x16384
    1.05x, the largest swiglu/geglu shapes the same (their backwards measured 90% of copy in the
    collector with either setting, which was the CUDA allocator's placement, not the kernel: 100%
    since the collector runs with expandable segments, run 251998cb; see collector/cli.py)."""
    return 1024, 4


def launch_elementwise(kernel, n: int, *args, block: int | None = None, num_warps: int | None = None,
                       **meta) -> None:
    """kernel[grid](*args, n, BLOCK=, TAIL=, **meta) over n flat elements. The kernels mask their
    block with n rounded down to a multiple of 16 and, when TAIL (n % 16 != 0), let the last
    program finish the remaining elements with a 16-wide masked block: a mask `offs < n` with an n
    the compiler cannot see is a multiple of 16 makes every load and store scalar (sm_90 compile of
    _gelu_fwd at 4096 elements: 16 LDG.E.U16 per thread instead of 2 LDG.E.128, 87 registers
    instead of 32). `block` and `num_warps` override elementwise_settings (GPU A/Bs)."""
    default_block, default_warps = elementwise_settings(n)
    block = block or default_block
    kernel[(triton.cdiv(n, block),)](*args, n, BLOCK=block, TAIL=n % 16 != 0,
                                     num_warps=num_warps or default_warps, **meta)


def sm_count(device) -> int:
    """Multiprocessors on a CUDA device; on the CPU (interpreter) a small number keeps the
    interpreted grid short."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def on_sm90(device) -> bool:
    """A Hopper (sm_90) GPU: where the register caps in the kernel files were measured."""
    import torch

    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


_RESIDENT: dict[tuple, int] = {}


def resident_programs(kernel, args: tuple, constexprs: dict, num_warps: int, device, strict: bool = False) -> int:
    """How many programs of this compiled kernel the GPU holds at once (registers, threads and shared
    memory per SM, as in Triton's fused-softmax tutorial), so that a persistent grid never spills into
    a second wave. On the CPU interpreter: a few programs, enough to exercise the striding. If the
    query fails (a Triton whose warmup API differs): a guess of 64 registers a thread, or with
    `strict` (grids whose programs wait for each other, which a guess could deadlock) 0."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return sm_count(device)
    key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), num_warps, device.index,
           tuple(a.dtype for a in args if torch.is_tensor(a)), strict)
    if key not in _RESIDENT:
        props = torch.cuda.get_device_properties(device)
        by_threads = props.max_threads_per_multi_processor // (32 * num_warps)
        try:
            compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps, **constexprs)
            compiled._init_handles()
            regs_per_warp = triton.cdiv(max(compiled.n_regs, 1) * 32, 256) * 256  # allocation granularity
            by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs_per_warp // num_warps
            smem = compiled.metadata.shared
            by_smem = props.shared_memory_per_multiprocessor // (smem + 1024) if smem else 32
            per_sm = max(1, min(by_regs, by_threads, by_smem, 32))
        except Exception as e:
            warnings.warn(f"{kernel.fn.__name__}: occupancy query failed ({e!r})"
                          + ("" if strict else "; assuming 64 registers per thread"))
            per_sm = 0 if strict else max(1, min(65536 // (64 * 32 * num_warps), by_threads))
        _RESIDENT[key] = per_sm * props.multi_processor_count
    return _RESIDENT[key]


def coop_plan(kernel, tensors: tuple, M: int, N: int, seg: int | None, default_seg: int, warps: int, partials: int,
              maxnreg: int | None = None, **constexprs):
    """Launch plan of a coop kernel (see publish / wait_total below) whose arguments are `tensors`
    (stand-ins will do for buffers sized by the answer), then slots, M, N, S, iters: a row of N in
    S segments of `seg` (None: `default_seg`) elements, one program each, as many groups of S
    programs as the GPU holds at once (they wait for each other), the fewest for the same sweeps
    over the M rows. Returns
    (groups, rows per group, S, slots, launch keywords: the constexprs, and `maxnreg` where given),
    `slots` zeroed for `partials` values a segment, or None when not even one group fits. On the CPU the segment is the whole row, one program a
    row: the interpreter runs programs one after the other, and one waiting for another not yet
    started would wait for ever."""
    import torch

    x = tensors[0]
    if x.device.type != "cuda":
        if seg is not None and seg < N:
            raise ValueError(f"coop segments of {seg} < {N} elements need a GPU: their programs wait for each other")
        seg = triton.next_power_of_2(N)
    seg = seg or default_seg
    S = triton.cdiv(N, seg)
    meta = dict(SEG=seg, S_BLOCK=triton.next_power_of_2(S), **constexprs)
    if maxnreg:
        meta["maxnreg"] = maxnreg
    stand_in = torch.zeros(partials, dtype=torch.int64, device=x.device)
    groups = min(M, resident_programs(kernel, (*tensors, stand_in, M, N, S, 1), meta, warps, x.device,
                                      strict=True) // S)
    if groups == 0:
        return None
    iters = triton.cdiv(M, groups)
    groups = triton.cdiv(M, iters)
    # iters + 1 rows a group: the step past the last row publishes too
    slots = torch.zeros(groups * (iters + 1) * S * partials, dtype=torch.int64, device=x.device)
    return groups, iters, S, slots, meta


def l2_bytes(device) -> int:
    """The L2 cache's size on a CUDA device; on the CPU (interpreter) the H100/H200's 50 MB, so that
    the CPU tests take the branches the GPU takes."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return 50 << 20


# ---------------------------------------------------------------------------------------------
# Wide rows split over programs, finished by the last to arrive. A row of S segments is handled by
# S consecutive programs of a 1-D grid (consecutive so that they are scheduled together): each
# loads its segment once, reduces it, stores its partial and then counts itself in on the row's
# counter; the one that counts last (sees S - 1) combines the S partials and writes the whole
# row, re-reading it from L2, where the others' loads just put it. Nobody waits for anybody (so
# any grid works, also under the CPU interpreter, which runs programs one after the other), and x
# crosses HBM once. (The scheme after this one waits instead, on a grid that the GPU holds whole.)
# Counters: int32, zeroed before the launch.


@triton.jit
def last_to_arrive(count_ptr, S):
    """True in the program that brings the counter at count_ptr to S. One thread does the atomic:
    the barrier before it makes the stores of all the program's threads (its partial,
    add_rms_norm's h) part of what its release publishes; acq_rel makes everything the others
    published visible to the last one; the barrier after it (the CUTLASS semaphore pattern) puts
    all of its threads' later loads after that acquire."""
    tl.debug_barrier()
    last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == S - 1
    tl.debug_barrier()
    return last


# ---------------------------------------------------------------------------------------------
# Wide rows split over co-resident programs that wait for each other. A row of S segments is
# held by S programs, each in its own registers; each publishes its partial of the row's reduction
# and waits until all S have; then every one of them sums the S partials (in the same order: the
# same total in all, deterministic) and finishes its own segment from registers: x crosses HBM once
# and nobody re-reads a row. A partial is published as one 64-bit word, (row + 1) << 32 | the fp32's
# bits, in slot [row, segment] of a zeroed int64 buffer: a naturally aligned 64-bit store is seen
# whole or not at all, so a reader that finds all S tags of its row has the S values, with no
# counter, atomic or fence: one store to publish, one load of the row's S slots per poll.
# Waiting is only safe when all of the grid's programs are resident at once (the launchers size the
# grid to what the GPU holds, see resident_programs) and on a GPU: the CPU interpreter
# runs programs one after the other, so there S must be 1. The wait is bounded: if a group's
# programs cannot all be resident (a GPU whose SMs are shared out, as with MPS limits), after
# MAX_SPINS polls the total is NaN, a wrong answer the correctness gate reports, rather than a hang.
# (A counter polled instead of the S slots, and waiting for a row's total right after publishing
# it, both measured slower: docs/evidence/rms_norm_ab_h200_run14.txt.)

MAX_SPINS = tl.constexpr(1 << 20)


@triton.jit
def coop_program(S, SEG: tl.constexpr):
    """(G, g, seg, cols) of a coop program: rows g, g+G, g+2G, ... of its group (G groups of S
    programs), and the columns [seg*SEG, (seg+1)*SEG) of them it holds."""
    pid = tl.program_id(0)
    seg = pid % S
    return tl.num_programs(0) // S, pid // S, seg, seg * SEG + tl.arange(0, SEG)


@triton.jit
def publish(slot_ptr, row, seg, S, value):
    """Give the row's other programs this program's partial `value` (an fp32 scalar)."""
    tl.store(slot_ptr + row * S + seg, ((row + 1).to(tl.int64) << 32) |
             (value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))


@triton.jit
def wait_total(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """The sum of the row's S published partials, once all are there (NaN after MAX_SPINS polls)."""
    j = tl.arange(0, S_BLOCK)
    slots = slot_ptr + row * S + j
    tag = (row + 1).to(tl.int64) << 32
    v = tl.load(slots, mask=j < S, other=tag, volatile=True)  # masked lanes: ready, value 0.0
    ready = tl.min(((v >> 32) == row + 1).to(tl.int32), axis=0)
    spins = 0
    while (ready == 0) & (spins < MAX_SPINS):
        v = tl.load(slots, mask=j < S, other=tag, volatile=True)
        ready = tl.min(((v >> 32) == row + 1).to(tl.int32), axis=0)
        spins += 1
    total = tl.sum(v.to(tl.int32).to(tl.float32, bitcast=True), axis=0)
    return tl.where(ready == 0, float("nan"), total)


@triton.jit
def publish2(slot_ptr, row, seg, S, a, b):
    """publish for two partials: slots [rows, 2, S] (the a's of a row, then its b's)."""
    tag = (row + 1).to(tl.int64) << 32
    tl.store(slot_ptr + row * 2 * S + seg, tag | (a.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))
    tl.store(slot_ptr + row * 2 * S + S + seg, tag | (b.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))


@triton.jit
def _poll2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """(a's, b's, ready) of a row's two sets of S published partials: the slots as two int64
    [S_BLOCK] vectors, polled in one round trip until all 2S tags are the row's (ready = 1) or
    MAX_SPINS polls have passed (ready = 0). (Polled as one [S, 2] block instead, the totals came
    out wrong at S = 32 on the H200 and right at S = 16 and 64, cause not found:
    docs/evidence/layer_norm_ab_h200_run12.txt.)"""
    j = tl.arange(0, S_BLOCK)
    slots_a = slot_ptr + row * 2 * S + j
    tag = (row + 1).to(tl.int64) << 32
    va = tl.load(slots_a, mask=j < S, other=tag, volatile=True)  # masked lanes: ready, value 0.0
    vb = tl.load(slots_a + S, mask=j < S, other=tag, volatile=True)
    ready = tl.min(((va >> 32) == row + 1).to(tl.int32) * ((vb >> 32) == row + 1).to(tl.int32), axis=0)
    spins = 0
    while (ready == 0) & (spins < MAX_SPINS):
        va = tl.load(slots_a, mask=j < S, other=tag, volatile=True)
        vb = tl.load(slots_a + S, mask=j < S, other=tag, volatile=True)
        ready = tl.min(((va >> 32) == row + 1).to(tl.int32) * ((vb >> 32) == row + 1).to(tl.int32), axis=0)
        spins += 1
    return va.to(tl.int32).to(tl.float32, bitcast=True), vb.to(tl.int32).to(tl.float32, bitcast=True), ready


@triton.jit
def wait_total2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """wait_total for two partials (publish2): (sum of the a's, sum of the b's)."""
    a, b, ready = _poll2(slot_ptr, row, S, S_BLOCK)
    return (tl.where(ready == 0, float("nan"), tl.sum(a, axis=0)),
            tl.where(ready == 0, float("nan"), tl.sum(b, axis=0)))


@triton.jit
def wait_slots2(slot_ptr, row, S, S_BLOCK: tl.constexpr):
    """The row's two sets of S published partials themselves (publish2), as two fp32 [S_BLOCK]
    vectors (0.0 past S), for a combination other than a sum; all NaN after MAX_SPINS polls."""
    a, b, ready = _poll2(slot_ptr, row, S, S_BLOCK)
    return tl.where(ready == 0, float("nan"), a), tl.where(ready == 0, float("nan"), b)


# ---------------------------------------------------------------------------------------------
# bf16 widened late. A kernel that holds a row of bf16 values across a reduction and uses them
# again after it (softmax's backward: dot = sum(y * dy), then y * (dy - dot)) keeps, as compiled,
# fp32 copies of them alive across the reduction: twice the registers of the packed bf16 loaded.
# At 32 elements per thread of two tensors (a 32768-wide row, 32 warps, where the hardware caps a
# thread at 64 registers) that spilled (sm_90 compile: 8 spill stores and loads a thread). An
# opaque, impure widening (a shift and a mask of the packed pair) cannot be hoisted or merged, so
# each use widens again from the packed bf16 (one integer op per element) and nothing spills.
# The interpreter cannot run PTX: the launchers pass ASM only for bf16 tensors on the GPU.


@triton.jit
def widen(v, ASM: tl.constexpr):
    """v as float32; ASM: v is bf16 on the GPU, widened by an opaque bit shift (see above)."""
    if ASM:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [v],
                                         dtype=tl.float32, is_pure=False, pack=2)
    else:
        return v.to(tl.float32)


def widen_asm(t) -> bool:
    """Whether `widen` may use its PTX for tensor t: bf16 on a CUDA device."""
    import torch

    return t.dtype == torch.bfloat16 and t.device.type == "cuda"


# ---------------------------------------------------------------------------------------------
# L2 prefetch. The wide-row kernels are short of loads in flight: a load holds its destination
# registers until the data arrives, so the bytes in flight per SM are capped by the registers
# (Nsight Compute, session 11: half the stall cycles wait on loads). A bulk prefetch into L2
# (sm_90's cp.async.bulk.prefetch.L2, one instruction for a whole segment, issued by the
# program's first thread) takes no register and is not waited for: a kernel asks for the rows it
# will load a step or two later, and its register loads then find them in L2, at a fraction of the
# HBM latency. GPU only (PTX, Hopper): the launchers pass the AHEAD constexprs as 0 elsewhere.


@triton.jit
def prefetch_l2(ptr, nbytes):
    """Bring nbytes at ptr into L2 (nbytes a multiple of 16, ptr 16-byte aligned; 0: nothing)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.ne.u32 p, $2, 0; @p setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_segment(ptr, row, M, N, seg, SEG: tl.constexpr):
    """prefetch_l2 of columns [seg*SEG, (seg+1)*SEG) (within N) of row `row` of the [M, N] tensor at
    ptr; nothing for a row past M. The caller makes sure rows are whole 16-byte vectors."""
    elt: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    nbytes = tl.where(row < M, tl.minimum(SEG, N - seg * SEG) * elt, 0)
    prefetch_l2(ptr + row.to(tl.int64) * N + seg * SEG, nbytes)


@triton.jit
def prefetch_chunk(row_ptr, c, N_FULL: tl.constexpr, BLOCK: tl.constexpr):
    """prefetch_l2 of chunk c (BLOCK elements from row_ptr + c * BLOCK) of a row of N_FULL full
    chunks; nothing for c past them."""
    elt: tl.constexpr = row_ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_l2(row_ptr + c * BLOCK, tl.where(c < N_FULL, BLOCK * elt, 0))


@triton.jit
def prefetch_rows(ptr, row0, ROWS: tl.constexpr, M, N):
    """prefetch_l2 of rows [row0, row0 + ROWS) of the [M, N] tensor at ptr, those below M (a tile of
    a persistent rows kernel: contiguous)."""
    elt: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    rows = tl.minimum(tl.maximum(M - row0, 0), ROWS)
    prefetch_l2(ptr + row0.to(tl.int64) * N, rows * N * elt)


def l2_prefetch_ok(t) -> bool:
    """Whether prefetch_l2 may run for the rows of 2-D tensor t: a Hopper GPU, rows that start on a
    16-byte boundary and are whole 16-byte vectors (so that every segment, chunk and tile is)."""
    e = t.element_size()
    return (on_sm90(t.device) and t.shape[-1] * e % 16 == 0 and t.stride(0) * e % 16 == 0
            and t.data_ptr() % 16 == 0)


def prefetch_ahead(asked: int | None, default: int, *tensors) -> int:
    """The L2_AHEAD constexpr of a launch that prefetches rows of `tensors`: `asked` (None: `default`)
    where prefetch_l2 may run for all of them, else 0."""
    return (default if asked is None else asked) if all(l2_prefetch_ok(t) for t in tensors) else 0


# ---------------------------------------------------------------------------------------------
# Launch of a "lines" kernel (softmax's forward, rms_norm's and layer_norm's wide forwards, fp8_quant's
# wide rows): two passes over each row in chunks of [BLOCK // VEC, VEC], 64 bytes a thread per chunk.
# H200 A/B, bf16 softmax fwd, % of copy (softmax_ab runs 9-10, docs/evidence/softmax_ab_h200_run9.txt,
# run10.txt): rows up to LINES_NARROW_ROW_BYTES in 16 KB chunks of 8 warps, one program a row
# (2048x65536: 81.4%; 2 per SM persistent 79.5%, 64 KB chunks 75.6%); wider rows in 64 KB chunks of
# 32 warps (2048x128256: 78.1-78.8%, 32 KB of 16 warps 75.3-75.6%), also one program a row (82.7%
# against 78.8% persistent one per SM, 80.3% two per SM; 1024x262144: 71.9% against 69.4%, 69.7%),
# as for rms_norm's (rms_norm_ab run 18) and fp8_quant's (fp8_quant_ab run 4) wide rows.
# Kernels that also read a weight in pass 2 (rms_norm, layer_norm) measured best with the wide rows'
# chunks from 128 KB rows on, and layer_norm with another grid for them: they pass narrow_row_bytes
# and wide_programs (their comments have the numbers).
LINES_NARROW_ROW_BYTES = 131072
LINES_CHUNK_BYTES, LINES_PROGRAMS_PER_SM = 16384, "rows"
LINES_CHUNK_BYTES_WIDE, LINES_PROGRAMS_PER_SM_WIDE = 65536, "rows"


def lines_launch(M: int, N: int, elt: int, device, chunk: int | None = None, programs_per_sm=None,
                 num_warps: int | None = None, narrow_row_bytes: int = LINES_NARROW_ROW_BYTES,
                 wide_programs=LINES_PROGRAMS_PER_SM_WIDE, vec: int | None = None) -> tuple[int, dict]:
    """(grid, launch keywords N_FULL, TAIL, BLOCK, VEC, num_warps) of a lines kernel over M rows of N
    elements of `elt` bytes: chunks of `chunk` elements (a power of two; default above: the narrow
    rows' up to `narrow_row_bytes` a row, the wide rows' past it), `programs_per_sm` programs per SM
    (a fraction leaves SMs idle) or "rows" (one program a row; default: the narrow rows' above,
    `wide_programs` for wide rows), `vec` elements a line (default one 16-byte vector)."""
    wide = N * elt > narrow_row_bytes
    vec = vec or 16 // elt
    block = max(vec, min(chunk or (LINES_CHUNK_BYTES_WIDE if wide else LINES_CHUNK_BYTES) // elt,
                         triton.next_power_of_2(N)))
    pps = programs_per_sm or (wide_programs if wide else LINES_PROGRAMS_PER_SM)
    grid = M if pps == "rows" else max(1, min(M, int(pps * sm_count(device))))
    warps = num_warps or max(1, min(32, block * elt // 2048))
    return grid, dict(N_FULL=N // block, TAIL=N % block != 0, BLOCK=block, VEC=vec, num_warps=warps)


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
