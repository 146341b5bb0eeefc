"""fp8_quant's Triton kernels and their launcher. One pass over memory: each program loads its
block(s) once, takes amax in registers, scales, casts and stores q and the scales. Only rows too
wide for registers (> config.ROW_MAX) are read twice, the second time from L2.

The float32 -> e4m3 cast: on the GPU, `.to(tl.float8e4nv)` is the hardware conversion
(cvt.rn.satfinite: round to nearest even). Triton's CPU interpreter (3.6) gets that cast wrong:
it rounds half-up on the mantissa and loses the carry into an odd exponent (1.97 -> 1.0,
500 -> 256) and truncates subnormals. So under the interpreter (EMULATE) the kernel first rounds
onto the e4m3 grid in float32 arithmetic (bit-exact with torch's cast, tested on every bf16
value), after which the interpreter's cast only has exact values to convert.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host.launch import lines_launch
from .config import GROUP, ROW_MAX, GroupsConfig, LinesConfig, TilesConfig, group_width, pick

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
AMAX_FLOOR = 1e-10  # as in common per-token-group quantisers: below it a block quantises to zeros
GRANULARITIES = ("row", "1x128", "128x128")

_FP8_MAX = tl.constexpr(FP8_MAX)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)


@triton.jit
def _round_to_e4m3_grid(v):
    """Round float32 v (|v| <= 448) to the nearest e4m3 value, ties to even, still as float32."""
    bits = v.to(tl.uint32, bitcast=True)
    # Normal range (|v| >= 2^-6): keep 3 of float32's 23 mantissa bits. Adding 0x7FFFF plus the
    # kept lsb then clearing the low 20 bits is round-to-nearest-even, the carry reaching the
    # exponent by plain integer addition.
    lsb = (bits >> 20) & 1
    normal = (((bits + 0x7FFFF + lsb) >> 20) << 20).to(tl.float32, bitcast=True)
    # Subnormal range (|v| < 2^-6): e4m3's step is 2^-9 there. 16384 + |v| has float32 ulp 2^-9,
    # so the float32 add rounds |v| to that step (ties to even); the sign bit is put back after.
    mag = (tl.abs(v) + 16384.0) - 16384.0
    sub = (mag.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) < 0.015625, sub, normal)


@triton.jit
def _scales_of(amax):
    """(scale, 1 / scale) from a block's amax; exact divisions (once per block, cheap), so the
    stored scale is the correctly rounded amax / 448 on every backend."""
    scale = tl.div_rn(tl.maximum(amax, _AMAX_FLOOR), _FP8_MAX)
    return scale, tl.div_rn(1.0, scale)


@triton.jit
def _fma(a, b, c, EMULATE: tl.constexpr):
    if EMULATE:
        # the interpreter's fma rounds the product and the sum separately; float64 holds the
        # product of two float32 exactly
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(a, b, c)


@triton.jit
def _to_e4m3(x, scale, inv, EMULATE: tl.constexpr):
    """e4m3(x / scale) with x / scale correctly rounded in float32, as torch's division, but with
    no division per element (div.rn.f32 is a dozen instructions): y = x * (1/scale) is within an
    ulp of x / scale, the residual r = x - y * scale is exact by fma, and y + r * (1/scale) (again
    by fma, 1/scale correctly rounded) is the correctly rounded quotient (Markstein). It matters:
    bf16 inputs over bf16 amaxes often put x / scale exactly on a midpoint between e4m3 values,
    where a product an ulp off rounds the other way. The negation sits on the per-block scale, so
    the whole step costs a multiply and two fmas per element.
    No clamp to +-448 on the GPU: |x / scale| <= 448 up to float32 rounding, which e4m3 rounds to
    448, and the conversion saturates anyway (cvt.rn.satfinite); the emulation clamps for its own
    precondition."""
    neg_scale = tl.broadcast_to(-scale, x.shape)
    inv = tl.broadcast_to(inv, x.shape)
    y = x * inv
    y = _fma(_fma(y, neg_scale, x, EMULATE), inv, y, EMULATE)
    if EMULATE:
        y = _round_to_e4m3_grid(tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX))
    return y.to(tl.float8e4nv)


@triton.jit
def _quant_row_groups(x_ptr, q_ptr, s_ptr, M, N, n_groups,
                      BM: tl.constexpr, G: tl.constexpr, GW: tl.constexpr, EMULATE: tl.constexpr,
                      POLICY: tl.constexpr):
    # A [BM rows, G groups, GW columns] tile, one scale per (row, group). "1x128": GW = 128 and
    # G groups side by side (the G scales of a row are then one contiguous store). "row": G = 1 and
    # GW = next_pow2(N) >= N, i.e. one group is the whole row (the mask drops the padding).
    rows = tl.program_id(1) * BM + tl.arange(0, BM)
    groups = tl.program_id(0) * G + tl.arange(0, G)
    cols = groups[:, None] * GW + tl.arange(0, GW)[None, :]  # [G, GW]
    row_ok = rows < M
    mask = row_ok[:, None, None] & (cols < N)[None, :, :]
    offs = rows.to(tl.int64)[:, None, None] * N + cols[None, :, :]
    # padding 0 never wins the amax; POLICY: the load's cache hint
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=2)  # [BM, G], a reduction inside each warp for GW = 128
    scale, inv = _scales_of(amax)
    tl.store(q_ptr + offs, _to_e4m3(x, scale[:, :, None], inv[:, :, None], EMULATE), mask=mask)
    s_offs = rows.to(tl.int64)[:, None] * n_groups + groups[None, :]
    tl.store(s_ptr + s_offs, scale, mask=row_ok[:, None] & (groups < n_groups)[None, :])


@triton.jit
def _quant_tiles(x_ptr, q_ptr, s_ptr, M, N, n_tile_cols, B: tl.constexpr, EMULATE: tl.constexpr,
                 POLICY: tl.constexpr):
    # One B x B tile (B = 128) per program: 32 KB of bf16 in flight, one scale.
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rows = pid_m * B + tl.arange(0, B)
    cols = pid_n * B + tl.arange(0, B)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale, inv = _scales_of(amax)
    tl.store(q_ptr + offs, _to_e4m3(x, scale, inv, EMULATE), mask=mask)
    tl.store(s_ptr + pid_m * n_tile_cols + pid_n, scale)


@triton.jit
def _quant_wide_lines(x_ptr, q_ptr, s_ptr, M, N, N_FULL: tl.constexpr, TAIL: tl.constexpr, BLOCK: tl.constexpr,
                      VEC: tl.constexpr, EMULATE: tl.constexpr):
    # Rows wider than registers, softmax's lines forward for the amax: chunks of
    # [BLOCK // VEC, VEC] (one or two 16-byte vectors a line), the amax kept per line (no block reduction in
    # the loop), the next chunk loaded before the current one is used in both passes; pass 2
    # re-reads the row from L2 newest chunk first. N_FULL unmasked chunks and a masked one if TAIL
    # (pass 1 first, pass 2 last). Programs stride over the rows.
    L: tl.constexpr = BLOCK // VEC
    offs = tl.arange(0, L)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    t_offs = N_FULL * BLOCK + offs
    t_mask = t_offs < N
    row = tl.program_id(0)
    while row < M:
        base = row.to(tl.int64) * N
        a = tl.zeros([L], dtype=tl.float32)
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_last")
        if N_FULL > 0:
            nxt = tl.load(x_ptr + base + offs, eviction_policy="evict_last")
        if TAIL:
            a = tl.maximum(a, tl.max(tl.abs(x_t.to(tl.float32)), 1))
        if N_FULL > 1:  # (a constexpr guard: the compiler visits a loop body even for 0 trips)
            for c in range(N_FULL - 1):
                cur = nxt
                nxt = tl.load(x_ptr + base + (c + 1) * BLOCK + offs, eviction_policy="evict_last")
                a = tl.maximum(a, tl.max(tl.abs(cur.to(tl.float32)), 1))
        if N_FULL > 0:
            a = tl.maximum(a, tl.max(tl.abs(nxt.to(tl.float32)), 1))
        scale, inv = _scales_of(tl.max(a, 0))
        if N_FULL > 0:
            v = tl.load(x_ptr + base + (N_FULL - 1) * BLOCK + offs, eviction_policy="evict_first")
        if N_FULL > 1:
            for j in range(N_FULL - 1):
                c = N_FULL - 1 - j
                cur = v
                v = tl.load(x_ptr + base + (c - 1) * BLOCK + offs, eviction_policy="evict_first")
                tl.store(q_ptr + base + c * BLOCK + offs, _to_e4m3(cur.to(tl.float32), scale, inv, EMULATE),
                         eviction_policy="evict_first")
        if TAIL:
            x_t = tl.load(x_ptr + base + t_offs, mask=t_mask, other=0.0, eviction_policy="evict_first")
        if N_FULL > 0:
            tl.store(q_ptr + base + offs, _to_e4m3(v.to(tl.float32), scale, inv, EMULATE),
                     eviction_policy="evict_first")
        if TAIL:
            tl.store(q_ptr + base + t_offs, _to_e4m3(x_t.to(tl.float32), scale, inv, EMULATE), mask=t_mask,
                     eviction_policy="evict_first")
        tl.store(s_ptr + row, scale)
        row += tl.num_programs(0)


def block_shape(M: int, N: int, gran: str) -> tuple[int, int]:
    """(rows, columns) covered by one scale."""
    if gran == "row":
        return 1, N
    if gran == "1x128":
        return 1, GROUP
    if gran == "128x128":
        return GROUP, GROUP
    raise ValueError(f"unknown granularity {gran!r}; known: {', '.join(GRANULARITIES)}")


def _config(M: int, N: int, gran: str, x: torch.Tensor, config):
    """config, or config.pick's; refused if it is not the one its path takes."""
    want = TilesConfig if gran == "128x128" else LinesConfig if gran == "row" and N > ROW_MAX else GroupsConfig
    if config is None:
        return pick(M, N, gran, x.element_size(), x.device)
    if not isinstance(config, want):
        raise ValueError(f"{gran} quantisation of {M}x{N} takes a {want.__name__}, got {type(config).__name__}")
    return config


def fp8_quant_forward(x: torch.Tensor, gran: str, emulate: bool | None = None, config=None):
    """(q, scales). `emulate` rounds in float32 before the cast (see the module docstring); by
    default only under Triton's interpreter (CPU tensors), where the cast itself is wrong. `config`:
    the path's TilesConfig, GroupsConfig or LinesConfig (None: config.pick's)."""
    M, N = x.shape
    br, bc = block_shape(M, N, gran)
    x = x.contiguous()
    q = torch.empty((M, N), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((triton.cdiv(M, br), triton.cdiv(N, bc)), dtype=torch.float32, device=x.device)
    emulate = x.device.type != "cuda" if emulate is None else emulate
    cfg = _config(M, N, gran, x, config)
    if isinstance(cfg, TilesConfig):
        grid = (s.shape[1], s.shape[0])
        _quant_tiles[grid](x, q, s, M, N, s.shape[1], B=GROUP, EMULATE=emulate, POLICY=cfg.policy,
                           num_warps=cfg.warps)
    elif isinstance(cfg, LinesConfig):
        grid, meta = lines_launch(M, N, x.element_size(), x.device, cfg.chunk, cfg.programs, cfg.warps, vec=cfg.vec)
        _quant_wide_lines[(grid,)](x, q, s, M, N, EMULATE=emulate, **meta)
    else:
        n_groups = s.shape[1]
        grid = (triton.cdiv(n_groups, cfg.groups), triton.cdiv(M, cfg.rows))
        _quant_row_groups[grid](x, q, s, M, N, n_groups, BM=cfg.rows, G=cfg.groups, GW=group_width(N, gran),
                                EMULATE=emulate, POLICY=cfg.policy, num_warps=cfg.warps)
    return q, s
