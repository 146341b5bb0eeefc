"""layer_norm against its float64 reference: every provider, mode and dtype, on awkward shapes, plus
the paths and numerics specific to LayerNorm (wide rows, large row offsets, the dw/db partial sums)."""
import os
import random

import pytest
import torch

import opcheck as gate
from kcollect import verify
from kcollect.kernels import layer_norm

SPEC = layer_norm.SPEC
SHAPES = [
    {"M": 37, "N": 1000},   # several rows per program, tail masked, width only 8-aligned
    {"M": 1, "N": 4099},    # one row, unaligned width
    {"M": 5, "N": 7},       # tiny
    {"M": 3, "N": 20000},   # wide: chunked forward, row sums + column-blocked backward
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


def _inputs(m, n, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * 2 + offset
    w = 1 + 0.2 * torch.randn(n, generator=g)
    b = 0.1 * torch.randn(n, generator=g)
    return x, w, b


@pytest.mark.parametrize("n", [1000, 20000], ids=["fused", "wide"])
def test_every_element_and_gradient(n):
    # Elementwise (not norm-wise) in fp32: a skipped block, row or column block would show.
    x, w, b = _inputs(5, n, seed=1)
    x, w, b = (t.requires_grad_(True) for t in (x, w, b))
    y = layer_norm.layer_norm(x, w, b, 1e-5)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b), dy)
    xr, wr, br = (t.detach().double().requires_grad_(True) for t in (x, w, b))
    yr = layer_norm.reference(xr, wr, br, 1e-5)
    want = torch.autograd.grad(yr, (xr, wr, br), dy.double())
    torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-5)
    for name, g_, w_ in zip(("dx", "dw", "db"), got, want):
        torch.testing.assert_close(g_.double(), w_, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("n", [1000, 20000], ids=["fused", "wide"])
def test_large_row_offset_keeps_variance_exact(n):
    # Rows centred at 1e4 with unit spread: E[x^2] - E[x]^2 in fp32 loses every digit of the
    # variance there; the two-pass (fused) and Chan-merged (wide) variances must not.
    x, w, b = _inputs(4, n, seed=2, offset=1e4)
    y, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    xd = x.double()
    var = xd.var(dim=-1, unbiased=False)
    torch.testing.assert_close(mean.double(), xd.mean(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(rstd.double(), 1 / torch.sqrt(var + 1e-5), rtol=1e-3, atol=0)
    want = layer_norm.reference(xd, w.double(), b.double(), 1e-5)
    assert verify.rel_error(y, want) < 1e-3


def test_dw_db_partials_summed_over_many_groups():
    # The launcher makes at most 2 groups per SM (8 on the CPU), so drive the final sum kernel
    # directly with more groups than one block of it holds, and a width that is not 16-aligned.
    groups, n2 = 70, 2 * 1000
    part = torch.randn(groups, n2)
    out = torch.empty(n2, dtype=torch.bfloat16)
    layer_norm._ln_sum_partials[(triton_cdiv(n2, layer_norm._SUM_BLOCK_C),)](
        part, out, groups, n2, BLOCK_G=layer_norm._SUM_BLOCK_G, BLOCK_C=layer_norm._SUM_BLOCK_C,
        N_ALIGN=layer_norm._align(n2))
    torch.testing.assert_close(out, part.sum(0).to(torch.bfloat16), rtol=1e-2, atol=1e-2)


def triton_cdiv(a, b):
    return (a + b - 1) // b


def test_leading_dims_are_flattened():
    x, w, b = _inputs(6, 64, seed=3)
    x3 = x.view(2, 3, 64)
    y = layer_norm.layer_norm(x3, w, b)
    assert y.shape == x3.shape
    torch.testing.assert_close(y.view(6, 64), layer_norm.layer_norm(x, w, b))


def test_alignment_hint():
    assert [layer_norm._align(n) for n in (1000, 4096, 4099, 5000, 7, 6)] == [8, 16, 1, 8, 1, 2]


def test_bad_weight_and_bias_are_refused():
    x, w, b = _inputs(2, 8)
    with pytest.raises(ValueError, match="weight and bias must have shape"):
        layer_norm.layer_norm(x, w[:4], b)
    with pytest.raises(ValueError, match="share a dtype"):
        layer_norm.layer_norm(x, w, b.double())


# ---------------------------------------------------------------------------------------------
# Launch variants (keyword options for the GPU A/B, benchmarks/layer_norm_ab.py): each must match
# the float64 reference in every dtype, on awkward shapes, with fresh random inputs.

FWD_VARIANTS = {
    "rows+warps": {"rows": 4, "num_warps": 8},
    "per_thread8": {"per_thread": 8},
    "per_thread32+cap": {"per_thread": 32, "maxnreg": 64},
    "persistent": {"persistent": True},
    "persistent+prefetch": {"persistent": True, "prefetch": True},
    "prefetch (1 tile each)": {"prefetch": True, "persistent": False, "rows": 2},
    "one tile per program": {"persistent": False, "prefetch": False},
    "evict_first": {"policy": "evict_first"},
    "register path 32768": {"max_block": 32768},
    "wide chunk+warps+2/SM": {"max_block": 4096, "chunk": 2048, "wide_warps": 8, "wide_per_sm": 2, "lines": False},
    # _ln_fwd_lines: full chunks and a masked tail (5000, 20000), a row of one partial chunk (1000),
    # programs striding over the rows or one a row
    "lines": {"max_block": 512, "lines": True, "chunk": 1024},
    "lines 1/SM 8 warps": {"max_block": 512, "lines": True, "chunk": 2048, "lines_programs": 1, "wide_warps": 8},
    "lines rows": {"max_block": 512, "lines": True, "lines_programs": "rows"},
    "lines wb at use": {"max_block": 512, "lines": True, "chunk": 1024, "lines_wb_ahead": False},
    "lines wb ahead": {"max_block": 512, "lines": True, "chunk": 1024, "lines_wb_ahead": True},
    "stream (Chan merge)": {"max_block": 512, "lines": False, "chunk": 1024},
    "w and b loaded early": {"early_wb": True, "persistent": False, "prefetch": False},
    "w and b loaded late": {"early_wb": False, "persistent": False, "prefetch": False},
    "early w and b, 4 rows": {"early_wb": True, "rows": 4, "persistent": False, "prefetch": False},
}
VARIANT_SHAPES = [(37, 1000), (11, 5000), (3, 20000), (1, 4099)]


def _fwd_check(x, w, b, y, mean, rstd, tol):
    xd = x.double()
    want = layer_norm.reference(xd, w.double(), b.double(), 1e-5)
    assert verify.rel_error(y, want) < tol
    torch.testing.assert_close(mean.double(), xd.mean(dim=-1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rstd.double(), 1 / torch.sqrt(xd.var(dim=-1, unbiased=False) + 1e-5),
                               rtol=1e-3, atol=0)


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("name", list(FWD_VARIANTS))
def test_forward_variants(name, dtype):
    kw = FWD_VARIANTS[name]
    for m, n in VARIANT_SHAPES:
        if "max_block" not in kw and triton_next_pow2(n) > layer_norm._FWD_MAX_BLOCK:
            continue  # wide row: the register-path options do not apply
        x, w, b = (t.to(dtype) for t in _inputs(m, n, seed=random.randrange(2**31), offset=3.0))
        y, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5, **kw)
        _fwd_check(x, w, b, y, mean, rstd, SPEC.tolerance[dtype])


BWD_VARIANTS = {
    "rows+warps": {"rows": 2, "num_warps": 8},
    "no prefetch, evict_last": {"prefetch": False, "policy": "evict_last"},
    "w re-read": {"w_reload": True},
    "partial sums 8x8": {"sum_rows": 8, "sum_block": 8},
    "stats at use": {"stats_ahead": False},
    "stats ahead, 2 rows, evict_first": {"stats_ahead": True, "rows": 2, "policy": "evict_first"},
    "two sums (c1, c2 not fused)": {"fused_sums": False},
    "two sums, 2 rows": {"fused_sums": False, "rows": 2},
    "registers up to 32768 (w re-read)": {"max_block": 32768},
    "registers up to 32768, prefetch": {"max_block": 32768, "prefetch": True, "num_warps": 8},
    "column blocks 2048": {"max_block": 1024, "chunk": 2048},
    "column blocks, 2 rows, 1 group/SM": {"max_block": 1024, "chunk": 1024, "rows": 2, "groups_per_sm": 1},
    # _ln_bwd_coop, the GPU's wide-row backward: one segment a row on the CPU (test_coop_backward_on_the_gpu
    # runs it in segments)
    "coop": {"max_block": 256, "wide": "coop"},
    "coop 8 warps": {"max_block": 256, "wide": "coop", "coop_warps": 8},
}


def test_backward_wide_path_must_be_known_and_coop_segments_need_a_gpu():
    x, w, b = _inputs(3, 1000)
    _, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    with pytest.raises(ValueError, match="'cols' or 'coop'"):
        layer_norm.layer_norm_backward(x, x, w, mean, rstd, max_block=256, wide="rows")
    with pytest.raises(ValueError, match="need a GPU"):
        layer_norm.layer_norm_backward(x, x, w, mean, rstd, max_block=256, wide="coop", coop_seg=256)


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the coop kernel's segments wait for each other: a GPU only")
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims,seg", [((37, 5003), 2048), ((300, 1000), 256), ((2048, 65536), None)],
                         ids=["37x5003-seg2048", "300x1000-seg256", "2048x65536-default"])
def test_coop_backward_on_the_gpu(dtype, dims, seg):
    # S > 1 segments a row (3 with the last partial, 4, 32), row groups striding; rows offset from 0
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    x = (torch.randn(dims, generator=g, device="cuda") * 2 + 1).to(dtype)
    w = (1 + 0.2 * torch.randn(dims[1], generator=g, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(dims[1], generator=g, device="cuda")).to(dtype)
    dy = torch.randn(dims, generator=g, device="cuda").to(dtype)
    _, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    kw = dict(max_block=256 if seg else layer_norm._BWD_MAX_BLOCK, wide="coop", coop_seg=seg)
    got = layer_norm.layer_norm_backward(dy, x, w, mean, rstd, **kw)
    xr, wr, br = (t.double().requires_grad_(True) for t in (x, w, b))
    want = torch.autograd.grad(layer_norm.reference(xr, wr, br, 1e-5), (xr, wr, br), dy.double())
    for g_, w_ in zip(got, want):
        assert verify.rel_error(g_, w_) < SPEC.tolerance[dtype]
    assert torch.equal(got[0], layer_norm.layer_norm_backward(dy, x, w, mean, rstd, **kw)[0])  # deterministic


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("name", list(BWD_VARIANTS))
def test_backward_variants(name, dtype):
    kw = BWD_VARIANTS[name]
    for m, n in VARIANT_SHAPES:
        x, w, b = _inputs(m, n, seed=random.randrange(2**31), offset=1.0)
        xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
        yd = layer_norm.reference(xd, wd, bd, 1e-5)
        dy = torch.randn(m, n, dtype=torch.float64)
        want = torch.autograd.grad(yd, (xd, wd, bd), dy)
        x, w, dyt = x.to(dtype), w.to(dtype), dy.to(dtype)
        _, mean, rstd = layer_norm.layer_norm_forward(x, w, b.to(dtype), 1e-5)
        got = layer_norm.layer_norm_backward(dyt, x, w, mean, rstd, **kw)
        # the reference's gradients at the rounded inputs would differ by the rounding: compare with
        # the reference on the dtype's inputs
        xr, wr, br = (t.double().requires_grad_(True) for t in (x, w, b.to(dtype)))
        want = torch.autograd.grad(layer_norm.reference(xr, wr, br, 1e-5), (xr, wr, br), dyt.double())
        for g_, w_ in zip(got, want):
            assert verify.rel_error(g_, w_) < SPEC.tolerance[dtype], (name, m, n)


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()
