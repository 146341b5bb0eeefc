"""The plan's split over machines and workers, the progress's ETA, the stability rule and the early
stop of timing: pure functions, no measurement."""
import dataclasses
import io
import json
import math
import types

import pytest

from kcollect import phases, progress, schedule, stability, timing
from kcollect.progress import Progress
from kcollect.plan import RunConfig, plan
from kcollect.spec import Shape

from planted_kernels import SPECS


def _cases(n_kernels=6):
    """Kernels of different sizes: the planted specs, copied under new names with more shapes."""
    specs = []
    for k in range(n_kernels):
        base = SPECS[k % len(SPECS)]
        shapes = tuple(Shape.rows(8 * (k + 1), 64 * (j + 1), "size") for j in range(k % 3 + 1))
        specs.append(dataclasses.replace(base, name=f"k{k}", grids={"quick": shapes, "full": shapes}))
    config = RunConfig(kernels=tuple(s.name for s in specs), grid="quick", device="cpu")
    return plan(specs, config)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_cover_the_plan_once_with_whole_kernels(n):
    cases = _cases()
    shards = [schedule.shard(cases, k, n, "cpu") for k in range(1, n + 1)]
    assert sorted(i for s in shards for i in s) == list(range(len(cases)))
    owner = {}
    for k, s in enumerate(shards):
        for i in s:
            assert owner.setdefault(cases[i].spec.name, k) == k  # a kernel never spans two shards
    assert shards == [schedule.shard(cases, k, n, "cpu") for k in range(1, n + 1)]  # deterministic


def test_shards_are_balanced_by_estimated_cost():
    cases = _cases(9)
    groups = schedule.groups(list(range(len(cases))), cases, "cpu")
    biggest = max(sum(schedule.case_cost(cases[i], "cpu") for i in g) for g in groups)
    loads = [sum(schedule.case_cost(cases[i], "cpu") for i in schedule.shard(cases, k, 3, "cpu")) for k in (1, 2, 3)]
    assert max(loads) - min(loads) <= biggest + 1e-9
    kernel_cost = {}
    for c in cases:
        kernel_cost[c.spec.name] = kernel_cost.get(c.spec.name, 0.0) + schedule.case_cost(c, "cpu")
    assert cases[groups[0][0]].spec.name == max(kernel_cost, key=kernel_cost.get)  # the largest kernel first


@pytest.mark.parametrize("text, count, want", [("all", 2, [0, 1]), ("1", 2, [1]), ("0,1", 4, [0, 1])])
def test_parse_gpus(text, count, want):
    assert schedule.parse_gpus(text, count) == want


@pytest.mark.parametrize("text, count", [("all", 0), ("2", 2), ("0,0", 2), ("x", 2), ("", 2), ("-1", 2)])
def test_parse_gpus_rejects(text, count):
    with pytest.raises(ValueError):
        schedule.parse_gpus(text, count)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "1/2/3"])
def test_parse_shard_rejects(text):
    with pytest.raises(ValueError):
        schedule.parse_shard(text)


def test_progress_lines_and_eta_from_the_plan():
    cases = _cases(2)
    out = io.StringIO()
    p = Progress(cases, "cpu", out=out, tty=False)
    assert p.units == sum(len(c.modes) * len(c.providers) for c in cases)
    assert p.eta() == pytest.approx(p.total_est)  # before anything is measured: the plan's estimate
    c = cases[0]
    p.event("start", c, "fwd", "torch")
    p.event("end", c, "fwd", "torch")
    line = out.getvalue().strip()
    assert line.startswith(f"[1/{p.units}] {c.label} fwd torch") and "ETA" in line
    assert p.done_est == pytest.approx(schedule.unit_cost(c, "fwd", "torch", "cpu"))
    # one measurement says little (it carries the first builds): still the plan's estimate
    assert p.eta() == pytest.approx(p.total_est - p.done_est)


def test_eta_follows_the_observed_rate_from_the_first_measurement_not_from_the_set_up(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    cases = _cases(2)
    p = Progress(cases, "cpu", out=io.StringIO(), tty=False)
    clock[0] += 60.0  # set-up: not measuring
    pairs = [(c, m, n) for c in cases for m in c.modes for n in c.providers][:progress.OBSERVED_AFTER]
    for c, m, n in pairs:
        p.event("start", c, m, n)
        clock[0] += 2 * schedule.unit_cost(c, m, n, "cpu")  # measurements take twice their estimate
        p.event("end", c, m, n)
    assert len(pairs) == progress.OBSERVED_AFTER
    assert p.eta() == pytest.approx(2 * (p.total_est - p.done_est))


def _m(median, spread=0.0, retries=0):
    t = timing.Timing("cuda-graph", median, median * (1 - spread / 2), median * (1 + spread / 2), median, 0.0,
                      median, 100)
    return stability.Measured(t, retries)


def test_stability_rule():
    assert stability.first_verdict(_m(1.0), _m(1.03), "cuda").status == "ok"
    assert stability.first_verdict(_m(1.0), _m(1.2), "cuda") is None  # a re-measurement decides
    assert stability.first_verdict(_m(1.0, spread=0.2), _m(1.2, spread=0.2), "cuda").status == "ok"  # their noise
    # a disturbance widens the measurement it hits: its own spread cannot vouch for it, either way
    assert stability.first_verdict(_m(9.0, spread=16.0), _m(1.0), "cuda") is None
    assert stability.first_verdict(_m(1.0), _m(1.8, spread=1.0), "cuda") is None
    # both within MAX_SPREAD: the narrower spread decides, not the wider one (1.5x is past 1 + 2 x 5%)
    assert stability.first_verdict(_m(1.0, spread=0.05), _m(1.5, spread=0.45), "cuda") is None
    assert stability.first_verdict(_m(1.0), _m(1.0, retries=3), "cuda") is None  # allocator retried
    # the first measurement was disturbed; the recheck and the re-measurement agree: ok, T2's numbers
    v = stability.second_verdict(_m(6.0), _m(1.0), _m(1.02), "cuda")
    assert (v.status, v.timing.median_ms, v.recheck_ms) == ("ok", 1.02, 1.0)
    v = stability.second_verdict(_m(1.0), _m(2.0), _m(4.0), "cuda")
    assert v.status == "unstable" and "recheck 2 ms" in v.error and v.timing.median_ms == 4.0
    assert "retried" in stability.second_verdict(_m(1.0), _m(1.0, retries=1), _m(1.0, retries=1), "cuda").error
    assert stability.first_verdict(_m(1.0), _m(1.2), "cpu").status == "ok"  # the interpreter's floor


def test_early_stop_once_the_median_is_pinned():
    calls = []

    def steady(k):
        calls.append(k)
        return [1.0 + 1e-4 * (i % 3) for i in range(k)]

    budget = timing.Budget(0, 1000, min_reps=10, ci_rel=0.005)
    assert len(timing._sample(steady, 500, budget)) == 10 and calls == [10]

    def noisy(k):
        return [1.0 + (i % 2) for i in range(k)]

    assert len(timing._sample(noisy, 200, budget)) == 200  # never pinned: the whole budget
    assert len(timing._sample(steady, 200, dataclasses.replace(budget, ci_rel=0))) == 200
    assert timing.median_ci_rel([1.0] * 4) == math.inf and timing.median_ci_rel([1.0] * 20) == 0


def test_time_cpu_spares_the_estimate_call():
    n = []
    t = timing.time_cpu(lambda: n.append(1), timing.Budget(0, 0, min_reps=3), estimate_ms=1.0)
    assert t.reps == 3 and len(n) == 3


def test_breakdown_records():
    recorded = phases.Phases(started=0.0)
    recorded.add("timing", 2.0)
    recorded.add("first_call", 6.0)
    recorded.add("timed_work", 1.0)
    records = phases.breakdown(recorded.to_json())
    names = [r["phase"] for r in records]
    assert names[:2] == ["first_call", "timing"] and names[-2:] == ["other", "wall"]
    by = {r["phase"]: r for r in records}
    assert by["wall"]["share"] == 1 and by["other"]["seconds"] == pytest.approx(by["wall"]["seconds"] - 8, abs=0.01)
    assert phases.breakdown(None) == [] and json.loads(recorded.to_json())["timed_work"] == 1.0


def test_several_gpus_take_cases_one_by_one_kernel_by_kernel():
    cases = _cases()
    every = list(range(len(cases)))
    alone = schedule.tasks(every, cases, "cuda", 1)
    assert alone == schedule.groups(every, cases, "cuda")
    assert schedule.tasks(every, cases, "cpu", 2) == schedule.groups(every, cases, "cpu")  # CPU workers: kernels
    assert schedule.tasks(every, cases, "cuda", 2) == [[i] for g in alone for i in g]  # GPUs: case by case


def test_the_estimate_takes_each_measurement_from_the_last_run_here_and_scales_the_rest():
    cases = _cases(2)
    units = [(c, m, n) for c in cases for m in c.modes for n in c.providers]
    (c0, m0, n0), (c1, m1, n1) = units[:2]
    plan0 = schedule.unit_cost(c0, m0, n0, "cpu")
    past = {(c0.spec.name, m0, n0, c0.shape.label, "bfloat16"): 10 * plan0,
            ("gone", "fwd", "x", "M=1", "bfloat16"): 5.0}
    cost, known = schedule.estimator(cases, "cpu", past)
    assert known == 1  # the plan's measurement with a past; a kernel no longer planned does not count
    assert cost(c0, m0, n0) == pytest.approx(10 * plan0)
    assert cost(c1, m1, n1) == pytest.approx(10 * schedule.unit_cost(c1, m1, n1, "cpu"))
    p = Progress(cases, "cpu", out=io.StringIO(), tty=False, cost=cost, known=known)
    assert p.total_est == pytest.approx(10 * sum(schedule.unit_cost(c, m, n, "cpu") for c, m, n in units))
    assert p.plan_line().endswith("(one worker, 1 of them from the last run here)")
    cost, known = schedule.estimator(cases, "cpu", {})
    assert known == 0 and cost(c1, m1, n1) == schedule.unit_cost(c1, m1, n1, "cpu")
