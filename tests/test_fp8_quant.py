"""fp8_quant: the dequantised output against the input (float64), ours and eager's, in every dtype on
awkward shapes; then the scales, the range of q, agreement with eager torch code, the rounding
itself (every bf16 value, every e4m3 midpoint), the configs of every path and the edge cases."""
import os
import random

import pytest
import torch
import torch.nn.functional as F

import opcheck
from kcollect import verify
from kcollect.kernels import fp8_quant
from kcollect.kernels.fp8_quant.spec import SPEC, fp8_quant_eager, make_inputs

SHAPES = [
    {"M": 37, "N": 1000, "gran": "1x128"},  # partial last group (104 columns)
    {"M": 1, "N": 4096, "gran": "1x128"},  # one row
    {"M": 200, "N": 300, "gran": "128x128"},  # partial tiles at both edges
    {"M": 9, "N": 4099, "gran": "row"},  # one-pass row kernel, masked tail
    {"M": 3, "N": 40000, "gran": "row"},  # two-pass (lines) kernel for rows wider than ROW_MAX
]
E4M3 = torch.float8_e4m3fn


def _label(d):
    return "x".join(map(str, d.values()))


# torch.compile of the eager code left out: PyTorch's, gated on every collector run, and each
# case costs seconds of CPU compile (torch 2.13's CPU inductor miscompiles the eager code for
# "1x128" when N % 128 != 0: its fused loop never writes the partial last group)
@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_unknown_granularity_and_bad_inputs_are_refused():
    assert "unknown granularity" in SPEC.check_shape({"M": 4, "N": 256, "gran": "1x64"})
    with pytest.raises(ValueError, match="unknown granularity"):
        fp8_quant.fp8_quant(torch.randn(4, 256), "1x64")
    with pytest.raises(ValueError, match="2-D"):
        fp8_quant.fp8_quant(torch.randn(2, 4, 256), "row")


def _block_amax(t, br, bc):
    """amax of |t| per (br x bc) block, blocks at the edges partial."""
    M, N = t.shape
    tp = F.pad(t.abs(), (0, -N % bc, 0, -M % br))
    return tp.view(tp.shape[0] // br, br, tp.shape[1] // bc, bc).amax(dim=(1, 3))


def _inputs(dims, dtype, seed=0):
    return make_inputs(dims, dtype, "cpu", seed)["x"]


@pytest.mark.parametrize("dims", SHAPES, ids=_label)
def test_scales_are_amax_over_448(dims):
    x = _inputs(dims, torch.bfloat16, seed=1)
    q, s = fp8_quant.fp8_quant(x, dims["gran"])
    br, bc = fp8_quant.block_shape(dims["M"], dims["N"], dims["gran"])
    assert s.dtype == torch.float32 and s.shape == (-(-dims["M"] // br), -(-dims["N"] // bc))
    # float64 division of float32 values, rounded once to float32, is the correctly rounded quotient
    want = (_block_amax(x.double(), br, bc) / 448.0).float()
    assert torch.equal(s, want)


@pytest.mark.parametrize("dims", SHAPES, ids=_label)
def test_q_is_in_range_and_each_block_reaches_448(dims):
    x = _inputs(dims, torch.float16, seed=2)
    q, s = fp8_quant.fp8_quant(x, dims["gran"])
    assert q.dtype == E4M3 and q.shape == x.shape
    qf = q.float()
    assert torch.isfinite(qf).all() and qf.abs().max() <= 448.0
    # the block's largest element maps onto the top of the range: a scale that belonged to another
    # block, or an off-by-one in the block bounds, shows up here
    br, bc = fp8_quant.block_shape(dims["M"], dims["N"], dims["gran"])
    assert torch.equal(_block_amax(qf, br, bc), torch.full(s.shape, 448.0))


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=_label)
def test_agrees_with_eager_on_q_and_scales(dims, dtype):
    # Our kernel multiplies by 1/scale with an fma correction, the eager code divides: both give
    # the correctly rounded x / scale, hence the same q (values compared: a -0.0 input becomes +0
    # in ours, -0 in eager's) and bit-identical scales.
    x = _inputs(dims, dtype, seed=random.randrange(2**31))
    q, s = fp8_quant.fp8_quant(x, dims["gran"])
    q_eager, s_eager = fp8_quant_eager(x, dims["gran"])
    assert torch.equal(s, s_eager)
    assert torch.equal(q.float(), q_eager.float())


def _bf16_values_within(limit):
    """Every finite bf16 value in [-limit, limit]."""
    v = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return v[torch.isfinite(v) & (v.abs() <= limit)]


@pytest.mark.parametrize("width", [4096, 40000], ids=["one-pass", "two-pass"])
def test_rounding_of_every_bf16_value_matches_torch_cast(width):
    # With 448 in every row the scale is exactly 1, so q must be torch's own e4m3 cast of x: this
    # covers round-to-nearest-even on every bf16 value of the range, subnormals and carries into
    # the exponent included (Triton's interpreter gets those wrong without our emulated rounding).
    v = _bf16_values_within(448.0)
    pad = -v.numel() % (width - 1)
    v = torch.cat([v, v[:pad]]).view(-1, width - 1)
    x = torch.cat([torch.full((v.shape[0], 1), 448.0), v], dim=1).to(torch.bfloat16)
    q, s = fp8_quant.fp8_quant(x, "row")
    assert torch.equal(s, torch.ones_like(s))
    assert torch.equal(q.float(), x.float().to(E4M3).float())


def test_ties_round_to_even():
    # Every midpoint between neighbouring e4m3 values (exact in float32), both signs, scale 1.
    grid = torch.arange(0, 256, dtype=torch.uint8).view(E4M3).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([torch.tensor([448.0]), mids, -mids]).view(1, -1)
    q, _ = fp8_quant.fp8_quant(x, "row")
    want = x.to(E4M3)
    assert torch.equal(q.float(), want.float())
    # and ties to even means the chosen neighbour has an even code
    assert (want.view(torch.uint8)[0, 1:] % 2 == 0).all()


@pytest.mark.parametrize("gran", fp8_quant.GRANULARITIES)
def test_zero_and_tiny_blocks(gran):
    # All-zero and all-tiny blocks use the amax floor: finite scales, q = 0, no NaN.
    x = torch.randn(130, 300)
    x[:, :128] = 0.0
    x[:, 128:256] = 1e-30
    q, s = fp8_quant.fp8_quant(x, gran)
    assert torch.isfinite(s).all() and (s > 0).all() and torch.isfinite(q.float()).all()
    if gran != "row":  # the first two column blocks are the quiet ones
        floor = torch.tensor(fp8_quant.AMAX_FLOOR, dtype=torch.float32) / 448.0
        assert torch.equal(s[:, :2], floor.expand(s.shape[0], 2))
        assert (q[:, :256].float() == 0).all()
    # the loud part still dequantises well
    back = fp8_quant.dequantize(q, s)[:, 256:]
    assert verify.rel_error(back, x[:, 256:].double()) < SPEC.tolerance[torch.float32]


def test_dequantize_matches_block_layout():
    # compare() reads the block shape off the scales' shape; check it against an explicit expansion
    for dims in ({"M": 3, "N": 300, "gran": "1x128"}, {"M": 130, "N": 260, "gran": "128x128"},
                 {"M": 3, "N": 100, "gran": "row"}):
        x = _inputs(dims, torch.float32, seed=3)
        q, s = fp8_quant.fp8_quant(x, dims["gran"])
        br, bc = fp8_quant.block_shape(dims["M"], dims["N"], dims["gran"])
        rows = torch.arange(dims["M"]) // br
        cols = torch.arange(dims["N"]) // bc
        want = q.double() * s.double()[rows[:, None], cols[None, :]]
        assert torch.equal(fp8_quant.dequantize(q, s), want), dims


def test_interpreter_cast_needs_the_emulated_rounding():
    # Why EMULATE exists: Triton 3.6's interpreter casts float32 -> e4m3 wrongly (half-up rounding,
    # a lost carry into odd exponents: 1.97 -> 1.0). If this starts passing without emulation,
    # the interpreter was fixed and the emulated rounding can go.
    x = torch.tensor([[448.0, 1.97, -1.97, 7.9, 0.0013]])
    q_raw, _ = fp8_quant.fp8_quant_forward(x, "row", emulate=False)
    q, _ = fp8_quant.fp8_quant_forward(x, "row")
    assert torch.equal(q.float(), x.to(E4M3).float())
    assert not torch.equal(q_raw.float(), x.to(E4M3).float())


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the hardware e4m3 conversion needs a GPU and compiled Triton")
@pytest.mark.parametrize("dims", SHAPES, ids=_label)
def test_gpu_hardware_cast_matches_emulated_rounding(dims):
    x = make_inputs(dims, torch.bfloat16, "cuda", 4)["x"]
    q_hw, s_hw = fp8_quant.fp8_quant_forward(x, dims["gran"], emulate=False)
    q_em, s_em = fp8_quant.fp8_quant_forward(x, dims["gran"], emulate=True)
    q_eager, s_eager = fp8_quant_eager(x, dims["gran"])
    assert torch.equal(s_hw, s_em)
    assert torch.equal(q_hw.float(), q_em.float())
    # CUDA torch divides by the Python scalar 448 through its reciprocal: its scales can be an ulp
    # off ours, which moves x / scale off the exact e4m3 midpoints bf16 data often hits (~0.1% of
    # elements in a CPU simulation), by one e4m3 step
    assert torch.allclose(s_hw, s_eager, rtol=2**-23, atol=0)
    a, b = q_hw.float(), q_eager.float()
    assert (a != b).float().mean() < 1e-2
    assert ((a - b).abs() <= torch.maximum(a.abs(), b.abs()) / 8 + 2**-9).all()


# Configs the heuristic does not pick: each must give exactly the default's q and scales (the eager
# code's, on the CPU) on awkward shapes, fresh random inputs.
CONFIGS = [
    ({"M": 9, "N": 1000, "gran": "1x128"}, fp8_quant.GroupsConfig(rows=2, groups=2, warps=2)),  # 4 group tiles a row
    ({"M": 9, "N": 4099, "gran": "row"}, fp8_quant.GroupsConfig(rows=4, groups=1, warps=4, policy="")),
    ({"M": 200, "N": 300, "gran": "128x128"}, fp8_quant.TilesConfig(warps=8, policy="evict_first")),
    # the lines kernel for wide rows: full chunks and a masked tail (40000 = 9 x 4096 + 3136), more
    # rows than programs (4 "SMs" on the CPU, one program each), one program a row; an unaligned
    # width in chunks of 2048 with 8 and 16 elements a line
    ({"M": 6, "N": 40000, "gran": "row"}, fp8_quant.LinesConfig(chunk=4096, warps=2, programs=1)),
    ({"M": 3, "N": 16411, "gran": "row"}, fp8_quant.LinesConfig(chunk=2048, warps=1, vec=8)),
    ({"M": 3, "N": 16411, "gran": "row"}, fp8_quant.LinesConfig(chunk=2048, warps=1, programs=2)),
]


@pytest.mark.parametrize("dims,config", CONFIGS, ids=lambda v: _label(v) if isinstance(v, dict) else str(v))
def test_configs(dims, config):
    x = _inputs(dims, torch.bfloat16, seed=random.randrange(2**31))
    q, s = fp8_quant.fp8_quant_forward(x, dims["gran"], config=config)
    q_eager, s_eager = fp8_quant_eager(x, dims["gran"])
    assert torch.equal(s, s_eager)
    assert torch.equal(q.float(), q_eager.float())


def test_default_configs():
    # the path and config of each full-grid granularity: one-pass tiles, wide-row lines
    assert fp8_quant.pick(16384, 7168, "1x128", 2) == fp8_quant.GroupsConfig(rows=8, groups=8, warps=8)
    assert fp8_quant.pick(8192, 4096, "row", 2) == fp8_quant.GroupsConfig(rows=2, groups=1, warps=8)
    assert fp8_quant.pick(4096, 14336, "128x128", 2) == fp8_quant.TilesConfig(warps=4)
    assert fp8_quant.pick(1024, 128256, "row", 2) == fp8_quant.LinesConfig(chunk=32768, warps=32, vec=16)
    inputs = make_inputs({"M": 3, "N": 40000, "gran": "row"}, torch.bfloat16, "cpu", 0)
    assert SPEC.provider("triton").config(inputs) == {"lines": {"chunk": 8192, "warps": 8, "vec": 16,
                                                                "programs": "rows"}}


def test_a_forced_config_is_picked_on_its_path_only():
    # the lab's A/B forces configs through the tunable pick (kcollect.kernels._host.config.forced)
    from kcollect.kernels._host.config import forced

    tiles = fp8_quant.TilesConfig(warps=8)
    with forced(tiles):
        assert fp8_quant.pick(256, 256, "128x128", 2) == tiles
        assert isinstance(fp8_quant.pick(256, 256, "1x128", 2), fp8_quant.GroupsConfig)


def test_config_of_another_path_is_refused():
    with pytest.raises(ValueError, match="takes a TilesConfig"):
        fp8_quant.fp8_quant_forward(torch.randn(4, 256), "128x128", config=fp8_quant.GroupsConfig(1, 1, 1))
