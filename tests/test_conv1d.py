"""conv1d against its float64 reference on the CPU interpreter: depthwise and channel-mixing, widths
2-4, resets at the first step, at tile boundaries and back to back, several time and channel
tiles (masked ones), backward spans, forward (inference) and forward+backward, bf16 and fp32; the
eager provider, cuDNN's refusal of resets, Cortex's of depthwise, and the input checks."""
import json
import random

import pytest
import torch

import opcheck

from kcollect import verify
from kcollect.kernels._host.config import forced
from kcollect.kernels.conv1d import DepthwiseConfig, MixConfig, conv1d
from kcollect.kernels.conv1d.spec import DEPTHWISE, MIX, SPEC, cortex, cudnn
from kcollect.spec import Unavailable

BF16, F32 = torch.bfloat16, torch.float32


def inputs(b, t, f, k, groups, dtype, resets=(), p=0.0):
    dims = {"B": b, "T": t, "F": f, "K": k, "groups": groups, "resets": 1 if resets or p else 0, "p": p}
    x = SPEC.make_inputs(dims, dtype, "cpu", random.randrange(2**31))
    if resets:
        x["resets"][0, list(resets)] = True
    return x


def check(x, dtype, mode="fwd+bwd", fn=None):
    dys, want = verify.reference_answers(SPEC, x, mode, random.randrange(2**31))
    got = verify.build_call(SPEC, fn or SPEC.provider("triton").fn, verify.clone_inputs(x), mode, dys)()
    err = verify.max_error(got, want)
    assert err <= SPEC.tolerance[dtype], f"error {err:.3g} > {SPEC.tolerance[dtype]:.3g}"


# CPU tiles: depthwise 8 steps x 16 channels (backward spans of 16 steps), channel-mixing 16 x 16
EDGES = (0, 8, 9, 16, 23)
DW, MX = DepthwiseConfig(8, 16, 1, 8, 16, 16, 1), MixConfig(16, 16, 16, 1, 1, 16, 16, 16, 1, 1)
CASES = [  # (B, T, F, K, groups, dtype, resets, p, config)
    (2, 24, 20, 4, DEPTHWISE, F32, EDGES, 0.1, DW),  # F 20: a masked channel tile; 2 backward spans
    (1, 19, 24, 3, DEPTHWISE, BF16, (), 0.0, DW),  # no reset mask, odd width
    (2, 21, 20, 3, MIX, F32, EDGES[:3], 0.1, MX),  # channel-mixing: masked tiles in time and channels
    (1, 18, 16, 2, MIX, BF16, (0, 16, 17), 0.0, MX),
]


@pytest.mark.parametrize("b, t, f, k, groups, dtype, resets, p, config", CASES,
                         ids=[f"B{c[0]}-T{c[1]}-F{c[2]}-K{c[3]}-{c[4]}-{str(c[5])[6:]}" for c in CASES])
def test_forward_backward_match_reference(b, t, f, k, groups, dtype, resets, p, config):
    with forced(config):
        check(inputs(b, t, f, k, groups, dtype, resets, p), dtype)


@pytest.mark.parametrize("groups, config", [(DEPTHWISE, DW), (MIX, MX)])
def test_inference_forward_matches_reference(groups, config):
    with forced(config):
        check(inputs(2, 17, 18, 4, groups, F32, (0, 5, 6), 0.1), F32, mode="fwd")


@pytest.mark.parametrize("groups", [DEPTHWISE, MIX])
def test_eager_matches_reference(groups):
    check(inputs(2, 25, 6, 4, groups, F32, EDGES, 0.2), F32, fn=SPEC.provider("eager").fn)


def test_reference_stops_the_window_at_a_reset():
    # width 3, one channel, weights 1: y_t sums x over the window, which a reset at step 2 cuts
    x = torch.arange(1.0, 6.0, dtype=torch.float64).reshape(1, 5, 1)
    resets = torch.tensor([[False, False, True, False, False]])
    y = SPEC.reference(x, torch.ones(1, 1, 3, dtype=torch.float64), None, resets)
    assert y.flatten().tolist() == [1, 1 + 2, 3, 3 + 4, 3 + 4 + 5]


def test_cudnn_refuses_resets_and_cortex_depthwise():
    x = inputs(1, 8, 4, 2, DEPTHWISE, F32, (3,))
    with pytest.raises(Unavailable, match="no resets"):
        cudnn(**x)
    with pytest.raises(Unavailable, match="groups=1"):
        cortex(**x)
    x["resets"] = None
    check(x, F32, mode="fwd", fn=cudnn)


def test_bad_inputs_are_refused():
    x = inputs(1, 6, 4, 3, MIX, F32)
    with pytest.raises(ValueError, match=r"\[4, 1, K\] \(depthwise\) or \[F_out, 4, K\]"):
        conv1d(x["x"], x["weight"][:, :2])
    with pytest.raises(ValueError, match=r"bias must be \[4\]"):
        conv1d(x["x"], x["weight"], x["bias"][:3])


def test_grids_and_cost_model():
    for shape in SPEC.grid("full") + SPEC.grid("quick"):
        assert set(shape.dims) == {"B", "T", "F", "K", "groups", "resets", "p"} and shape.why
    d = {"B": 2, "T": 3, "F": 4, "K": 2, "groups": MIX, "resets": 0, "p": 0}
    assert SPEC.flops(d, "fwd") == 2 * 2 * 3 * 4 * 4 * 2
    assert SPEC.bytes_moved(d, F32, "fwd") == (2 * 24 + 32 + 4) * 4


_LOOP_SM90 = """
import json
import torch
from benchmarks.ab_tools import recorded
from benchmarks import compile_report as cr
from kcollect.kernels.conv1d import DepthwiseConfig, depthwise_backward

out = {}
for K, t in ((2, 16), (3, 8), (4, 8)):  # the GPU's picks
    for resets in (False, True):
        x = torch.empty(2, 256, 256, dtype=torch.bfloat16)
        w = torch.empty(256, 1, K, dtype=torch.bfloat16)
        r = torch.zeros(2, 256, dtype=torch.bool) if resets else None
        calls = []
        with recorded(calls):
            cfg = DepthwiseConfig(channels_first=True, bwd_block_t=t, bwd_block_f=64, bwd_warps=2)
            depthwise_backward(x, x, w, r, cfg)
        k, _, args, kw = calls[0]
        out[f"K{K}-{resets}"] = cr.compile_launch(k, args, kw)[0]["loops"]
print(json.dumps(out))
"""


def test_depthwise_backward_time_loop_crosses_no_layout():
    """The depthwise backward's time loop, compiled for sm_90 at the GPU's tiles: no barrier and no
    shared-memory traffic an iteration (its taps' weights loaded inside it crossed into the tiles'
    layout through shared memory every tile: 8 barriers and 36 loads and stores at width 4)."""
    got = json.loads(opcheck.run_offline_compile(_LOOP_SM90).strip().splitlines()[-1])
    for name, loops in got.items():
        time_loop = max(loops, key=lambda lp: lp["global_loads"])
        assert time_loop["global_loads"] >= 4 and time_loop["barriers"] == 0 and time_loop["shared"] == 0, (name, loops)


def test_depthwise_backward_tiles_on_the_gpu(monkeypatch):
    """The sm_90 pick's backward tiles: 8 steps at widths 3 and 4 (width 3 in 16-step tiles holds 174
    registers since the weights left the time loop; 8 took 0.738x its time on the H200), 16 at 2,
    and 32 rows of shifted steps over next_pow2(K) wider."""
    from kcollect.kernels.conv1d import config

    monkeypatch.setattr(config, "arch", lambda device: "sm90")
    got = {K: config.pick_depthwise(8, 8192, 2048, K, "cuda").bwd_block_t for K in (2, 3, 4, 5, 8)}
    assert got == {2: 16, 3: 8, 4: 8, 5: 4, 8: 4}, got
