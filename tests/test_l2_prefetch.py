"""The L2 prefetch of the wide-row kernels (_utils.prefetch_l2): where the launchers turn it on, that
the kernels compile for sm_90 with it (same registers, the bulk prefetches present), and on a GPU
that the results are right with it at the ends of the tensors."""
import os
import random
import types

import pytest
import torch
from triton.runtime.jit import KernelInterface

import opcheck as gate
from kcollect import verify
from kcollect.kernels._lib import prefetch
from kcollect.kernels._lib.prefetch import l2_prefetch_ok
from kcollect.kernels import layer_norm, rms_norm


def fake(shape, dtype, device="cuda"):
    """What l2_prefetch_ok reads of a tensor, for a CUDA one on a CPU machine."""
    t = torch.empty(shape, dtype=dtype)
    return types.SimpleNamespace(device=torch.device(device), shape=t.shape, element_size=t.element_size,
                                 stride=t.stride, data_ptr=t.data_ptr)


def test_prefetch_needs_hopper_and_rows_of_whole_vectors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert l2_prefetch_ok(fake((4, 65536), torch.bfloat16))
    assert l2_prefetch_ok(fake((4, 1000), torch.float32))
    assert not l2_prefetch_ok(fake((4, 5003), torch.bfloat16))  # rows not whole 16-byte vectors
    assert not l2_prefetch_ok(fake((4, 65536), torch.bfloat16, "cpu"))  # the interpreter runs no PTX
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not l2_prefetch_ok(fake((4, 65536), torch.bfloat16))


class Planned(Exception):
    pass


def planned_ahead(monkeypatch, module, call) -> int:
    """The L2_AHEAD a coop launch in `module` asks coop_plan for, the prefetch allowed (nothing runs)."""
    asked = []

    def plan(*args, **kw):
        asked.append(kw.get("L2_AHEAD"))
        raise Planned

    monkeypatch.setattr(module, "coop_plan", plan)
    monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t: True)
    with pytest.raises(Planned):
        call()
    return asked[0]


def test_coop_launches_prefetch_where_measured(monkeypatch):
    # rms_norm: without dh only (add_rms_norm lost with it); layer_norm: rows of 65536 and more
    # (4096x16384 lost); an explicit value wins; never where not allowed
    b = torch.bfloat16
    x2, w, r = torch.empty(4, 65536, dtype=b), torch.empty(65536, dtype=b), torch.empty(4)
    assert planned_ahead(monkeypatch, rms_norm, lambda: rms_norm.rms_norm_backward(x2, x2, w, r, wide="coop")) == 1
    assert planned_ahead(monkeypatch, rms_norm, lambda: rms_norm.rms_norm_backward(x2, x2, w, r, dh=x2,
                                                                                  wide="coop")) == 0
    assert planned_ahead(monkeypatch, layer_norm, lambda: layer_norm.layer_norm_backward(
        x2, x2, w, r, r, wide="coop")) == 1
    x3, w3 = torch.empty(4, 16384, dtype=b), torch.empty(16384, dtype=b)
    assert planned_ahead(monkeypatch, layer_norm, lambda: layer_norm.layer_norm_backward(
        x3, x3, w3, r, r, wide="coop")) == 0
    monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t: False)
    asked = []
    monkeypatch.setattr(layer_norm, "coop_plan", lambda *a, **kw: asked.append(kw["L2_AHEAD"]) or None)
    monkeypatch.setattr(KernelInterface, "__getitem__", lambda self, grid: lambda *a, **k: None)
    layer_norm.layer_norm_backward(x2, x2, w, r, r, wide="coop", coop_l2_ahead=2)
    assert asked == [0]


def launch_kwargs(monkeypatch, call) -> dict:
    """{kernel name: launch keywords} of the Triton launches call() makes; nothing runs."""
    got = {}
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *a, **k: got.setdefault(self.fn.__name__, k))
    call()
    return got


def test_register_paths_prefetch_where_measured(monkeypatch):
    # layer_norm's register-path backward one tile ahead; rms_norm's register paths not at all
    b = torch.bfloat16
    x, w, r = torch.empty(64, 4096, dtype=b), torch.empty(4096, dtype=b), torch.empty(64)
    monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t: True)
    got = launch_kwargs(monkeypatch, lambda: layer_norm.layer_norm_backward(x, x, w, r, r))
    assert got["_ln_bwd_rows"]["L2_AHEAD"] == 1
    got = launch_kwargs(monkeypatch, lambda: rms_norm.rms_norm_backward(x, x, w, r))
    assert "L2_AHEAD" not in got["_bwd_rows"]
    got = launch_kwargs(monkeypatch, lambda: rms_norm.rms_norm_forward(x, w))
    assert "L2_AHEAD" not in got["_fwd_rows"]
    got = launch_kwargs(monkeypatch, lambda: rms_norm.rms_norm_backward(x, x, w, r, rows_l2_ahead=2))
    assert got["_bwd_rows"]["L2_AHEAD"] == 2


_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import layer_norm, rms_norm
b, C = "*bf16", "constexpr"
cases = {
    "rms_bwd": (rms_norm._bwd_coop, {"x_ptr": b, "w_ptr": b, "dy_ptr": b, "dh_ptr": b, "rstd_ptr": "*fp32",
                "dx_ptr": b, "dwp_ptr": "*fp32", "slot_ptr": "*i64", "M": "i32", "N": "i32", "S": "i32",
                "iters": "i32", "SEG": C, "S_BLOCK": C, "HAS_DH": C, "W_AT_USE": C, "RELOAD": C, "L2_AHEAD": C},
                {"SEG": 2048, "S_BLOCK": 32, "HAS_DH": False, "W_AT_USE": False, "RELOAD": True}, 128),
    "ln_bwd": (layer_norm._ln_bwd_coop, {"x_ptr": b, "dy_ptr": b, "w_ptr": b, "mean_ptr": "*fp32",
               "rstd_ptr": "*fp32", "dx_ptr": b, "part_ptr": "*fp32", "slot_ptr": "*i64", "M": "i32", "N": "i32",
               "S": "i32", "iters": "i32", "SEG": C, "S_BLOCK": C, "N_ALIGN": C, "L2_AHEAD": C},
               {"SEG": 2048, "S_BLOCK": 32, "N_ALIGN": 16}, None),
}
for name, (fn, sig, const, cap) in cases.items():
    aligned = tuple(k for k, v in sig.items() if v.startswith("*")) + ("N",)
    for ahead in (0, 1):
        r = report(fn, sig, {**const, "L2_AHEAD": ahead}, 4, aligned=aligned, sass=True, maxnreg=cap)
        print(name, ahead, r["registers"], r["stack"], r["sass"].count("UBLKPF"))
"""


def test_coop_kernels_compile_with_the_prefetch():
    # sm_90, offline: the prefetch takes no register or stack (the occupancy the defaults were measured at)
    # and is there, one bulk prefetch per tensor a step
    got = {}
    for line in gate.run_offline_compile(_COMPILE).split("\n"):
        if line:
            name, ahead, regs, stack, n = line.split()
            got[name, int(ahead)] = (int(regs), int(stack), int(n))
    for name, tensors in (("rms_bwd", 2), ("ln_bwd", 2)):
        (r0, s0, n0), (r1, s1, n1) = got[name, 0], got[name, 1]
        assert r1 <= r0 and s1 <= s0 and n0 == 0 and n1 == tensors, (name, got[name, 0], got[name, 1])


ON_GPU = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
                            or torch.cuda.get_device_capability() != (9, 0),
                            reason="PTX for sm_90; the coop kernels' segments wait for each other: a Hopper GPU")


@ON_GPU
@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("dims", [(300, 1000), (1000, 65536)], ids=["300x1000", "1000x65536"])
def test_prefetching_coop_kernels_on_the_gpu(ahead, dims):
    # rows prefetched past the last (nothing is fetched there) and segments past the row's end
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    m, n = dims
    seg = 256 if n == 1000 else None
    x = (torch.randn(dims, generator=g, device="cuda") * 2 + 1).to(torch.bfloat16)
    dy = torch.randn(dims, generator=g, device="cuda").to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(n, generator=g, device="cuda")).to(torch.bfloat16)
    tol = layer_norm.SPEC.tolerance[torch.bfloat16]
    _, _, rstd = rms_norm.rms_norm_forward(x, w, 1e-6)
    block = 256 if seg else rms_norm.MAX_REG_BLOCK
    dx, dw = rms_norm.rms_norm_backward(dy, x, w, rstd, max_block=block, wide="coop", coop_seg=seg,
                                        coop_l2_ahead=ahead)
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    want = torch.autograd.grad(rms_norm.reference(xr, wr, 1e-6), (xr, wr), dy.double())
    assert verify.rel_error(dx, want[0]) <= tol and verify.rel_error(dw, want[1]) <= tol
    b = (0.1 * torch.randn(n, generator=g, device="cuda")).to(torch.bfloat16)
    _, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    got = layer_norm.layer_norm_backward(dy, x, w, mean, rstd, max_block=256 if seg else layer_norm._BWD_MAX_BLOCK,
                                         wide="coop", coop_seg=seg, coop_l2_ahead=ahead)
    xr, wr, br = (t.double().requires_grad_(True) for t in (x, w, b))
    want = torch.autograd.grad(layer_norm.reference(xr, wr, br, 1e-5), (xr, wr, br), dy.double())
    assert all(verify.rel_error(g_, w_) <= tol for g_, w_ in zip(got, want))


@ON_GPU
@pytest.mark.parametrize("ahead", [1, 2])
@pytest.mark.parametrize("dims", [(1000, 4096), (333, 8192)], ids=["1000x4096", "333x8192"])
def test_prefetching_register_paths_on_the_gpu(ahead, dims):
    # tiles prefetched past the last row (clipped to M; nothing past it)
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    x = (torch.randn(dims, generator=g, device="cuda") * 2 + 1).to(torch.bfloat16)
    dy = torch.randn(dims, generator=g, device="cuda").to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(dims[1], generator=g, device="cuda")).to(torch.bfloat16)
    b = (0.1 * torch.randn(dims[1], generator=g, device="cuda")).to(torch.bfloat16)
    tol = layer_norm.SPEC.tolerance[torch.bfloat16]
    _, mean, rstd = layer_norm.layer_norm_forward(x, w, b, 1e-5)
    got = layer_norm.layer_norm_backward(dy, x, w, mean, rstd, rows_l2_ahead=ahead)
    xr, wr, br = (t.double().requires_grad_(True) for t in (x, w, b))
    want = torch.autograd.grad(layer_norm.reference(xr, wr, br, 1e-5), (xr, wr, br), dy.double())
    assert all(verify.rel_error(g_, w_) <= tol for g_, w_ in zip(got, want))
    y, _, rstd = rms_norm.rms_norm_forward(x, w, 1e-6, l2_ahead=ahead)
    dx, dw = rms_norm.rms_norm_backward(dy, x, w, rstd, rows_l2_ahead=ahead)
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ref = rms_norm.reference(xr, wr, 1e-6)
    want = torch.autograd.grad(ref, (xr, wr), dy.double())
    assert verify.rel_error(y, ref) <= tol
    assert verify.rel_error(dx, want[0]) <= tol and verify.rel_error(dw, want[1]) <= tol
