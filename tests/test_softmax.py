"""softmax against its float64 reference: every provider, mode and dtype, on awkward shapes, plus
the streaming and split paths for wide rows (-inf chunks, huge logits), the launch variants and
the rule that picks the split path."""
import os
import random

import pytest
import torch
from triton.runtime.jit import KernelInterface

import opcheck as gate
from kcollect import verify
from kcollect.kernels import softmax

SPEC = softmax.SPEC
SHAPES = [
    {"M": 37, "N": 1000},   # several rows per program, tail masked, width only 8-aligned
    {"M": 1, "N": 4099},    # one row, unaligned width
    {"M": 5, "N": 7},       # tiny
    {"M": 3, "N": 40000},   # few wide rows: the split path, 10 segments per row, the last partial
    {"M": 2, "N": 20000},   # bf16/fp16: one 32768 block in registers, 32 warps; fp32: split path
]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("mode", SPEC.modes)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: "x".join(map(str, d.values())))
def test_matches_reference(provider, mode, dtype, dims):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    if provider == "compile" and dims["M"] != 37:
        pytest.skip("compile is checked once per mode and dtype: each shape costs a CPU compile")
    seed = _well_conditioned_seed(dims, dtype, mode)
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=seed)
    assert result.ok, f"{provider} {mode} {dtype} {dims} seed {seed}: error {result.error:.3g} > {result.tolerance:.3g}"


def _well_conditioned_seed(dims, dtype, mode):
    """A fresh seed, redrawn while a half-precision backward would be ill-conditioned: where one
    entry dominates a row, dx = y (dy - sum(y dy)) cancels and the dtype's rounding of the saved y
    (which every provider keeps, eager included) is amplified past any fixed tolerance: at 1x4099
    bf16, seed 556 has a largest probability of 0.99 and gives relative errors of 0.32 (ours) and
    0.18 (eager) against the 0.016 tolerance. Such rows (largest probability over 0.5) are redrawn."""
    while True:
        seed = random.randrange(2**31)
        if mode == "fwd" or dtype == torch.float32:
            return seed
        x = SPEC.make_inputs(dims, torch.float32, "cpu", seed)["x"].double()
        if torch.softmax(x, -1).max() <= 0.5:
            return seed


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


# (n, softmax_forward keywords): the register path, one 32768 block in registers, the streaming
# path with many chunks per row (4 rows of 20000 fp32 would split: split=False), and the split
# path (20 segments per row, whole -inf segments in row 0) forced and by the automatic rule
PATHS = {"fused": (3000, {}), "reg32k": (20000, {"max_block": 32768}),
         "stream": (20000, {"chunk": 1024, "split": False}),
         "split": (20000, {"split": True, "split_seg": 1024}), "split-auto": (70001, {}),
         "coop": (20000, {"max_block": 1024, "split": False, "coop": True}),  # (CPU: one segment a row)
         "lines": (20000, {"chunk": 1024, "split": False, "lines": True, "max_block": 0, "coop": False})}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN row, by design
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # interpreter: 1 / 0 for that row
@pytest.mark.parametrize("path", PATHS)
def test_minus_infinity_entries(path):
    # Masked attention scores: -inf entries, whole -inf chunks (stream: leading -inf chunks must
    # not make the running sum NaN), and an all -inf row, which gives NaN in PyTorch as in ours.
    n, kw = PATHS[path]
    x = torch.randn(4, n) * 2
    x[0, : n // 2] = -float("inf")      # covers whole chunks on the streaming path
    x[1, ::3] = -float("inf")
    x[2, :] = -float("inf")
    y = softmax.softmax(x) if not kw else softmax.softmax_forward(x, **kw)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7, equal_nan=True)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("path", PATHS)
def test_huge_logits_do_not_overflow(path):
    n, kw = PATHS[path]
    x = torch.randn(3, n) * 1e4
    x[1] += 1e30
    y = softmax.softmax(x) if not kw else softmax.softmax_forward(x, **kw)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


# A/B variants (keywords of softmax_forward / softmax_backward), each on small awkward shapes:
# small chunks give the streaming path many per row and a partial last one.
_NARROW = [{"M": 5, "N": 1000}, {"M": 3, "N": 4099}, {"M": 5, "N": 7}, {"M": 4, "N": 2048}]
VARIANTS = {
    # one row of next_pow2(N) = 32768 (65536) held by one program of 32 warps
    "reg32k-32w": ({"max_block": 32768, "max_warps": 32}, [{"M": 3, "N": 20000}, {"M": 37, "N": 1000}]),
    "reg64k-32w": ({"max_block": 65536, "max_warps": 32}, [{"M": 2, "N": 40000}]),
    # streaming path: few rows would take the split path, so split=False
    "stream-256-rows": ({"max_block": 0, "chunk": 256, "programs_per_sm": "rows", "split": False}, _NARROW),
    "stream-256-pps1": ({"max_block": 0, "chunk": 256, "programs_per_sm": 1, "split": False}, _NARROW),
    "stream-1024-pps2-16w": ({"max_block": 0, "chunk": 1024, "programs_per_sm": 2, "max_warps": 16,
                              "split": False}, _NARROW),
    "stream-default": ({"split": False}, [{"M": 3, "N": 40000}]),
    # split path by the automatic rule (default 4096 segments): 18 segments, the last one of 370
    # elements; 65536 = 16 whole segments (no tail)
    "split-auto": ({}, [{"M": 1, "N": 70001}, {"M": 3, "N": 70001}, {"M": 2, "N": 65536}]),
    # forced: many segments and a masked tail, whole segments (8192), rows that fit in registers,
    # more rows than the rule splits, one segment wider than the row (S = 1)
    "split-1k": ({"split": True, "split_seg": 1024},
                 [{"M": 2, "N": 70001}, {"M": 3, "N": 8192}, {"M": 37, "N": 1000}, {"M": 5, "N": 7}]),
    # unaligned width (N_ALIGN = 1), 33 segments: S_BLOCK 64 with 31 padding lanes
    "split-128": ({"split": True, "split_seg": 128}, [{"M": 3, "N": 4099}]),
    "split-8k-evict_first": ({"split": True, "split_seg": 8192, "policy": "evict_first"}, [{"M": 2, "N": 20000}]),
    # persistent register-path forward (CPU: 4 "SMs"), several tiles per program, the last partial
    "persist0": ({"persist": 0, "max_block": 32768}, [{"M": 9, "N": 20000}]),
    "persist1": ({"persist": 1}, [{"M": 37, "N": 1000}, {"M": 11, "N": 4099}, {"M": 9, "N": 20000}]),
    "persist2": ({"persist": 2}, [{"M": 37, "N": 1000}, {"M": 5, "N": 7}]),
    "tile8k": ({"tile_bytes": 8192}, [{"M": 37, "N": 1000}, {"M": 3, "N": 4099}]),
    "evict_last": ({"policy": "evict_last"}, [{"M": 37, "N": 1000}, {"M": 9, "N": 20000}]),
    "no_hint": ({"policy": ""}, [{"M": 37, "N": 1000}]),
    # rows up to 65536 in registers, one row per program (the bf16 default above 32768 on the GPU;
    # the packed widening itself is PTX: see the compile test below); 17 rows, more than the split
    # path takes; lean off at 40000: the stream
    "lean": ({"lean": True}, [{"M": 17, "N": 40000}, {"M": 37, "N": 1000}]),
    "not-lean": ({"lean": False}, [{"M": 17, "N": 40000}]),
    # the GPU's path for many rows too wide for registers; on the CPU one segment a row (its
    # programs would wait for each other: test_coop_on_the_gpu runs it in segments)
    "coop": ({"max_block": 256, "split": False, "coop": True}, [{"M": 37, "N": 1000}, {"M": 17, "N": 4099}]),
    # the forward's lines path where the stream would run (the backward ignores `lines`): whole
    # chunks with a masked tail, no tail, a row narrower than one chunk (N_FULL = 0), an unaligned
    # width, more rows than programs (CPU: 4 "SMs") and one program a row
    "lines": ({"max_block": 0, "split": False, "coop": False, "lines": True, "chunk": 1024},
              [{"M": 9, "N": 5003}, {"M": 3, "N": 4096}, {"M": 5, "N": 1000}, {"M": 3, "N": 4099}, {"M": 5, "N": 7}]),
    "lines-rows-16w": ({"max_block": 0, "split": False, "coop": False, "lines": True, "chunk": 512,
                        "programs_per_sm": "rows", "max_warps": 16}, [{"M": 6, "N": 2050}]),
    "lines-default-chunk": ({"max_block": 0, "split": False, "coop": False, "lines": True}, [{"M": 3, "N": 40000}]),
}
VARIANT_CASES = [(v, d) for v, (_, shapes) in VARIANTS.items() for d in shapes]


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("variant,dims", VARIANT_CASES,
                         ids=[f"{v}-{d['M']}x{d['N']}" for v, d in VARIANT_CASES])
def test_variant_matches_reference(variant, dims, dtype, mode):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    kw = VARIANTS[variant][0]
    seed = random.randrange(2**31)
    x = SPEC.make_inputs(dims, dtype, "cpu", seed)["x"]
    dys, want = verify.reference_answers(SPEC, {"x": x}, mode, seed + 1)
    y = softmax.softmax_forward(x, **kw)
    bwd_kw = {k: v for k, v in kw.items() if k not in ("persist", "lines")}  # forward-only options
    got = y if mode == "fwd" else softmax.softmax_backward(dys[0].to(dtype), y, **bwd_kw)
    error = verify.rel_error(got, want[0])
    assert error <= SPEC.tolerance[dtype], f"{variant} {mode} {dtype} {dims} seed {seed}: error {error:.3g}"


def test_leading_dims_are_flattened():
    x = torch.randn(2, 3, 50)
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        softmax.softmax(torch.empty(0, 8))


# The split path's combine, forward: a segment whose max is far above the others' (scaled by 50:
# it takes all the mass, so the others' sums must be rescaled by exp(m_j - m), not added as they
# are), and a single spike worth as much as the rest of its row together (its logsumexp: both
# sides of the combine matter). Row 2: the spike in the masked tail segment. Row 3: every logit
# far below 0 (the padding lanes of the partials must not count as a max of 0: exp underflows).
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("kw", [{}, {"split": True, "split_seg": 1024}], ids=["auto", "seg1k"])
def test_split_combines_far_apart_maxima(kw, dtype):
    m, n = 4, 70001
    x = SPEC.make_inputs({"M": m, "N": n}, torch.float32, "cpu", random.randrange(2**31))["x"]
    x[0, 4096:8192] *= 50
    x[1, 5000] = torch.logsumexp(x[1], 0)
    x[2, n - 100] = torch.logsumexp(x[2], 0)
    x[3] -= 1000
    x = x.to(dtype)
    _, want = verify.reference_answers(SPEC, {"x": x}, "fwd", 0)
    error = verify.rel_error(softmax.softmax_forward(x, **kw), want[0])
    assert error <= SPEC.tolerance[dtype], f"{kw} {dtype}: error {error:.3g}"


def launched(monkeypatch, call) -> list[tuple[str, tuple]]:
    """(kernel name, grid) of each launch call() makes; nothing runs."""
    calls = []
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *a, **k: calls.append((self.fn.__name__, tuple(grid))))
    call()
    return calls


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_split_rule_picks_the_path(monkeypatch, mode):
    def kernels(m, n, dtype=torch.bfloat16, **kw):
        x = torch.empty(m, n, dtype=dtype)
        if mode == "fwd":
            return launched(monkeypatch, lambda: softmax.softmax_forward(x, **kw))
        return launched(monkeypatch, lambda: softmax.softmax_backward(x, x, **kw))

    few = softmax._SPLIT_MAX_ROWS
    first, second = [k.__name__ for k in (softmax._FWD_SPLIT if mode == "fwd" else softmax._BWD_SPLIT)[:2]]
    # rows that would stream, few of them: split, grid (rows, segments of 4096)
    assert kernels(few, 128256) == [(first, (few, 32)), (second, (few, 32))]
    assert kernels(1, 65537, torch.float32, split_seg=2048) == [(first, (1, 33)), (second, (1, 33))]
    # more rows: stream (the forward: its lines path; CPU, so no coop); rows that fit in registers:
    # the register path; split=False / True force
    streamed = "_softmax_fwd_lines" if mode == "fwd" else "_softmax_bwd_stream"
    assert [k for k, _ in kernels(few + 1, 128256)] == [streamed]
    assert [k for k, _ in kernels(1, 128256, split=False)] == [streamed]
    # rows in registers: split over 16384 elements (1 x 32000), not at 16384
    assert kernels(1, 32000) == [(first, (1, 8)), (second, (1, 8))]
    assert "split" not in kernels(1, 16384)[0][0]
    assert "split" not in kernels(few + 1, 32000)[0][0]
    assert kernels(1, 32000, split=True, split_seg=8192) == [(first, (1, 4)), (second, (1, 4))]


def test_split_segment_is_checked():
    x = torch.randn(1, 5000)
    with pytest.raises(ValueError, match="power of two"):
        softmax.softmax_forward(x, split=True, split_seg=1000)
    with pytest.raises(ValueError, match="segments"):
        softmax.softmax_forward(x, split=True, split_seg=4)


_LEAN_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import softmax
sig = {"y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16", "M": "i32", "N": "i32", "ROWS": "constexpr",
       "BLOCK_N": "constexpr", "N_ALIGN": "constexpr", "POLICY": "constexpr", "ASM": "constexpr"}
fwd_sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "ROWS": "constexpr", "BLOCK_N": "constexpr",
           "N_ALIGN": "constexpr", "POLICY": "constexpr", "ASM": "constexpr"}
for asm in (False, True):
    const = {"ROWS": 1, "N_ALIGN": 16, "POLICY": "evict_last", "ASM": asm}
    for name, fn, s, block, aligned in (("bwd", softmax._softmax_bwd, sig, 32768, ("y_ptr", "dy_ptr", "dx_ptr", "N")),
                                        ("fwd", softmax._softmax_fwd, fwd_sig, 65536, ("x_ptr", "y_ptr", "N"))):
        r = report(fn, s, {**const, "BLOCK_N": block}, 32, aligned=aligned)
        print(name, asm, r["stack"], sum(v for k, v in r["sass_ops"].items() if k.startswith(("LDL", "STL"))))
"""


def test_lean_kernels_assemble_for_sm90_and_do_not_spill():
    # The GPU half of _utils.widen is PTX, which the interpreter cannot run: compile the kernels
    # that use it offline for sm_90 (their own process, without TRITON_INTERPRET) at the blocks it
    # is for, the backward's 32768 and the forward's 65536. Without it both spill there; with it,
    # they must assemble and (next to) not spill.
    stdout = gate.run_offline_compile(_LEAN_COMPILE)
    spills = {tuple(line.split()[:2]): tuple(map(int, line.split()[2:])) for line in stdout.strip().splitlines()}
    assert spills["bwd", "True"] == (0, 0)
    # the forward's 64K row: a word or two at most (Triton 3.6: 8 bytes, one store and one load;
    # unpacked, 43 stores and 44 loads a thread)
    stack, spill_ops = spills["fwd", "True"]
    assert stack <= 16 and spill_ops <= 4


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the PTX path of _utils.widen runs on a CUDA GPU only")
def test_lean_backward_on_the_gpu_is_bitwise_the_plain_one():
    x = torch.randn(64, 32000, device="cuda").to(torch.bfloat16)
    y = softmax.softmax_forward(x)
    dy = torch.randn(64, 32000, device="cuda").to(torch.bfloat16)
    assert torch.equal(softmax.softmax_backward(dy, y, lean=True), softmax.softmax_backward(dy, y, lean=False))


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the coop kernels' segments wait for each other: a GPU only")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims,seg", [((37, 5003), 2048), ((300, 1000), 256), ((1024, 262144), None)],
                         ids=["37x5003-seg2048", "300x1000-seg256", "1024x262144-default"])
def test_coop_on_the_gpu(dtype, dims, seg):
    # S > 1 segments a row (3, the last partial; 4; 128), row groups striding; -inf entries, a whole
    # -inf row (NaN, as PyTorch), a segment far above the others, every logit far below 0, whole
    # segments of -inf beside logits far below 0
    m, n = dims
    x = SPEC.make_inputs({"M": m, "N": n}, torch.float32, "cuda", random.randrange(2**31))["x"]
    x[0, : n // 2] = -float("inf")
    x[1, ::3] = -float("inf")
    x[2, :] = -float("inf")
    x[3, n // 4: n // 2] *= 50
    x[4] -= 1000
    x[5] -= 1000
    x[5, : n // 2] = -float("inf")
    x = x.to(dtype)
    kw = dict(max_block=256 if seg else None, split=False, coop=True, coop_seg=seg)
    y = softmax.softmax_forward(x, **kw)
    want = torch.softmax(x.double(), dim=-1)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3, 4, 5]]).all()
    keep = torch.arange(m, device="cuda") != 2
    assert verify.rel_error(y[keep], want[keep]) <= SPEC.tolerance[dtype]
    dy = torch.randn(m, n, device="cuda").to(dtype)
    yk = y[keep].contiguous()
    dx = softmax.softmax_backward(dy[keep].contiguous(), yk, **kw)
    y64, dy64 = yk.double(), dy[keep].double()
    assert verify.rel_error(dx, y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))) <= SPEC.tolerance[dtype]
    assert torch.equal(y.nan_to_num(), softmax.softmax_forward(x, **kw).nan_to_num())  # deterministic


@pytest.mark.parametrize("n,seg", [(65536, softmax._COOP_SEG), (65537, softmax._COOP_SEG_MID),
                                   (128256, softmax._COOP_SEG_MID), (131072, softmax._COOP_SEG_MID),
                                   (131073, softmax._COOP_SEG), (262144, softmax._COOP_SEG)])
def test_coop_segments_by_width(monkeypatch, n, seg):
    # the backward's coop segments: 4096 for rows of 65537-131072 elements, 2048 otherwise (measured:
    # see _COOP_SEG_MID), those of 4096 at 8 warps (_COOP_WARPS_MID), the rest at 4; the forward's:
    # 4096 at 4 warps at every width (_FWD_COOP_SEG); a given coop_seg or coop_warps is passed on
    asked = []

    def plan(kernel, tensors, M, N, seg, default_seg, warps, *args, **kw):
        asked.append((kernel, seg, default_seg, warps))
        return None  # no group fits: the launcher falls back to the stream, which is not run here

    monkeypatch.setattr(softmax, "coop_plan", plan)
    y = torch.empty(softmax._SPLIT_MAX_ROWS + 1, n, dtype=torch.bfloat16)  # more rows than the split takes
    launched(monkeypatch, lambda: softmax.softmax_backward(y, y, coop=True))
    launched(monkeypatch, lambda: softmax.softmax_backward(y, y, coop=True, coop_seg=1024, coop_warps=2))
    launched(monkeypatch, lambda: softmax.softmax_forward(y, coop=True))
    bwd_warps = 8 if seg == 4096 else 4
    assert asked == [(softmax._softmax_bwd_coop, None, seg, bwd_warps), (softmax._softmax_bwd_coop, 1024, seg, 2),
                     (softmax._softmax_fwd_coop, None, softmax._FWD_COOP_SEG, 4)]


_COOP_FWD_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import softmax
sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "slot_ptr": "*i64", "M": "i32", "N": "i32", "S": "i32", "iters": "i32",
       "SEG": "constexpr", "S_BLOCK": "constexpr", "N_ALIGN": "constexpr", "L2_AHEAD": "constexpr"}
r = report(softmax._softmax_fwd_coop, sig, {"SEG": softmax._FWD_COOP_SEG, "S_BLOCK": 64, "N_ALIGN": 16,
           "L2_AHEAD": softmax._COOP_L2_AHEAD}, softmax._COOP_WARPS, aligned=("x_ptr", "y_ptr", "slot_ptr", "N"))
print(r["registers"], r["stack"])
"""


def test_forward_coop_fits_three_programs_per_sm():
    # the forward's coop default at 262144 wide (segments of 4096, 4 warps, the L2 prefetch) was
    # measured at 3 programs per SM: at most 168 registers a thread, no spill (sm_90, Triton 3.6;
    # it compiles to 142)
    regs, stack = map(int, gate.run_offline_compile(_COOP_FWD_COMPILE).split())
    assert regs <= 168 and stack == 0, (regs, stack)


def test_forward_coop_default(monkeypatch):
    # by default the forward takes the coop path on the GPU for rows of _FWD_COOP_FROM elements and
    # more, never on the CPU (its programs would wait for each other)
    kernels = []

    def plan(kernel, *args, **kw):
        kernels.append(kernel)
        return None

    monkeypatch.setattr(softmax, "coop_plan", plan)
    x = torch.empty(softmax._SPLIT_MAX_ROWS + 1, softmax._FWD_COOP_FROM, dtype=torch.bfloat16)
    launched(monkeypatch, lambda: softmax.softmax_forward(x))
    assert kernels == []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    launched(monkeypatch, lambda: softmax.softmax_forward(x))
    launched(monkeypatch, lambda: softmax.softmax_forward(x[:, :-1].contiguous()))
    assert kernels == [softmax._softmax_fwd_coop]


def test_backward_coop_register_cap(monkeypatch):
    # the cap applies on sm_90 to the measured launch (segments of 2048 at 4 warps) only
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert softmax._bwd_coop_cap(cuda, 2048, 4) == 96
    assert softmax._bwd_coop_cap(cuda, 4096, 4) is None and softmax._bwd_coop_cap(cuda, 2048, 8) is None
    assert softmax._bwd_coop_cap(cpu, 2048, 4) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert softmax._bwd_coop_cap(cuda, 2048, 4) is None
