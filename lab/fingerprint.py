"""What an op's provider launches on an H100/H200, without a GPU: every Triton launch of a spec's
`triton` provider (kernel, grid, scalar arguments, constexprs, warps, stages, register cap) per
(shape, mode, dtype), and a hash of each distinct binary's SASS compiled offline for sm_90. Two
trees whose tables are equal launch the same binaries the same way, so they run at the same speed:
the evidence a refactor needs before any GPU time is spent.

How it emulates the GPU: inputs are fake CUDA tensors (torch's FakeTensorMode: shapes, strides and
dtypes, no memory), made by the spec's own make_inputs and laid out as it lays them out; the
device queries the launchers make (torch.cuda.get_device_properties / get_device_capability) answer
as an H100 or H200 would; launches are recorded instead of run (benchmarks/ab_tools.recorded).
Autograd's engine cannot run on fake CUDA tensors in a CPU build of torch, so autograd.Function.apply
is replaced by a tape that calls the Function's forward and, for the backward modes, its backward
with contiguous upstream gradients of the outputs' dtype (what the collector passes).

    from lab.fingerprint import table, compare
    rows = table(spec, shapes, modes, dtypes)   # JSON-able; compare(before, after) lists differences
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import tempfile
import types

from benchmarks import compile_report as cr  # first: compiles for the GPU, not the interpreter

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402

# What the launchers may ask of the device (the H100 SXM and the H200: 132 SMs each, L2 50 / 60 MB)
GPUS = {
    "H100": dict(name="NVIDIA H100 80GB HBM3", L2_cache_size=50 << 20, total_memory=80 << 30),
    "H200": dict(name="NVIDIA H200", L2_cache_size=60 << 20, total_memory=141 << 30),
}
_SM90 = dict(major=9, minor=0, multi_processor_count=132, max_threads_per_multi_processor=2048,
             regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
             shared_memory_per_block_optin=232448, warp_size=32)


@contextlib.contextmanager
def emulated(gpu: str):
    """torch.cuda's device queries answer as `gpu` (a key of GPUS) would."""
    props = types.SimpleNamespace(**_SM90, **GPUS[gpu])
    saved = {n: getattr(torch.cuda, n) for n in ("get_device_properties", "get_device_capability",
                                                 "get_device_name", "is_available", "device_count")}
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: props.name
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.cuda, n, f)


class _Ctx:
    """What an autograd.Function's forward and backward use of their ctx."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


@contextlib.contextmanager
def taped(tape: list):
    """autograd.Function.apply runs the Function's forward directly and appends (Function, ctx,
    outputs) to `tape` (see the module docstring)."""
    saved = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args):
        ctx = _Ctx()
        ctx.needs_input_grad = tuple(torch.is_tensor(a) and a.is_floating_point() for a in args)
        out = cls.forward(ctx, *args)
        tape.append((cls, ctx, out))
        return out

    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = saved


def _on_cuda(inputs: dict) -> dict:
    return {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") if torch.is_tensor(v) else v
            for k, v in inputs.items()}


def launches(spec, dims, mode: str, dtype, provider: str = "triton") -> list:
    """The (kernel, grid, args, kwargs) launched by one unit of `mode`'s work of the provider, as the
    collector calls it (verify.build_call): fwd: the forward; bwd: the backward of a forward made
    before; fwd+bwd: both. Call inside `emulated`."""
    fn = spec.provider(provider).fn
    calls, tape = [], []
    with FakeTensorMode(allow_non_fake_inputs=True), taped(tape), recorded(calls):
        inputs = _on_cuda(spec.make_inputs(dims, dtype, "cpu", 0))
        outs = fn(**inputs)
        if mode == "bwd":
            del calls[:]
        if mode != "fwd":
            for cls, ctx, out in tape:
                out = out if isinstance(out, tuple) else (out,)
                cls.backward(ctx, *(torch.empty(o.shape, dtype=o.dtype, device=o.device) for o in out))
    del outs
    return calls


def describe(fn, grid, args, kwargs) -> dict:
    """A launch as data: kernel, grid, scalar arguments by name, constexprs (defaults included),
    warps, stages and register cap, and the pointer types."""
    sig, const, _, options = cr.specialise(fn, args, kwargs)
    names = [p.name for p in fn.params]
    scalars = {n: a for n, a in zip(names, args) if not torch.is_tensor(a) and n not in const}
    pointers = {n: sig[n] for n, a in zip(names, args) if torch.is_tensor(a)}
    return {"kernel": fn.fn.__name__, "grid": list(grid), "scalars": scalars,
            "constexprs": {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                           for k, v in const.items()},
            "options": options, "pointers": pointers}


def sass_hash(fn, args, kwargs) -> str:
    """sha1 (12 hex digits) of the binary's SASS instructions, addresses and the kernel's name
    stripped: equal for the same code whatever the kernel is called."""
    compiled = cr.compile_recorded(fn, args, kwargs)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([os.path.join(cr._BIN, "cuobjdump"), "--dump-sass", f.name],
                             capture_output=True, text=True, check=True).stdout
    name = fn.fn.__name__
    ins = [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip().replace(name, "KERNEL")
           for line in out.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12]


def table(spec, shapes, modes, dtypes, gpus=tuple(GPUS), log=print) -> dict:
    """{case: [launch, ...]} with case = "op|mode|dtype|shape label|gpu" and each launch
    `describe`d plus its "sass" hash. Each distinct binary is compiled once."""
    hashes: dict[str, str] = {}
    rows = {}
    for gpu in gpus:
        with emulated(gpu):
            for shape in shapes:
                for dtype in dtypes:
                    for mode in modes:
                        case = f"{spec.name}|{mode}|{str(dtype)[6:]}|{shape.label}|{gpu}"
                        rows[case] = []
                        for fn, grid, args, kwargs in launches(spec, shape.dims, mode, dtype):
                            d = describe(fn, grid, args, kwargs)
                            key = repr((d["kernel"], d["constexprs"], d["options"], d["pointers"],
                                        cr.binary_key(fn, args, kwargs)[2]))
                            if key not in hashes:
                                hashes[key] = sass_hash(fn, args, kwargs)
                                log(f"  compiled {d['kernel']} {d['constexprs']} {d['options']}: {hashes[key]}")
                            rows[case].append({**d, "sass": hashes[key]})
    return rows


def compare(before: dict, after: dict, dropped: tuple[str, ...] = ()) -> list[str]:
    """One line per case that differs (or exists on one side only); empty: the same launches.
    `dropped`: constexprs a change removed (a parameter of a deleted code path), left out of both."""
    def strip(rows):
        return None if rows is None else [{**r, "constexprs": {k: v for k, v in r["constexprs"].items()
                                                                 if k not in dropped}} for r in rows]

    out = []
    for case in sorted(set(before) | set(after)):
        a, b = strip(before.get(case)), strip(after.get(case))
        if a != b:
            out.append(f"{case}: before {a}\n    after  {b}")
    return out
