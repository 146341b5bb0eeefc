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
from kcollect.kernels import cross_entropy, softmax


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
    # softmax: both directions; an explicit value wins
    b = torch.bfloat16
    x = torch.empty(softmax._SPLIT_MAX_ROWS + 1, 131072, dtype=b)
    assert planned_ahead(monkeypatch, softmax, lambda: softmax.softmax_forward(x, coop=True)) == 1
    assert planned_ahead(monkeypatch, softmax, lambda: softmax.softmax_backward(x, x, coop=True)) == 1
    assert planned_ahead(monkeypatch, softmax, lambda: softmax.softmax_backward(x, x, coop=True, coop_l2_ahead=2)) == 2


def launch_kwargs(monkeypatch, call) -> dict:
    """{kernel name: launch keywords} of the Triton launches call() makes; nothing runs."""
    got = {}
    monkeypatch.setattr(KernelInterface, "__getitem__",
                        lambda self, grid: lambda *a, **k: got.setdefault(self.fn.__name__, k))
    call()
    return got


def test_lines_and_cross_entropy_prefetch_where_measured(monkeypatch):
    # softmax's lines forward: rows up to LINES_NARROW_ROW_BYTES (65536 bf16: 1 chunk ahead), not
    # wider; cross_entropy's row path: 2 chunks ahead with a gradient, none for the loss alone
    monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t: True)
    b = torch.bfloat16
    fwd = lambda n: launch_kwargs(monkeypatch, lambda: softmax.softmax_forward(  # noqa: E731
        torch.empty(softmax._SPLIT_MAX_ROWS + 1, n, dtype=b), coop=False))["_softmax_fwd_lines"]["L2_AHEAD"]
    assert fwd(65536) == 1 and fwd(128256) == 0
    logits, target = torch.empty(64, 32000, dtype=b), torch.zeros(64, dtype=torch.int64)
    ce = lambda grad, **kw: launch_kwargs(monkeypatch, lambda: cross_entropy.cross_entropy_rows(  # noqa: E731
        logits, target, torch.empty(64), logits if grad else None, -100, 0.0, split=False, **kw))["_ce_rows"]
    assert ce(True)["L2_AHEAD"] == 2 and ce(False)["L2_AHEAD"] == 0 and ce(True, l2_ahead=1)["L2_AHEAD"] == 1
    monkeypatch.setattr(prefetch, "l2_prefetch_ok", lambda t: False)
    assert ce(True)["L2_AHEAD"] == 0


_COMPILE = """
from benchmarks.compile_report import report
from kcollect.kernels import softmax
b, C = "*bf16", "constexpr"
cases = {
    "softmax_fwd": (softmax._softmax_fwd_coop, {"x_ptr": b, "y_ptr": b, "slot_ptr": "*i64", "M": "i32", "N": "i32",
                    "S": "i32", "iters": "i32", "SEG": C, "S_BLOCK": C, "N_ALIGN": C, "L2_AHEAD": C},
                    {"SEG": 2048, "S_BLOCK": 128, "N_ALIGN": 16}, None),
    "softmax_bwd": (softmax._softmax_bwd_coop, {"y_ptr": b, "dy_ptr": b, "dx_ptr": b, "slot_ptr": "*i64", "M": "i32",
                    "N": "i32", "S": "i32", "iters": "i32", "SEG": C, "S_BLOCK": C, "N_ALIGN": C, "L2_AHEAD": C},
                    {"SEG": 2048, "S_BLOCK": 32, "N_ALIGN": 16}, 96),
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
    for name, tensors in (("softmax_fwd", 1), ("softmax_bwd", 2)):
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
    tol = softmax.SPEC.tolerance[torch.bfloat16]
    y = softmax.softmax_forward(x, coop=True, coop_seg=seg, coop_l2_ahead=ahead)
    y64 = torch.softmax(x.double(), -1)
    assert verify.rel_error(y, y64) <= tol
    dx = softmax.softmax_backward(dy, y, coop=True, coop_seg=seg, coop_l2_ahead=ahead)
    yd, dyd = y.double(), dy.double()
    assert verify.rel_error(dx, yd * (dyd - (yd * dyd).sum(-1, keepdim=True))) <= tol


@ON_GPU
@pytest.mark.parametrize("ahead", [1, 2])
def test_prefetching_lines_and_cross_entropy_on_the_gpu(ahead):
    # softmax's lines forward and cross_entropy's row path, chunks prefetched past the row's full ones
    g = torch.Generator(device="cuda").manual_seed(random.randrange(2**31))
    x = (torch.randn((200, 70000), generator=g, device="cuda") * 3).to(torch.bfloat16)
    y = softmax.softmax_forward(x, coop=False, lines=True, lines_l2_ahead=ahead)
    assert verify.rel_error(y, torch.softmax(x.double(), -1)) <= softmax.SPEC.tolerance[torch.bfloat16]
    target = torch.randint(0, 70000, (200,), generator=g, device="cuda")
    loss, dlogits = cross_entropy.cross_entropy_forward(x, target, -100, 0.0, True, split=False, l2_ahead=ahead)
    xr = x.double().requires_grad_(True)
    ref = cross_entropy.reference(xr, target, -100, 0.0)
    (want,) = torch.autograd.grad(ref, xr)
    tol = cross_entropy.SPEC.tolerance[torch.bfloat16]
    assert verify.rel_error(loss, ref) <= tol and verify.rel_error(dlogits, want) <= tol
