"""The runner's gate and bookkeeping, with a real store and the swiglu spec plus planted providers."""
import dataclasses
import time
from pathlib import Path

import pytest
import torch

import planted_kernels
from kcollect import report, timing, verify
from kcollect.kernels.swiglu import spec as swiglu
from kcollect.runner import Runner, RunConfig, plan
from kcollect.spec import Provider, Shape
from kcollect.store import Store

ROOT = Path(__file__).resolve().parent.parent


def _off_by_three_percent(a, b):
    return swiglu.swiglu_eager(a, b) * 1.03


def _raises(a, b):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _nan(a, b):
    out = swiglu.swiglu_eager(a, b)
    out.view(-1)[7] = float("nan")
    return out


PLANTED = dataclasses.replace(
    swiglu.SPEC,
    providers=swiglu.SPEC.providers[:2] + (
        Provider("wrong", _off_by_three_percent),
        Provider("boom", _raises),
        Provider("nan", _nan),
        Provider("absent", swiglu.swiglu_eager, lambda device: "not installed here"),
    ),
    grids={"quick": (Shape({"M": 33, "N": 515}, "awkward"),), "full": ()},
)


def _run(tmp_path, spec=PLANTED, modes=("fwd",), recheck=False):
    config = RunConfig(kernels=(spec.name,), grid="quick", device="cpu", modes=modes, warmup_ms=1, rep_ms=5,
                       min_reps=3, seed=1, recheck=recheck)
    with Store(tmp_path / "k.duckdb") as store:
        runner = Runner(config, store)
        run = runner.start(ROOT)
        rows = [r for case in plan([spec], config) for r in runner.run_case(case)]
        runner.finish("finished")
        stored = store.query("SELECT * FROM results_v ORDER BY seq")
    return run, rows, stored


def test_gate_statuses_and_no_speed_for_failures(tmp_path):
    run, rows, stored = _run(tmp_path)
    by = {r["provider"]: r for r in stored}
    assert by["triton"]["status"] == "ok" and by["torch"]["status"] == "ok"
    assert by["wrong"]["status"] == "failed" and by["wrong"]["rel_err"] > by["wrong"]["tolerance"]
    assert by["wrong"]["error"].endswith("(worst: output 0)"), by["wrong"]["error"]
    assert by["nan"]["status"] == "failed" and by["nan"]["rel_err"] is None
    assert by["boom"]["status"] == "error" and "illegal memory access" in by["boom"]["error"]
    assert by["absent"]["status"] == "unavailable" and by["absent"]["error"] == "not installed here"
    for name in ("wrong", "nan", "boom", "absent"):
        assert by[name]["median_ms"] is None and by[name]["gbps"] is None and by[name]["frac_of_peak"] is None
    ups = report.speedups(rows)
    assert {rows[i]["provider"] for i in ups} == {"triton", "torch"}
    table = "\n".join(report.table_lines(rows, run.copy_gbps, run.matmul_tflops))
    for name, word in (("wrong", "failed"), ("nan", "failed"), ("boom", "error"), ("absent", "unavailable")):
        line = next(ln for ln in table.splitlines() if f" {name} " in ln)
        assert f" {word} " in line, line


def test_a_failed_backward_names_its_worst_gradient(tmp_path):
    _, _, stored = _run(tmp_path, modes=("bwd",))
    wrong = next(r for r in stored if r["provider"] == "wrong")
    names = [f"gradient of {n}" for n in PLANTED.grad_inputs]
    assert wrong["status"] == "failed" and wrong["error"].endswith(tuple(f"(worst: {n})" for n in names)), wrong


def test_timed_rows_have_consistent_statistics(tmp_path):
    _, _, stored = _run(tmp_path, spec=dataclasses.replace(PLANTED, providers=swiglu.SPEC.providers[:2]),
                        modes=("fwd", "bwd"))
    assert {(r["mode"], r["provider"]) for r in stored} == {(m, p) for m in ("fwd", "bwd") for p in ("triton", "torch")}
    for r in stored:
        assert r["min_ms"] <= r["p20_ms"] <= r["median_ms"] <= r["p80_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["reps"] >= 3 and r["timing"] == "cpu-clock" and r["bytes"] > 0
        assert r["shape"] == "M=33,N=515" and r["baseline"] == "torch"


def test_plan_respects_filters_and_claimed_dtypes():
    config = RunConfig(kernels=("swiglu",), grid="quick", device="cpu", modes=("bwd",), providers=("torch",),
                       dtypes=("float16", "float32"))
    cases = plan([swiglu.SPEC], config)
    assert len(cases) == 2 * len(swiglu.SPEC.grid("quick"))
    assert {c.dtype for c in cases} == {torch.float16, torch.float32}
    assert all(c.modes == ("bwd",) and c.providers == ("torch",) for c in cases)
    fp8_only = dataclasses.replace(swiglu.SPEC, dtypes=(torch.bfloat16,))
    assert plan([fp8_only], config) == []


def test_plan_measures_a_point_in_its_own_dtypes_unless_the_command_names_them():
    # Shape.dtypes (grids.toml's `dtypes`): a point of the grid measured in fewer of the bench dtypes
    two = dataclasses.replace(swiglu.SPEC, bench_dtypes=(torch.bfloat16, torch.float16),
                              grids={"quick": (Shape({"M": 3, "N": 8}, "both"),
                                               Shape({"M": 5, "N": 8}, "one", ("float16",)))})
    default = RunConfig(kernels=("swiglu",), grid="quick", device="cpu")
    assert [(c.shape.dims["M"], c.dtype) for c in plan([two], default)] == \
        [(3, torch.bfloat16), (3, torch.float16), (5, torch.float16)]
    named = dataclasses.replace(default, dtypes=("bfloat16",))
    assert [c.shape.dims["M"] for c in plan([two], named)] == [3, 5]


def test_dynamos_recompile_limit_is_raised_where_compile_is_measured():
    # compile specialises on each shape; past dynamo's default of 8 graphs it falls back to eager
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older torch
    config = RunConfig(kernels=("swiglu",), grid="quick", device="cpu")
    before = getattr(cfg, name)
    try:
        setattr(cfg, name, 8)
        Runner(dataclasses.replace(config, unavailable=(("compile", "not here"),)), None)._prepare()
        assert getattr(cfg, name) == 8  # left alone, and dynamo's import with it
        Runner(config, None)._prepare()
        assert getattr(cfg, name) == 4096
    finally:
        setattr(cfg, name, before)


def test_quantiles_and_summary():
    t = timing.summarize("cpu-clock", [5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.min_ms, t.median_ms, t.mean_ms, t.reps) == (1.0, 3.0, 3.0, 5)
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)
    assert t.p99_ms == pytest.approx(4.96) and t.max_ms == 5.0


def test_the_gate_fails_an_error_just_over_the_tolerance():
    # fp32's tolerance is 1e-5: an output 2e-5 off must fail (a gate loosened even 2x passes it),
    # and the exact one passes.
    near = Provider("near", lambda x: x * (2.0 * (1 + 2e-5)))
    spec = dataclasses.replace(planted_kernels.SPECS[0], providers=(planted_kernels.SPECS[0].providers[0], near))
    over = verify.check(spec, "near", {"M": 4, "N": 8}, torch.float32, "fwd")
    assert over.error == pytest.approx(2e-5, rel=0.05) and over.tolerance == 1e-5 and not over.ok
    assert verify.check(spec, "torch", {"M": 4, "N": 8}, torch.float32, "fwd").ok


def test_cpu_timing_is_in_milliseconds():
    # a call of 20 ms must read as about 20, not 0.02 (seconds) nor 20000 (microseconds)
    t = timing.time_cpu(lambda: time.sleep(0.02), timing.Budget(0, 0, min_reps=2, max_reps=2), estimate_ms=20.0)
    assert 15 <= t.min_ms and t.median_ms < 200, t


def test_an_error_row_says_what_went_wrong_in_one_plain_line():
    from kcollect.runner import _error_text

    # QuACK's CuTe DSL colours its compile errors for a terminal; a row is read on a page or in CSV
    e = RuntimeError("\x1b[91m\x1b[1merror[INTERNAL]:\x1b[0m could not build valid IR.\n  at line 3")
    assert _error_text(e) == "RuntimeError: error[INTERNAL]: could not build valid IR."


def test_the_floor_of_timed_calls_gives_way_only_for_calls_slower_than_the_budget():
    budget = timing.Budget(warmup_ms=10, rep_ms=40, min_reps=10)
    assert timing._counts(0.01, budget)[1] == budget.max_reps
    assert timing._counts(5.0, budget)[1] == 10  # the budget alone would give 8
    assert timing._counts(timing.SLOW_MS / 10, budget)[1] == 10  # the floor still fits in SLOW_MS
    assert timing._counts(timing.SLOW_MS / 5, budget)[1] == 5
    assert timing._counts(10 * timing.SLOW_MS, budget)[1] == timing.SLOW_REPS
    # a floor set below SLOW_REPS (the CPU's 2) stays where it was set
    assert timing._counts(10 * timing.SLOW_MS, timing.Budget(0, 40, min_reps=2))[1] == 2


def test_every_timed_cuda_call_follows_an_l2_flush(monkeypatch):
    # CUDA's timing without a GPU: events and synchronize record what happens, in order. Every
    # timed call (between its start and end events) must come right after a write of the flush
    # buffer, or the call finds its inputs in L2 and reads faster than it would in a model.
    log = []
    flush = _fake_cuda(monkeypatch, log, 1.0)
    timing.time_cuda(lambda: log.append("call"), timing.Budget(0, 0, min_reps=4, max_reps=4), flush, peak=False)
    timed = [i for i in range(1, len(log) - 1) if log[i - 1] == "event" and log[i] == "call" and log[i + 1] == "event"]
    assert len(timed) >= 4
    assert all(log[i - 2] == "flush" for i in timed), log


def _fake_cuda(monkeypatch, log: list, call_ms: float):
    """CUDA's events, synchronize and memory counters without a GPU: each event pair reads
    `call_ms` per call between them; "peak" is logged where a peak memory is read."""
    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            log.append("event")
            self.at = len(log)

        def elapsed_time(self, end):
            return call_ms * log[self.at:end.at].count("call")

    class Flush:
        def zero_(self):
            log.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: log.append("peak"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 64)
    return Flush()


def test_the_estimating_calls_count_as_warm_up_and_a_known_estimate_spares_them(monkeypatch):
    # a 50 ms call: its estimating call is over the 10 ms warm-up budget, so the timed calls follow
    # it at once; a recheck that knows the call's time makes no estimating call, one warm-up (where
    # the peak memory is read) and the same timed calls
    budget = timing.Budget(warmup_ms=10, rep_ms=40, min_reps=4, max_reps=4)
    log = []
    flush = _fake_cuda(monkeypatch, log, 50.0)
    t = timing.time_cuda(lambda: log.append("call"), budget, flush)
    assert log.count("call") == 1 + 4 and t.reps == 4 and t.median_ms == 50.0 and t.peak_bytes == 64, log
    log.clear()
    t = timing.time_cuda(lambda: log.append("call"), budget, flush, estimate_ms=50.0)
    assert log[:3] == ["peak", "call", "flush"] and log.count("call") == 1 + 4, log  # warm-up, unflushed
    assert t.reps == 4 and t.peak_bytes == 64
    # a fast call still gets its warm-up budget beside its three estimating calls
    log.clear()
    flush = _fake_cuda(monkeypatch, log, 1.0)
    timing.time_cuda(lambda: log.append("call"), budget, flush, peak=False)
    assert log.count("call") == 3 + (10 - 3) + 4, log
    assert timing._counts(50.0, budget) == (1, 4) and timing._counts(1.0, budget, warmed_ms=3.0) == (7, 4)


def test_the_l2_flush_is_larger_than_the_l2_it_flushes():
    # Writing the flush buffer evicts what a call would otherwise find in L2 only when the buffer is
    # well beyond the L2 (its replacement is not strict LRU): twice this device's L2 at least (on
    # the CPU, the H100's 50 MB that kernels/_host/device.py stands in with).
    from kcollect.kernels._host.device import l2_bytes

    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert timing.L2_FLUSH_BYTES >= 2 * l2_bytes(device), (timing.L2_FLUSH_BYTES, l2_bytes(device))


def test_reference_runs_once_per_case_for_every_mode(tmp_path):
    calls = []

    def counted(a, b):
        calls.append(1)
        return swiglu.reference(a, b)

    spec = dataclasses.replace(PLANTED, providers=swiglu.SPEC.providers[1:2], reference=counted)
    _, rows, _ = _run(tmp_path, spec=spec, modes=("fwd", "bwd", "fwd+bwd"))
    assert len(calls) == 1 and {r["status"] for r in rows} == {"ok"} and len(rows) == 3


def test_inputs_that_cannot_be_made_fail_their_case_not_the_run(tmp_path):
    # a plugin's make_inputs that raises (here on the first of two shapes) gives that case's rows,
    # status error and the reason; the next case is measured
    def make_inputs(dims, dtype, device, seed):
        if dims["M"] == 5:
            raise RuntimeError("Trying to create tensor with negative dimension -3: [-3, 5]")
        return swiglu.SPEC.make_inputs(dims, dtype, device, seed)

    spec = dataclasses.replace(PLANTED, providers=swiglu.SPEC.providers[:2], make_inputs=make_inputs,
                               grids={"quick": (Shape({"M": 5, "N": 7}, "raises"), Shape({"M": 3, "N": 7}, "fine")),
                                      "full": ()})
    _, rows, stored = _run(tmp_path, spec=spec, modes=("fwd", "bwd"))
    bad = [r for r in stored if r["shape"] == "M=5,N=7"]
    assert len(bad) == 4 and {r["status"] for r in bad} == {"error"}
    assert all(r["error"].startswith("inputs failed: RuntimeError: Trying to create tensor") for r in bad), bad[0]
    assert {r["status"] for r in stored if r["shape"] == "M=3,N=7"} == {"ok"} and len(stored) == 8


def test_rows_carry_evidence_and_the_run_its_breakdown(tmp_path):
    import json

    from kcollect import phases

    _, _, stored = _run(tmp_path, spec=dataclasses.replace(PLANTED, providers=swiglu.SPEC.providers[:2]),
                        recheck=True)
    # a CPU shared with other work may disturb a row: then it says so, as `unstable`
    assert all(r["status"] in ("ok", "unstable") and r["recheck_ms"] > 0 for r in stored)
    assert all(r["free_mem_bytes"] is None and r["clock_mhz"] is None for r in stored)  # CPU: nothing to read
    with Store(tmp_path / "k.duckdb") as store:
        (run,) = store.query("SELECT phases FROM runs")
    spent = json.loads(run["phases"])
    assert {"setup", "reference", "first_call", "timing", "recheck", "store", "wall"} <= set(spent)
    assert spent["wall"] >= sum(v for k, v in spent.items() if k not in ("wall", "timed_work")) - 0.01
    assert [r["phase"] for r in phases.breakdown(run["phases"])][-1] == "wall"


def test_rows_store_the_tokens_of_a_spec_that_counts_them(tmp_path):
    # attention's rows carry B * Sq tokens (the site shows tokens/s); a spec without tokens, NULL
    counted = dataclasses.replace(PLANTED, providers=swiglu.SPEC.providers[:1], baseline="triton",
                                  tokens=lambda dims: dims["M"] * 2)
    _, _, stored = _run(tmp_path, spec=counted)
    assert [r["tokens"] for r in stored] == [66]
    _, _, plain = _run(tmp_path / "plain", spec=dataclasses.replace(counted, tokens=None))
    assert [r["tokens"] for r in plain] == [None]


def _planted_times(monkeypatch, runner, medians):
    """runner._time answers these medians in turn (the recheck, then the re-measurement)."""
    from kcollect import stability

    seq = iter(medians)

    def fake(timer, key, budget, phase="timing", estimate_ms=None, since=None):
        m = next(seq)
        return stability.Measured(timing.Timing("cpu-clock", m, m, m, m, 0.0, m, 5))

    monkeypatch.setattr(runner, "_time", fake)


@pytest.mark.parametrize("medians, status, stored_ms", [
    ((1.0,), "ok", 1.0),  # the recheck agrees: the first numbers stay
    ((9.0, 9.1), "ok", 9.1),  # the first was disturbed: recheck and re-measurement agree
    ((3.0, 9.0), "unstable", 9.0),  # three different stories
])
def test_settle_rechecks_and_remeasures_once(tmp_path, monkeypatch, medians, status, stored_ms):
    from kcollect import stability

    with Store(tmp_path / "k.duckdb") as store:
        runner = Runner(RunConfig(kernels=("swiglu",), grid="quick", device="cpu"), store)
        _planted_times(monkeypatch, runner, medians)
        row = {"kernel": "swiglu", "mode": "fwd", "provider": "torch", "status": "ok", "median_ms": 1.0}
        first = stability.Measured(timing.Timing("cpu-clock", 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 5))
        runner._settle(row, None, lambda: (lambda: ()), first)
    assert row["status"] == status and row["median_ms"] == stored_ms
    assert row["recheck_ms"] == medians[0] and (row["error"] is None) == (status == "ok")


def _recorded(tmp_path, monkeypatch, delay=lambda event: 0.0, previous=None, recheck_all=False, ours=()):
    """A planted kernel (fwd and fwd+bwd, two providers, one shape) run on the CPU with its recheck,
    recording each build of a call and each call of a provider (with the input tensor it got) under
    the progress event ('start': the first measurement, 'recheck'), and the rows. Each call takes
    `delay(event)` seconds more on the CPU timing's clock, a virtual one."""
    now = ["", ""]  # the progress event and mode under way
    calls, builds = [], []
    clock = [0.0]

    def virtual():
        clock[0] += 5e-5
        return clock[0]

    def provider(name, fn):
        def call(x):
            calls.append((now[0], now[1], name, x))
            timing.clock = virtual  # from the first call on (the ceilings, measured before, read the real one)
            clock[0] += delay(now[0])
            return fn(x)

        return Provider(name, call, ours=name in ours)

    build = verify.build_call
    monkeypatch.setattr(verify, "build_call", lambda *a: builds.append(now[0]) or build(*a))
    monkeypatch.setattr(timing, "clock", timing.clock)  # put back after the test
    spec = dataclasses.replace(planted_kernels._spec(
        "recorded", (provider("torch", lambda x: x * 2.0), provider("add", lambda x: x + x)),
        (Shape.rows(3, 5, "small"),)), modes=("fwd", "fwd+bwd"))
    config = RunConfig(kernels=(spec.name,), grid="quick", device="cpu", dtypes=("float32",), warmup_ms=1,
                       rep_ms=2, min_reps=3, seed=1, recheck=True, recheck_all=recheck_all)
    tmp_path.mkdir(exist_ok=True)
    with Store(tmp_path / "k.duckdb") as store:
        runner = Runner(config, store)
        runner.previous = previous or {}
        runner.progress = lambda event, case, mode, name: now.__setitem__(slice(None), [event, mode])
        runner.start(ROOT)
        rows = [r for case in plan([spec], config) for r in runner.run_case(case)]
        runner.finish("finished")
    return rows, calls, builds, runner.phases.seconds


@pytest.mark.parametrize("free, kept", [
    (None, 0),  # the free memory is not known: every recheck builds a fresh call
    (600, 1),  # 60 bytes of inputs a call: one fits in an eighth of 600 + 60, two do not
    ("host's", 4),  # the host's own free memory: every call is kept
])
def test_the_recheck_replays_the_measured_call_where_memory_allows(tmp_path, monkeypatch, free, kept):
    from kcollect import memory

    if free != "host's":
        monkeypatch.setattr(memory, "free_bytes", lambda device: free)
    rows, calls, builds, spent = _recorded(tmp_path, monkeypatch)
    assert len(rows) == 4 and all(r["status"] == "ok" and r["recheck_ms"] > 0 for r in rows)
    replayed = 0
    for mode in ("fwd", "fwd+bwd"):
        for name in ("torch", "add"):
            first = {id(x): x for e, m, n, x in calls if (e, m, n) == ("start", mode, name)}
            again = {id(x): x for e, m, n, x in calls if (e, m, n) == ("recheck", mode, name)}
            assert len(first) == 1 and len(again) == 1, (mode, name)  # and the recheck called it
            replayed += first.keys() == again.keys()  # the very call measured first, on its inputs
            assert torch.equal(*first.values(), *again.values())  # else fresh copies of them
    assert replayed == kept and builds.count("recheck") == 4 - kept
    assert (spent["recheck_fresh"] > 0) == (kept < 4)  # the run's breakdown shows what fresh calls cost


def test_a_recheck_measures_again_and_catches_a_disturbed_first_measurement(tmp_path, monkeypatch):
    # Each call takes 5 ms while its row is first measured (a disturbance), 1 ms from its recheck on.
    # The recheck, replaying the measured call, must measure it again, not hand back what the
    # first measurement found: it disagrees with it, a re-measurement agrees with it, and the rows
    # keep the re-measurement's time (a recheck that passed on the first numbers would store 5 ms).
    rows, _, builds, _ = _recorded(tmp_path, monkeypatch, delay=lambda event: 5e-3 if event == "start" else 1e-3)
    assert builds.count("recheck") == 0  # every call was kept, and replayed
    for r in rows:
        assert r["status"] == "ok", r
        assert r["median_ms"] == pytest.approx(1.05) and r["recheck_ms"] == pytest.approx(1.05), r


def test_a_row_its_last_time_vouches_for_is_not_rechecked(tmp_path, monkeypatch):
    # every call takes 1.05 ms on the virtual clock; the series' last times: two within 1.5% of
    # that, one 2x away, one missing. Only the first two skip their recheck, unless --recheck-all,
    # or the provider is ours.
    slow = lambda event: 1e-3  # noqa: E731
    key = lambda mode, provider: (None, "recorded", mode, provider, "M=3,N=5", "float32")  # noqa: E731
    previous = {key("fwd", "torch"): (1.05, 1.05, 1.05, "cpu-clock"),
                key("fwd+bwd", "add"): (1.04, 1.03, 1.05, "cpu-clock"),
                key("fwd", "add"): (2.1, 2.1, 2.1, "cpu-clock")}
    for recheck_all, ours in ((False, ()), (True, ()), (False, ("add",))):  # ours: always rechecked
        rows, calls, _, _ = _recorded(tmp_path / f"{recheck_all}-{'-'.join(ours)}", monkeypatch, slow, previous,
                                      recheck_all, ours)
        rechecked = {(m, n) for e, m, n, _ in calls if e == "recheck"}
        vouched = set() if recheck_all else {("fwd", "torch"), ("fwd+bwd", "add")}
        vouched = {(m, n) for m, n in vouched if n not in ours}
        assert rechecked == {(r["mode"], r["provider"]) for r in rows} - vouched
        for r in rows:
            assert r["status"] == "ok" and r["median_ms"] == pytest.approx(1.05), r
            assert (r.get("recheck_ms") is None) == ((r["mode"], r["provider"]) in vouched), r


def test_calls_are_kept_for_the_recheck_within_an_eighth_of_the_free_memory():
    from kcollect import memory

    assert memory.KEEP_SHARE == 1 / 8
    # free: what is free with the calls kept so far and this one allocated
    assert memory.may_keep(0, 125, 875) and not memory.may_keep(0, 126, 874)
    assert memory.may_keep(100, 25, 875) and not memory.may_keep(100, 26, 874)
    assert not memory.may_keep(0, 1, None)
    assert memory.tensor_bytes([torch.ones(3, 5), torch.ones(2, dtype=torch.float16), 7]) == 64


def test_a_gpu_keeps_no_measured_call_for_its_recheck_yet(monkeypatch):
    # memory.KEEP_ON_GPU: kept graphs died in LSTM backward rechecks on an H200; until a GPU run
    # confirms a fix, a GPU's recheck captures a fresh call, whatever memory is free
    from types import SimpleNamespace

    from kcollect import memory

    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 50)
    assert memory.KEEP_ON_GPU is False
    runner = Runner(RunConfig(kernels=("swiglu",), grid="quick", device="cuda", recheck=True), None)
    closed = []
    timer = SimpleNamespace(close=lambda: closed.append(True), graph=None, held=0)
    assert runner._keep(timer, 0, {}, 0) is None and closed == [True]


def test_a_kept_graph_is_replayed_after_an_l2_flush_until_it_is_closed(monkeypatch):
    # The measurement and the recheck time the same captured graph: each timed replay follows a
    # write of the flush buffer, and its pool is released only when it is closed.
    log = []
    flush = _fake_cuda(monkeypatch, log, 1.0)

    class Captured:
        def replay(self):
            log.append("call")

        def reset(self):
            log.append("reset")

    graph = timing.Graph(Captured(), peak_bytes=64, pool_bytes=0)
    for _ in range(2):
        log.clear()
        t = graph.time(timing.Budget(0, 0, min_reps=4, max_reps=4), flush, estimate_ms=1.0)
        timed = [i for i in range(1, len(log) - 1) if log[i - 1:i + 2] == ["event", "call", "event"]]
        assert len(timed) == 4 and all(log[i - 2] == "flush" for i in timed), log
        assert t.method == "cuda-graph" and t.peak_bytes == 64 and t.median_ms == 1.0 and "reset" not in log
    graph.close()
    assert log[-1] == "reset"


def test_a_provider_with_its_own_reference_is_gated_on_it(tmp_path):
    # a layer timed beside the op (axon's nn.Linear, say) computes another function: gated on its own
    # float64 reference and gradient inputs, it passes; gated on the op's, the same function fails
    def doubled(a, b):
        return 2.0 * swiglu.swiglu_eager(a, b)

    def doubled_reference(a, b):
        return 2.0 * swiglu.reference(a, b)

    spec = dataclasses.replace(PLANTED, providers=(
        Provider("other", doubled, reference=doubled_reference, grad_inputs=("a",)),
        Provider("ungated", doubled), swiglu.SPEC.providers[1]))
    _, rows, _ = _run(tmp_path, spec=spec, modes=("fwd", "bwd"))
    by = {(r["mode"], r["provider"]): r["status"] for r in rows}
    assert by == {(m, p): s for m in ("fwd", "bwd") for p, s in (("other", "ok"), ("ungated", "failed"),
                                                                  ("torch", "ok"))}


def test_a_case_is_released_after_its_tensors_are_gone(tmp_path, monkeypatch):
    # The allocator can only give back blocks nothing holds: a release while the case's inputs,
    # float64 answers or upstream gradients were still referenced kept them cached until the
    # next case (the GPU memory test caught it on the H200).
    import weakref

    from kcollect import runner as runner_module

    made = []

    def inputs(dims, dtype, device, seed):
        out = planted_kernels._inputs(dims, dtype, device, seed)
        made.extend(weakref.ref(t) for t in out.values())
        return out

    def reference(x):
        out = x * 2.0
        made.append(weakref.ref(out))
        return out

    def copies(inputs):  # the providers' copies, kept for the recheck since: gone by the case's end too
        out = clone(inputs)
        made.extend(weakref.ref(t) for t in out.values())
        return out

    clone = verify.clone_inputs
    monkeypatch.setattr(verify, "clone_inputs", copies)
    alive = []
    monkeypatch.setattr(runner_module.memory, "release",
                        lambda device, compiled=False, case_end=False, level=None: alive.append(sum(r() is not None for r in made)))
    spec = dataclasses.replace(planted_kernels.SPECS[0], make_inputs=inputs, reference=reference)
    config = RunConfig(kernels=(spec.name,), grid="quick", device="cpu", modes=("fwd", "bwd"), warmup_ms=1,
                       rep_ms=2, min_reps=3, seed=1, recheck=True)
    with Store(tmp_path / "k.duckdb") as store:
        runner = Runner(config, store)
        runner.start(ROOT)
        for case in plan([spec], config):
            made.clear()
            runner.run_case(case)
            assert made and alive[-1] == 0, f"{alive[-1]} of the case's tensors alive at its release"
        runner.finish("finished")


def test_release_collects_cycles_made_before_and_after_a_case_ends():
    # After each provider, a collection scans only what was made since the last case ended (the
    # rest is frozen): cyclic garbage made since then goes at once, and a frozen object that
    # becomes cyclic garbage goes at the next case's end.
    import gc
    import weakref

    from kcollect import memory

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    try:
        old = cycle()
        memory.release("cpu", case_end=True, collect=True)  # `old` is alive: frozen
        assert gc.get_freeze_count() > 0
        gone = weakref.ref(old)
        old = None
        new = weakref.ref(cycle())  # garbage at once
        memory.release("cpu", collect=True)  # as after a provider that left device memory held
        assert new() is None and gone() is not None  # frozen: not scanned after a provider
        memory.release("cpu", case_end=True, collect=True)  # as on a GPU, memory still held
        assert gone() is None
        # device memory back at its level (the CPU's default): only what the case made is scanned
        old = cycle()
        memory.release("cpu", case_end=True)
        gone, old = weakref.ref(old), None
        new = weakref.ref(cycle())
        memory.release("cpu", case_end=True)
        assert new() is None and gone() is not None
    finally:
        gc.unfreeze()


def test_compiled_backwards_keep_no_donated_buffers():
    # a bwd row replays one backward (retain_graph), which AOTAutograd refuses with donated buffers
    import torch._functorch.config

    from kcollect.runner import _raise_recompile_limit

    before = torch._functorch.config.donated_buffer
    try:
        torch._functorch.config.donated_buffer = True
        _raise_recompile_limit()
        assert torch._functorch.config.donated_buffer is False
    finally:
        torch._functorch.config.donated_buffer = before
