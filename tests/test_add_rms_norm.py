"""add_rms_norm against its float64 reference: every provider, mode and dtype, on awkward shapes;
h exactly the rounded sum; one gradient shared by x and residual; unused outputs; wide rows."""
import random

import pytest
import torch

import opcheck as gate
from kcollect import verify
from kcollect.kernels import add_rms_norm as K
from kcollect.kernels import rms_norm

SPEC = K.SPEC
# 37 x 1000: two rows per program, tail masked, several sweeps of the persistent grid;
# 9 x 1536: forward in two column blocks (1024 + 512), two rows per program; 1 x 4099: one row,
# odd width, forward blocks 4096 + 4; 5 x 7: rows narrower than a vector; 3 x 20000: wide-row path
SHAPES = [{"M": 37, "N": 1000}, {"M": 9, "N": 1536}, {"M": 1, "N": 4099}, {"M": 5, "N": 7},
          {"M": 3, "N": 20000}]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


def _id(d):
    return "x".join(map(str, d.values()))


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("mode", SPEC.modes)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=_id)
def test_matches_reference(provider, mode, dtype, dims):
    if gate.too_few_for_bf16(dims, dtype):
        pytest.skip("bf16 over a few dozen elements is too noisy to gate on (tests/gate.py)")
    if provider == "compile" and dims["M"] != 37:
        pytest.skip("compile is checked once per mode and dtype: each shape costs a CPU compile")
    result = verify.check(SPEC, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.ok, f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def _inputs(m, n, dtype):
    inp = SPEC.make_inputs({"M": m, "N": n}, dtype, "cpu", random.randrange(2**31))
    return inp["x"], inp["residual"], inp["w"], inp["eps"]


def _reference_grads(x, r, w, eps, dh, dy):
    xd, rd, wd = (t.double().requires_grad_(True) for t in (x, r, w))
    h, y = K.reference(xd, rd, wd, eps)
    grads = torch.autograd.grad((h, y), (xd, rd, wd), (dh.double(), dy.double()))
    return (h.detach(), y.detach()) + grads


def _rel(got, want):
    return (torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("path", [(rms_norm.MAX_REG_BLOCK, None), (256, "split"), (256, "chunked"),
                                  (256, "packed"), (256, "lines")], ids=["registers", "split", "chunked", "packed",
                                                                         "lines"])
def test_h_is_the_rounded_sum(dtype, path):
    # h is x + residual rounded once to the input dtype, exactly as torch's add (bf16 is left out:
    # the interpreter's fp32->bf16 cast truncates where torch rounds)
    max_block, wide = path
    x, r, w, eps = _inputs(37, 1000, dtype)
    y, h, _ = rms_norm.rms_norm_forward(x, w, eps, residual=r, max_block=max_block, wide=wide)
    assert torch.equal(h, x + r)
    # and y is the norm of that rounded h
    y_plain, _, _ = rms_norm.rms_norm_forward(h, w, eps, max_block=max_block, wide=wide)
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)


@pytest.mark.parametrize("wide", ["split", "chunked", "packed", "lines"])
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
def test_chunked_paths(wide, dtype):
    # max_block=256 sends 6 x 4099 through the wide-row kernels with the residual flags on:
    # _fwd_split (each segment's program writes its h, the row's last program re-reads all of it),
    # _fwd_chunked (writes h in pass 1, re-reads it in pass 2) or _fwd_packed (writes h and keeps
    # it in registers); _bwd_row_dot + _bwd_cols (dh)
    x, r, w, eps = _inputs(6, 4099, dtype)
    dh, dy = torch.randn(6, 4099).to(dtype), torch.randn(6, 4099).to(dtype)
    y, h, rstd = rms_norm.rms_norm_forward(x, w, eps, residual=r, max_block=256, wide=wide)
    dx, dw = rms_norm.rms_norm_backward(dy, h, w, rstd, dh=dh, max_block=256)
    h_ref, y_ref, dx_ref, dr_ref, dw_ref = _reference_grads(x, r, w, eps, dh, dy)
    tol = SPEC.tolerance[dtype]
    for got, want in ((h, h_ref), (y, y_ref), (dx, dx_ref), (dx, dr_ref), (dw, dw_ref)):
        assert _rel(got, want) <= tol


# The A/B variants (benchmarks/rms_norm_ab.py) with the residual flags on: forward knobs of
# rms_norm_forward (see tests/test_rms_norm.py for the shapes), backward knobs with dh.
FWD_VARIANTS = {
    "liger_like": dict(liger_like=True),
    "no_cap": dict(maxnreg=False),
    "no_prefetch": dict(prefetch=False),
    "no_prefetch_persistent": dict(prefetch=False, persistent=True),
    "persistent": dict(persistent=True),
    "rows2_16w": dict(rows=2, num_warps=16),
    "unsplit": dict(split=False),
}


@pytest.mark.parametrize("variant", FWD_VARIANTS)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(37, 1000), (7, 1536), (5, 4099)], ids=["37x1000", "7x1536", "5x4099"])
def test_forward_variants(variant, dtype, dims):
    x, r, w, eps = _inputs(*dims, dtype)
    y, h, rstd = rms_norm.rms_norm_forward(x, w, eps, residual=r, **FWD_VARIANTS[variant])
    h_ref, y_ref = K.reference(x.double(), r.double(), w.double(), eps)
    tol = SPEC.tolerance[dtype]
    assert _rel(h, h_ref) <= tol and _rel(y, y_ref) <= tol
    if dtype != torch.bfloat16:  # (the interpreter's bf16 cast truncates, torch's rounds)
        assert torch.equal(h, x + r)
    rstd_ref = 1.0 / torch.sqrt(h.double().pow(2).mean(-1) + eps)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)


BWD_VARIANTS = {
    "no_prefetch": dict(prefetch=False),
    "rstd_ahead": dict(rstd_ahead=True),
    "4w": dict(num_warps=4),
    "16w": dict(num_warps=16),
    "cols_8x64": dict(max_block=256, cols_tile=(8, 64)),
    "coop": dict(max_block=256, wide="coop"),  # one segment a row on the CPU (tests/test_rms_norm.py)
}


@pytest.mark.parametrize("variant", BWD_VARIANTS)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", [(37, 1000), (6, 4099)], ids=["37x1000", "6x4099"])
def test_backward_variants(variant, dtype, dims):
    x, r, w, eps = _inputs(*dims, dtype)
    dh, dy = torch.randn(dims).to(dtype), torch.randn(dims).to(dtype)
    _, h, rstd = rms_norm.rms_norm_forward(x, w, eps, residual=r)
    dx, dw = rms_norm.rms_norm_backward(dy, h, w, rstd, dh=dh, **BWD_VARIANTS[variant])
    _, _, dx_ref, _, dw_ref = _reference_grads(x, r, w, eps, dh, dy)
    tol = SPEC.tolerance[dtype]
    assert _rel(dx, dx_ref) <= tol and _rel(dw, dw_ref) <= tol


def test_one_gradient_for_x_and_residual():
    x, r, w, eps = _inputs(19, 640, torch.float32)
    x.requires_grad_(True), r.requires_grad_(True), w.requires_grad_(True)
    h, y = K.add_rms_norm(x, r, w, eps)
    dh, dy = torch.randn_like(h), torch.randn_like(y)
    dx, dr, dw = torch.autograd.grad((h, y), (x, r, w), (dh, dy))
    assert torch.equal(dx, dr)
    h_ref, y_ref, dx_ref, _, dw_ref = _reference_grads(x.detach(), r.detach(), w.detach(), eps, dh, dy)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)  # elementwise: every row
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("used", ["h", "y"])
def test_only_one_output_used(used):
    # the other output's gradient is None in the backward (grads are not materialised)
    x, r, w, eps = _inputs(11, 300, torch.float32)
    x.requires_grad_(True), w.requires_grad_(True)
    h, y = K.add_rms_norm(x, r, w, eps)
    out = h if used == "h" else y
    g = torch.randn_like(out)
    dx, dw = torch.autograd.grad(out, (x, w), g)
    zeros = torch.zeros_like(g)
    _, _, dx_ref, _, dw_ref = _reference_grads(x.detach(), r, w.detach(), eps,
                                                g if used == "h" else zeros, g if used == "y" else zeros)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


def test_inference_path():
    x, r, w, eps = _inputs(9, 300, torch.float32)
    with torch.no_grad():
        h, y = K.add_rms_norm(x, r, w, eps)
    h_ref, y_ref = K.reference(x.double(), r.double(), w.double(), eps)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)


def test_mismatched_residual_is_refused():
    with pytest.raises(ValueError, match="must match"):
        K.add_rms_norm(torch.randn(4, 8), torch.randn(4, 7), torch.randn(8))
    with pytest.raises(ValueError, match="must match"):
        K.add_rms_norm(torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64), torch.randn(8))


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape
    assert any(s.dims["N"] > rms_norm.MAX_REG_BLOCK for s in SPEC.grids["full"])


def test_cost_model():
    dims = {"M": 4096, "N": 4096}
    fwd = SPEC.bytes_moved(dims, torch.bfloat16, "fwd")
    bwd = SPEC.bytes_moved(dims, torch.bfloat16, "bwd")
    assert fwd == (4 * 4096 * 4096 + 4096) * 2
    assert bwd == (4 * 4096 * 4096 + 2 * 4096) * 2
    assert SPEC.bytes_moved(dims, torch.bfloat16, "fwd+bwd") == fwd + bwd
    assert set(SPEC.tolerance) == set(SPEC.dtypes)
