"""What every op's tests share: the reference check of each provider, mode and dtype on awkward
shapes (`reference_cases` + `check_case`), the rules for tiny bf16 shapes, and offline compiles for
sm_90 (PTX the interpreter cannot run)."""
import math
import random

import pytest
import torch

from kcollect import verify

# Below this many elements a bf16 result's relative error is too noisy to gate on: bf16 keeps 8
# mantissa bits and the interpreter truncates, so over 35 elements (and a 7-element dw) 1 draw in
# about 300 passes the tolerance for PyTorch's kernels as for ours (measured on 5x7: tails of
# 1.0e-2 to 2.1e-2 against medians of 3e-3 to 7e-3). Tiny shapes are there for masking, which does
# not depend on the dtype: they are checked in fp16 and fp32, whose tolerances are tight.
MIN_BF16_ELEMENTS = 256


def too_few_for_bf16(dims, dtype) -> bool:
    return dtype == torch.bfloat16 and _size(dims) < MIN_BF16_ELEMENTS


def _size(dims) -> int:
    return math.prod(v for v in dims.values() if isinstance(v, int))


def run_offline_compile(script: str) -> str:
    """Run `script` (Python that compiles kernels with benchmarks/compile_report.py and prints what
    it found) in its own process without TRITON_INTERPRET, so that Triton compiles for sm_90
    instead of interpreting: the way to check PTX that the CPU interpreter cannot run. Its stdout;
    a failed compile fails the test with the script's error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def row_inputs(spec, m: int, n: int, dtype, tiny=()) -> dict:
    """spec.make_inputs for M=m, N=n on the CPU from a fresh seed; the first row of each input named
    in `tiny` scaled by 1e-4, so small that eps dominates its statistics (a missing eps shows)."""
    inputs = spec.make_inputs({"M": m, "N": n}, dtype, "cpu", random.randrange(2**31))
    for name in tiny:
        inputs[name][0] *= 1e-4
    return inputs


def fake_gpu(monkeypatch, capability=(9, 0), l2_bytes=50 << 20, sms=132) -> str:
    """torch.cuda answering as a GPU would (default: an H100; l2_bytes=60 << 20 an H200), for the
    config heuristics, which read the architecture, SM count and L2 size: returns the device "cuda"."""
    import types

    props = types.SimpleNamespace(multi_processor_count=sms, L2_cache_size=l2_bytes)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return "cuda"


def record_launches(monkeypatch, module, name: str, execute: bool = True) -> list[tuple]:
    """Replaces the Triton kernel `module.name` for the test: each launch (kernel[grid](...)) is
    recorded as (grid, keywords) in the list returned, and run too where `execute`."""
    real, launches = getattr(module, name), []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs))
                return real[grid](*args, **kwargs) if execute else None
            return launch

    monkeypatch.setattr(module, name, Recording())
    return launches


def shape_id(dims) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def reference_cases(spec, shapes, compile_shapes: int = 1):
    """pytest params of (provider, mode, dtype, dims) for every provider the CPU can run, every mode
    and every dtype the op claims, over `shapes`. Left out: bf16 on tiny shapes (too noisy to gate
    on, see above), and torch.compile past the first `compile_shapes` shapes (each shape costs a
    CPU compile, and compile is PyTorch's, not ours)."""
    runnable = [p.name for p in spec.providers if p.available("cpu") is None]
    params = []
    for i, dims in enumerate(shapes):
        for dtype in spec.dtypes:
            if too_few_for_bf16(dims, dtype):
                continue
            for mode in spec.modes:
                for provider in runnable:
                    if provider == "compile" and i >= compile_shapes:
                        continue
                    params.append(pytest.param(provider, mode, dtype, dims,
                                               id=f"{provider}-{mode}-{str(dtype)[6:]}-{shape_id(dims)}"))
    return params


def lean_reference_cases(spec, shapes, ours: str = "triton"):
    """pytest params of (provider, mode, dtype, dims) that check each code path and dtype once
    instead of their product: ours in every dtype on the first shape, in fwd (the inference path)
    and fwd+bwd (autograd's forward and backward), bwd once (fp32; the same kernels, the graph
    reused), and fwd+bwd in fp32 on each other shape (the paths its width takes; fp32: the tightest
    tolerance, gated on any size); every other provider the CPU runs, except torch.compile
    (PyTorch's code on the eager function), in fwd+bwd once per dtype on the first shape, so that
    the tolerance is shown to hold for the baselines too. An op without fwd+bwd (fp8_quant) takes
    its last mode where these take fwd+bwd."""
    f32 = torch.float32
    whole = "fwd+bwd" if "fwd+bwd" in spec.modes else spec.modes[-1]  # an op without a backward: its own
    cases = [(ours, mode, dtype, shapes[0]) for dtype in spec.dtypes for mode in dict.fromkeys(("fwd", whole))
             if mode in spec.modes]
    cases += [(ours, "bwd", f32, shapes[0])] if "bwd" in spec.modes else []
    cases += [(ours, whole, f32, dims) for dims in shapes[1:]]
    others = [p.name for p in spec.providers if p.name not in (ours, "compile") and p.available("cpu") is None]
    cases += [(name, whole, dtype, shapes[0]) for name in others for dtype in spec.dtypes]
    return [pytest.param(*case, id=f"{case[0]}-{case[1]}-{str(case[2])[6:]}-{shape_id(case[3])}") for case in cases
            if not too_few_for_bf16(case[3], case[2])]


def planned_cases(plan, eager_ok=lambda dims, dtype: True):
    """pytest params of (provider, mode, dtype, dims) for a plan of (dims, mode, dtypes) entries, for
    ops whose paths depend on the dtype as well as the shape (row bytes) or whose modes are not
    fwd/bwd/fwd+bwd: ours ("triton") on every entry; eager ("torch") once per mode and dtype, on
    the largest shape of the plan where `eager_ok` (its check shows the tolerance holds for the
    baseline, which does not depend on our paths)."""
    params, eager = [], {}
    for dims, mode, dtypes in plan:
        for dtype in dtypes:
            params.append(("triton", mode, dtype, dims))
            if eager_ok(dims, dtype) and _size(dims) > _size(eager.get((mode, dtype), {})):
                eager[(mode, dtype)] = dims
    params += [("torch", mode, dtype, dims) for (mode, dtype), dims in eager.items()]
    return [pytest.param(*p, id=f"{p[0]}-{p[1]}-{str(p[2])[6:]}-{shape_id(p[3])}") for p in params]


def in_turn(names, dtypes=(torch.bfloat16, torch.float32)):
    """pytest params of (name, dtype): each name (a forced code path) once, the dtypes in turn, so
    that a kernel with several branches runs in each dtype without the product of the two."""
    return [pytest.param(name, dtypes[i % len(dtypes)], id=f"{name}-{str(dtypes[i % len(dtypes)])[6:]}")
            for i, name in enumerate(names)]


def compiled_device() -> str:
    """'cuda' where there is a GPU and Triton compiles for it (TRITON_INTERPRET unset), else 'cpu':
    for checks of what the GPU's own instructions give, which the interpreter also runs."""
    import os

    return "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def errors(spec, provider, mode, dtype, dims, seed, device="cpu") -> list[float]:
    """The relative error against float64 of each output the mode checks (verify.check's, output by
    output), on the inputs and upstream gradients of `seed`: two providers given the same seed see
    the same data, so their errors compare."""
    inputs = spec.make_inputs(dims, dtype, device, seed)
    dys, want = verify.reference_answers(spec, inputs, mode, seed + 1)
    got = verify.build_call(spec, spec.provider(provider).fn, verify.clone_inputs(inputs), mode, dys)()
    errs = verify.part_errors(spec, got, want, mode)
    assert errs is not None, f"{spec.name} {provider} {mode}: {len(got)} values, want {len(want)}"
    return errs


def check_as_accurate_as_eager(spec, shapes, modes=("fwd", "bwd"), dtype=torch.float32, factor: float = 2.0):
    """Ours ("triton") within `factor` times eager's ("torch") error against float64, output by
    output, on fresh random inputs of each of `shapes`, on the GPU where Triton compiles for one."""
    device = compiled_device()
    for dims in shapes:
        seed = random.randrange(2**31)
        for mode in modes:
            ours = errors(spec, "triton", mode, dtype, dims, seed, device)
            eager = errors(spec, "torch", mode, dtype, dims, seed, device)
            assert all(o <= factor * e for o, e in zip(ours, eager)), f"{mode} {dims}: ours {ours}, eager {eager}"


def check_gated_1d(forward, backward, reference, n: int, config):
    """A gated activation's forward(a, b, config) and backward(dc, a, b, config) launchers on 1-D
    inputs of n elements against the float64 reference: c, da and db within fp32's rounding."""
    a, b, dc = torch.randn(n) * 3, torch.randn(n), torch.randn(n)
    ad, bd = a.double().requires_grad_(True), b.double().requires_grad_(True)
    want = reference(ad, bd)
    want_da, want_db = torch.autograd.grad(want, (ad, bd), dc.double())
    torch.testing.assert_close(forward(a, b, config).double(), want.detach(), rtol=1e-5, atol=1e-6)
    da, db = backward(dc, a, b, config)
    torch.testing.assert_close(da.double(), want_da, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db.double(), want_db, rtol=1e-5, atol=1e-6)


def check_grids_accepted(spec):
    """Every shape of every grid of the spec passes its own check_shape."""
    for grid in spec.grids.values():
        for shape in grid:
            assert spec.check_shape(shape.dims) is None, shape


def check_pass_bytes(spec, dims, fwd: int, bwd: int | None = None, dtype=torch.bfloat16):
    """The spec's bytes_moved for the forward (and the backward, where given) as expected, and for
    fwd+bwd the sum of the two passes."""
    assert spec.bytes_moved(dims, dtype, "fwd") == fwd
    if bwd is not None:
        assert spec.bytes_moved(dims, dtype, "bwd") == bwd
    assert spec.bytes_moved(dims, dtype, "fwd+bwd") == fwd + spec.bytes_moved(dims, dtype, "bwd")


def check_case(spec, provider, mode, dtype, dims, factor: float = 1.0):
    """One provider against float64 on fresh random inputs: within the op's tolerance (times
    `factor`, where a test says why the interpreter needs more)."""
    result = verify.check(spec, provider, dims, dtype, mode, seed=random.randrange(2**31))
    assert result.error <= factor * result.tolerance, (
        f"{provider} {mode} {dtype} {dims}: error {result.error:.3g} > {factor} x {result.tolerance:.3g}")
    return result


def fake_quack(monkeypatch) -> list:
    """A stand-in for the `quack` package (QuACK's CuTe DSL kernels need a Hopper GPU): its norm
    entry points with QuACK 0.6.5's signatures, returns and dtype asserts, in plain torch, so that a
    provider's wiring (names, argument order, what comes back, autograd) runs on the CPU. Returns the
    list of the entry points called, in order."""
    import sys
    import types

    calls = []

    def rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                prenorm=False, weight_offset=0.0):
        calls.append("rmsnorm")
        h = x if residual is None else x + residual
        hf = h.float()
        out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
        return (out, h) if residual is not None and prenorm else out

    def layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False, return_mean=False):
        calls.append("layernorm_fwd")
        assert x.dim() == 2 and weight.dtype == torch.float32 and bias.dtype == torch.float32
        xf = x.detach().float()
        mean = xf.mean(-1)
        rstd = torch.rsqrt(((xf - mean[:, None]) ** 2).mean(-1) + eps)
        out = ((xf - mean[:, None]) * rstd[:, None] * weight + bias).to(x.dtype)
        return out, rstd, mean

    def layernorm_bwd(x, weight, dout, rstd, mean, has_bias=True):
        calls.append("layernorm_bwd")
        xhat = (x.float() - mean[:, None]) * rstd[:, None]
        wdy = dout.float() * weight
        c1, c2 = (xhat * wdy).mean(-1, keepdim=True), wdy.mean(-1, keepdim=True)
        dx = ((wdy - xhat * c1 - c2) * rstd[:, None]).to(x.dtype)
        return dx, (dout.float() * xhat).sum(0), dout.float().sum(0) if has_bias else None

    quack = types.ModuleType("quack")
    quack.rmsnorm = rmsnorm
    norms = types.ModuleType("quack.rmsnorm")
    norms.rmsnorm, norms.layernorm_fwd, norms.layernorm_bwd = rmsnorm, layernorm_fwd, layernorm_bwd
    monkeypatch.setitem(sys.modules, "quack", quack)
    monkeypatch.setitem(sys.modules, "quack.rmsnorm", norms)
    return calls


def check_quack_provider(spec, monkeypatch, called: list[str], dims=None):
    """The `quack` provider: unavailable on the CPU with the reason; wired to QuACK's entry points
    `called` (checked against the fake_quack stand-in, fwd+bwd in each dtype within the op's
    tolerance); rows QuACK's backward refuses (over 128K elements of fp32) raise Unavailable."""
    from kcollect.spec import Unavailable

    provider = spec.provider("quack")
    why = provider.available("cpu")
    assert why is not None and "quack" in why, why
    calls = fake_quack(monkeypatch)
    for dtype in spec.dtypes:
        check_case(spec, "quack", "fwd+bwd", dtype, dims or {"M": 23, "N": 300})
    assert calls[:len(called)] == called, calls
    wide = spec.make_inputs({"M": 1, "N": 128 * 1024 + 8}, torch.float32, "cpu", 0)
    for name in spec.grad_inputs:
        wide[name].requires_grad_(True)
    with pytest.raises(Unavailable, match="128K|131072"):
        provider.fn(**wide)
