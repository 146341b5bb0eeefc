"""swiglu against its float64 reference: every provider, mode and dtype, on awkward shapes."""
import random

import pytest
import torch

import gate
from kcollect import verify
from kcollect.kernels import swiglu

SPEC = swiglu.SPEC
SHAPES = [{"M": 37, "N": 1000}, {"M": 1, "N": 4099}, {"M": 5, "N": 7}]
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


def test_triton_writes_every_element():
    # A poisoned output buffer would show through if a block were skipped: compare elementwise.
    a = torch.randn(3, 5000) * 3
    b = torch.randn(3, 5000)
    got = swiglu.swiglu(a, b)
    want = swiglu.reference(a.double(), b.double())
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="must match"):
        swiglu.swiglu(torch.randn(2, 3), torch.randn(3, 2))


@pytest.mark.parametrize("n", [1, 15, 17, 4099, 8197])
@pytest.mark.parametrize("block", [None, 64, 4096])
def test_unaligned_tail_forward_and_backward(n, block):
    # n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
    # block=64 puts the tail behind several programs, None and 4096 (the size above 2^27) in one
    a, b, dc = torch.randn(n) * 3, torch.randn(n), torch.randn(n)
    launch = {"block": block} if block else {}
    ad, bd = a.double().requires_grad_(True), b.double().requires_grad_(True)
    want = swiglu.reference(ad, bd)
    want_da, want_db = torch.autograd.grad(want, (ad, bd), dc.double())
    torch.testing.assert_close(swiglu.swiglu_forward(a, b, **launch).double(), want.detach(), rtol=1e-5, atol=1e-6)
    da, db = swiglu.swiglu_backward(dc, a, b, **launch)
    torch.testing.assert_close(da.double(), want_da, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), want_db, rtol=1e-5, atol=1e-6)
