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


@pytest.mark.parametrize("n", [15, 4099])
@pytest.mark.parametrize("block", [None, 64])
def test_unaligned_tail_forward_and_backward(n, block):
    # n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
    # block=64 puts the tail behind several programs, the default in one
    config = swiglu.SwiGLUConfig(block=block) if block else None
    opcheck.check_gated_1d(swiglu.swiglu_forward, swiglu.swiglu_backward, reference, n, config)


def test_config_is_recorded():
    inputs = SPEC.make_inputs({"M": 3, "N": 100}, torch.float32, "cpu", 0)
    record = SPEC.provider("triton").config(inputs)
    assert record == {"elementwise": {"block": 1024, "warps": 4}}
