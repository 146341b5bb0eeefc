"""softmax against its float64 reference: every provider, mode and dtype, on awkward shapes, plus
the streaming path for wide rows (-inf chunks, huge logits) and the launch variants."""
import random

import pytest
import torch

import gate
from kcollect import verify
from kcollect.kernels import softmax

SPEC = softmax.SPEC
SHAPES = [
    {"M": 37, "N": 1000},   # several rows per program, tail masked, width only 8-aligned
    {"M": 1, "N": 4099},    # one row, unaligned width
    {"M": 5, "N": 7},       # tiny
    {"M": 3, "N": 40000},   # streaming path: 3 chunks per row (5 in fp32), the last partial
    {"M": 2, "N": 20000},   # bf16/fp16: one 32768 block in registers, 32 warps; fp32: streaming
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
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape


# (n, softmax_forward keywords): the register path, one 32768 block in registers, and the streaming
# path with many chunks per row
PATHS = {"fused": (3000, {}), "reg32k": (20000, {"max_block": 32768}),
         "stream": (20000, {"chunk": 1024})}


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
    "stream-256-rows": ({"max_block": 0, "chunk": 256, "programs_per_sm": "rows"}, _NARROW),
    "stream-256-pps1": ({"max_block": 0, "chunk": 256, "programs_per_sm": 1}, _NARROW),
    "stream-1024-pps2-16w": ({"max_block": 0, "chunk": 1024, "programs_per_sm": 2, "max_warps": 16}, _NARROW),
    # persistent register-path forward (CPU: 4 "SMs"), several tiles per program, the last partial
    "persist0": ({"persist": 0, "max_block": 32768}, [{"M": 9, "N": 20000}]),
    "persist1": ({"persist": 1}, [{"M": 37, "N": 1000}, {"M": 11, "N": 4099}, {"M": 9, "N": 20000}]),
    "persist2": ({"persist": 2}, [{"M": 37, "N": 1000}, {"M": 5, "N": 7}]),
    "tile8k": ({"tile_bytes": 8192}, [{"M": 37, "N": 1000}, {"M": 3, "N": 4099}]),
    "evict_last": ({"policy": "evict_last"}, [{"M": 37, "N": 1000}, {"M": 9, "N": 20000}]),
    "no_hint": ({"policy": ""}, [{"M": 37, "N": 1000}]),
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
    bwd_kw = {k: v for k, v in kw.items() if k != "persist"}  # a forward-only option
    got = y if mode == "fwd" else softmax.softmax_backward(dys[0].to(dtype), y, **bwd_kw)
    error = verify.rel_error(got, want[0])
    assert error <= SPEC.tolerance[dtype], f"{variant} {mode} {dtype} {dims}: error {error:.3g}"


def test_leading_dims_are_flattened():
    x = torch.randn(2, 3, 50)
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-7)


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        softmax.softmax(torch.empty(0, 8))
