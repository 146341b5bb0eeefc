"""Why is Liger's rope forward faster in the collector than in benchmarks/rope_ab.py? (GPU only,
~40 s on an H200.)

At the small rope shapes the collector measured Liger's forward 6-9% faster than ours (run
56a11cd4: 8x14x2x2048x64 21.3 against 23.1 us, 3x32x32x1000x80 21.0 against 22.8), while the A/B
(rope_ab_h200_run3/4.txt) timed the same Liger call at 22.2-22.7 us, about as fast as our launch
writing in place. This runs, in one process and in this order, per shape: (1) the collector's own
Runner.run_case on the forward with ours and Liger, into a throwaway DuckDB file; (2) the A/B's
way, each provider's call built on private copies of the inputs after the float64 reference;
(3) the same, Liger first; (4) the Runner again; (5) the Runner with every provider, in the
collector's order (ours, eager, torch.compile, Liger); (6, 7) as 2 and 3 with
200 ms of matmuls run right before each provider is timed; (8-10) the Runner with the providers
in other orders (ours last; the usual; eager, ours, Liger). The direct lines give where q lies (MiB into its
GiB) and its strides, so that a difference can be laid next to them.

What it found (docs/evidence/rope_context_check_h200.txt): Liger's forward is 5% faster once
torch.compile has been timed earlier in the process, and only then; ours is not, wherever it is
timed. Not the clock's warm-up (steps 6-7) and not the ptxas that inductor switches the process
to (run 5: TRITON_PTXAS_PATH pinned from the start, the same). The cause is not known.

    python benchmarks/rope_context_check.py
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kcollect import runner as R  # noqa: E402
from kcollect import timing, verify  # noqa: E402
from kcollect.kernels import get  # noqa: E402
from kcollect.store import Store  # noqa: E402

SHAPES = [{"B": 8, "Hq": 14, "Hk": 2, "T": 2048, "D": 64, "pos": "ids"},
          {"B": 3, "Hq": 32, "Hk": 32, "T": 1000, "D": 80, "pos": "ids"}]
PROVIDERS = ("triton", "liger")


def _label(dims) -> str:
    return "x".join(str(dims[k]) for k in ("B", "Hq", "Hk", "T", "D", "pos"))


def collector_case(label: str, dims, providers=PROVIDERS) -> None:
    """The Runner on one case, timing `providers` in the order given (it times them in the spec's
    order: a copy of the spec in this one)."""
    spec = get("rope")
    spec = dataclasses.replace(spec, providers=tuple(spec.provider(n) for n in providers))
    config = R.RunConfig(kernels=("rope",), grid="full", device="cuda", modes=("fwd",), providers=providers,
                         warmup_ms=5, rep_ms=25)
    case = next(c for c in R.plan([spec], config) if c.shape.dims == dims)
    with tempfile.TemporaryDirectory() as d:
        store = Store(os.path.join(d, "check.duckdb"))
        runner = R.Runner(config, store)
        runner.start(os.getcwd())
        for row in runner.run_case(case):
            print(f"{_label(dims)} {label:30s} {row['provider']:7s} {row['status']:6s} "
                  f"{(row['median_ms'] or 0) * 1000:7.1f} us", flush=True)
        runner.finish("ok")
        store.close()


def busy(ms: float) -> None:
    """About `ms` of back-to-back bf16 matmuls (the GPU at full load, as after eager's long case)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(10):
            a @ a
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= ms:
            return


def direct(label: str, dims, providers, warm_ms: float = 0.0) -> None:
    spec = get("rope")
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    inputs = spec.make_inputs(dims, torch.bfloat16, "cuda", 0)
    dys, want = verify.reference_answers(spec, inputs, "fwd", 1)
    for provider in providers:
        mine = verify.clone_inputs(inputs)
        call = verify.build_call(spec, spec.provider(provider).fn, mine, "fwd", dys)
        with torch.no_grad():
            err = verify.error_of(spec, call(), want, "fwd")
            if warm_ms:
                busy(warm_ms)
            t = timing.time_cuda_graph(call, timing.Budget(5, 25), flush)
        q = mine["q"]
        print(f"{_label(dims)} {label:30s} {provider:7s} ok     {t.median_ms * 1000:7.1f} us  err {err:.1e}  "
              f"q@{q.data_ptr() % (1 << 30) >> 20}M strides {tuple(q.stride())}", flush=True)
        call = mine = q = None
        torch.cuda.empty_cache()


def main():
    print(f"{torch.cuda.get_device_name()} rope fwd, bf16, CUDA graphs, L2 flushed", flush=True)
    for dims in SHAPES:
        collector_case("1 collector Runner.run_case", dims)
        direct("2 direct, ours first", dims, PROVIDERS)
        direct("3 direct, Liger first", dims, PROVIDERS[::-1])
        collector_case("4 collector again", dims)
        # run 2: as in a full run, with eager and torch.compile timed between ours and Liger's
        collector_case("5 collector, all providers", dims, ("triton", "torch", "compile", "liger"))
        # run 3: the GPU kept busy for 200 ms (matmuls) right before each provider is timed
        direct("6 direct, 200 ms busy before", dims, PROVIDERS, warm_ms=200)
        direct("7 direct, Liger first, busy", dims, PROVIDERS[::-1], warm_ms=200)
        # run 4: every provider, ours last (and the usual order again)
        collector_case("8 collector, ours last", dims, ("torch", "compile", "liger", "triton"))
        collector_case("9 collector, all, usual order", dims, ("triton", "torch", "compile", "liger"))
        collector_case("10 collector, eager then ours", dims, ("torch", "triton", "liger"))


if __name__ == "__main__":
    main()
