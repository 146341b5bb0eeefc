"""GPU only: each case of a multi-kernel full grid gives the device back as it found it.

On an 80 GB H100 the full grid once crept from 16 to 81 GB within gelu's cases and rows went out of
memory for shapes that fit alone. This runs the full grids of several kernels (fwd+bwd, the
standard providers and any peer installed) through the runner, case by case, and asserts after
each case that PyTorch's allocated and reserved bytes, and the device's free bytes, are back within
a small margin of their level before it; it prints one line per case (pytest -s) for the record.
A planted provider whose capture fails goes first. KCOLLECT_MEMTEST_KERNELS narrows or widens the
kernels (default gelu,rms_norm; fwd+bwd, the mode with the most memory). It compiles with the
caches `kcollect run` keeps (cold, torch.compile's graphs of two full grids take minutes).
"""
import gc
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MiB = 1 << 20
# What a case may leave: cuBLAS workspaces of new streams, Triton's and inductor's small buffers.
MARGIN = {"allocated": 64 * MiB, "reserved": 256 * MiB, "used": 512 * MiB}


def _levels():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "used": total - free}


def test_every_case_returns_the_memory_it_found(tmp_path):
    if os.environ.get("KCOLLECT_MEMTEST_CHILD") != "1":
        # In a fresh process, configured as `kcollect run` configures PyTorch's allocator
        # (expandable segments): in this one, earlier tests started CUDA without it.
        env = {**os.environ, "KCOLLECT_MEMTEST_CHILD": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        # no log capture: torch's debug records would bury the case lines and the failure
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:logging",
                              "--tb=short", f"{__file__}::test_every_case_returns_the_memory_it_found"],
                             env=env, capture_output=True, text=True)
        lines = out.stdout.splitlines()
        print("\n".join(line for line in lines if " MiB" in line), out.stderr[-3000:])
        assert out.returncode == 0, "\n".join([line for line in lines if line.startswith("E ")][-40:]) or out.stdout[-3000:]
        return
    from kcollect import caches
    from kcollect.registry import load
    from kcollect.runner import Runner, RunConfig, plan
    from kcollect.store import Store

    caches.use()  # the compile caches `kcollect run` keeps: after a run, its graphs are not rebuilt

    names = tuple(os.environ.get("KCOLLECT_MEMTEST_KERNELS", "gelu,rms_norm").split(","))
    registry = load()
    # first a provider whose capture fails (a host sync), as peers' do: every later capture of
    # the grid must still give its memory back (a failed capture once made them all leak)
    specs = [_syncing(), *(registry.get(n) for n in names)]
    config = RunConfig(kernels=(specs[0].name, *names), grid="full", device="cuda", modes=("fwd+bwd",), warmup_ms=2,
                       rep_ms=10, min_reps=5, seed=0)
    cases = plan(specs, config)
    assert cases[0].spec.name == "syncing"
    grew = []
    with Store(tmp_path / "mem.duckdb") as store:
        runner = Runner(config, store, device_index=0)
        runner.start()
        start = _levels()
        for case in cases:
            before = _levels()
            rows = runner.run_case(case)
            after = _levels()
            delta = {k: after[k] - before[k] for k in before}
            bad = [r for r in rows if r["status"] == "error"]
            print(f"{case.label}: " + ", ".join(f"{k} {before[k] / MiB:.0f} -> {after[k] / MiB:.0f} MiB"
                                               for k in before) + f"; {len(bad)} error rows", flush=True)
            assert not [r for r in bad if "out of memory" in (r["error"] or "")], bad
            grew += [(case.label, k, d / MiB) for k, d in delta.items() if d > MARGIN[k]]
        runner.finish("finished")
        end = _levels()
    assert not grew, f"cases that kept memory (label, kind, MiB): {grew}"
    assert all(end[k] - start[k] <= MARGIN[k] for k in start), (start, end)


def _syncing():
    """A planted kernel whose `sync` provider reads a value back to the host inside the call, so
    that its capture fails, on one shape of 8192 x 8192."""
    from dataclasses import replace

    sys.path.insert(0, os.path.dirname(__file__))
    from planted_kernels import _p, _spec

    from kcollect.spec import Shape

    def sync(x):
        return x * 2.0 if x.sum().item() is not None else x

    spec = _spec("syncing", (_p("torch", lambda x: x * 2.0), _p("sync", sync)), (Shape.rows(8192, 8192, "large"),))
    return replace(spec, modes=("fwd", "bwd", "fwd+bwd"))


def test_captures_after_a_failed_capture_give_their_memory_back():
    # A failed capture once left the allocator routing every later capture into its pool, which
    # is never released: reserved memory then grew by each capture's working set (timing.py).
    from kcollect import timing

    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(warmup_ms=1, rep_ms=5, min_reps=3)
    x = torch.ones(1, device="cuda")
    with pytest.raises(timing.CaptureError):
        timing.time_cuda_graph(lambda: x.item(), budget, flush)  # a host sync cannot be captured
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    for _ in range(3):  # 1 GiB a call, captured
        timing.time_cuda_graph(lambda: torch.empty(1 << 28, device="cuda").fill_(1.0), budget, flush)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before <= MARGIN["reserved"]


def test_a_kept_graph_holds_its_pool_until_it_is_closed():
    # The runner keeps a row's graph from its measurement to its recheck, across the case's other
    # providers and their releases: emptying the allocator's cache must leave the kept graph's pool
    # (its replays write there), the pool's size must be what the runner counts against the case's
    # share (Graph.pool_bytes), and closing the graph must give it back.
    from kcollect import timing

    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    budget = timing.Budget(warmup_ms=1, rep_ms=5, min_reps=3)
    x = torch.ones(1 << 26, device="cuda")  # 256 MiB; x * 2 allocates as much again inside the pool
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    graph = timing.Graph.capture(lambda: x * 2.0)
    assert graph.pool_bytes >= x.nbytes
    first = graph.time(budget, flush)
    torch.cuda.empty_cache()  # as a release after the measurement does
    assert torch.cuda.memory_reserved() - before >= x.nbytes
    again = graph.time(budget, flush, estimate_ms=first.median_ms)
    assert first.method == again.method == "cuda-graph" and again.reps >= 3
    graph.close()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before <= MARGIN["reserved"]
