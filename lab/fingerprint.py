"""Launch fingerprints without a GPU: what an op's own provider (`ours`) launches on an emulated sm_90
GPU (kernel, grid, scalar arguments, tensor shapes and dtypes, constexprs, warps, stages, register
cap) and, per launch, the registers, shared memory, stack and a hash of the SASS its binary
compiles to for sm_90 offline (addresses and the kernel's own name stripped). Two trees whose
tables are equal launch the same binaries the same way, so they run at the same speed: what a
refactor of the kernels needs before any GPU time is spent.

How the GPU is emulated: the tensors are 'meta' tensors (shapes and dtypes, no memory) that tell
the kernels' code (and only it) they live on cuda:0; torch.cuda's device queries answer as an H100
or H200 would (132 SMs, the L2, sm_90); the occupancy query that persistent and coop grids are
sized by (JITFunction.warmup) compiles offline and reads the registers from the cubin; Triton
launches are recorded instead of run (benchmarks/ab_tools.recorded). A case runs the spec's triton
provider as the collector's mode does: fwd under no_grad, bwd the backward of one forward (only its
launches kept), fwd+bwd both.

An op family's script (lab/norms_fingerprint.py, lab/elementwise_fingerprint.py,
lab/softmax_ce_fingerprint.py) lists its cases with `spec_cases` and calls `main`; each takes

    --out FILE                  write the table (JSON)
    --compare BEFORE AFTER      print the differences; exit 1 if any launch differs
    --tree DIR                  import kcollect and its kernels from another checkout (the "before")
    --gpu h100|h200             the emulated GPU (repeatable; default both)
    --only FIELD=VALUE          only the cases with op, mode, dtype or shape = VALUE (repeatable)
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
import types
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402
from kcollect.spec import DTYPE_NAMES, shape_label  # noqa: E402

# What torch.cuda.get_device_properties says on the two sm_90 GPUs the kernels are tuned on.
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", multi_processor_count=132, L2_cache_size=50 << 20,
                 total_memory=80 << 30),
    "h200": dict(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=60 << 20, total_memory=141 << 30),
}
_SM90 = dict(major=9, minor=0, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
             shared_memory_per_multiprocessor=233472, shared_memory_per_block_optin=232448,
             shared_memory_per_block=49152, warp_size=32)

_BINARIES: dict[tuple, dict] = {}  # binary key -> what its offline compile gave


def binary(fn, args: tuple, kwargs: dict) -> dict:
    """Registers, shared memory, stack, and the SASS hash and length of one launch, compiled once per
    distinct binary (ab_tools' key plus the arguments' dtypes)."""
    key = (cr.binary_key(fn, args, kwargs), tuple(str(a.dtype) for a in args if torch.is_tensor(a)))
    if key not in _BINARIES:
        rep, _, _ = cr.compile_launch(fn, args, kwargs, sass=True)
        name = fn.fn.__name__
        lines = [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip().replace(name, "KERNEL")
                 for line in rep["sass"].splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
        _BINARIES[key] = {"registers": rep["registers"], "shared": rep["shared"], "stack": rep["stack"],
                          "sass": hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12],
                          "instructions": len(lines)}
    return _BINARIES[key]


def _warmup(self, *args, grid, **kwargs):
    """JITFunction.warmup on the emulated GPU: the offline compile's registers and shared memory."""
    b = binary(self, args, kwargs)
    return types.SimpleNamespace(n_regs=b["registers"], metadata=types.SimpleNamespace(shared=b["shared"]),
                                 _init_handles=lambda: None)


_CUDA = torch.device("cuda", 0)
_DEVICE, _IS_CUDA = torch._C.TensorBase.device, torch._C.TensorBase.is_cuda


def _asked_by_kernels() -> bool:
    return sys._getframe(2).f_globals.get("__name__", "").startswith("kcollect.kernels")


def _kernels_device(t):
    """Tensor.device: a 'meta' tensor is on the GPU where the kernels' code asks."""
    d = _DEVICE.__get__(t)
    return _CUDA if d.type == "meta" and _asked_by_kernels() else d


def _kernels_is_cuda(t):
    return _IS_CUDA.__get__(t) or (_DEVICE.__get__(t).type == "meta" and _asked_by_kernels())


def _on_meta(factory):
    """torch.<factory> making on 'meta' what is asked for on the GPU."""

    def make(*args, **kwargs):
        d = kwargs.get("device")
        if isinstance(d, (str, torch.device)) and torch.device(d).type == "cuda":
            kwargs["device"] = "meta"
        return factory(*args, **kwargs)

    return make


_FACTORIES = ("empty", "empty_strided", "zeros", "ones", "full", "arange", "tensor")


def _occupancy_cache() -> dict:
    """resident_programs' answers (kernels/_host/device.py; kernels/_lib/device.py in a tree from before
    the shared code was split by layer, which --tree may name)."""
    for name in ("kcollect.kernels._host.device", "kcollect.kernels._lib.device"):
        try:
            return importlib.import_module(name)._RESIDENT
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("kcollect.kernels._host.device")


@contextmanager
def emulated(gpu: str):
    """Fake CUDA tensors on an emulated `gpu` (a key of GPUS) whose kernels compile offline."""
    props = types.SimpleNamespace(**GPUS[gpu], **_SM90)
    resident = _occupancy_cache()
    resident.clear()
    with ExitStack() as stack:
        patches = [(torch.cuda, "get_device_properties", lambda d=None: props),
                   (torch.cuda, "get_device_capability", lambda d=None: (9, 0)),
                   (torch.cuda, "device", lambda d=None: nullcontext()),  # the kernels' own device switch
                   (JITFunction, "warmup", _warmup),
                   (torch.Tensor, "device", property(_kernels_device)),
                   (torch.Tensor, "is_cuda", property(_kernels_is_cuda))]
        patches += [(torch, name, _on_meta(getattr(torch, name))) for name in _FACTORIES]
        for owner, name, value in patches:
            stack.enter_context(mock.patch.object(owner, name, value))
        yield
    resident.clear()


def fake_inputs(spec, dims, dtype) -> dict:
    """spec.make_inputs' inputs as fresh tensors on the emulated GPU (made under FakeTensorMode:
    no memory, no time at the full grid's sizes)."""
    with FakeTensorMode():
        inputs = spec.make_inputs(dims, dtype, "cpu", 0)
    return {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") if torch.is_tensor(v) else v
            for k, v in inputs.items()}


def mode_launches(spec, mode: str, dims, dtype) -> list:
    """The Triton launches (fn, grid, args, kwargs) of one collector call of our provider in `mode`,
    inside `emulated`."""
    fn = next(p for p in spec.providers if p.ours).fn
    inputs = fake_inputs(spec, dims, dtype)
    calls: list = []
    with recorded(calls):
        if mode == "fwd":
            with torch.no_grad():
                fn(**inputs)
            return calls
        leaves = [inputs[n].requires_grad_(True) for n in spec.grad_inputs]
        outs = fn(**inputs)
        outs = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if o.requires_grad]  # (mlstm's states: not)
        first = len(calls)
        gys = [torch.ones_like(o) if o.dim() == 0 else torch.empty_like(o) for o in outs]  # a loss starts from 1
        torch.autograd.grad(outs, leaves, gys)
    return calls[first:] if mode == "bwd" else calls


def describe(fn, grid, args, kwargs) -> dict:
    """One launch as a row of the table."""
    options = ("num_warps", "num_stages", "maxnreg")
    return {
        "kernel": fn.fn.__name__,
        "grid": list(grid),
        "scalars": [a for a in args if not torch.is_tensor(a)],
        "tensors": [[list(a.shape), str(a.dtype)[6:]] for a in args if torch.is_tensor(a)],
        "constexprs": {k: v for k, v in sorted(kwargs.items()) if k not in options},
        "num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3),
        "maxnreg": kwargs.get("maxnreg"),
        **binary(fn, args, kwargs),
    }


ALL = "all"  # spec_cases: a dtype checked on every shape


def spec_cases(specs, other_dtypes: dict | None = None, grids=("full",)) -> list[tuple]:
    """Cases (spec, mode, dims, dtype): every shape of the grids in every mode in bf16, and in the
    dtypes of other_dtypes[op] ({dtype: shape labels, or ALL}) on those shapes."""
    out = []
    for spec in specs:
        shapes = {s.label: s for g in grids for s in spec.grids[g]}.values()
        for shape in shapes:
            for mode in spec.modes:
                out.append((spec, mode, shape.dims, torch.bfloat16))
                for dtype, labels in (other_dtypes or {}).get(spec.name, {}).items():
                    if labels == ALL or shape.label in labels:
                        out.append((spec, mode, shape.dims, dtype))
    return out


def fields(case) -> dict:
    spec, mode, dims, dtype = case
    return {"op": spec.name, "mode": mode, "dtype": DTYPE_NAMES[dtype], "shape": shape_label(dims)}


def table(cases, gpus=tuple(GPUS)) -> dict:
    """{case key: [launch rows]} for cases of (spec, mode, dims, dtype), on each emulated GPU."""
    out = {}
    for gpu in gpus:
        with emulated(gpu):
            for case in cases:
                key = " ".join([gpu, *fields(case).values()])
                out[key] = [describe(*c) for c in mode_launches(*case)]
                print(key, " | ".join(f"{r['kernel']} {r['grid']} w{r['num_warps']} {r['sass']}" for r in out[key]),
                      flush=True)
    return out


# What must match launch for launch: the binary (SASS hash, registers) and how it is launched.
SAME = ("sass", "instructions", "registers", "shared", "stack", "grid", "scalars", "tensors", "num_warps",
        "num_stages", "maxnreg")


def compare(before: dict, after: dict) -> list[str]:
    """The differences between two tables (cases missing on either side, launches that differ in
    anything of SAME); kernel names and constexprs that differ with the same binary are listed as
    notes (a renamed kernel, a constexpr removed with the variant it chose)."""
    lines, notes = [], set()
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            lines.append(f"{key}: only {'after' if key in after else 'before'}")
            continue
        b, a = before[key], after[key]
        if len(b) != len(a):
            lines.append(f"{key}: {len(b)} launches before, {len(a)} after")
            continue
        for rb, ra in zip(b, a):
            diff = [f"{f} {rb[f]} -> {ra[f]}" for f in SAME if rb[f] != ra[f]]
            if diff:
                lines.append(f"{key} {rb['kernel']}: " + "; ".join(diff))
            if rb["kernel"] != ra["kernel"] or rb["constexprs"] != ra["constexprs"]:
                notes.add(f"note: {rb['kernel']} {rb['constexprs']} -> {ra['kernel']} {ra['constexprs']}")
    return lines + sorted(notes)


def summary(t: dict) -> str:
    launches = [r for rows in t.values() for r in rows]
    return (f"{len(t)} cases, {len(launches)} launches, {len({r['sass'] for r in launches})} distinct binaries "
            f"({len({(r['kernel'], r['sass']) for r in launches})} kernel/binary pairs)")


def use_tree(root: str) -> None:
    """Import kcollect and kcollect.kernels from another checkout (e.g. a worktree of main) instead of
    the installed one: how the table of the code before a change is made."""
    root = Path(root).resolve()
    parent = None
    for name, folder in (("kcollect", "collector"), ("kcollect.kernels", "kernels")):
        spec = importlib.util.spec_from_file_location(name, root / folder / "__init__.py",
                                                      submodule_search_locations=[str(root / folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        if parent is not None:
            parent.kernels = mod
        parent = mod


def main(cases, doc: str, argv=None) -> int:
    """The command line of a family's script (this module's docstring); `cases()` lists its cases,
    called after --tree has chosen the checkout."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", help="write the table (JSON) here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two tables")
    ap.add_argument("--tree", help="import kcollect and its kernels from this checkout")
    ap.add_argument("--gpu", choices=sorted(GPUS), action="append", help="emulated GPU(s) (default both)")
    ap.add_argument("--only", action="append", default=[], metavar="FIELD=VALUE",
                    help="only the cases with this op, mode, dtype or shape, e.g. op=layer_norm (repeatable)")
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        print("before:", summary(before))
        print("after: ", summary(after))
        lines = compare(before, after)
        print("\n".join(lines) or "identical")
        return 1 if any(not line.startswith("note:") for line in lines) else 0
    only = [tuple(o.split("=", 1)) for o in args.only]
    if any(len(o) != 2 or o[0] not in ("op", "mode", "dtype", "shape") for o in only):
        ap.error(f"--only takes FIELD=VALUE with FIELD op, mode, dtype or shape (e.g. op=layer_norm): got {args.only}")
    if args.tree:
        use_tree(args.tree)
    chosen = [c for c in cases() if all(fields(c)[k] == v for k, v in only)]
    t = table(chosen, tuple(args.gpu or GPUS))
    print(summary(t))
    if args.out:
        Path(args.out).write_text(json.dumps(t, indent=1, sort_keys=True, default=str))
    return 0
