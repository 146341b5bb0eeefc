"""selective_scan against its float64 reference on the CPU interpreter: several chunks and channel
blocks (one masked), N not a power of two, one sequence, forward (inference) and
forward+backward, bf16 and fp32; the lanes forward (forced by config) on awkward cases of
lab/awkward (T = 1, T not a multiple of the tile, odd D and N, strided inputs, extreme steps and
decays) with the tiles backward reading the states it kept; the PyTorch providers' code (the
loop, the log-depth scan), the reference against the recurrence by hand, mamba_ssm's reason, and
the input checks."""
import random

import pytest
import torch

from kcollect import verify
from kcollect.kernels._host.config import forced
from kcollect.kernels.selective_scan import SelectiveScanConfig, selective_scan
from kcollect.kernels.selective_scan.spec import EAGER_MAX_T, SPEC, eager, log_depth, mamba_available
from kcollect.spec import Unavailable
from test_awkward_scans import case as awkward_case
from test_awkward_scans import verify_case

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


# The lanes forward at the CPU's chunk of 8 steps (the states kept for the tiles backward) and
# blocks of 8 channels: tiles of `steps`, time in `segments`
def lanes(steps=4, segments=3):
    return SelectiveScanConfig(8, 8, 1, 8, 1, "lanes", steps, segments)


LANES_CASES = [  # (case of lab/awkward, config)
    (awkward_case("selective_scan", {"B": 1, "T": 1, "D": 5, "N": 3}, step="large", decay="strong"), lanes()),
    (awkward_case("selective_scan", {"B": 2, "T": 17, "D": 9, "N": 5}, "bfloat16", step="mixed", gate="large",
                  layout="strided", grad_layout="strided"), lanes(2, 3)),  # states kept every 4 tiles
    (awkward_case("selective_scan", {"B": 3, "T": 9, "D": 1, "N": 1}, step="tiny", decay="weak", x_scale=0.01),
     lanes(8, 2)),
    (awkward_case("selective_scan", {"B": 1, "T": 48, "D": 16, "N": 16}, decay="weak"),
     lanes(4, 6)),  # whole tiles, blocks and N; 6 segments: ends of more than one group of 4, every one mattering
]


@pytest.mark.parametrize("case, config", LANES_CASES, ids=[f"{c['dtype']}-" + "-".join(
    f"{k}{v}" for k, v in c["dims"].items()) for c, _ in LANES_CASES])
def test_lanes_forward_matches_reference(case, config):
    # outputs and every gradient against float64: fp32 within twice eager's error, bf16 the tolerance
    with forced(config):
        verify_case(case)


def test_lanes_inference_forward_matches_reference():
    # no gradient wanted: no states kept; one segment, and several
    for segments in (1, 3):
        with forced(lanes(4, segments)):
            check(dims(2, 13, 9, 4), F32, mode="fwd")
            check(dims(1, 16, 16, 16), BF16, mode="fwd")


def test_pick_switches_to_lanes_from_the_threshold(monkeypatch):
    from kcollect.kernels.selective_scan import config

    # the measured threshold: the lanes forward from B1 T60 D512 on, the tiles path below
    assert config.pick(1, 60, 512, 16, "cpu").path == "lanes" and config.pick(1, 59, 512, 16, "cpu").path == "tiles"
    monkeypatch.setattr(config, "LANES_FROM", 1000)
    assert config.pick(2, 50, 10, 16, "cpu") == config.lanes(2, 50, 10, "cpu")
    assert config.pick(2, 49, 10, 16, "cpu").path == "tiles"


def test_lanes_tile_must_divide_the_chunk():
    with forced(lanes(3)), pytest.raises(ValueError, match="a multiple of its tile"):
        selective_scan(**SPEC.make_inputs(dims(1, 4, 3, 2), F32, "cpu", 0))


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


def test_lanes_walks_time_whole_where_the_grid_fills_the_gpu(monkeypatch):
    """On an H100-like GPU (132 SMs): 8 steps a tile; one segment once the grid holds 2 warps an SM
    (B8 D2048: 512 programs), as measured on the H200; segments up to 8 warps an SM below that."""
    import opcheck
    from kcollect.kernels.selective_scan import config

    device = opcheck.fake_gpu(monkeypatch)
    full = config.lanes(8, 2048, 2048, device)
    assert (full.steps, full.segments, full.block_d) == (8, 1, 32)
    assert config.lanes(3, 1000, 1000, device).segments == 11  # 96 programs: 1056 / 96 warps
    assert config.lanes(1, 60, 512, device).segments == 8  # capped by the sequence's 8 tiles
