"""selective_scan against its float64 reference on the CPU interpreter: several chunks and channel
blocks (one masked), N not a power of two, one sequence, forward (inference) and
forward+backward, bf16 and fp32; the PyTorch providers' code (the loop, the log-depth scan), the
reference against the recurrence by hand, mamba_ssm's reason, and the input checks."""
import random

import pytest
import torch

from kcollect import verify
from kcollect.kernels._lib import forced
from kcollect.kernels.selective_scan import SelectiveScanConfig, selective_scan
from kcollect.kernels.selective_scan.spec import EAGER_MAX_T, SPEC, eager, log_depth, mamba_available
from kcollect.spec import Unavailable

BF16, F32 = torch.bfloat16, torch.float32


def check(dims, dtype, mode="fwd+bwd", fn=None):
    x = SPEC.make_inputs(dims, dtype, "cpu", random.randrange(2**31))
    dys, want = verify.reference_answers(SPEC, x, mode, random.randrange(2**31))
    got = verify.build_call(SPEC, fn or SPEC.provider("triton").fn, verify.clone_inputs(x), mode, dys)()
    err = verify.max_error(got, want)
    assert err <= SPEC.tolerance[dtype], f"error {err:.3g} > {SPEC.tolerance[dtype]:.3g}"


def dims(b, t, d, n):
    return {"B": b, "T": t, "D": d, "N": n}


CASES = [  # (dims, dtype, config: chunk, block_d, warps, bwd_block_d, bwd_warps)
    (dims(2, 19, 12, 5), F32, SelectiveScanConfig(8, 8, 1, 8, 1)),  # 3 chunks, D 12: a masked block, N 5 padded
    (dims(1, 17, 16, 16), BF16, SelectiveScanConfig(8, 16, 1, 8, 1)),  # one sequence, Mamba's N
]


@pytest.mark.parametrize("shape, dtype, config", CASES, ids=[f"{c[0]}-{str(c[1])[6:]}" for c in CASES])
def test_forward_backward_match_reference(shape, dtype, config):
    with forced(config):
        check(shape, dtype)


def test_inference_forward_matches_reference():
    with forced(SelectiveScanConfig(8, 8, 1, 8, 1)):
        check(dims(2, 13, 9, 4), F32, mode="fwd")


@pytest.mark.parametrize("fn", [eager, log_depth], ids=["eager", "log_depth"])
def test_pytorch_providers_match_reference(fn):
    check(dims(2, 33, 6, 5), F32, fn=fn)


def test_reference_is_the_recurrence():
    # one channel, one state, two steps by hand
    x = verify.upcast(SPEC.make_inputs(dims(1, 2, 1, 1), F32, "cpu", 3))
    dt = torch.nn.functional.softplus(x["delta"][0, :, 0])
    a, u, b, c = x["A"][0, 0], x["x"][0, :, 0], x["B"][0, :, 0], x["C"][0, :, 0]
    h1 = dt[0] * b[0] * u[0]
    h2 = torch.exp(dt[1] * a) * h1 + dt[1] * b[1] * u[1]
    y = (torch.stack([c[0] * h1, c[1] * h2]) + x["D"][0] * u) * torch.nn.functional.silu(x["z"][0, :, 0])
    torch.testing.assert_close(SPEC.reference(**x)[0, :, 0], y)


def test_mamba_ssm_says_why_it_is_missing():
    reason = mamba_available("cuda")
    assert reason is None or "mamba_ssm" in reason
    assert SPEC.provider("mamba_ssm").available("cpu")


def test_bad_inputs_are_refused():
    x = SPEC.make_inputs(dims(1, 4, 3, 2), F32, "cpu", 0)
    x["B"] = x["B"][:, :, :1]
    with pytest.raises(ValueError, match=r"B must be \[1, 4, 2\]"):
        selective_scan(**x)


def test_grids_and_cost_model():
    for shape in SPEC.grid("full") + SPEC.grid("quick"):
        assert set(shape.dims) == {"B", "T", "D", "N"} and shape.why
    d = dims(2, 3, 4, 5)
    assert SPEC.bytes_moved(d, BF16, "fwd") == (4 * 24 + 2 * 30) * 2 + 4 * (20 + 4)


def test_the_loop_refuses_sequences_past_its_limit():
    x = torch.randn(1, EAGER_MAX_T + 1, 2)
    with pytest.raises(Unavailable, match=f"T={EAGER_MAX_T}"):
        eager(x, x, None, None, None, None, x)
