"""attention's gradients from rows that see one key or none (issue 40), on the CPU interpreter.

A row that sees a single key has softmax 1 there whatever its score: its exact dS is 0, so it adds
nothing to dq or dk (dv gets its upstream gradient). A row whose other keys hold less than fp32's
2^-24 of the probability is the same to within roundings. The kernels took dS = p (dP - delta)
with dP and delta rounded differently, a rounding of |do| |v| where 0 is exact: where every row is
such (a window of one key, one key, causal rows past Skv with the key probabilities one-hot), dk
and dq were that rounding alone (1e-7, against a float64 gradient of 0 or 1e-10: dk 2,100x
float64's norm off, where eager's 0 is 1x). Rows without keys must give dq 0 and nothing to dk,
dv, whatever memory the buffers come from (torch.empty on a GPU is not zeroed): the allocations
are poisoned with NaN here."""
import functools
import random

import pytest
import torch

import triton
import triton.language as tl

from kcollect import verify
from kcollect.kernels.attention import bwd, fwd
from kcollect.kernels.attention import ACCURATE_KEYS, attention
from kcollect.kernels.attention.naive import reference
from kcollect.kernels.attention.spec import SPEC, cu_seqlens

DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like fill what they hand out: NaN (floats) or a large value (integers)."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        return t.fill_(float("nan") if t.is_floating_point() else 127) if t.numel() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))


def _grads(fn, q, k, v, do, **kw):
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    o = fn(*x, **kw)
    return (o.detach(), *torch.autograd.grad(o, x, do.to(o.dtype)))


def _run(q, k, v, dtype, seed, **kw):
    """Ours and float64's (o, dq, dk, dv) for these inputs in `dtype` and a seeded upstream gradient."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ours = _grads(functools.partial(attention, accurate=True), q, k, v, do, **kw)
    want = _grads(reference, *(t.double() for t in (q, k, v)), do, **kw)
    return ours, want


def _inputs(shape_q, shape_k, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape_q, generator=g) * scale, torch.randn(shape_k, generator=g) * scale,
            torch.randn(shape_k, generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq, sk, causal, window", [(40, 1, 1, 0), (33, 1, 0, 0), (19, 33, 1, 1), (37, 5, 1, 1)])
def test_rows_of_one_key_give_exact_zero_dq_dk(poisoned, dtype, sq, sk, causal, window):
    """Every row sees one key or none (one key, causal or not: the latter through the dk/dv kernel's
    mask-free blocks; a window of one; causal Sq > Skv with a window of one): dq and dk are exactly
    0, dv and o match float64; no NaN from the poisoned buffers."""
    seed = random.randrange(2**31)
    q, k, v = _inputs((2, sq, 4, 24), (2, sk, 2, 24), seed, scale=2.0)
    (o, dq, dk, dv), want = _run(q, k, v, dtype, seed + 1, causal=bool(causal), window=window)
    at = f"seed {seed}, {dtype}, Sq {sq} Skv {sk} causal {causal} window {window}"
    assert (dq == 0).all() and (dk == 0).all(), f"{at}: |dq| {dq.double().norm():.3g} |dk| {dk.double().norm():.3g}"
    for name, got, w in (("o", o, want[0]), ("dv", dv, want[3])):
        err = verify.rel_error(got, w)
        assert err <= SPEC.tolerance[dtype], f"{at}: {name} error {err:.3g}"


def _one_hot_inputs(s, d, seed):
    """q_i and k_j in a plane of 2 of the d dims at angles i pi/2 and (j + 1) pi/2, plus a little
    noise: query i scores key i - 1 at about 40 and key i at about 0, so a window of 2 leaves each
    row (but the first) with all of its probability on its first key (e^-40 < 2^-24 on the other)."""
    g = torch.Generator().manual_seed(seed)
    angle = torch.arange(s + 1, dtype=torch.float64) * torch.pi / 2
    plane = torch.stack([angle.cos(), angle.sin()], -1) * (40 * d ** 0.5) ** 0.5
    q = torch.randn(1, s, 1, d, generator=g, dtype=torch.float64) * 0.01
    k = torch.randn(1, s, 1, d, generator=g, dtype=torch.float64) * 0.01
    q[0, :, 0, :2] += plane[:s]
    k[0, :, 0, :2] += plane[1:]
    return q, k, torch.randn(1, s, 1, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_rows_gradients_within_eagers_reach(dtype):
    """Rows whose second key has under 2^-24 of the probability (whose exact dq, dk are below
    fp16's smallest number): dq and dk within twice the float64 gradient's own norm of it, as
    eager's 0 is (the kernels gave their roundings of |do| |v|, thousands of times that)."""
    seed = random.randrange(2**31)
    q, k, v = _one_hot_inputs(40, 8, seed)
    (o, dq, dk, dv), want = _run(q, k, v, dtype, seed + 1, causal=True, window=2)
    for name, got, w in (("dq", dq, want[1]), ("dk", dk, want[2])):
        err = verify.rel_error(got, w)
        assert err <= 2.0, f"seed {seed}, {dtype}: {name} error {err:.3g} (|float64| {w.norm():.3g})"
    assert verify.rel_error(dv, want[3]) <= SPEC.tolerance[dtype], f"seed {seed}, {dtype}: dv"


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_rows_of_one_key_or_none(poisoned, dtype):
    """A packed batch with a sequence without keys, one without queries and one of one key, a
    window of one: dq and dk exactly 0, dv and o as float64's."""
    seed = random.randrange(2**31)
    lens_q, lens_k = [3, 0, 5, 17, 2], [0, 2, 1, 17, 4]
    q, k, v = _inputs((sum(lens_q), 2, 8), (sum(lens_k), 1, 8), seed, scale=2.0)
    cu = dict(cu_seqlens_q=cu_seqlens(lens_q, "cpu"), cu_seqlens_k=cu_seqlens(lens_k, "cpu"))
    (o, dq, dk, dv), want = _run(q, k, v, dtype, seed + 1, causal=True, window=1, **cu)
    assert (dq == 0).all() and (dk == 0).all(), f"seed {seed}, {dtype}"
    assert (o[:3] == 0).all() and (dv[:2] == 0).all(), f"seed {seed}, {dtype}: a sequence without keys or queries"
    for name, got, w in (("o", o, want[0]), ("dv", dv, want[3])):
        assert verify.rel_error(got, w) <= SPEC.tolerance[dtype], f"seed {seed}, {dtype}: {name}"


def test_sweep_case_causal_queries_past_the_keys():
    """The H200 sweep's case (seed 12 at 90e3254, index 804; attention(accurate=True)): causal Sq 64
    over Skv 2 at scale 3, one row of one key and one whose second key is under 2^-24: dk was 2,100x float64's norm off
    (the gate: 2, eager's 0 being 1)."""
    from lab.awkward import attention as family

    case = {"op": "attention", "path": "dense", "dtype": "float16",
            "dims": {"B": 1, "Hq": 2, "Hkv": 2, "Sq": 64, "Skv": 2, "D": 8, "causal": 1, "window": 0},
            "options": {"scale": 3.0, "layout": "contiguous", "grad_layout": "contiguous", "accurate": True},
            "refusal": None,
            "seed": 1212178766}
    v = family.check(case, "cpu")
    assert v["status"] == "ok", v.get("message")


def test_float32_is_refused():
    """fp32 is not among the kernels' dtypes: refused with a ValueError naming them."""
    q, k, v = _inputs((1, 3, 1, 8), (1, 2, 1, 8), 0)
    with pytest.raises(ValueError, match="bfloat16, float16"):
        attention(q, k, v, causal=True)


def test_accurate_by_default_only_on_short_rows(monkeypatch):
    """accurate=True takes all three measures (o's rounding kept, the dq shift, rows of one key) and
    accurate=False none; the default takes them where a query sees at most ACCURATE_KEYS keys (the
    window, else the key length), and past that leaves them off for their cost (bwd.py)."""
    from kcollect.kernels.attention import bwd, fwd

    seen = []
    forward, backward = fwd.forward, bwd.backward
    monkeypatch.setattr(fwd, "forward", lambda *a, **k: seen.append(("residual", k["residual"])) or forward(*a, **k))

    def spy(*a, **k):
        config = a[13]
        seen.append(("bwd", config.dq_shift, config.one_key))
        return backward(*a, **k)

    monkeypatch.setattr(bwd, "backward", spy)
    n = ACCURATE_KEYS
    for skv, window, accurate, want in ((7, 0, False, False), (7, 0, True, True), (7, 0, None, True),
                                        (n, 0, None, True), (n + 1, 0, None, False), (n + 1, n + 5, None, False),
                                        (n + 1, n, None, True), (3 * n, 3, None, True), (3 * n, 0, True, True)):
        q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in _inputs((1, 5, 2, 8), (1, skv, 2, 8), 3))
        seen.clear()
        attention(q, k, v, causal=True, window=window, accurate=accurate).sum().backward()
        assert seen == [("residual", want), ("bwd", want, want)], (skv, window, accurate, seen)
    with torch.no_grad():  # nothing to keep for a backward that will not come
        seen.clear()
        attention(q.detach(), k.detach(), v.detach(), causal=True)
        assert seen == [("residual", False)], seen



@triton.jit
def _kept(X, O, R, n, R_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """The forward's epilogue on a vector: x rounded to O's dtype, and the code of its rounding."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    o = x.to(O.dtype.element_ty)
    tl.store(O + i, o, mask=i < n)
    tl.store(R + i, fwd.rounding_code(x, o, R_SHIFT), mask=i < n)


def _delta(x, dtype, do, residual: bool):
    """bwd._bwd_delta's rowsum(o * do) of fp32 rows x [T, D], o = x rounded to dtype and, with
    `residual`, its kept rounding added back."""
    t, d = x.shape
    o, r = torch.empty(x.shape, dtype=dtype), torch.empty(x.shape, dtype=torch.int8)
    _kept[(triton.cdiv(x.numel(), 256),)](x, o, r, x.numel(), R_SHIFT=fwd.residual_shift(dtype), BLOCK=256)
    delta = torch.empty(t)
    bwd._bwd_delta[(triton.cdiv(t, 16), 1)](o, r, do, delta, 0, d, d, 0, d, d, t, t, D=d, BLOCK_D=32, BLOCK_T=16,
                                           VARLEN=False, RESIDUAL=residual, R_SHIFT=fwd.residual_shift(dtype))
    return o, delta


@pytest.mark.parametrize("dtype", DTYPES)
def test_kept_rounding_gives_delta_of_o_in_fp32(dtype):
    """accurate=True keeps o's rounding (fwd.residual_shift: an int8 count of fp32 steps from o to
    the forward's fp32 o) and _bwd_delta adds it back: delta = rowsum(o32 * do) to sum |do| times
    half a code step an element (2^7 fp32 steps of o32 in bf16, 2^4 in fp16: the finest codes that
    fit an int8), a whole step where the code saturates at 127 (about 2% of draws have a row's
    largest element there), and the sum's fp32 roundings, where o alone is off by o's rounding,
    2^-9 or 2^-12. Both signs,
    magnitudes over decades, values just under a power of two (rounded up across it), zeros, and
    o32's that overflow fp16 (delta inf, as o's)."""
    t, d = 67, 24
    x = torch.randn(t, d) * torch.logspace(-4, 4, d)  # fresh draws: the test's seed
    x[::5, 3] = 2.0 ** torch.randint(-10, 10, (14,)).float() * (1 - 2.0 ** -12)  # rounds up to 2^k
    x[1::7, 7] = 0.0
    do = torch.randn(t, d)
    want = (x.double() * do.double()).sum(1)
    size = (x.double() * do.double()).abs().sum(1)
    o, kept = _delta(x, dtype, do, True)
    _, plain = _delta(x, dtype, do, False)
    assert torch.equal(o, x.to(dtype))
    err = lambda got: ((got.double() - want).abs() / size).max().item()  # noqa: E731
    half = {torch.bfloat16: 2.0 ** 7, torch.float16: 2.0 ** 4}[dtype]  # half a code step, in fp32 steps
    count = (x.view(torch.int32) - o.float().view(torch.int32)).double()  # fp32 steps from o to o32
    steps = torch.where(count.abs() > 255 * half, 2 * half, half)  # codes of 127.5 steps and up saturate
    ulp = (torch.nextafter(x.abs(), torch.tensor(float("inf"))) - x.abs()).double()
    bound = (steps * ulp * do.double().abs()).sum(1) + d * 2.0 ** -23 * size  # and the fp32 sums' roundings
    assert ((kept.double() - want).abs() <= bound).all(), err(kept)
    assert err(plain) > (2.0 ** -14 if dtype == torch.bfloat16 else 2.0 ** -17), err(plain)  # the test sees it
    if dtype == torch.float16:  # past fp16's largest: o is inf, and so is delta, code or not
        x[0, 0] = 7e4
        do[0, 0] = 1.0
        assert _delta(x, dtype, do, True)[1][0] == float("inf")
