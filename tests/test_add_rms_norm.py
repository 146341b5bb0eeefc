"""add_rms_norm against its float64 reference: each provider, mode and dtype once (opcheck.lean_reference_cases); h
exactly the rounded sum on every forward path; one gradient shared by x and residual; unused
outputs; the backward paths with dh. (The kernels are rms_norm's, under HAS_RES / HAS_DH.)"""
import pytest
import torch

import opcheck
from kcollect.kernels import add_rms_norm as K
from kcollect.kernels import rms_norm
from kcollect.kernels.add_rms_norm.spec import SPEC, reference
from kcollect.kernels.rms_norm import config as C

# 23x300: four rows a program, tail masked (one tile a program with a residual); 1x4099: one row,
# odd width, the forward in two column blocks (4096 + 4); 5x7: rows narrower than a vector.
# (torch.compile is PyTorch's code on the eager function that `torch` checks: not compiled.)
SHAPES = [{"M": 23, "N": 300}, {"M": 1, "N": 4099}, {"M": 5, "N": 7}]
# The forced paths run once each, in bf16 (the dtype timed) and fp32 (the tightest tolerance) in
# turn; fp16's casts are the default path's, checked above.


@pytest.mark.parametrize("provider, mode, dtype, dims", opcheck.lean_reference_cases(SPEC, SHAPES))
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def inputs(m, n, dtype, tiny_row=True):
    """x, residual, w, eps; tiny_row: see opcheck.row_inputs (left out where elementwise fp32 checks
    leave no room for that row's larger rstd)."""
    inp = opcheck.row_inputs(SPEC, m, n, dtype, ("x", "residual") if tiny_row else ())
    return inp["x"], inp["residual"], inp["w"], inp["eps"]


def reference_grads(x, r, w, eps, dh, dy):
    xd, rd, wd = (t.double().requires_grad_(True) for t in (x, r, w))
    h, y = reference(xd, rd, wd, eps)
    grads = torch.autograd.grad((h, y), (xd, rd, wd), (dh.double(), dy.double()))
    return (h.detach(), y.detach()) + grads


def rel(got, want):
    return (torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)).item()


FORWARD = {  # (M, N, config): every forward kernel with the residual flag on
    "rows-prefetch": (23, 300, C.RowsConfig(512, 0, 4, 4, prefetch=True)),
    "rows-one-tile-two-blocks": (9, 640, C.RowsConfig(512, 128, 2, 4, persistent=False)),
    "lines": (5, 2500, rms_norm.LinesConfig(512, 4, 4, programs_per_sm=1)),
    "packed": (3, 1000, C.PackedConfig(1024, 4)),
    "split": (3, 1000, C.SplitConfig(256, 4)),
}


@pytest.mark.parametrize("path, dtype", opcheck.in_turn(FORWARD, (torch.float16, torch.float32)))
def test_h_is_the_rounded_sum(dtype, path):
    # h is x + residual rounded once to the input dtype, exactly as torch's add, and y is the norm of
    # that h (bf16 is left out: the interpreter's fp32->bf16 cast truncates where torch rounds)
    m, n, config = FORWARD[path]
    x, r, w, eps = inputs(m, n, dtype)
    y, h, rstd = rms_norm.rms_norm_forward(x, w, eps, residual=r, config=config)
    assert torch.equal(h, x + r)
    y_plain, _, rstd_plain = rms_norm.rms_norm_forward(h, w, eps, config=config)
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)
    torch.testing.assert_close(rstd, rstd_plain, rtol=0, atol=0)
    assert rel(y, reference(x.double(), r.double(), w.double(), eps)[1]) <= SPEC.tolerance[dtype]


BACKWARD = {  # (M, N, config): every backward kernel with dh
    "rows-prefetch": (23, 300, C.BwdRowsConfig(512, 4, 4, prefetch=True, rstd_ahead=False)),
    "rows-no-prefetch": (9, 300, C.BwdRowsConfig(512, 1, 4, prefetch=False, rstd_ahead=False)),
    "cols": (23, 300, C.ColsConfig(dot_chunk=128, block_r=4, block_c=128)),
    "coop": (23, 300, C.CoopConfig(seg=512)),  # one segment a row on the CPU (tests/test_rms_norm.py)
}


@pytest.mark.parametrize("path, dtype", opcheck.in_turn(BACKWARD))
def test_backward_paths(path, dtype):
    m, n, config = BACKWARD[path]
    x, r, w, eps = inputs(m, n, dtype)
    dh, dy = torch.randn(m, n).to(dtype), torch.randn(m, n).to(dtype)
    _, h, rstd = rms_norm.rms_norm_forward(x, w, eps, residual=r)
    dx, dw = rms_norm.rms_norm_backward(dy, h, w, rstd, dh=dh, config=config)
    _, _, dx_ref, dr_ref, dw_ref = reference_grads(x, r, w, eps, dh, dy)
    tol = SPEC.tolerance[dtype]
    assert rel(dx, dx_ref) <= tol and rel(dx, dr_ref) <= tol and rel(dw, dw_ref) <= tol


def test_one_gradient_for_x_and_residual():
    x, r, w, eps = inputs(19, 640, torch.float32, tiny_row=False)
    x.requires_grad_(True), r.requires_grad_(True), w.requires_grad_(True)
    h, y = K.add_rms_norm(x, r, w, eps)
    dh, dy = torch.randn_like(h), torch.randn_like(y)
    dx, dr, dw = torch.autograd.grad((h, y), (x, r, w), (dh, dy))
    assert torch.equal(dx, dr)
    _, _, dx_ref, _, dw_ref = reference_grads(x.detach(), r.detach(), w.detach(), eps, dh, dy)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)  # elementwise: every row
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("used", ["h", "y"])
def test_only_one_output_used(used):
    # the other output's gradient is None in the backward (grads are not materialised)
    x, r, w, eps = inputs(11, 300, torch.float32, tiny_row=False)
    x.requires_grad_(True), w.requires_grad_(True)
    h, y = K.add_rms_norm(x, r, w, eps)
    out = h if used == "h" else y
    g = torch.randn_like(out)
    dx, dw = torch.autograd.grad(out, (x, w), g)
    zeros = torch.zeros_like(g)
    _, _, dx_ref, _, dw_ref = reference_grads(x.detach(), r, w.detach(), eps,
                                              g if used == "h" else zeros, g if used == "y" else zeros)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-5, atol=1e-5)


def test_inference_path():
    x, r, w, eps = inputs(9, 300, torch.float32, tiny_row=False)
    with torch.no_grad():
        h, y = K.add_rms_norm(x, r, w, eps)
    h_ref, y_ref = reference(x.double(), r.double(), w.double(), eps)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)


def test_mismatched_residual_is_refused():
    with pytest.raises(ValueError, match="must match"):
        K.add_rms_norm(torch.randn(4, 8), torch.randn(4, 7), torch.randn(8))
    with pytest.raises(ValueError, match="must match"):
        K.add_rms_norm(torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64), torch.randn(8))


def test_grid_shapes_cost_model_and_config():
    assert any(s.dims["N"] > C.MAX_REG_BLOCK for s in SPEC.grids["full"])
    opcheck.check_pass_bytes(SPEC, {"M": 4096, "N": 4096}, fwd=(4 * 4096 * 4096 + 4096) * 2,
                             bwd=(4 * 4096 * 4096 + 2 * 4096) * 2)
    assert set(SPEC.tolerance) == set(SPEC.dtypes)
    # with a residual: one tile a program, whatever the width (rms_norm without one: persistent)
    record = SPEC.provider("triton").config(SPEC.make_inputs({"M": 3, "N": 100}, torch.float32, "cpu", 0))
    assert record["fwd"]["path"] == "rows" and record["fwd"]["persistent"] is False
    assert record["bwd"] == {"block_n": 128, "rows": 16, "warps": 8, "prefetch": True, "rstd_ahead": False,
                             "path": "rows"}


def test_quack_provider(monkeypatch):
    # QuACK's rmsnorm with its fused residual add (prenorm=True: the sum returned too, as h)
    opcheck.check_quack_provider(SPEC, monkeypatch, ["rmsnorm"])
