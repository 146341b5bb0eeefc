"""softmax against its float64 reference: every provider, mode and dtype, on awkward shapes, plus
the split path for wide rows (its work queue, -inf segments) and the edge cases of softmax."""
import random

import pytest
import torch
import triton
import triton.language as tl

import gate
from kcollect import verify
from kcollect.kernels import softmax

SPEC = softmax.SPEC
SHAPES = [
    {"M": 37, "N": 1000},   # several rows per program, tail masked, width only 8-aligned
    {"M": 1, "N": 4099},    # one row, unaligned width
    {"M": 5, "N": 7},       # tiny
    {"M": 3, "N": 40000},   # split path: 5 segments per row (10 in fp32), queue head/middle/tail
]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("mode", SPEC.modes)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "x".join(map(str, d.values())))
def test_matches_reference(provider, mode, dtype, dims):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    if provider == "compile" and dims["M"] != 37:
        pytest.skip("compile is checked once per mode and dtype: each shape costs a CPU compile")
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


@triton.jit
def _items_kernel(out_ptr, n_items, M, S, LAG, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    row, seg, is_write = softmax._split_item(t, M, S, LAG)
    mask = t < n_items
    tl.store(out_ptr + 3 * t, row, mask=mask)
    tl.store(out_ptr + 3 * t + 1, seg, mask=mask)
    tl.store(out_ptr + 3 * t + 2, is_write.to(tl.int32), mask=mask)


@pytest.mark.parametrize("m,s,lag", [(5, 3, 2), (7, 4, 1), (3, 2, 3), (1, 16, 1), (40, 16, 1), (9, 1, 4)])
def test_queue_order_lets_every_item_finish(m, s, lag):
    # The deadlock-freedom argument: every (row, segment) has one stats and one write item, and a
    # write item comes after all stats items of its row (it only ever waits on earlier items).
    n = 2 * m * s
    out = torch.full((3 * triton.next_power_of_2(n),), -7, dtype=torch.int32)
    _items_kernel[(1,)](out, n, m, s, lag, BLOCK=triton.next_power_of_2(n))
    items = [tuple(out[3 * t: 3 * t + 3].tolist()) for t in range(n)]
    assert sorted(items) == sorted((r, g, w) for r in range(m) for g in range(s) for w in (0, 1))
    stats = {r: [t for t, (rr, _, w) in enumerate(items) if rr == r and not w] for r in range(m)}
    writes = {r: [t for t, (rr, _, w) in enumerate(items) if rr == r and w] for r in range(m)}
    assert all(min(writes[r]) > max(stats[r]) for r in range(m)), items
    for r in range(lag, m - lag):  # steady state: a row's writes trail its stats by 2 * LAG + 1 phases
        assert min(writes[r]) - min(stats[r]) == (2 * lag + 1) * s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_split_path_with_many_segments(dtype):
    # Small segments force many segments per row and many rows in flight through the queue.
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(24, 600, generator=g) * 3).to(dtype)
    y = softmax.softmax_forward(x, max_block=0, seg=64)
    want = torch.softmax(x.double(), dim=-1)
    torch.testing.assert_close(y.double(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
    dy = torch.randn(24, 600, generator=g).to(dtype)
    dx = softmax.softmax_backward(dy, y, max_block=0, seg=64)
    yd, dyd = y.double(), dy.double()
    want_dx = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
    assert verify.rel_error(dx, want_dx) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


# (n, softmax_forward keywords): the register path, the split path and the row-streaming variant
PATHS = {"fused": (3000, {}), "split": (20000, {}), "stream": (20000, {"wide": "stream"})}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN row, by design
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # interpreter: 1 / 0 for that row
@pytest.mark.parametrize("path", PATHS)
def test_minus_infinity_entries(path):
    # Masked attention scores: -inf entries, a whole -inf segment (split path: its partial sum
    # must count 0, not NaN; stream: leading -inf chunks must not make the running sum NaN), and an
    # all -inf row, which gives NaN in PyTorch as in ours.
    n, kw = PATHS[path]
    x = torch.randn(4, n) * 2
    x[0, : n // 2] = -float("inf")      # covers whole segments on the split path
    x[1, ::3] = -float("inf")
    x[2, :] = -float("inf")
    y = softmax.softmax(x) if not kw else softmax.softmax_forward(x, **kw)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7, equal_nan=True)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("path", PATHS)
def test_huge_logits_do_not_overflow(path):
    n, kw = PATHS[path]
    x = torch.randn(3, n) * 1e4
    x[1] += 1e30
    y = softmax.softmax(x) if not kw else softmax.softmax_forward(x, **kw)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


# A/B variants (keywords of softmax_forward / softmax_backward; defaults unchanged), each on small
# awkward shapes: small chunks/segments give the wide-row paths many per row and a partial last one.
_NARROW = [{"M": 5, "N": 1000}, {"M": 3, "N": 4099}, {"M": 5, "N": 7}, {"M": 4, "N": 2048}]
VARIANTS = {
    # one row of next_pow2(N) = 32768 (65536) held by one program of 32 warps
    "reg32k-32w": ({"max_block": 32768, "max_warps": 32}, [{"M": 3, "N": 20000}, {"M": 37, "N": 1000}]),
    "reg64k-32w": ({"max_block": 65536, "max_warps": 32}, [{"M": 2, "N": 40000}]),
    "split-seg256-pps1": ({"max_block": 0, "seg": 256, "programs_per_sm": 1}, _NARROW),
    "split-seg1024-pps8-32w": ({"max_block": 0, "seg": 1024, "programs_per_sm": 8, "max_warps": 32}, _NARROW),
    "stream-seg256": ({"max_block": 0, "seg": 256, "wide": "stream"}, _NARROW),
    "stream-seg256-pps1": ({"max_block": 0, "seg": 256, "wide": "stream", "programs_per_sm": 1}, _NARROW),
    "stream-seg1024-pps2-32w": ({"max_block": 0, "seg": 1024, "wide": "stream", "programs_per_sm": 2,
                                 "max_warps": 32}, _NARROW),
}
VARIANT_CASES = [(v, d) for v, (_, shapes) in VARIANTS.items() for d in shapes]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("variant,dims", VARIANT_CASES,
                         ids=[f"{v}-{d['M']}x{d['N']}" for v, d in VARIANT_CASES])
def test_variant_matches_reference(variant, dims, dtype, mode):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    kw = VARIANTS[variant][0]
    seed = random.randrange(2**31)
    x = SPEC.make_inputs(dims, dtype, "cpu", seed)["x"]
    dys, want = verify.reference_answers(SPEC, {"x": x}, mode, seed + 1)
    y = softmax.softmax_forward(x, **kw)
    got = y if mode == "fwd" else softmax.softmax_backward(dys[0].to(dtype), y, **kw)
    error = verify.rel_error(got, want[0])
    assert error <= SPEC.tolerance[dtype], f"{variant} {mode} {dtype} {dims}: error {error:.3g}"


@pytest.mark.parametrize("isolate", [1, 2])
def test_isolation_variants_run(isolate):
    # Timing isolation only: without the spin-wait (and queue) a write item may use unpublished
    # stats, so the output is not checked -- only that the kernel runs to completion.
    x = torch.randn(6, 1000)
    assert softmax.softmax_forward(x, max_block=0, seg=128, isolate=isolate).shape == x.shape


def test_leading_dims_are_flattened():
    x = torch.randn(2, 3, 50)
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        softmax.softmax(torch.empty(0, 8))
