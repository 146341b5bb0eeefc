"""gelu against its float64 reference: each provider, mode, dtype and variant once on awkward shapes;
fp32 as accurate as eager; the tail of a size that is not a multiple of 16; extreme inputs."""
import random

import pytest
import torch

import opcheck
from kcollect import verify
from kcollect.kernels import gelu
from kcollect.kernels.gelu.spec import SPEC, reference

# 7x600 and 1x4099: several programs, a 16-wide tail behind the last block; 5x7: fewer elements
# than one vector (fp16 and fp32 only, see opcheck)
SHAPES = [{"M": 7, "N": 600, "approx": "tanh"}, {"M": 1, "N": 4099, "approx": "none"},
          {"M": 5, "N": 7, "approx": "tanh"}]


# torch.compile of the eager code left out: PyTorch's, gated on every collector run, and each
# case costs seconds of CPU compile
@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        assert {s.dims["approx"] for s in grid} == {"tanh", "none"}, "both variants in every grid"
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


@pytest.mark.parametrize("approx", gelu.APPROX)
def test_fp32_is_as_accurate_as_eager(approx):
    # fp32's error against float64 at most twice eager's, forward and backward, on random shapes
    # (the tanh backward's 1 - s cancelled where s is near 1: 2.5x eager's on the CPU, 4.2x on an
    # H100, before the precise fp32 forms of maths.py)
    shapes = [{"M": random.randrange(1, 9), "N": random.randrange(257, 1500), "approx": approx} for _ in range(3)]
    opcheck.check_as_accurate_as_eager(SPEC, shapes)


@pytest.mark.parametrize("approx", gelu.APPROX)
def test_variant_is_the_one_asked_for(approx):
    # The two forms differ by ~1e-4 relative, under the bf16 tolerance: only fp32 tells them apart,
    # so check the kernel against both references in fp32.
    other = "none" if approx == "tanh" else "tanh"
    x = torch.randn(4, 3000) * 2
    got = gelu.gelu(x, approx).double()
    tol = SPEC.tolerance[torch.float32]
    assert verify.rel_error(got, reference(x.double(), approx)) < tol
    assert verify.rel_error(got, reference(x.double(), other)) > 10 * tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("approx", gelu.APPROX)
def test_extreme_inputs_saturate(approx, dtype):
    # exp overflows for x << 0 in the tanh form (x / inf): results must be 0 / x, never NaN, in the
    # fast forms (bf16) as in the precise ones (fp32)
    x = torch.tensor([-1e4, -100.0, -30.0, -10.0, 0.0, 10.0, 30.0, 100.0, 1e4], dtype=dtype).requires_grad_(True)
    y = gelu.gelu(x, approx)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(y, torch.where(x > 0, x, torch.zeros_like(x)).detach(), rtol=1e-6, atol=1e-6)
    want_dx = torch.where(x == 0, 0.5, (x > 0).to(dtype))  # gelu'(0) = Phi(0) = 0.5
    torch.testing.assert_close(dx, want_dx, rtol=1e-6, atol=1e-6)


def test_non_contiguous_input():
    x = (torch.randn(3, 300, 64) * 2).transpose(1, 2)
    torch.testing.assert_close(gelu.gelu(x, "tanh").double(), reference(x.double(), "tanh"), rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="approximate must be one of"):
        gelu.gelu(torch.randn(2, 3), "sigmoid")
    with pytest.raises(ValueError, match="floating"):
        gelu.gelu(torch.arange(6), "tanh")
    assert "approx must be one of" in SPEC.check_shape({"M": 2, "N": 3, "approx": "exact"})


@pytest.mark.parametrize("n", [15, 333])
@pytest.mark.parametrize("block", [None, 64])
def test_unaligned_tail_forward_and_backward(n, block):
    # n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
    # block=64 puts the tail behind several programs (333: 6), the default in one
    x, dy = torch.randn(n) * 3, torch.randn(n)
    config = gelu.GELUConfig(block=block) if block else None
    for approx in gelu.APPROX:
        xd = x.double().requires_grad_(True)
        want = reference(xd, approx)
        (want_dx,) = torch.autograd.grad(want, xd, dy.double())
        torch.testing.assert_close(gelu.gelu_forward(x, approx, config).double(), want.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gelu.gelu_backward(dy, x, approx, config).double(), want_dx, rtol=1e-5, atol=1e-6)


def test_config_is_recorded():
    inputs = SPEC.make_inputs({"M": 3, "N": 100, "approx": "tanh"}, torch.float32, "cpu", 0)
    assert SPEC.provider("triton").config(inputs) == {"elementwise": {"block": 1024, "warps": 4}}
