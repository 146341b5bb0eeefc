"""What the recurrent cells share (lstm, slstm, mlstm, axon): reset masks, shape checks, the
limit on the PyTorch step loops the collector times, activations and the reset factor in kernels,
the four-gate split of a fused gate tile, and the grid-wide step barrier of a persistent recurrence."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The step loops (one small kernel per operation per timestep, ten or more a step) take seconds a
# call past a few hundred steps, fwd+bwd: the collector times them up to this many steps and reports
# them unavailable beyond, so that a full collection stays within minutes.
STEP_LOOP_MAX_T = 256


def step_loop_limit(name: str, T: int) -> None:
    """Raise Unavailable for a step-loop provider past STEP_LOOP_MAX_T steps."""
    if T > STEP_LOOP_MAX_T:
        from kcollect.spec import Unavailable

        raise Unavailable(f"{name} launches several kernels per timestep: timed up to T={STEP_LOOP_MAX_T} "
                          f"steps, T={T} would take seconds a call")


DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_dtypes(op: str, **tensors) -> torch.dtype:
    """The dtype `tensors` share (those an op's products read in one type; states and gates it
    converts may differ); ValueError unless they agree and it is one of DTYPES."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    first = next(iter(dtypes.values()))
    if first not in DTYPES or any(d != first for d in dtypes.values()):
        raise ValueError(f"{op}: the inputs must share one dtype of float32, bfloat16 or float16, got "
                         + ", ".join(f"{n} {str(d)[6:]}" for n, d in dtypes.items()))
    return first


def dims_check(op: str, names: tuple[str, ...]):
    """A spec's check_shape for shapes that must name every one of `names`."""

    def check_shape(dims) -> str | None:
        missing = [n for n in names if n not in dims]
        return f"{op} needs dims {', '.join(names)}; missing {', '.join(missing)}" if missing else None

    return check_shape


def reset_mask(B: int, T: int, p: float, gen: torch.Generator, device) -> torch.Tensor | None:
    """A seeded [B, T] bool mask, True where a row's state is zeroed before that step; None at p = 0
    (the kernels' path without resets)."""
    if p <= 0:
        return None
    return (torch.rand(B, T, generator=gen) < p).to(device)


def keep_factor(resets: torch.Tensor | None, t: int, like: torch.Tensor) -> torch.Tensor | None:
    """[B, 1] factor 1 - resets[:, t] in like's dtype (None without resets): the state a step reads."""
    if resets is None:
        return None
    return (~resets[:, t]).to(like.dtype)[:, None]


def unit_major(n_units: int, n_gates: int, device) -> torch.Tensor:
    """Row order that puts the gates of one unit next to each other: [g*H + j] -> position
    j*n_gates + g, so that a program holding units [a, b) holds the contiguous gate rows
    [a*n_gates, b*n_gates) (PyTorch's LSTM layout stacks the gates: i of all units, then f ...)."""
    return (torch.arange(n_gates, device=device)[None, :] * n_units
            + torch.arange(n_units, device=device)[:, None]).reshape(-1)


def dot_f32(dtype: torch.dtype, device) -> bool:
    """Whether the kernels' tl.dot takes fp32 operands (as TF32x3, about fp32's accuracy: see dot):
    for fp32 inputs, whose recurrences would lose 13 mantissa bits a step to TF32, and on the CPU
    interpreter, whose tl.dot multiplies bf16 operands as their uint16 bit patterns (Triton 3.6)."""
    return dtype == torch.float32 or torch.device(device).type != "cuda"


@triton.jit
def tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def logsigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


# ---------------------------------------------------------------------------------------------
# fp32 maths as accurate as PyTorch's. On a GPU, tl.exp is ex2.approx of x * log2(e) (the rounding
# of that product grows with |x|: 8 ulp at x = -10), tl.sigmoid and `/` divide with div.full (2 ulp),
# and tanh above is 2 sigmoid(2x) - 1, whose absolute error of ~2e-7 is all of a small tanh's
# digits; PyTorch's fp32 kernels use expf, tanhf and IEEE division (1-2 ulp), and a recurrence
# carries every step's error into the next. So the kernels take PRECISE (a constexpr: the tensors
# are fp32) and use the forms below then: Cephes' expf (a range reduction by ln 2 in two exact
# parts and a degree-7 polynomial) and tanhf, division rounded to nearest, log1p by Goldberg's
# correction. Off (bf16, fp16), the fast forms: their error is far below one rounding of the data.
# Only tl ops, so the CPU interpreter runs the same code.


@triton.jit
def _exp_precise(x):
    xc = tl.minimum(tl.maximum(x, -87.3), 88.72)
    k = tl.floor(xc * 1.4426950408889634 + 0.5)
    r = xc - k * 0.693359375  # ln 2 = 0.693359375 - 2.12194440e-4: k * 0.693359375 is exact
    r = r + k * 2.12194440e-4
    p = 1.9875691500e-4
    p = p * r + 1.3981999507e-3
    p = p * r + 8.3334519073e-3
    p = p * r + 4.1665795894e-2
    p = p * r + 1.6666665459e-1
    p = p * r + 5.0000001201e-1
    e = p * r * r + r + 1.0
    half_scale = ((k.to(tl.int32) + 126) << 23).to(tl.float32, bitcast=True)  # 2^(k-1): k = 128 fits
    e = e * half_scale * 2.0
    e = tl.where(x > 88.72, float("inf"), tl.where(x < -87.3, 0.0, e))  # below: subnormal, flushed
    return tl.where(x == x, e, x)  # NaN stays NaN


@triton.jit
def exp_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        return _exp_precise(x)
    else:
        return tl.exp(x)


@triton.jit
def div_f32(a, b, PRECISE: tl.constexpr):
    if PRECISE:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def sigmoid_f32(x, PRECISE: tl.constexpr):
    if PRECISE:
        return tl.div_rn(1.0, 1.0 + _exp_precise(-x))
    else:
        return tl.sigmoid(x)


@triton.jit
def tanh_f32(x, PRECISE: tl.constexpr):
    """tanh; PRECISE: Cephes' tanhf, a polynomial below |x| = 0.625 (no cancellation near 0)."""
    if PRECISE:
        z = tl.abs(x)
        big = 1.0 - tl.div_rn(2.0, _exp_precise(2.0 * z) + 1.0)
        z2 = x * x
        p = -5.70498872745e-3
        p = p * z2 + 2.06390887954e-2
        p = p * z2 - 5.37397155531e-2
        p = p * z2 + 1.33314422036e-1
        p = p * z2 - 3.33332819422e-1
        return tl.where(z > 0.625, tl.where(x < 0.0, -big, big), p * z2 * x + x)
    else:
        return tanh(x)


@triton.jit
def logsigmoid_f32(x, PRECISE: tl.constexpr):
    """min(x, 0) - log1p(exp(-|x|)); PRECISE: log1p(e) = log(u) e / (u - 1), u = 1 + e (Goldberg),
    which keeps the digits of a small e that log(1 + e) rounds away (a forget gate near 1)."""
    if PRECISE:
        e = _exp_precise(-tl.abs(x))
        u = 1.0 + e
        log1p = tl.where(u == 1.0, e, tl.div_rn(tl.log(u) * e, u - 1.0))
        return tl.minimum(x, 0.0) - log1p
    else:
        return logsigmoid(x)


def precise(dtype: torch.dtype) -> bool:
    """The kernels' PRECISE flag: fp32 tensors (see exp_f32)."""
    return dtype == torch.float32


@triton.jit
def keep_rows(rs_ptr, rows, mask, t, T, has_resets):
    """fp32 per row: 0 for the rows whose state is zeroed before step t (resets [B, T] as uint8 at
    rs_ptr), 1 for the others and everywhere when has_resets is 0."""
    r = tl.load(rs_ptr + rows.to(tl.int64) * T + t, mask=mask & (has_resets != 0), other=0)
    return 1.0 - r.to(tl.float32)


@triton.jit
def dot(a, b, acc, DOT_F32: tl.constexpr):
    """acc + a @ b on tensor cores, with fp32 operands where dot_f32 says so: as three TF32 products
    (each operand a TF32 part and the TF32 remainder; the remainders' product is left out, about
    2^-22 of the terms), where "ieee" ran on the CUDA cores: compiled for sm_90 the mLSTM's fp32
    backward chunk kernel then kept a 44 KB stack a thread (7 KB with TF32x3), which the GPU
    reserves for every thread it holds."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


# ---------------------------------------------------------------------------------------------
# Gate tiles. A [BB, 4*HB] tile whose columns are unit-major (column u*4 + g holds gate g of unit
# u) splits into the four [BB, HB] gates with two halvings of the trailing dimension.


@triton.jit
def split4(acc, BB: tl.constexpr, HB: tl.constexpr):
    """(gate 0, gate 1, gate 2, gate 3) of a unit-major [BB, 4*HB] tile."""
    even, odd = tl.split(tl.reshape(acc, (BB, HB, 2, 2)))  # gates (0, 2) and (1, 3)
    g0, g2 = tl.split(even)
    g1, g3 = tl.split(odd)
    return g0, g1, g2, g3


@triton.jit
def join4(g0, g1, g2, g3, BB: tl.constexpr, HB: tl.constexpr):
    """The unit-major [BB, 4*HB] tile of four [BB, HB] gates (split4's inverse)."""
    return tl.reshape(tl.join(tl.join(g0, g2), tl.join(g1, g3)), (BB, 4 * HB))


# ---------------------------------------------------------------------------------------------
# Grid-wide step barrier. The programs of one recurrence (the hidden units of a batch group, split
# over SMs) each publish their slice of step t's state, `arrive` on the group's counter, and before
# step t + 1 `wait` until all of them have: the counter only grows (program count x steps), so no
# reset is needed between steps. Only safe when all programs of a group are resident at once (the
# launchers check the occupancy); the wait is bounded: after MAX_WAIT polls a program gives up,
# stops waiting for good and reports it (the launcher then writes NaN, which the gate reports),
# rather than hanging the collection. Zeroed int32 counters, one per group. The CPU interpreter
# runs programs one after the other, so there a group is one program (which never waits).

MAX_WAIT = tl.constexpr(1 << 18)


@triton.jit
def arrive(count_ptr):
    """Count this program in, after all of its threads' stores (the barrier before the release
    makes them part of what it publishes; one thread does a scalar atomic)."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")


@triton.jit
def wait(count_ptr, target, ok):
    """Wait until the counter reaches `target`; returns ok and-ed with whether it did. A program
    that already failed (ok False) does not wait again."""
    n = tl.load(count_ptr, volatile=True)
    spins = 0
    limit = tl.where(ok, MAX_WAIT, 0)
    while (n < target) & (spins < limit):
        n = tl.load(count_ptr, volatile=True)
        spins += 1
    tl.atomic_add(count_ptr, 0, sem="acquire")  # what the others published is visible from here on
    tl.debug_barrier()
    return ok & (n >= target)
