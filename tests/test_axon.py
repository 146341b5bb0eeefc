"""axon against its float64 reference: our scan kernels, the PyTorch step loop, nn.Linear beside it
on its own reference, every dtype, forward and backward; the carried state plane by plane, resets
at the edge cases, and the reference's eligibility traces against forward-mode autograd."""
import pytest
import torch

import opcheck
from cells_check import errors_against_reference, reference_cases, with_resets
from kcollect import verify
from kcollect.kernels import axon
from kcollect.kernels.axon.naive import fwht_srht, reference
from kcollect.kernels.axon.spec import SPEC

# 2 rows, 16 features, resets drawn at p = 0.3; 3 rows, 32 features, no resets (one program a row at
# the CPU config: test_channel_blocks splits the channels)
SMALL = {"B": 2, "T": 4, "H": 16, "resets": "0.3"}
WIDER = {"B": 3, "T": 3, "H": 32, "resets": "0"}
CASES = reference_cases(SMALL, WIDER, extra=[("linear", "fwd+bwd", torch.float32, SMALL)])
GRADS = SPEC.grad_inputs


@pytest.mark.parametrize("provider, mode, dtype, dims", CASES)
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_channel_blocks_resets_and_every_state_plane():
    # 32 channels in two 16-channel programs; resets at the first, consecutive and last steps; each
    # of the ten carried planes (c1, c2, eight traces) compared on its own
    inputs = with_resets(SPEC.make_inputs({"B": 3, "T": 4, "H": 32, "resets": "0"}, torch.float32, "cpu", 5), 3, 4)
    errors = errors_against_reference(reference, axon.axon, inputs, GRADS, config=axon.AxonConfig(bh=16))
    assert max(errors) < 1e-5, errors
    state = axon.axon(**inputs, config=axon.AxonConfig(bh=16))[1].double()
    want = reference(**verify.upcast(inputs))[1]
    planes = [verify.rel_error(s, w) for s, w in zip(state, want)]
    assert max(planes) < 1e-5, planes


def test_reference_traces_are_the_state_derivatives():
    # the traces of the reference are d(c1, c2)/d(nu_log, theta_log, w1, w2) of the final state since
    # each row's last reset: forward-mode autograd of the same step loop says so
    inputs = verify.upcast(with_resets(SPEC.make_inputs(SMALL, torch.float32, "cpu", 2), 2, 4))
    state = reference(**inputs)[1]
    for i, name in enumerate(("nu_log", "theta_log", "w1", "w2")):
        _, tangent = torch.func.jvp(lambda p: _final_state(inputs, name, p), (inputs[name],),
                                    (torch.ones_like(inputs[name]),))
        torch.testing.assert_close(state[2 + 2 * i:4 + 2 * i], tangent, rtol=1e-9, atol=1e-12)


def _final_state(inputs, name, p):
    """(c1, c2) after the last step, as a differentiable function of one parameter."""
    x = dict(inputs, **{name: p})
    xhat = fwht_srht(x["x"], x["signs"], x["perm"])
    r = torch.exp(-torch.exp(x["nu_log"]))
    theta = torch.exp(x["theta_log"])
    g, phi, gamma = r * torch.cos(theta), r * torch.sin(theta), torch.sqrt(1 - r * r)
    c1 = c2 = torch.zeros_like(xhat[:, 0])
    for t in range(xhat.shape[1]):
        keep = (~x["resets"][:, t]).double()[:, None]
        c1, c2 = c1 * keep, c2 * keep
        c1, c2 = (g * c1 - phi * c2 + gamma * x["w1"] * xhat[:, t], g * c2 + phi * c1 + gamma * x["w2"] * xhat[:, t])
    return torch.stack((c1, c2))


def test_srht_matrix_is_the_butterfly():
    inputs = SPEC.make_inputs(WIDER, torch.float64, "cpu", 1)
    m = axon.srht_matrix(inputs["signs"], inputs["perm"], torch.float64)
    got = inputs["x"] @ m / 32 ** 0.5
    torch.testing.assert_close(got, fwht_srht(inputs["x"], inputs["signs"], inputs["perm"]))


def test_grid_shapes_are_accepted():
    opcheck.check_grids_accepted(SPEC)
    assert "power of two" in SPEC.check_shape({"B": 1, "T": 1, "H": 24, "resets": "0"})


def test_mismatched_inputs_are_refused():
    inputs = SPEC.make_inputs(SMALL, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="power of two"):
        axon.axon(**dict(inputs, x=inputs["x"][..., :12]))
    with pytest.raises(ValueError, match="w_out must be"):
        axon.axon(**dict(inputs, w_out=inputs["w_out"][:, :16]))


def test_config_is_recorded():
    record = SPEC.provider("triton").config(SPEC.make_inputs(SMALL, torch.float32, "cpu", 0))
    assert record == {"axon": {"bh": 16, "warps": 1, "stages": 1}}
