"""geglu against its float64 reference: every provider, mode and dtype, on awkward shapes."""
import random

import pytest
import torch

import opcheck as gate
from kcollect import verify
from kcollect.kernels import geglu, gelu

SPEC = geglu.SPEC
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


def test_liger_is_a_provider():
    assert "liger" in SPEC.provider_names
    assert SPEC.provider("liger").available("cpu") is not None  # Liger's kernels need a GPU


def test_gelu_maths_is_shared_with_gelu():
    assert geglu.gelu_tanh_f32 is gelu.gelu_tanh_f32
    assert geglu.gelu_tanh_and_grad_f32 is gelu.gelu_tanh_and_grad_f32


def test_uses_the_tanh_form():
    # tanh and erf GELU differ by ~1e-4 relative: only fp32 tells them apart.
    a, b = torch.randn(4, 3000) * 2, torch.randn(4, 3000)
    got = geglu.geglu(a, b).double()
    exact = torch.nn.functional.gelu(a.double()) * b.double()
    tol = SPEC.tolerance[torch.float32]
    assert verify.rel_error(got, geglu.reference(a.double(), b.double())) < tol
    assert verify.rel_error(got, exact) > 10 * tol


def test_extreme_gates_saturate():
    # exp overflows for a << 0: c -> 0 and both gradients finite, never NaN.
    a = torch.tensor([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4]).requires_grad_(True)
    b = torch.full_like(a, 3.0).requires_grad_(True)
    c = geglu.geglu(a, b)
    da, db = torch.autograd.grad(c, (a, b), torch.ones_like(c))
    pos = (a > 0).float()
    torch.testing.assert_close(c, (a * pos * 3.0).detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(da, torch.where(a == 0, 1.5, 3.0 * pos), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(db, (a * pos).detach(), rtol=1e-6, atol=1e-6)


def test_triton_writes_every_element():
    # A skipped block would leave uninitialised memory: compare elementwise, in a 3-D view.
    a = torch.randn(3, 7, 5000) * 3
    b = torch.randn(3, 7, 5000)
    got = geglu.geglu(a, b)
    torch.testing.assert_close(got.double(), geglu.reference(a.double(), b.double()), rtol=1e-5, atol=1e-6)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="must match"):
        geglu.geglu(torch.randn(2, 3), torch.randn(3, 2))
    with pytest.raises(ValueError, match="must match"):
        geglu.geglu(torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("n", [1, 15, 17, 4099, 8197])
@pytest.mark.parametrize("block", [None, 64, 4096])
def test_unaligned_tail_forward_and_backward(n, block):
    # n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
    # block=64 puts the tail behind several programs, None and 4096 (the size above 2^27) in one
    a, b, dc = torch.randn(n) * 3, torch.randn(n), torch.randn(n)
    launch = {"block": block} if block else {}
    ad, bd = a.double().requires_grad_(True), b.double().requires_grad_(True)
    want = geglu.reference(ad, bd)
    want_da, want_db = torch.autograd.grad(want, (ad, bd), dc.double())
    torch.testing.assert_close(geglu.geglu_forward(a, b, **launch).double(), want.detach(), rtol=1e-5, atol=1e-6)
    da, db = geglu.geglu_backward(dc, a, b, **launch)
    torch.testing.assert_close(da.double(), want_da, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), want_db, rtol=1e-5, atol=1e-6)
