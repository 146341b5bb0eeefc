"""What SwiGLU and GEGLU share (their launches are one, _host's elementwise launch): the tail of a
size that is not a multiple of 16, and the config each row records."""
import importlib

import pytest
import torch

import opcheck

# n % 16 != 0: the last program finishes the tail after its 16-aligned block (launch_elementwise);
# block=64 puts the tail behind several programs (333: 6; 4099: 65), the default in one
CASES = [("swiglu", "SwiGLUConfig", 15), ("swiglu", "SwiGLUConfig", 4099), ("geglu", "GEGLUConfig", 15),
         ("geglu", "GEGLUConfig", 333)]


@pytest.mark.parametrize("op, config_class, n", CASES)
@pytest.mark.parametrize("block", [None, 64])
def test_unaligned_tail_forward_and_backward(op, config_class, n, block):
    module = importlib.import_module(f"kcollect.kernels.{op}")
    reference = importlib.import_module(f"kcollect.kernels.{op}.spec").reference
    config = getattr(module, config_class)(block=block) if block else None
    opcheck.check_gated_1d(getattr(module, f"{op}_forward"), getattr(module, f"{op}_backward"), reference, n, config)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_config_is_recorded(op):
    spec = importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC
    inputs = spec.make_inputs({"M": 3, "N": 100}, torch.float32, "cpu", 0)
    assert spec.provider("triton").config(inputs) == {"elementwise": {"block": 1024, "warps": 4}}
