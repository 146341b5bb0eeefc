"""gelu against its float64 reference: every provider, mode, dtype and variant, on awkward shapes."""
import random

import pytest
import torch

import opcheck as gate
from kcollect import verify
from kcollect.kernels import gelu

SPEC = gelu.SPEC
SHAPES = [
    {"M": 37, "N": 1000, "approx": "tanh"},
    {"M": 37, "N": 1000, "approx": "none"},
    {"M": 1, "N": 4099, "approx": "tanh"},
    {"M": 5, "N": 7, "approx": "none"},
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
        pytest.skip("compile is checked on the 37x1000 shapes only: each shape costs a CPU compile")
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        assert {s.dims["approx"] for s in grid} == {"tanh", "none"}, "both variants in every grid"
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


@pytest.mark.parametrize("approx", gelu.APPROX)
def test_variant_is_the_one_asked_for(approx):
    # The two forms differ by ~1e-4 relative, under the bf16 tolerance: only fp32 tells them apart,
    # so check the kernel against both references in fp32.
    other = "none" if approx == "tanh" else "tanh"
    x = torch.randn(4, 3000) * 2
    got = gelu.gelu(x, approx).double()
    tol = SPEC.tolerance[torch.float32]
    assert verify.rel_error(got, gelu.reference(x.double(), approx)) < tol
    assert verify.rel_error(got, gelu.reference(x.double(), other)) > 10 * tol


@pytest.mark.parametrize("approx", gelu.APPROX)
def test_extreme_inputs_saturate(approx):
    # exp overflows for x << 0 in the tanh form (x / inf): results must be 0 / x, never NaN.
    x = torch.tensor([-1e4, -100.0, -30.0, -10.0, 0.0, 10.0, 30.0, 100.0, 1e4]).requires_grad_(True)
    y = gelu.gelu(x, approx)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(y, torch.where(x > 0, x, torch.zeros_like(x)).detach(), rtol=1e-6, atol=1e-6)
    want_dx = torch.where(x == 0, 0.5, (x > 0).float())  # gelu'(0) = Phi(0) = 0.5
    torch.testing.assert_close(dx, want_dx, rtol=1e-6, atol=1e-6)


def test_triton_writes_every_element():
    # A skipped block would leave uninitialised memory: compare elementwise, in a 3-D view.
    x = torch.randn(3, 7, 5000) * 3
    for approx in gelu.APPROX:
        got = gelu.gelu(x, approx)
        assert got.shape == x.shape
        torch.testing.assert_close(got.double(), gelu.reference(x.double(), approx), rtol=1e-5, atol=1e-6)


def test_non_contiguous_input():
    x = (torch.randn(300, 64) * 2).t()
    torch.testing.assert_close(gelu.gelu(x, "tanh").double(), gelu.reference(x.double(), "tanh"), rtol=1e-5, atol=1e-6)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="approximate must be one of"):
        gelu.gelu(torch.randn(2, 3), "sigmoid")
    assert "approx must be one of" in SPEC.check_shape({"M": 2, "N": 3, "approx": "exact"})


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4099, 8197])
@pytest.mark.parametrize("block", [None, 64, 4096])
def test_unaligned_tail_forward_and_backward(n, block):
    # n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
    # block=64 puts the tail behind several programs, None and 4096 (the size above 2^27) in one
    x = torch.randn(n) * 3
    dy = torch.randn(n)
    launch = {"block": block} if block else {}
    for approx in gelu.APPROX:
        xd = x.double().requires_grad_(True)
        want = gelu.reference(xd, approx)
        (want_dx,) = torch.autograd.grad(want, xd, dy.double())
        torch.testing.assert_close(gelu.gelu_forward(x, approx, **launch).double(), want.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gelu.gelu_backward(dy, x, approx, **launch).double(), want_dx, rtol=1e-5, atol=1e-6)
