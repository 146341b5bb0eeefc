"""fused_linear_cross_entropy against its float64 reference: every provider and dtype on awkward
shapes, plus chunking (partial last chunk, a chunk of ignored tokens), gradients and scaling."""
import random

import pytest
import torch

from kcollect import verify
from kcollect.kernels import fused_linear_cross_entropy as flce

SPEC = flce.SPEC
SHAPES = [s.dims for s in SPEC.grid("quick")]
RUNNABLE = [p.name for p in SPEC.providers if p.available("cpu") is None]


def _ids(d):
    return "x".join(map(str, d.values()))


@pytest.mark.parametrize("provider", RUNNABLE)
@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=str)
@pytest.mark.parametrize("dims", SHAPES, ids=_ids)
def test_matches_reference(provider, dtype, dims):
    if provider == "compile" and dims["tokens"] != 37:
        pytest.skip("compile is checked once per dtype: each shape costs a CPU compile")
    if provider in ("torch", "compile") and dtype == torch.float16 and float(dims["smoothing"]) > 0:
        pytest.skip("eager's fp16 label smoothing sums -log p over the batch into fp16: inf")
    result = verify.check(SPEC, provider, dims, dtype, "fwd+bwd", seed=random.randrange(2**31))
    assert result.ok, f"{provider} {dtype} {dims}: error {result.error:.3g} > {result.tolerance:.3g}"


def test_grid_shapes_are_accepted():
    for grid in SPEC.grids.values():
        for shape in grid:
            assert SPEC.check_shape(shape.dims) is None, shape
    assert any(s.dims["tokens"] == 8192 and s.dims["hidden"] == 4096 and s.dims["vocab"] == 128256
               for s in SPEC.grid("full")), "the memory-goal shape must be in the full grid"


def _inputs(t, h, v, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w = torch.randn(v, h, generator=g) * (2.0 / h ** 0.5)
    y = torch.randint(0, v, (t,), generator=g)
    return x, w, y


def _reference_grads(x, w, y, eps=0.0, scale=1.0):
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    loss = flce.reference(xr, wr, y, flce.IGNORE_INDEX, eps)
    (loss * scale).backward()
    return loss.detach(), xr.grad, wr.grad


@pytest.mark.parametrize("chunk", [8, 16, 128])
def test_chunks_give_the_one_chunk_answer(chunk):
    # 37 tokens in chunks of 8 or 16: a partial last chunk, dW accumulated over 5 or 3 chunks;
    # tokens 8..15 all ignored: the mean must use the whole batch's count, not the chunk's.
    x, w, y = _inputs(37, 24, 301)
    y[8:16] = flce.IGNORE_INDEX
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(xg, wg, y, label_smoothing=0.1, chunk=chunk)
    dx, dw = torch.autograd.grad(loss, (xg, wg))
    want, want_dx, want_dw = _reference_grads(x, w, y, eps=0.1)
    assert torch.allclose(loss.double(), want, rtol=1e-5)
    assert torch.allclose(dx.double(), want_dx, rtol=1e-4, atol=1e-7)
    assert torch.allclose(dw.double(), want_dw, rtol=1e-4, atol=1e-7)
    assert (dx[8:16] == 0).all()


def test_upstream_gradient_scales_both_and_inputs_stay_intact():
    x, w, y = _inputs(20, 16, 200, seed=1)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(xg, wg, y, chunk=8)
    dx, dw = torch.autograd.grad(loss * -3.0, (xg, wg))
    _, want_dx, want_dw = _reference_grads(x, w, y, scale=-3.0)
    assert torch.allclose(dx.double(), want_dx, rtol=1e-4, atol=1e-7)
    assert torch.allclose(dw.double(), want_dw, rtol=1e-4, atol=1e-7)
    assert torch.equal(xg.detach(), x) and torch.equal(wg.detach(), w)


@pytest.mark.parametrize("which", ["x", "weight"])
def test_gradient_only_for_what_requires_it(which, monkeypatch):
    seen = []
    real = flce.fused_linear_cross_entropy_forward

    def spy(x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, chunk=None):
        seen.append((need_dx, need_dw))
        return real(x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, chunk)

    monkeypatch.setattr(flce, "fused_linear_cross_entropy_forward", spy)
    x, w, y = _inputs(9, 8, 50, seed=2)
    leaf = (x if which == "x" else w).requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(x, w, y)
    (g,) = torch.autograd.grad(loss, leaf)
    _, want_dx, want_dw = _reference_grads(x.detach(), w.detach(), y)
    assert torch.allclose(g.double(), want_dx if which == "x" else want_dw, rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        flce.fused_linear_cross_entropy(x, w, y)
    assert seen == [(which == "x", which == "weight"), (False, False)]


def test_second_backward_is_refused():
    x, w, y = _inputs(4, 8, 30)
    x.requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(x, w, y)
    torch.autograd.grad(loss, x, retain_graph=True)
    with pytest.raises(RuntimeError, match="already consumed"):
        torch.autograd.grad(loss, x)


def test_chunk_size_keeps_the_memory_goal():
    # At 8192 x 4096 -> 128256 bf16 the logits chunk stays near 256 MiB (dW alone is 1 GB; eager
    # holds several 2.1 GB [T, V] tensors) and K = chunk >= 1024 keeps dW += g.T @ x compute-bound.
    c = flce._chunk_rows(8192, 128256, 2)
    assert c % 128 == 0 and 1024 <= c and c * 128256 * 2 <= 260 * 2**20
    assert flce._chunk_rows(5, 128256, 2) == 5


def test_bad_inputs_are_refused():
    x, w, y = _inputs(4, 8, 30)
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        flce.fused_linear_cross_entropy(x, w[:, :7], y)
    with pytest.raises(ValueError, match="target"):
        flce.fused_linear_cross_entropy(x, w, y[:3])
    with pytest.raises(ValueError, match="share a dtype"):
        flce.fused_linear_cross_entropy(x, w.double(), y)


def test_cost_model():
    dims = {"tokens": 8192, "hidden": 4096, "vocab": 128256, "smoothing": "0"}
    assert SPEC.flops(dims, "fwd+bwd") == 6 * 8192 * 4096 * 128256
    assert SPEC.bound == "compute" and SPEC.modes == ("fwd+bwd",)
