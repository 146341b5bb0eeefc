"""fused_linear_cross_entropy against its float64 reference: ours in every dtype on awkward shapes,
eager once per dtype, plus chunking (partial last chunk, a chunk of ignored tokens), gradients and
scaling."""
import pytest
import torch

import opcheck
from kcollect.kernels import fused_linear_cross_entropy as flce
from kcollect.kernels.fused_linear_cross_entropy import FLCEConfig
from kcollect.kernels.fused_linear_cross_entropy.spec import SPEC

# 13x64 -> 1000: one chunk, awkward sizes, every dtype; 20x48 -> 3001: prime vocabulary, label
# smoothing; 1x32 -> 500: a single token. Its Triton kernel is cross_entropy's (tested there in every
# dtype on both paths): the later shapes in fp32. Eager once per dtype. torch.compile is PyTorch's
# code, gated like every provider wherever the collector runs (each case a CPU compile): not checked.
B, H, F = torch.bfloat16, torch.float16, torch.float32
_PLAN = [({"tokens": 13, "hidden": 64, "vocab": 1000, "smoothing": "0"}, "fwd+bwd", (B, H, F)),
         ({"tokens": 20, "hidden": 48, "vocab": 3001, "smoothing": "0.1"}, "fwd+bwd", (F,)),
         ({"tokens": 1, "hidden": 32, "vocab": 500, "smoothing": "0"}, "fwd+bwd", (F,))]


def _eager_fp16_smoothing(dims, dtype) -> bool:
    """eager's fp16 label smoothing sums -log p over the batch into fp16: inf (PyTorch's, not ours)."""
    return dtype == torch.float16 and float(dims["smoothing"]) > 0


CASES = opcheck.planned_cases(_PLAN, eager_ok=lambda dims, dtype: not _eager_fp16_smoothing(dims, dtype))


@pytest.mark.parametrize("provider, mode, dtype, dims", CASES)
def test_matches_reference(provider, mode, dtype, dims):
    opcheck.check_case(SPEC, provider, mode, dtype, dims)


def test_grid_shapes_are_accepted():
    opcheck.check_grids_accepted(SPEC)
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
    loss = SPEC.reference(xr, wr, y, flce.IGNORE_INDEX, eps)
    (loss * scale).backward()
    return loss.detach(), xr.grad, wr.grad


def test_chunks_give_the_one_chunk_answer():
    # 21 tokens in chunks of 8: a partial last chunk, dW accumulated over 3 chunks; tokens 8..15
    # (the second chunk) all ignored: the mean must use the whole batch's count, not the chunk's.
    chunk = 8
    x, w, y = _inputs(21, 24, 301)
    y[8:16] = flce.IGNORE_INDEX
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(xg, wg, y, label_smoothing=0.1, config=FLCEConfig(chunk))
    dx, dw = torch.autograd.grad(loss, (xg, wg))
    want, want_dx, want_dw = _reference_grads(x, w, y, eps=0.1)
    assert torch.allclose(loss.double(), want, rtol=1e-5)
    assert torch.allclose(dx.double(), want_dx, rtol=1e-4, atol=1e-7)
    assert torch.allclose(dw.double(), want_dw, rtol=1e-4, atol=1e-7)
    assert (dx[8:16] == 0).all()


def test_upstream_gradient_scales_both_and_inputs_stay_intact():
    x, w, y = _inputs(20, 16, 200, seed=1)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = flce.fused_linear_cross_entropy(xg, wg, y, config=FLCEConfig(8))
    dx, dw = torch.autograd.grad(loss * -3.0, (xg, wg))
    _, want_dx, want_dw = _reference_grads(x, w, y, scale=-3.0)
    assert torch.allclose(dx.double(), want_dx, rtol=1e-4, atol=1e-7)
    assert torch.allclose(dw.double(), want_dw, rtol=1e-4, atol=1e-7)
    assert torch.equal(xg.detach(), x) and torch.equal(wg.detach(), w)


@pytest.mark.parametrize("which", ["x", "weight"])
def test_gradient_only_for_what_requires_it(which, monkeypatch):
    seen = []
    real = flce.fused_linear_cross_entropy_forward

    def spy(x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, config=None):
        seen.append((need_dx, need_dw))
        return real(x, weight, target, ignore_index, label_smoothing, need_dx, need_dw, config)

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
    c = flce.pick(8192, 128256, torch.bfloat16).chunk
    assert c % 128 == 0 and 1024 <= c and c * 128256 * 2 <= 260 * 2**20
    assert flce.pick(5, 128256, torch.bfloat16).chunk == 5


def test_bad_inputs_are_refused():
    x, w, y = _inputs(4, 8, 30)
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        flce.fused_linear_cross_entropy(x, w[:, :7], y)
    with pytest.raises(ValueError, match="target"):
        flce.fused_linear_cross_entropy(x, w, y[:3])
    with pytest.raises(ValueError, match="share a dtype"):
        flce.fused_linear_cross_entropy(x, w.double(), y)
    with pytest.raises(ValueError, match="chunk"):
        flce.fused_linear_cross_entropy(x, w, y, config=FLCEConfig(0))


def test_config_is_recorded():
    inputs = SPEC.make_inputs({"tokens": 300, "hidden": 8, "vocab": 100, "smoothing": "0"}, torch.float32, "cpu", 0)
    record = SPEC.provider("triton").config(inputs)
    assert record["flce"] == {"chunk": 300} and record["cross_entropy"]["path"] == "rows"


def test_cost_model():
    dims = {"tokens": 8192, "hidden": 4096, "vocab": 128256, "smoothing": "0"}
    assert SPEC.flops(dims, "fwd+bwd") == 6 * 8192 * 4096 * 128256
    assert SPEC.bound == "compute" and SPEC.modes == ("fwd+bwd",)
