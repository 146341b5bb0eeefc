"""rtu against its float64 reference on the CPU interpreter: diagonal and low-rank input maps, resets
at the first step, at chunk boundaries and back to back, several chunks, channel blocks (one
masked) and time segments (forward and backward), forward (inference) and forward+backward, bf16
and fp32; the same for the lanes path (forced by config) on the awkward cases of lab/awkward (T = 1,
T not a multiple of the chunk, one sequence, odd H, resets at the first, last and every step,
strided inputs, extreme memories), and each path's states read by the other's backward; the
PyTorch providers' own code (the log-depth scan, the adapter around accelerated_scan's complex
scan) and the input checks."""
import random

import pytest
import torch

import opcheck
from kcollect import verify
from kcollect.kernels._host.config import forced
from kcollect.kernels.rtu import RTUConfig, providers, rtu
from kcollect.kernels.rtu.naive import reference
from kcollect.kernels.rtu.spec import SPEC
from test_awkward_scans import case as awkward_case
from test_awkward_scans import verify_case

BF16, F32 = torch.bfloat16, torch.float32


def inputs(b, t, h, r, dtype, resets=(), p=0.0):
    """Fresh inputs; resets at the given steps of the first sequence (and at rate p elsewhere)."""
    dims = {"B": b, "T": t, "H": h, "R": r, "resets": 1 if resets or p else 0, "p": p}
    x = SPEC.make_inputs(dims, dtype, "cpu", random.randrange(2**31))
    if resets:
        x["resets"][0, list(resets)] = True
    return x


def check(x, dtype, mode="fwd+bwd", fn=None):
    seed = random.randrange(2**31)
    dys, want = verify.reference_answers(SPEC, x, mode, seed)
    got = verify.build_call(SPEC, fn or SPEC.provider("triton").fn, verify.clone_inputs(x), mode, dys)()
    err = verify.max_error(got, want)
    bound = SPEC.tolerance[dtype]
    if dtype == BF16:  # the gate's bf16 tolerance is for the low-rank tail at T 512 (spec.py): these
        # small cases are held to twice the PyTorch path's error on the same inputs, at least 1e-2
        eager = verify.build_call(SPEC, providers.log_depth, verify.clone_inputs(x), mode, dys)()
        bound = max(1e-2, 2 * verify.max_error(eager, want))
    assert err <= bound, f"error {err:.3g} > {bound:.3g}"


# chunk 8 on the CPU: steps 0, 8 and 16 open chunks; 8, 9 back to back; 26 the last step
EDGES = (0, 8, 9, 16, 26)
CASES = [  # (B, T, H, R, dtype, resets, p, config: chunk, block_h, warps, segments, bwd ..)
    (1, 27, 12, "diag", F32, EDGES, 0.0, RTUConfig(8, 8, 1, 3, 8, 1, 2)),  # H 12: a masked channel block
    (2, 20, 16, "diag", BF16, (0,), 0.2, RTUConfig(8, 8, 1, 1, 16, 1, 1)),
    (2, 17, 8, 3, F32, (1, 8), 0.15, RTUConfig(8, 8, 1, 2, 8, 1, 3)),  # low-rank maps, R 3
    (1, 24, 16, "diag", BF16, (), 0.0, RTUConfig(8, 16, 1, 2, 8, 1, 2)),  # no reset mask
]


@pytest.mark.parametrize("b, t, h, r, dtype, resets, p, config", CASES,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-R{c[3]}-{str(c[4])[6:]}" for c in CASES])
def test_forward_backward_match_reference(b, t, h, r, dtype, resets, p, config):
    with forced(config):
        check(inputs(b, t, h, r, dtype, resets, p), dtype)


def test_inference_forward_matches_reference():
    # no gradient wanted: the launch that keeps no states
    with forced(RTUConfig(8, 8, 1, 2, 8, 1, 1)):
        check(inputs(2, 19, 8, 2, F32, (0, 8), 0.2), F32, mode="fwd")


# The lanes path at the CPU's chunk of 8 steps and blocks of 8 channels, time in segments both ways
def lanes(segments=3, bwd_segments=3, path="lanes", bwd_path="lanes", steps=0):
    return RTUConfig(8, 8, 1, segments, 8, 1, bwd_segments, path, bwd_path, steps)


LANES_CASES = [  # (case of lab/awkward, config)
    (awkward_case("rtu", {"B": 1, "T": 1, "H": 5, "R": "diag"}, resets="first", radius="long", angle="large"),
     lanes()),  # one step, odd H, memories of 1e6 steps
    (awkward_case("rtu", {"B": 3, "T": 9, "H": 9, "R": "diag"}, "bfloat16", resets="edges", radius="mixed",
                  layout="strided", grad_layout="strided"), lanes(2, 2)),
    (awkward_case("rtu", {"B": 2, "T": 17, "H": 3, "R": 3}, resets="every", radius="short", angle="tiny",
                  x_scale=10.0), lanes()),  # low-rank maps, a reset at every step
    (awkward_case("rtu", {"B": 2, "T": 8, "H": 8, "R": 1}, resets="last", layout="strided"), lanes()),  # whole blocks
    (awkward_case("rtu", {"B": 1, "T": 41, "H": 17, "R": "diag"}, resets="last", radius="long"),
     lanes(6, 6)),  # 6 segments: the ends of more than one group of 4 combined, both ways, every one mattering
    (awkward_case("rtu", {"B": 2, "T": 24, "H": 16, "R": "diag"}, "bfloat16", resets="none"),
     lanes(2, 3)),  # no reset mask; whole chunks and channel blocks
    (awkward_case("rtu", {"B": 2, "T": 19, "H": 6, "R": "diag"}, resets="random"),
     lanes(path="tiles", bwd_segments=1)),  # the tiles forward's states, the lanes backward in one segment
    (awkward_case("rtu", {"B": 2, "T": 19, "H": 6, "R": 2}, resets="random"),
     lanes(bwd_path="tiles")),  # the lanes forward's states, the tiles backward
    (awkward_case("rtu", {"B": 2, "T": 37, "H": 8, "R": "diag"}, resets="first", radius="long"),
     lanes(2, 2, steps=16)),  # forward tiles of 16 steps: two states kept a tile (the last one past T)
    (awkward_case("rtu", {"B": 1, "T": 30, "H": 9, "R": "diag"}, "bfloat16", resets="edges", radius="long"),
     lanes(3, 1, steps=4)),  # forward tiles of 4 steps: a state kept every other tile
]


@pytest.mark.parametrize("case, config", LANES_CASES, ids=[f"{c['dtype']}-" + "-".join(
    f"{k}{v}" for k, v in c["dims"].items()) + f"-{cfg.path}-{cfg.bwd_path}" for c, cfg in LANES_CASES])
def test_lanes_path_matches_reference(case, config):
    # outputs and every gradient against float64: fp32 within twice eager's error, bf16 the tolerance
    with forced(config):
        verify_case(case)


def test_pick_switches_to_lanes_from_the_thresholds(monkeypatch):
    from kcollect.kernels.rtu import config

    # the measured thresholds: the lanes path both ways from B4 T128 H64 on, the tiles path below
    assert (config.pick(4, 128, 64, "cpu").path, config.pick(4, 128, 64, "cpu").bwd_path) == ("lanes", "lanes")
    assert (config.pick(4, 127, 64, "cpu").path, config.pick(4, 127, 64, "cpu").bwd_path) == ("tiles", "tiles")
    monkeypatch.setattr(config, "LANES_BWD_FROM", None)
    monkeypatch.setattr(config, "LANES_FWD_FROM", 1000)
    assert (config.pick(2, 50, 10, "cpu").path, config.pick(2, 50, 10, "cpu").bwd_path) == ("lanes", "tiles")
    assert config.pick(2, 49, 10, "cpu").path == "tiles"
    monkeypatch.setattr(config, "LANES_BWD_FROM", 1000)
    both = config.pick(2, 50, 10, "cpu")
    assert both == config.lanes(2, 50, 10, "cpu") and both.bwd_path == "lanes"
    monkeypatch.setattr(config, "LANES_FWD_FROM", None)
    assert (config.pick(2, 50, 10, "cpu").path, config.pick(2, 50, 10, "cpu").bwd_path) == ("tiles", "lanes")


def test_lanes_forward_tile_must_fit_the_chunk():
    x = inputs(1, 4, 3, "diag", F32)
    with forced(lanes(steps=12)), pytest.raises(ValueError, match="multiple or a divisor of the chunk"):
        rtu(x["x"], x["nu_log"], x["theta_log"], x["map1"], x["map2"])


def test_lanes_inference_forward_matches_reference():
    # no gradient wanted: the launch that keeps no states; one segment, and several
    for segments in (1, 3):
        with forced(lanes(segments)):
            check(inputs(2, 19, 8, 2, F32, (0, 8), 0.2), F32, mode="fwd")
            check(inputs(1, 16, 16, "diag", BF16, (15,), 0.1), BF16, mode="fwd")


def test_log_depth_scan_matches_reference():
    # the compile provider's code, run eagerly
    check(inputs(2, 37, 6, "diag", F32, EDGES, 0.1), F32, fn=providers.log_depth)
    check(inputs(1, 19, 6, 2, F32, (3,), 0.1), F32, fn=providers.log_depth)


def _scan_loop(gates, tokens):
    """A first-order scan over the last axis, as accelerated_scan.complex.scan computes it."""
    h, out = torch.zeros_like(tokens[..., 0]), []
    for t in range(tokens.shape[-1]):
        h = gates[..., t] * h + tokens[..., t]
        out.append(h)
    return torch.stack(out, dim=-1)


def test_complex_scan_adapter_matches_reference():
    # the accelerated_scan provider's code, with a plain loop standing in for its scan
    check(inputs(2, 29, 5, "diag", F32, EDGES[:3], 0.1), F32, fn=lambda **x: providers.through_scan(_scan_loop, **x))


def test_cortex_torch_refuses_long_sequences():
    x = {"x": torch.zeros(1, providers.CORTEX_TORCH_MAX_STEPS + 1, 2)}
    with pytest.raises(providers.Unavailable, match=f"T={providers.CORTEX_TORCH_MAX_STEPS}"):
        providers.cortex_torch(x["x"], None, None, None, None)


def test_reference_is_the_recurrence():
    # one channel by hand: c_1 = gamma u_1; c_2 = lambda c_1 + gamma u_2; a reset at step 2 drops c_1
    x = verify.upcast(inputs(1, 3, 1, "diag", F32, (2,)))
    lam = torch.polar(torch.exp(-torch.exp(x["nu_log"][0])), torch.exp(x["theta_log"][0]))
    u = torch.complex(x["x"][0, :, 0] * x["map1"][0], x["x"][0, :, 0] * x["map2"][0]) * torch.sqrt(1 - lam.abs() ** 2)
    c = torch.stack([u[0], lam * u[0] + u[1], u[2]])
    want = torch.nn.functional.silu(torch.stack([c.real, c.imag], dim=-1))
    torch.testing.assert_close(reference(**x)[0], want)


def test_bad_inputs_are_refused():
    x = inputs(1, 4, 3, "diag", F32)
    with pytest.raises(ValueError, match=r"resets must be bool \[B, T\]"):
        rtu(x["x"], x["nu_log"], x["theta_log"], x["map1"], x["map2"], torch.zeros(1, 4))
    with pytest.raises(ValueError, match="first input map must be"):
        rtu(x["x"], x["nu_log"], x["theta_log"], x["map1"][:2], x["map2"])
    with pytest.raises(ValueError, match=r"x must be \[B, T, H\]"):
        rtu(x["x"][0], x["nu_log"], x["theta_log"], x["map1"], x["map2"])


def test_grids_and_cost_model():
    for shape in SPEC.grid("full") + SPEC.grid("quick"):
        assert set(shape.dims) == {"B", "T", "H", "R", "resets", "p"} and shape.why
        assert SPEC.bytes_moved(shape.dims, BF16, "fwd") > 0 and SPEC.flops(shape.dims, "bwd") > 0
    d = {"B": 2, "T": 3, "H": 4, "R": "diag", "resets": 1, "p": 0.1}
    assert SPEC.bytes_moved(d, BF16, "fwd") == 3 * 24 * 2 + 6  # x in, y out (2H), the reset mask
    assert len({s.label for s in SPEC.grid("full")}) == len(SPEC.grid("full"))


def test_lanes_backward_segments_count_its_two_warps(monkeypatch):
    """On an H100-like GPU the lanes backward runs 64 channels over two warps, and cuts time only
    until the grid holds _LANES_WARPS_PER_SM warps an SM, counting warps: at B32 T2048 H2048 (1024
    two-warp programs) one segment; counted as programs it split in two, 1.40x slower on the H200."""
    from kcollect.kernels.rtu import config

    device = opcheck.fake_gpu(monkeypatch)
    wide = config.lanes(32, 2048, 2048, device)
    assert (wide.bwd_block_h, wide.bwd_warps, wide.bwd_segments) == (64, 2, 1)
    target = config.lanes(8, 8192, 1024, device)  # 128 programs of 2 warps: 1056 / 256 -> 5 segments
    assert (target.bwd_segments, target.segments) == (5, 9)


def test_lanes_segments_are_never_shorter_than_32_steps_nor_64_in_the_backward(monkeypatch):
    """Cortex's B8 T1024 H64 (8 programs): the grid would want 66 segments of the backward; at most
    16 (64 steps each: 1.28x faster than 32 of 32 on the H200), the forward's 32 (one 32-step tile
    each) unchanged; B8 T512 H128: 8 backward segments; B4 T128 H64: 4 both ways (the backward's
    floor of 4 segments where 32-step ones allow)."""
    from kcollect.kernels.rtu import config

    device = opcheck.fake_gpu(monkeypatch)
    cortex = config.lanes(8, 1024, 64, device)
    assert (cortex.segments, cortex.bwd_segments, cortex.chunk) == (32, 16, 16)
    assert config.lanes(8, 512, 128, device).bwd_segments == 8
    short = config.lanes(4, 128, 64, device)
    assert (short.segments, short.bwd_segments) == (4, 4)


@pytest.mark.parametrize("low_rank", [False, True], ids=["diag", "lowrank"])
def test_lanes_backward_folded_sums_match_reference(monkeypatch, low_rank):
    # the lanes backward's parameter sums with lambda folded in (bf16 and fp16 by default), forced on
    # fp32 inputs so that their own error shows: short memories (r down to 1e-4, where d = c - u
    # cancels most) and long ones, resets, several segments; every gradient within 3e-5 of the
    # float64 reference's largest (the exact sums: about 1e-7, the folded ones a few 1e-6)
    from kcollect.kernels.rtu import lanes as lanes_module

    monkeypatch.setattr(lanes_module, "FOLD_SUMS", True)
    B, T, H = 2, 37, 11
    x = torch.randn(B, T, H)
    r = torch.cat([torch.empty(H - 5).uniform_(1e-4, 0.05), torch.empty(5).uniform_(0.5, 0.999)])
    nu, th = torch.log(-torch.log(r)), torch.log(torch.empty(H).uniform_(0.01, 3.0))
    maps = (torch.randn(2, H, 3), torch.randn(2, H, 3)) if low_rank else (torch.randn(H), torch.randn(H))
    resets = torch.rand(B, T) < 0.1
    dy = torch.randn(B, T, 2 * H)
    leaves = [t.clone().requires_grad_() for t in (x, nu, th, *maps)]
    with forced(lanes(3, 3)):
        SPEC.provider("triton").fn(x=leaves[0], nu_log=leaves[1], theta_log=leaves[2], map1=leaves[3],
                                   map2=leaves[4], resets=resets).backward(dy)
    exact = [t.double().clone().requires_grad_() for t in (x, nu, th, *maps)]
    reference(*exact, resets).backward(dy.double())
    for name, got, want in zip(("x", "nu_log", "theta_log", "map1", "map2"), leaves, exact):
        err = ((got.grad.double() - want.grad).abs().max() / want.grad.abs().max()).item()
        assert err <= 3e-5, f"d{name}: {err:.3g}"


@pytest.mark.parametrize("dtype, bwd_segments, folded", [(torch.bfloat16, 15, True), (torch.bfloat16, 16, False),
                                                         (torch.bfloat16, 3, True), (torch.float32, 3, False)])
def test_lanes_backward_folds_in_low_precision_below_16_segments(monkeypatch, dtype, bwd_segments, folded):
    # folded sums in bf16 (and fp16) unless the backward runs in 16 segments or more (slower there on
    # the H200); fp32 keeps the exact sums; the gradients match the reference either way
    from kcollect.kernels.rtu import lanes as lanes_module

    launches = opcheck.record_launches(monkeypatch, lanes_module, "_bwd")
    B, T, H = 1, 8 * bwd_segments, 5  # CPU chunks of 8 steps: one chunk a segment
    leaves = [t.requires_grad_() for t in (torch.randn(B, T, H).to(dtype), torch.randn(H) - 1, torch.randn(H) - 1,
                                            torch.randn(H), torch.randn(H))]
    resets = torch.rand(B, T) < 0.1
    with forced(lanes(2, bwd_segments)):
        y = SPEC.provider("triton").fn(x=leaves[0], nu_log=leaves[1], theta_log=leaves[2], map1=leaves[3],
                                       map2=leaves[4], resets=resets)
    dy = torch.randn(y.shape, dtype=torch.float64)
    y.backward(dy.to(dtype))
    assert launches and {kw["FOLD"] for _, kw in launches} == {folded}
    exact = [t.detach().double().requires_grad_() for t in leaves]
    reference(*exact, resets).backward(dy.to(dtype).double())
    for name, got, want in zip(("x", "nu_log", "theta_log", "map1", "map2"), leaves, exact):
        assert verify.rel_error(got.grad, want.grad) <= SPEC.tolerance[dtype], name


def test_lanes_forward_walks_time_whole_from_half_the_warps_target(monkeypatch):
    """On a GPU the lanes forward splits time until the grid holds _LANES_WARPS_PER_SM warps an SM,
    but from half of them on it walks time whole (a second segment's ends pass reads x again):
    with 132 SMs, 1024 programs take one segment where cdiv would ask for 2, 128 keep cdiv's 9, and
    the backward's count is not the forward's rule."""
    from kcollect.kernels.rtu import config

    monkeypatch.setattr(config, "arch", lambda device: "sm90")
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    whole = config.lanes(64, 1024, 1024, "cuda", resets=True)
    split = config.lanes(8, 8192, 1024, "cuda", resets=True)
    assert whole.segments == 1 and split.segments == 9 and split.bwd_segments == 5
    edge = config.lanes(33, 1024, 1024, "cuda")  # 528 programs: 4 warps an SM exactly
    assert edge.segments == 1 and config.lanes(32, 1024, 1024, "cuda").segments == 3
