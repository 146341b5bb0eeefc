"""swiglu against its float64 reference: each provider, mode and dtype once on awkward shapes
(opcheck.lean_reference_cases)."""
import pytest
import torch

import opcheck
from kcollect.kernels import swiglu
from kcollect.kernels.swiglu.spec import SPEC, reference

# 37x1000: several programs, tail masked; 1x4099: one row, a 16-wide tail behind the last block;
# 5x7: fewer elements than one vector
SHAPES = [{"M": 37, "N": 1000}, {"M": 1, "N": 4099}, {"M": 5, "N": 7}]


@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="must match"):
        swiglu.swiglu(torch.randn(2, 3), torch.randn(3, 2))
