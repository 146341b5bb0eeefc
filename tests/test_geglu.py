"""geglu against its float64 reference: each provider, mode and dtype once on awkward shapes
(opcheck.lean_reference_cases); fp32 as accurate as eager; the tail of a size that is not a
multiple of 16; extreme gates."""
import random

import pytest
import torch

import opcheck
from kcollect import verify
from kcollect.kernels import geglu
from kcollect.kernels.geglu.spec import SPEC, reference

# 7x600 and 1x4099: several programs, a 16-wide tail behind the last block; 5x7: fewer elements
# than one vector (fp16 and fp32 only, see opcheck)
SHAPES = [{"M": 7, "N": 600}, {"M": 1, "N": 4099}, {"M": 5, "N": 7}]


# torch.compile of the eager code left out: PyTorch's, gated on every collector run, and each
# case costs seconds of CPU compile
@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_liger_is_a_provider():
    assert "liger" in SPEC.provider_names
    assert SPEC.provider("liger").available("cpu") is not None  # Liger's kernels need a GPU


def test_fp32_is_as_accurate_as_eager():
    # fp32's error against float64 (c, da, db) at most twice eager's, on random shapes (da was
    # 4.6x eager's on an H100 before the precise fp32 forms of gelu/maths.py)
    shapes = [{"M": random.randrange(1, 9), "N": random.randrange(257, 1500)} for _ in range(3)]
    opcheck.check_as_accurate_as_eager(SPEC, shapes)


def test_uses_the_tanh_form():
    # tanh and erf GELU differ by ~1e-4 relative: only fp32 tells them apart.
    a, b = torch.randn(4, 3000) * 2, torch.randn(4, 3000)
    got = geglu.geglu(a, b).double()
    exact = torch.nn.functional.gelu(a.double()) * b.double()
    tol = SPEC.tolerance[torch.float32]
    assert verify.rel_error(got, reference(a.double(), b.double())) < tol
    assert verify.rel_error(got, exact) > 10 * tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_extreme_gates_saturate(dtype):
    # exp overflows for a << 0: c -> 0 and both gradients finite, never NaN (fast and precise forms)
    a = torch.tensor([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4], dtype=dtype).requires_grad_(True)
    b = torch.full_like(a, 3.0).requires_grad_(True)
    c = geglu.geglu(a, b)
    da, db = torch.autograd.grad(c, (a, b), torch.ones_like(c))
    pos = (a > 0).to(dtype)
    torch.testing.assert_close(c, (a * pos * 3.0).detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(da, torch.where(a == 0, 1.5, 3.0 * pos), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(db, (a * pos).detach(), rtol=1e-6, atol=1e-6)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="must match"):
        geglu.geglu(torch.randn(2, 3), torch.randn(3, 2))
    with pytest.raises(ValueError, match="must match"):
        geglu.geglu(torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64))
