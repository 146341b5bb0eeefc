"""Compile a Triton kernel offline for sm_90 (no GPU needed) and report what the compiler made of
it: registers per thread, spill stores/loads, shared memory, and counts of the SASS instructions
that matter for a memory-bound kernel (global loads/stores by width, barriers, local memory).

Used as evidence for launch choices: a variant that spills, or whose loads are not 16 bytes wide,
explains a bandwidth shortfall before any GPU time is spent. `loops` counts what each loop of the
SASS does an iteration: a barrier and shared-memory traffic inside a time loop is a layout crossing
the compiler left there (conv1d's backward loaded its taps' weights in its loop: 8 barriers and 36
shared-memory loads and stores an iteration, none once they were loaded before it).

Compile with the GPU's Triton: the layouts it picks differ between versions (the selective scan's
lanes forward, sm_90: Triton 3.6 puts a warp's lanes on the channels as the kernel intends, 3.7.1
puts 16 of them on the states). Where this machine's Triton is another, install the benchmark
runner's pin (requirements/gpu.txt) beside it and put it first on the path:

    pip install --no-deps --target /tmp/triton-gpu "$(grep '^triton==' requirements/gpu.txt)"
    PYTHONPATH=/tmp/triton-gpu:. TRITON_CACHE_DIR=/tmp/triton-gpu-cache python SCRIPT

    from benchmarks.compile_report import report
    print(report(fn, {"x_ptr": "*bf16", "N": "i32", "BLOCK": "constexpr"}, {"BLOCK": 4096},
                 num_warps=8, aligned=("x_ptr", "N")))
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU even inside the CPU test session

import torch  # noqa: E402
import triton  # noqa: E402
import triton.backends.nvidia as _nv  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

_BIN = os.path.join(os.path.dirname(_nv.__file__), "bin")
_TARGET = GPUTarget("cuda", 90, 32)


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int, aligned=(), num_stages: int = 3,
                 maxnreg: int | None = None):
    """The compiled kernel. `aligned` names pointer/int arguments to mark divisible by 16, as the
    JIT does for 16-byte-aligned pointers and ints that are multiples of 16; `maxnreg`: a register
    cap, as the launch keyword."""
    while not hasattr(fn, "arg_names"):  # unwrap autotune/heuristics wrappers
        fn = fn.fn
    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn, signature, constexprs, attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=_TARGET, options=options)


def _resource_usage(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([os.path.join(_BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}
    return usage, sass


def _instructions(sass: str) -> dict[int, tuple[str, str]]:
    """address -> (opcode, operands) of each SASS instruction (its predicate left out)."""
    body = {}
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", line)
        if m:
            body[int(m.group(1), 16)] = (m.group(2), m.group(3))
    return body


def _sass_counts(sass: str) -> dict:
    kept = ("LDG", "STG", "LDL", "STL", "BAR", "ATOMG", "RED", "LDS", "STS", "SHFL")
    ops = collections.Counter(op for op, _ in _instructions(sass).values() if op.startswith(kept))
    return dict(sorted(ops.items()))


def loops(sass: str) -> list[dict]:
    """Each loop of the SASS (a branch back to an earlier address), innermost first by size: its
    first and last address, instructions, barriers, shared-memory loads and stores, global loads."""
    body = _instructions(sass)
    out = []
    for end, (op, rest) in body.items():
        target = re.search(r"(0x[0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < end:
            ops = [o for a, (o, _) in body.items() if int(target.group(1), 16) <= a <= end]
            out.append({"start": target.group(1), "end": hex(end), "instructions": len(ops),
                        "barriers": sum(o.startswith("BAR") for o in ops),
                        "shared": sum(o.startswith(("LDS", "STS")) for o in ops),
                        "global_loads": sum(o.startswith("LDG") for o in ops)})
    return sorted(out, key=lambda r: r["instructions"])


def report(fn, signature: dict, constexprs: dict, num_warps: int, aligned=(), num_stages: int = 3,
           sass: bool = False, maxnreg: int | None = None) -> dict:
    k = compile_sm90(fn, signature, constexprs, num_warps, aligned, num_stages, maxnreg)
    usage, text = _resource_usage(k.asm["cubin"])
    out = {"registers": usage.get("REG"), "local_bytes": usage.get("LOCAL", 0),
           "stack": usage.get("STACK", 0), "shared": k.metadata.shared, "num_warps": num_warps,
           "sass_ops": _sass_counts(text)}
    if sass:
        out["sass"] = text
    return out


def format_report(label: str, r: dict) -> str:
    ops = " ".join(f"{k}:{v}" for k, v in r["sass_ops"].items())
    return (f"{label}: {r['registers']} regs, {r['num_warps']} warps, local {r['local_bytes']} B, "
            f"shared {r['shared']} B | {ops}")


_PTR_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
              torch.float8_e4m3fn: "*fp8e4nv", torch.int8: "*i8", torch.uint8: "*u8", torch.int32: "*i32",
              torch.int64: "*i64", torch.float64: "*fp64"}


def specialise(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attributes, options) of one launch recorded by ab_tools.recorded (a
    launcher called on 'meta' or fake tensors), specialised as the JIT would: tensors as
    16-byte-aligned pointers, ints by value (divisible by 16, equal to 1), `maxnreg` applied if the
    launch set it."""
    sig, const, attrs = {}, {}, {}
    for i, (p, a) in enumerate(zip(fn.params, args)):
        dtype = a if isinstance(a, torch.dtype) else a.dtype if torch.is_tensor(a) else None  # (warmup passes dtypes)
        if dtype is not None:
            sig[p.name], spec = _PTR_TYPES[dtype], "D"  # fresh allocations: 16-byte aligned
        else:
            sig[p.name], spec = native_specialize_impl(BaseBackend, a, False, not p.do_not_specialize,
                                                       not p.do_not_specialize_on_alignment)
            if sig[p.name] == "constexpr":
                const[p.name] = a
        if spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    for p in fn.params[len(args):]:
        sig[p.name] = "constexpr"
        const[p.name] = kwargs.get(p.name, p._param.default)
    options = {"num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3)}
    if kwargs.get("maxnreg"):
        options["maxnreg"] = kwargs["maxnreg"]
    return sig, const, attrs, options


def compile_recorded(fn, args: tuple, kwargs: dict):
    """The sm_90 binary of one recorded launch (see specialise)."""
    sig, const, attrs, options = specialise(fn, args, kwargs)
    return triton.compile(ASTSource(fn, sig, const, attrs), target=_TARGET, options=options)


def compile_launch(fn, args: tuple, kwargs: dict, sass: bool = False) -> tuple[dict, dict, float]:
    """(report, constexprs, compile seconds) for one recorded launch (see specialise); with `sass`,
    the report holds the SASS text too."""
    t0 = time.perf_counter()
    k = compile_recorded(fn, args, kwargs)
    secs = time.perf_counter() - t0
    usage, text = _resource_usage(k.asm["cubin"])
    const = specialise(fn, args, kwargs)[1]
    r = {"registers": usage.get("REG"), "local_bytes": usage.get("LOCAL", 0), "stack": usage.get("STACK", 0),
         "shared": k.metadata.shared, "num_warps": k.metadata.num_warps, "sass_ops": _sass_counts(text),
         "loops": loops(text)}
    if sass:
        r["sass"] = text
    return r, const, secs


def binary_key(fn, args: tuple, kwargs: dict) -> tuple:
    """What tells two recorded launches' binaries apart: kernel, constexprs and warps, and how the
    JIT specialises the scalar arguments (== 1, divisible by 16). Equal keys: compile once."""
    scalars = tuple((a == 1, a % 16 == 0) for a in args if isinstance(a, int))
    return fn.fn.__name__, tuple(sorted(kwargs.items())), scalars


def per_sm(regs: int, warps: int, shared: int = 0) -> int:
    """Programs per SM that registers, threads and shared memory allow (H100/H200: 64K registers,
    2048 threads, 228 KB shared, 1 KB of it reserved per program)."""
    per_warp = triton.cdiv(regs * 32, 256) * 256
    by_smem = 233472 // (shared + 1024) if shared else 32
    return min(65536 // (per_warp * warps), 2048 // (32 * warps), by_smem)
