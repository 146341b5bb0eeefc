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


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN row, by design
@pytest.mark.parametrize("wide", [False, True], ids=["fused", "split"])
def test_minus_infinity_entries(wide):
    # Masked attention scores: -inf entries, a whole -inf segment (split path: its partial sum
    # must count 0, not NaN), and an all -inf row, which gives NaN in PyTorch as in ours.
    n = 20000 if wide else 3000
    x = torch.randn(4, n) * 2
    x[0, : n // 2] = -float("inf")      # covers whole segments on the split path
    x[1, ::3] = -float("inf")
    x[2, :] = -float("inf")
    y = softmax.softmax(x)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7, equal_nan=True)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("n", [3000, 20000], ids=["fused", "split"])
def test_huge_logits_do_not_overflow(n):
    x = torch.randn(3, n) * 1e4
    x[1] += 1e30
    y = softmax.softmax(x)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


def test_leading_dims_are_flattened():
    x = torch.randn(2, 3, 50)
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        softmax.softmax(torch.empty(0, 8))
