"""Where does the collector's slower time for our swiglu backward at 16384x14336 come from? (GPU only,
~60 s on an H200.)

The collector measured ours at 610 us and torch.compile at 548 (runs 737d6f99, 3eb2496c), while
benchmarks/stream_check.py timed the same call at 548 in a process of its own. This runs, in one
process and in this order: (1) the collector's own Runner.run_case on that one case, into a
throwaway DuckDB file; (2) the stream_check timing (upstream gradient drawn on the device, no
float64 reference); (3) the same with the float64 reference computed first and its gradients as
the upstream gradient, as the collector does; (4) the Runner again. The direct lines give where
the call's inputs a and b lie (MiB into their GiB), so that a difference can be laid next to it.

    python benchmarks/swiglu_context_check.py
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect import runner as R  # noqa: E402
from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import get  # noqa: E402
from kcollect.store import Store  # noqa: E402

M, N = 16384, 14336
PROVIDERS = ("triton", "compile")


def _addr(t: torch.Tensor) -> str:
    return f"{t.data_ptr() % (1 << 30) >> 20:4d}M"  # the address within its GiB, in MiB


def collector_case(label: str) -> None:
    spec = get("swiglu")
    config = R.RunConfig(kernels=("swiglu",), grid="full", device="cuda", modes=("bwd",), providers=PROVIDERS,
                         warmup_ms=5, rep_ms=25)
    case = next(c for c in R.plan([spec], config) if c.shape.dims == {"M": M, "N": N})
    with tempfile.TemporaryDirectory() as d:
        store = Store(os.path.join(d, "check.duckdb"))
        runner = R.Runner(config, store)
        runner.start(os.getcwd())
        for row in runner.run_case(case):
            print(f"{label:34s} {row['provider']:8s} {row['status']:6s} {(row['median_ms'] or 0) * 1000:8.1f} us",
                  flush=True)
        runner.finish("ok")
        store.close()


def direct(label: str, with_reference: bool) -> None:
    spec = get("swiglu")
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(5, 25)
    inputs = spec.make_inputs({"M": M, "N": N}, torch.bfloat16, "cuda", 0)
    if with_reference:
        dys, want = verify.reference_answers(spec, inputs, "bwd", 1)
    else:
        dys, want = (torch.randn(M, N, device="cuda", dtype=torch.float64),), None
    for provider in PROVIDERS:
        mine = verify.clone_inputs(inputs)
        call = verify.build_call(spec, spec.provider(provider).fn, mine, "bwd", dys)
        out = call()
        err = verify.error_of(spec, out, want, "bwd") if want is not None else float("nan")
        t = timing.time_cuda_graph(call, budget, flush)
        where = " ".join(f"{k}@{_addr(v)}" for k, v in mine.items() if torch.is_tensor(v))
        print(f"{label:34s} {provider:8s} ok     {t.median_ms * 1000:8.1f} us  err {err:.1e}  {where}", flush=True)
        call = mine = out = None
        torch.cuda.empty_cache()


def main():
    print(f"{torch.cuda.get_device_name()} swiglu bwd {M}x{N} bf16, CUDA graphs, L2 flushed", flush=True)
    collector_case("1 collector Runner.run_case")
    direct("2 direct, device-drawn dy", with_reference=False)
    direct("3 direct, float64 reference first", with_reference=True)
    collector_case("4 collector Runner.run_case again")


if __name__ == "__main__":
    main()
