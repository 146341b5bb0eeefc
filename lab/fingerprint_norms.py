"""What a launcher launches on an H100 / H200, found without a GPU: every Triton launch of a call,
recorded instead of run, with the grid, the launch options and a hash of the SASS each launch's
binary compiles to for sm_90 (offline, with Triton's ptxas). (rms_norm's, add_rms_norm's and
layer_norm's tables were made with this module; lab/fingerprint.py runs a spec's provider as the
collector does instead.) Two code versions whose tables are
equal launch the same machine code with the same grids: a refactor that keeps them equal cannot
have cost a GB/s.

How the GPU is emulated, below the launchers so that their own code runs unpatched:
- tensors live on the 'meta' device (no memory, no data) but report themselves as cuda:0
  (`Tensor.device`, `Tensor.is_cuda`), and factories asked for a CUDA tensor make a meta one;
- torch.cuda.get_device_properties / get_device_capability answer for the emulated GPU (SM count,
  L2, registers, threads and shared memory per SM, sm_90);
- `JITFunction.warmup` (what the occupancy queries compile to count registers) compiles offline;
- `kernel[grid](...)` records the launch (benchmarks/ab_tools.recorded).

lab/norms_fingerprint.py lists the cases and calls `main`.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import compile_report as cr  # noqa: E402  (first: compiles for the GPU, not the interpreter)

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from benchmarks.ab_tools import recorded  # noqa: E402

# What the launchers read of the GPU (torch.cuda.get_device_properties), for the two sm_90 parts.
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", multi_processor_count=132, L2_cache_size=50 << 20),
    "h200": dict(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=60 << 20),
}
_SM90 = dict(major=9, minor=0, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
             shared_memory_per_multiprocessor=233472, total_memory=80 << 30, warp_size=32)


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


_DEVICE = torch._C.TensorBase.__dict__["device"]
_IS_CUDA = torch._C.TensorBase.__dict__["is_cuda"]


class _MetaAsCuda(TorchFunctionMode):
    """Meta tensors that say they are on cuda:0; CUDA factories that make meta tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE:
            d = func(*args)
            return torch.device("cuda", 0) if d.type == "meta" else d
        if owner is _IS_CUDA:
            return func(*args) or _DEVICE.__get__(args[0]).type == "meta"
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


_COMPILED: dict = {}


def _compiled(fn, args: tuple, kwargs: dict):
    """(compiled kernel, constexprs) of a launch, compiled once per binary (ab_tools' binary key plus
    the launch options and argument dtypes)."""
    key = (cr.binary_key(fn, args, kwargs), tuple(str(a.dtype) for a in args if torch.is_tensor(a)))
    if key not in _COMPILED:
        _COMPILED[key] = cr.compile_recorded(fn, args, kwargs), cr.specialise(fn, args, kwargs)[1]
    return _COMPILED[key]


def _warmup(self, *args, grid, **kwargs):
    """JITFunction.warmup, offline: what the occupancy queries read of the compiled kernel."""
    k, _ = _compiled(self, args, kwargs)
    regs = cr._resource_usage(k.asm["cubin"])[0]["REG"]
    return types.SimpleNamespace(n_regs=regs, metadata=k.metadata, _init_handles=lambda: None)


@contextlib.contextmanager
def emulated(gpu: str):
    """Launchers called inside see an sm_90 `gpu` ('h100' or 'h200'); their launches are recorded
    into the list yielded, nothing runs."""
    props = types.SimpleNamespace(**_SM90, **GPUS[gpu])
    saved = (torch.cuda.get_device_properties, torch.cuda.get_device_capability, torch.cuda.is_available,
             JITFunction.warmup)
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.is_available = lambda: True
    JITFunction.warmup = _warmup
    calls: list = []
    try:
        with _MetaAsCuda(), recorded(calls):
            yield calls
    finally:
        (torch.cuda.get_device_properties, torch.cuda.get_device_capability, torch.cuda.is_available,
         JITFunction.warmup) = saved


def sass_hash(compiled, name: str) -> tuple[str, int]:
    """(hash, instruction count) of the kernel's SASS: the instructions only, their addresses and the
    kernel's own name stripped (a renamed kernel with the same code hashes the same)."""
    text = cr._resource_usage(compiled.asm["cubin"])[1].replace(name, "KERNEL")
    ins = [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
           for line in text.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha1("\n".join(ins).encode()).hexdigest()[:16], len(ins)


def describe(fn, grid, args, kwargs) -> dict:
    """One launch as a row: kernel, grid, launch options, the runtime arguments (scalars by value,
    tensors by shape and dtype), the constexprs, and the compiled binary's registers, spill and SASS."""
    k, const = _compiled(fn, args, kwargs)
    name = fn.fn.__name__
    digest, n = sass_hash(k, name)
    usage = cr._resource_usage(k.asm["cubin"])[0]
    return {
        "kernel": name,
        "grid": list(grid),
        "num_warps": kwargs.get("num_warps", 4),
        "num_stages": kwargs.get("num_stages", 3),
        "maxnreg": kwargs.get("maxnreg") or None,
        "args": [[list(a.shape), str(a.dtype)[6:]] if torch.is_tensor(a) else a for a in args],
        "constexprs": {k_: v for k_, v in const.items()},
        "registers": usage.get("REG"),
        "stack": usage.get("STACK", 0),
        "sass": digest,
        "instructions": n,
    }


# What must be equal for two launches to be the same launch (the kernel's and constexprs' names may
# change; what they compile to may not).
COMPARED = ("grid", "num_warps", "num_stages", "maxnreg", "args", "sass", "registers", "stack")


def table(cases, gpus=("h100", "h200"), log=sys.stderr) -> list[dict]:
    """Rows {case..., gpu, launches: [describe(...)]} for each case (a dict with 'call': a function
    of no arguments that calls the launchers on meta tensors, plus the fields that name the case)."""
    rows = []
    for gpu in gpus:
        for case in cases:
            with emulated(gpu) as calls:
                case["call"]()
            launches = [describe(fn, grid, args, kwargs) for fn, grid, args, kwargs in calls]
            row = {k: v for k, v in case.items() if k != "call"} | {"gpu": gpu, "launches": launches}
            rows.append(row)
            print(_line(row), file=log, flush=True)
    return rows


def _key(row) -> tuple:
    return tuple((k, json.dumps(v)) for k, v in row.items() if k != "launches")


def _line(row) -> str:
    head = " ".join(str(v) for k, v in row.items() if k != "launches")
    return head + " | " + " ; ".join(
        f"{l['kernel']}{l['grid']} w{l['num_warps']} s{l['num_stages']} r{l['maxnreg'] or '-'} "
        f"{l['registers']}reg {l['sass'][:8]}" for l in row["launches"])


def compare(before: list[dict], after: list[dict]) -> list[str]:
    """The differences between two tables, one line each (none: the same launches everywhere)."""
    a = {_key(r): r for r in after}
    out = []
    for r in before:
        k = _key(r)
        if k not in a:
            out.append(f"missing after: {_line(r)}")
            continue
        la, lb = r["launches"], a[k]["launches"]
        if len(la) != len(lb):
            out.append(f"{len(la)} launches before, {len(lb)} after: {_line(r)} || {_line(a[k])}")
            continue
        for i, (x, y) in enumerate(zip(la, lb)):
            diff = [f for f in COMPARED if x[f] != y[f]]
            if diff:
                out.append(f"launch {i} differs in {diff}: {_line(r)} || {_line(a[k])}")
    extra = set(a) - {_key(r) for r in before}
    out += [f"new after: {_line(a[k])}" for k in extra]
    return out


def main(cases, argv=None) -> int:
    """CLI of an op's fingerprint script: --out FILE writes the table (JSON), --tree DIR takes the
    kernels from another checkout, --compare BEFORE AFTER prints the differences (exit 1 if any)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the table here (JSON)")
    ap.add_argument("--tree", help="import kcollect and its kernels from this checkout")
    ap.add_argument("--gpu", action="append", choices=sorted(GPUS), help="emulated GPU(s), default both")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--only", action="append", default=[], metavar="FIELD=VALUE",
                    help="only the cases with this field (op, shape, dtype, phase), e.g. op=layer_norm")
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = compare(before, after)
        n = sum(len(r["launches"]) for r in before)
        print("\n".join(diffs) or f"equal: {len(before)} cases, {n} launches, "
              f"{len({l['sass'] for r in before for l in r['launches']})} distinct binaries")
        return 1 if diffs else 0
    if args.tree:
        use_tree(args.tree)
    only = [tuple(o.split("=", 1)) for o in args.only]
    if any(len(o) != 2 for o in only):
        ap.error(f"--only takes FIELD=VALUE, e.g. op=layer_norm: got {args.only}")
    rows = table([c for c in cases() if all(str(c.get(k)) == v for k, v in only)], tuple(args.gpu or GPUS))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0

