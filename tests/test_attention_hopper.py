"""The Gluon forwards (FwdConfig.gluon: kernels/attention/hopper.py's one warpgroup of 64 query rows,
pingpong.py's two) and backward (BwdConfig.gluon: hopper_bwd.py's dk/dv and dq kernels): their
scope, the fallback to the Triton kernels, where they are picked, what they compile to for sm_90 (on
the CPU), and on an sm_90 GPU their answers and gradients against float64."""
import os
from pathlib import Path
import random
import re
import subprocess
import sys

import pytest
import torch

from kcollect.kernels._host.config import forced
from kcollect.kernels.attention import AttentionConfig, BwdConfig, FwdConfig, attention, hopper, hopper_bwd
from kcollect.kernels.attention.spec import SPEC
from test_attention import BF16, F16, ON_GPU, check, dense

GLUON = FwdConfig(64, 64, 4, 3, gluon=True)
PINGPONG = FwdConfig(128, 64, 4, 4, gluon=True)
GLUON_BWD = BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, gluon=True)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("q_shape, keys, causal, window, why", [
    ((2, 4096, 16, 128), 4096, True, 0, None),
    ((2, 1024, 32, 64), 4096, True, 0, None),  # end-aligned causal, keys a multiple of the block ahead
    ((1, 192, 4, 32), 64, False, 0, None),  # fewer keys than queries: fine without a mask
    ((1, 192, 4, 32), 64, True, 0, "at least as many keys"),
    ((1, 1000, 4, 128), 1000, True, 0, "multiples of its blocks"),
    ((1, 1024, 4, 96), 1024, False, 0, "head dims"),
    ((1, 1024, 4, 128), 1024, True, 256, "no window"),
    ((65536, 64, 1, 64), 64, False, 0, "65535"),
    ((1, 128, 2, 64), 0, False, 0, "at least one key"),  # rows of no key: the Triton kernel's zeros
])
def test_scope(q_shape, keys, causal, window, why):
    got = hopper.out_of_scope(q_shape, keys, causal, window, 64, 64)
    assert got is None if why is None else why in got


def test_causal_scope_needs_square_blocks_at_64_rows():
    assert "square" in hopper.out_of_scope((1, 256, 2, 64), 256, True, 0, 64, 128)
    assert hopper.out_of_scope((1, 256, 2, 64), 256, False, 0, 64, 128) is None
    assert hopper.out_of_scope((1, 256, 2, 64), 320, True, 0, 128, 64) is None  # the ping-pong's 128 rows
    assert "multiples" in hopper.out_of_scope((1, 192, 2, 64), 192, False, 0, 128, 64)
    assert "blocks of 64 or 128" in hopper.out_of_scope((1, 256, 2, 64), 256, False, 0, 32, 64)


def test_a_gluon_config_runs_the_triton_kernel_where_it_cannot(monkeypatch):
    """On the CPU (and for packed batches, windows, ...) the forced Gluon config falls back to the
    Triton kernel with its tiles: right answers, and hopper.forward never called."""
    def never(*args, **kwargs):
        raise AssertionError("hopper.forward called outside its scope")

    monkeypatch.setattr(hopper, "forward", never)
    assert hopper.refuses(*(torch.randn(1, 64, 2, 64),) * 3, False, 0, False, 64, 64) is not None
    inputs = SPEC.make_inputs(dense(1, 2, 1, 37, 45, 64, 1), BF16, "cpu", random.randrange(2**31))
    with forced(FwdConfig(16, 16, 4, 1, gluon=True)):
        check(inputs, BF16)


@pytest.mark.parametrize("q_shape, keys, why", [
    ((2, 4096, 16, 128), 4096, None),
    ((3, 192, 5, 64), 192, None),
    ((1, 1024, 4, 128), 4096, "as many keys as queries"),
    ((1, 1000, 4, 128), 1000, "a multiple of 64"),
    ((1, 256, 4, 32), 256, "head dims"),
    ((1, 256, 4, 96), 256, "head dims"),
    ((65536, 64, 1, 64), 64, "65535"),
])
def test_backward_scope(q_shape, keys, why):
    got = hopper_bwd.out_of_scope(q_shape, keys)
    assert got is None if why is None else why in got


def test_a_gluon_backward_runs_the_triton_kernels_where_it_cannot(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("hopper_bwd.backward called outside its scope")

    monkeypatch.setattr(hopper_bwd, "backward", never)
    t = torch.randn(1, 64, 2, 64)
    assert hopper_bwd.refuses(t, t, t, t, False, 0, False, False) is not None
    inputs = SPEC.make_inputs(dense(1, 2, 1, 64, 64, 64, 1), BF16, "cpu", random.randrange(2**31))
    with forced(BwdConfig(16, 16, 4, 1, 16, 16, 4, 1, gluon=True)):
        check(inputs, BF16)


@pytest.mark.skipif(hopper.gluon is None, reason="this Triton has no Gluon Hopper API")
@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_kernels_compile_for_sm90_without_spill(causal):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "lab.gluon_attention_bwd", "--offline"] + ["--causal"] * causal
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    found = re.findall(r"sm_90 (dk/dv|dq): .*: (\d+) registers, stack (\d+), shared (\d+) B", out)
    assert {name for name, *_ in found} == {"dk/dv", "dq"}
    for name, regs, stack, shared in found:
        # no spill; two programs of one warpgroup an SM
        assert int(stack) == 0 and int(regs) <= 255 and int(shared) <= 232448 // 2, (name, regs, stack, shared)


@pytest.mark.skipif(hopper.gluon is None, reason="this Triton has no Gluon Hopper API")
@pytest.mark.parametrize("tiles", [GLUON, PINGPONG], ids=["one_warpgroup", "pingpong"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_tiles_compile_for_sm90_within_the_registers_and_shared_memory(tiles, causal):
    # in a process of its own: this session's kernels were defined under the interpreter
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "lab.gluon_attention", "--offline", "--block-m", str(tiles.block_m), "--block-n",
           str(tiles.block_n), "--stages", str(tiles.stages), "--warps", str(tiles.warps)] + ["--causal"] * causal
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    regs, stack, shared, waits, setmaxnreg = map(int, re.search(
        r"(\d+) registers, stack (\d+), shared (\d+) B, PTX wgmma \d+, waits \d+ \(for one left (\d+)\), "
        r"setmaxnreg (\d+)", out).groups())
    assert stack == 0  # no spill
    assert waits >= 1  # the overlap: S_j and P_{j-1} V_{j-1} in flight, and a wait for S_j alone
    if tiles.block_m == 64:
        assert regs <= 168 and shared <= 232448 // 2  # two programs an SM (an H100's or H200's 227 KB)
    else:  # one program of 12 warps an SM, registers moved to the consumers
        assert regs * 12 * 32 <= 65536 and shared <= 232448 and setmaxnreg > 0


# -- on an sm_90 GPU (TRITON_INTERPRET=0 pytest tests/test_attention_hopper.py -k gpu) -----------------
GPU_CASES = {  # query lengths in multiples of 128, so that both tilings take them
    "gqa_causal": (dense(2, 8, 2, 1024, 1024, 128, 1), BF16),
    "end_aligned": (dense(1, 4, 4, 256, 1088, 128, 1), F16),
    "cross": (dense(3, 2, 1, 640, 192, 64, 0), F16),
    "d32": (dense(2, 3, 3, 384, 384, 32, 0), BF16),
    "one_block": (dense(1, 2, 2, 128, 128, 128, 1), BF16),
}


@ON_GPU
@pytest.mark.parametrize("tiles", [GLUON, PINGPONG], ids=["one_warpgroup", "pingpong"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_gluon_matches_reference(case, tiles, monkeypatch):
    dims, dtype = GPU_CASES[case]
    calls = []
    real = hopper.forward
    monkeypatch.setattr(hopper, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    inputs = SPEC.make_inputs(dims, dtype, "cuda", random.randrange(2**31))
    # accurate=False: no residual asked for, so the Gluon kernel runs even where few keys are seen
    check(inputs, dtype, lambda **kw: attention(**kw, config=AttentionConfig(fwd=tiles), accurate=False))
    assert calls, "the Gluon kernel did not run"


BWD_CASES = {  # as many keys as queries (hopper_bwd's scope)
    "gqa_causal": (dense(2, 8, 2, 1024, 1024, 128, 1), BF16),
    "mha_causal_f16": (dense(1, 3, 3, 320, 320, 128, 1), F16),
    "d64": (dense(3, 4, 2, 192, 192, 64, 0), BF16),
    "one_block": (dense(1, 2, 2, 64, 64, 128, 0), F16),
}


@ON_GPU
@pytest.mark.parametrize("case", BWD_CASES)
def test_gpu_gluon_backward_matches_reference(case, monkeypatch):
    dims, dtype = BWD_CASES[case]
    calls = []
    real = hopper_bwd.backward
    monkeypatch.setattr(hopper_bwd, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    inputs = SPEC.make_inputs(dims, dtype, "cuda", random.randrange(2**31))
    check(inputs, dtype, lambda **kw: attention(**kw, config=AttentionConfig(fwd=GLUON, bwd=GLUON_BWD), accurate=False))
    assert calls, "the Gluon backward did not run"


def test_the_gluon_forward_is_picked_where_it_measured_faster_and_recorded_where_it_runs(monkeypatch):
    from kcollect.kernels.attention import config as attention_config
    from kcollect.kernels.attention import spec

    monkeypatch.setattr(attention_config, "arch", lambda device: "sm90")
    # (GPU, head dim, queries, keys): the forward picked, None for the Triton kernel
    for model, d, s, keys, want in (
            ("h200", 128, 4096, 4096, PINGPONG), ("h200", 128, 1024, 4096, PINGPONG), ("h200", 128, 2048, 2048, GLUON),
            ("h200", 128, 512, 512, GLUON), ("h200", 128, 4096, 0, GLUON), ("h200", 64, 512, 512, GLUON),
            ("h200", 64, 2048, 8192, GLUON), ("h200", 64, 4096, 4096, None), ("h200", 96, 4096, 4096, None),
            ("h200", 128, 60, 8192, None), ("h100", 128, 4096, 4096, None)):
        monkeypatch.setattr(attention_config, "gpu_model", lambda device, model=model: model)
        got = attention_config.pick_fwd(d, True, s, "cpu", keys)
        assert got == want if want else not got.gluon, (model, d, s, keys, got)
    monkeypatch.setattr(attention_config, "gpu_model", lambda device: "h200")
    # the record says which kernel ran: the Triton one for a window, a packed batch or a length off the
    # blocks; the 64-row Gluon one where the ping-pong's 128 rows do not divide the queries
    for dims, want in ((dense(1, 2, 2, 1024, 1024, 128, 1), GLUON), (dense(1, 2, 2, 1024, 1024, 128, 1, 256), None),
                       (dense(1, 2, 2, 1000, 1000, 128, 1), None), ({**dense(2, 2, 2, 512, 512, 128, 1), "varlen": 1},
                                                                    None),
                       (dense(1, 1, 1, 1024, 4096, 128, 1), PINGPONG), (dense(1, 1, 1, 960, 4096, 128, 1), GLUON),
                       (dense(1, 1, 1, 4000, 4000, 128, 0), None)):
        got = spec.config_of(SPEC.make_inputs(dims, BF16, "cpu", 0))["fwd"]
        assert got["gluon"] is bool(want) and (not want or got["block_m"] == want.block_m), (dims, got)
    # the Gluon backward: picked at D 128, recorded where its scope takes the call
    assert attention_config.pick_bwd(128, True, 4096, "cpu", 4, 4096).gluon
    assert attention_config.pick_bwd(64, True, 4096, "cpu", 1, 4096).gluon
    assert not attention_config.pick_bwd(64, False, 4096, "cpu", 1, 4096).gluon
    assert not attention_config.pick_bwd(96, True, 4096, "cpu", 1, 4096).gluon
    for dims, gluon in ((dense(1, 2, 2, 1024, 1024, 128, 1), True), (dense(1, 4, 2, 512, 512, 128, 0), True),
                        (dense(1, 2, 2, 1024, 1024, 128, 1, 256), False), (dense(1, 1, 1, 1024, 4096, 128, 1), False),
                        ({**dense(2, 2, 2, 512, 512, 128, 1), "varlen": 1}, False), (dense(1, 2, 2, 48, 48, 128, 0), False)):
        assert spec.config_of(SPEC.make_inputs(dims, BF16, "cpu", 0))["bwd"]["gluon"] is gluon, dims


def test_a_picked_pingpong_gives_way_to_the_64_row_forward_and_a_forced_one_keeps_its_tiles():
    from kcollect.kernels.attention.config import runnable

    def at(queries):  # the scope of a causal call of `queries` over 4096 keys
        return lambda c: hopper.out_of_scope((1, queries, 2, 128), 4096, True, 0, c.block_m, c.block_n)

    assert runnable(PINGPONG, True, at(1024)) == PINGPONG
    assert runnable(PINGPONG, True, at(960)) == GLUON
    assert runnable(PINGPONG, True, at(1000)) == FwdConfig(64, 64, 4, 3)
    assert runnable(PINGPONG, False, at(960)) == FwdConfig(128, 64, 4, 4)
