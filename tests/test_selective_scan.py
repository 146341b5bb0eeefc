"""selective_scan against its float64 reference on the CPU interpreter: several chunks and channel
blocks (one masked), N not a power of two, one sequence, forward (inference) and
forward+backward, bf16 and fp32; the lanes forward (forced by config) on awkward cases of
lab/awkward (T = 1, T not a multiple of the tile, odd D and N, strided inputs, extreme steps and
decays) with the tiles backward reading the states it kept; the PyTorch providers' code (the
loop, the log-depth scan), the reference against the recurrence by hand, mamba_ssm's reason, and
the input checks."""
import contextlib
import dataclasses
import random

import pytest
import torch

import opcheck
from kcollect import verify
from kcollect.kernels._host.config import forced
from kcollect.kernels.selective_scan import SelectiveScanConfig, selective_scan
from kcollect.kernels.selective_scan.spec import EAGER_MAX_T, SPEC, eager, log_depth, mamba_available
from kcollect.spec import Unavailable
from test_awkward_scans import case as awkward_case
from test_awkward_scans import verify_case

BF16, F32 = torch.bfloat16, torch.float32


def check(dims, dtype, mode="fwd+bwd", fn=None, tolerance=None):
    seed = random.randrange(2**31)
    x = SPEC.make_inputs(dims, dtype, "cpu", seed)
    dys, want = verify.reference_answers(SPEC, x, mode, seed + 1)
    got = verify.build_call(SPEC, fn or SPEC.provider("triton").fn, verify.clone_inputs(x), mode, dys)()
    err = verify.max_error(got, want)
    tolerance = tolerance or SPEC.tolerance[dtype]
    assert err <= tolerance, f"seed {seed} {dims} {dtype}: error {err:.3g} > {tolerance:.3g}"


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
def lanes(steps=4, segments=3, split=1, poly=0, block_d=8, warps=1, share=False):
    return SelectiveScanConfig(8, block_d, warps, 8, 1, "lanes", steps, segments, split, poly, share)


LANES_CASES = [  # (case of lab/awkward, config)
    (awkward_case("selective_scan", {"B": 1, "T": 1, "D": 5, "N": 3}, step="large", decay="strong"), lanes()),
    (awkward_case("selective_scan", {"B": 2, "T": 17, "D": 9, "N": 5}, "bfloat16", step="mixed", gate="large",
                  layout="strided", grad_layout="strided"), lanes(2, 3)),  # states kept every 4 tiles
    (awkward_case("selective_scan", {"B": 3, "T": 9, "D": 1, "N": 1}, step="tiny", decay="weak", x_scale=0.01),
     lanes(8, 2)),
    (awkward_case("selective_scan", {"B": 1, "T": 48, "D": 16, "N": 16}, decay="weak"),
     lanes(4, 6)),  # whole tiles, blocks and N; 6 segments: ends of more than one group of 4, every one mattering
    # states over lanes: N 5 (padded to 8) in 2 groups of 4, 1/2 of the decays by the polynomial (bf16)
    (awkward_case("selective_scan", {"B": 2, "T": 17, "D": 9, "N": 5}, "bfloat16", step="mixed", gate="large",
                  layout="strided", grad_layout="strided"), lanes(2, 3, split=2, poly=2)),
    (awkward_case("selective_scan", {"B": 1, "T": 48, "D": 16, "N": 16}, decay="weak"),
     lanes(4, 6, split=4, share=True)),  # fp32: groups of 4 states, segments' ends and kept states by group
    (awkward_case("selective_scan", {"B": 3, "T": 9, "D": 1, "N": 1}, step="tiny", decay="weak", x_scale=0.01),
     lanes(8, 2, split=8)),  # more lanes asked for than states: one state a lane
]


@pytest.mark.parametrize("case, config", LANES_CASES, ids=[f"{c['dtype']}-" + "-".join(
    f"{k}{v}" for k, v in c["dims"].items()) for c, _ in LANES_CASES])
def test_lanes_forward_matches_reference(case, config):
    # outputs and every gradient against float64: fp32 within twice eager's error, bf16 the tolerance
    with forced(config):
        verify_case(case)


# The lanes backward (bwd_path "lanes") at the CPU's chunk of 8 steps, after either forward: tiles
# of bwd_steps (8: one a kept state; 4 and 2: the chunk's later tiles advance the kept state over
# its earlier ones), time in bwd_segments, blocks of bwd_block_d channels on bwd_warps
def lanes_bwd(steps=4, segments=1, block_d=8, warps=1, fwd="lanes"):
    first = lanes(4, 2) if fwd == "lanes" else SelectiveScanConfig(8, 8, 1)
    return dataclasses.replace(first, bwd_path="lanes", bwd_steps=steps, bwd_segments=segments, bwd_block_d=block_d,
                               bwd_warps=warps)


LANES_BWD_CASES = [  # (case of lab/awkward, config)
    (awkward_case("selective_scan", {"B": 1, "T": 1, "D": 5, "N": 3}, step="large", decay="strong"),
     lanes_bwd(4, 3)),  # one step: one tile, one segment
    (awkward_case("selective_scan", {"B": 2, "T": 17, "D": 9, "N": 5}, "bfloat16", step="mixed", gate="large",
                  layout="strided", grad_layout="strided"), lanes_bwd(2, 2)),  # 4 tiles a chunk, the last partial
    (awkward_case("selective_scan", {"B": 3, "T": 9, "D": 1, "N": 1}, step="tiny", decay="weak", x_scale=0.01),
     lanes_bwd(8, 2, fwd="tiles")),
    # fp32, whole tiles, blocks and N; 5 segments: the ends of more than one group of 4 after a segment
    (awkward_case("selective_scan", {"B": 1, "T": 40, "D": 16, "N": 16}, decay="weak"), lanes_bwd(4, 5)),
]


@pytest.mark.parametrize("case, config", LANES_BWD_CASES, ids=[f"{c['dtype']}-" + "-".join(
    f"{k}{v}" for k, v in c["dims"].items()) for c, _ in LANES_BWD_CASES])
def test_lanes_backward_matches_reference(case, config):
    # outputs and every gradient against float64: fp32 within twice eager's error, bf16 the tolerance
    with forced(config):
        verify_case(case)


@pytest.mark.parametrize("dtype, n, config", [(F32, 3, lanes_bwd(2, 2)), (BF16, 16, lanes_bwd(4, 3, 64, 2, "tiles")),
                                              (torch.float16, 16, lanes_bwd(8, 1, 32))],
                         ids=["fp32-N3-seg2", "bf16-N16-w2-seg3", "fp16-N16"])
def test_lanes_backward_dtypes_match_reference(dtype, n, config):
    # D 11 (a masked channel block), T 21 (a partial chunk and tile); fp16 (not in the grid's dtypes)
    # at bf16's tolerance. bf16 and fp16 at 32 channels a warp: dB and dC by the warps' reduce-scatter
    # (bwd_lanes._warp_sums; on two warps at bf16), fp32 by tl.sum
    with forced(config):
        check(dims(2, 21, 11, n), dtype, tolerance=1e-2 if dtype == torch.float16 else None)


def test_lanes_backward_tile_must_divide_the_chunk():
    x = SPEC.make_inputs(dims(1, 4, 3, 2), F32, "cpu", 0)
    x["x"].requires_grad_()
    with forced(lanes_bwd(3)), pytest.raises(ValueError, match="must divide the chunk"):
        selective_scan(**x).sum().backward()


def test_lanes_inference_forward_matches_reference():
    # no gradient wanted: no states kept; one segment, and several
    for segments in (1, 3):
        with forced(lanes(4, segments)):
            check(dims(2, 13, 9, 4), F32, mode="fwd")
            check(dims(1, 16, 16, 16), BF16, mode="fwd")


# (split, poly, block_d, warps, segments, share, dtype): each state grouping, the polynomial at each
# share (bf16 and fp16: fp32 keeps its precise decays), channels over two warps (the groups' partial
# sums meet within each warp), with and without segments, softplus per lane and once a channel;
# bf16 with N 16 loads B and C as pairs of states
FP16 = torch.float16
SPLIT_CASES = [(2, 0, 8, 1, 1, False, F32), (2, 4, 8, 2, 3, True, BF16), (4, 2, 8, 1, 2, True, BF16),
               (4, 4, 4, 1, 1, False, FP16), (8, 0, 8, 1, 3, True, F32), (1, 8, 8, 1, 2, False, BF16),
               (2, 2, 8, 1, 2, True, FP16)]


@pytest.mark.parametrize("split, poly, block_d, warps, segments, share, dtype", SPLIT_CASES,
                         ids=[f"split{c[0]}-poly{c[1]}-bd{c[2]}-w{c[3]}-seg{c[4]}{'-share' * c[5]}-{str(c[6])[6:]}"
                              for c in SPLIT_CASES])
def test_lanes_split_and_poly_forward_match_reference(split, poly, block_d, warps, segments, share, dtype):
    # D 11 (a masked channel block), N 16 and N 3 (padded to 4: split 8 falls back to 4 lanes, the
    # polynomial to none where a lane holds fewer states than 1/poly needs), T 13 (a partial tile)
    with forced(lanes(4, segments, split, poly, block_d, warps, share)):
        for n in (16, 3):
            check(dims(2, 13, 11, n), dtype, mode="fwd", tolerance=1e-2 if dtype == FP16 else None)


def test_lanes_refuses_a_split_it_cannot_lay_out():
    x = SPEC.make_inputs(dims(1, 4, 3, 2), F32, "cpu", 0)
    with forced(lanes(split=3)), pytest.raises(ValueError, match="split = 1, 2, 4 or 8"):
        selective_scan(**x)
    with forced(lanes(split=2, block_d=2, warps=2)), pytest.raises(ValueError, match="2 channels a warp"):
        selective_scan(**x)


def _exp2_of(fn, v):
    import triton
    import triton.language as tl

    @triton.jit
    def apply(V, O, n, F: tl.constexpr):
        i = tl.arange(0, 1024)
        tl.store(O + i, F(tl.load(V + i, mask=i < n, other=0.0)), mask=i < n)

    out = torch.empty_like(v)
    apply[(1,)](v, out, v.numel(), F=fn)
    return out


def test_exp2_polynomial_is_as_close_as_the_sfu():
    """exp2_poly against float64 2^v over the decays' range (relative error at most ~3 fp32 ulps,
    as ex2.approx's 2; the interpreter rounds each multiply and add, the GPU fuses them, which only
    helps), and clamped at 2^-125 below it."""
    from kcollect.kernels.selective_scan.softplus import exp2_poly

    seed = random.randrange(2**31)
    g = torch.Generator().manual_seed(seed)
    v = torch.cat([torch.linspace(-125, 8, 700), torch.rand(300, generator=g) * -20, torch.tensor([-0.5, 0.5, 0.0])])
    got = _exp2_of(exp2_poly, v).double()
    want = torch.exp2(v.double())
    err = ((got - want).abs() / want).max().item()
    assert err < 4e-7, f"seed {seed}: relative error {err:.3g}"
    deep = _exp2_of(exp2_poly, torch.tensor([-126.0, -200.0, -1e4]))
    assert torch.allclose(deep.double(), torch.full((3,), 2.0**-125, dtype=torch.float64), rtol=4e-7, atol=0), deep


def test_precise_decays_are_exp_of_the_step():
    """fp32's decays (softplus.decay, PRECISE) within 2 ulp of float64's exp of the fp32 product
    dt A, from weak decays to |dt A| 87. exp2(dt * (A log2(e))) carried A log2(e)'s rounding into
    every decay, |dt A| x 2^-24 of it with the same sign at every step of a channel (about 20 ulp at
    |dt A| 30), and states and adjoints multiply tens of decays: dA, dB and ddelta were 2-3x eager's
    error at T 257 (lab.awkward's sweep; the cases that showed it gate three numbers on one draw,
    see test_awkward_scans.py). Measured: at most 0.6 ulp; the exp2 formula 69."""
    import triton
    import triton.language as tl

    from kcollect.kernels._jit.lse import LOG2E
    from kcollect.kernels.selective_scan.softplus import decay

    @triton.jit
    def apply(DT, A, O, n, F: tl.constexpr, L2E: tl.constexpr):
        i = tl.arange(0, 4096)
        m = i < n
        dt, a = tl.load(DT + i, mask=m, other=0.0), tl.load(A + i, mask=m, other=0.0)
        tl.store(O + i, F(dt, a, a * L2E, True), mask=m)  # a2 as the kernels form it

    seed = random.randrange(2**31)
    g = torch.Generator().manual_seed(seed)
    n = 4096
    dt = torch.rand(n, generator=g) * 2 + 1e-3
    a = -torch.exp(torch.rand(n, generator=g) * 10 - 6).clamp(max=87 / 2.001)  # A in [-43, -0.0025]
    out = torch.empty(n)
    apply[(1,)](dt, a, out, n, F=decay, L2E=LOG2E)
    want = torch.exp((dt * a).double())  # the fp32 product, as the kernel forms it
    ulps = ((out.double() - want).abs() / (want * 2.0**-23)).max().item()
    assert ulps <= 2, f"seed {seed}: {ulps:.2f} ulp"


@pytest.mark.parametrize("path", ["tiles", "lanes"])
def test_parameter_sums_are_fp64_for_fp32_inputs(monkeypatch, path):
    """dA, dD (and dB, dC) summed in fp64 for fp32 inputs, fp32 for bf16 (kernels/_jit/scan.py's
    sum_dtype): an fp32 running sum of terms that cancel lost digits eager's pairwise sums keep,
    the other half of the fix of the 2-3x-eager dA and dB at T 257."""
    import triton.language as tl

    from kcollect.kernels.selective_scan import bwd_lanes, scan

    module, name = (scan, "_ss_bwd") if path == "tiles" else (bwd_lanes, "_ss_bwd_lanes")
    launches = opcheck.record_launches(monkeypatch, module, name)
    config = None if path == "tiles" else lanes_bwd()
    for dtype, acc in ((F32, tl.float64), (BF16, tl.float32)):
        x = {k: v.requires_grad_(v.is_floating_point())
             for k, v in SPEC.make_inputs(dims(1, 9, 3, 2), dtype, "cpu", random.randrange(2**31)).items()}
        launches.clear()
        with forced(config) if config is not None else contextlib.nullcontext():
            selective_scan(**x).sum().backward()
        accs = {kw["ACC"] for _, kw in launches}
        assert accs == {acc}, (dtype, accs)


def test_poly_decays_keep_fp32_states_over_a_long_sequence():
    """The states the bf16 lanes forward keeps (fp32, every chunk of 8 steps) over 512 steps with
    half of the decays by the polynomial, against float64 from the same bf16 inputs: within 2x the
    error of the exp2-only kernel's (interpreter: numpy's exp2; about 1.2x measured; a polynomial
    with p(0) 7e-8 above 1 gave 6x, the bias of every decay near 1 adding up)."""
    from kcollect.kernels.selective_scan import selective_scan_forward

    seed = random.randrange(2**31)
    x = SPEC.make_inputs(dims(1, 512, 8, 16), BF16, "cpu", seed)
    args = [x[k] for k in ("x", "delta", "A", "B", "C", "D", "z")]
    xd, dl, A, Bm = (x[k].double() for k in ("x", "delta", "A", "B"))
    dt = torch.nn.functional.softplus(dl)
    h = torch.zeros(8, 16, dtype=torch.float64)
    want = []
    for t in range(512):
        h = torch.exp(dt[0, t, :, None] * A) * h + (dt[0, t] * xd[0, t])[:, None] * Bm[0, t][None, :]
        if t % 8 == 7:
            want.append(h)
    want = torch.stack(want)
    errs = {}
    for poly in (0, 2):
        _, ck = selective_scan_forward(*args, config=lanes(8, 1, 2, poly), keep_states=True)
        errs[poly] = ((ck[0].double() - want).norm() / want.norm()).item()
    assert errs[2] <= 2 * errs[0], f"seed {seed}: relative error of the states by poly: {errs}"


def test_pick_switches_to_lanes_from_the_threshold(monkeypatch):
    from kcollect.kernels.selective_scan import config

    # the measured threshold: the lanes forward from B1 T60 D512 on, the tiles path below
    assert config.pick(1, 60, 512, 16, "cpu").path == "lanes" and config.pick(1, 59, 512, 16, "cpu").path == "tiles"
    monkeypatch.setattr(config, "LANES_FROM", 1000)
    assert config.pick(2, 50, 10, 16, "cpu") == config.lanes(2, 50, 10, "cpu")
    assert config.pick(2, 49, 10, 16, "cpu").path == "tiles"


# (B, T, D) -> the lanes backward's segments on a 132-SM Hopper GPU: the rule's (whole from 4 warps an
# SM, 2 from 2, else twice the forward's), doubled where it cuts time and each segment keeps >= 128
# steps (lab/results/scan_prefetch_h200_d3e7e33.txt)
BWD_SEGMENTS = [((8, 2048, 2048), 4), ((4, 4096, 2048), 20), ((32, 60, 512), 2), ((3, 1000, 1000), 22),
                ((16, 1024, 1536), 1), ((8, 2048, 4096), 1)]


@pytest.mark.parametrize("shape, segments", BWD_SEGMENTS, ids=[f"B{b}-T{t}-D{d}" for (b, t, d), _ in BWD_SEGMENTS])
def test_lanes_backward_segments_and_prefetch_on_hopper(monkeypatch, shape, segments):
    from kcollect.kernels.selective_scan import config

    monkeypatch.setattr(config, "arch", lambda device: "sm90")
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    cfg = config.lanes(*shape, "cuda")
    assert (cfg.bwd_segments, cfg.bwd_ahead, cfg.bwd_level) == (segments, config.LANES_BWD_AHEAD, 2)


def test_lanes_backward_prefetch_asked_for_on_the_interpreter():
    # the prefetch is PTX: on the CPU the backward leaves it out and still matches the reference
    with forced(dataclasses.replace(lanes_bwd(2, 2), bwd_ahead=2, bwd_level=1)):
        check(dims(2, 19, 9, 5), F32, mode="fwd+bwd")


@pytest.mark.parametrize("mode", ["fwd+bwd", "fwd"])
def test_lanes_tile_that_does_not_divide_the_chunk(mode):
    """Tiles of 8 steps, states kept every 4 (the GPU's pick): with states kept the forward walks
    tiles of gcd(8, 4) = 4 (so that each kept state falls at a tile's end), without them of 8."""
    with forced(dataclasses.replace(lanes(8, 2), chunk=4)):
        check(dims(2, 19, 9, 5), F32, mode=mode)


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
    from kcollect.kernels.selective_scan import config

    device = opcheck.fake_gpu(monkeypatch)
    full = config.lanes(8, 2048, 2048, device)
    assert (full.steps, full.segments, full.block_d) == (8, 1, 32)
    assert config.lanes(3, 1000, 1000, device).segments == 11  # 96 programs: 1056 / 96 warps
    assert config.lanes(1, 60, 512, device).segments == 8  # capped by the sequence's 8 tiles
