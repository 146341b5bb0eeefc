"""The verdict engine (kcollect.regress, kcollect.verdicts, kcollect.noise, kcollect.series) on small
hand-made and seeded series."""
import math
from datetime import datetime, timedelta

import numpy as np
import pytest

from kcollect import noise, regress, stability, timing, verdicts
from kcollect.regress import Flag, Point, SeriesKey, analyse, detect, detect_all, points_from_rows
from kcollect.verdicts import CHANGED, Line, Side

T0 = datetime(2025, 1, 1)
QUIET = 0.003  # a prior for the tests' series: 0.3% run-to-run noise, like most real series
KEY = SeriesKey("swiglu", "fwd", "triton", "M=4096,N=14336", "bfloat16", "NVIDIA H100", None, "cuda-graph")


def points(levels, spread=0.01, envs=None):
    return [Point(commit=f"c{i}", commit_time=T0 + timedelta(hours=i), median_ms=float(m),
                  p20_ms=float(m) * (1 - spread), p80_ms=float(m) * (1 + spread), runs=1, runs_ms=(float(m),),
                  env=(("torch", envs[i]),) if envs else None)
            for i, m in enumerate(levels)]


def noisy(n, sigma, seed, steps=()):
    """n levels of 1.0 times lognormal noise; steps: (index, factor) applied from index on."""
    level = np.ones(n)
    for at, factor in steps:
        level[at:] *= factor
    return level * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def row(commit, ms, hour, run, status="ok", kernel="swiglu", gpu="NVIDIA H100", device_kind="cuda", provider="triton",
        shape="M=4096,N=14336", timing="cuda-graph", machine=None, torch="2.11.0", recheck=None, run_status="finished"):
    return dict(kernel=kernel, mode="fwd", provider=provider, shape=shape, dtype="bfloat16", status=status,
                git_commit=commit, commit_time=T0 + timedelta(hours=hour),
                started_at=T0 + timedelta(hours=hour, minutes=run), run_id=f"{commit}-{run}",
                median_ms=ms, p20_ms=ms * 0.99, p80_ms=ms * 1.01, recheck_ms=recheck, gpu_name=gpu,
                device_kind=device_kind, timing=timing, machine=machine, torch=torch, triton="3.6.0", driver=None,
                cuda=None, peers=None, ours=provider == "triton", package="" if provider == "triton" else None,
                run_status=run_status)


@pytest.mark.parametrize("seed", range(5))
def test_planted_step_is_flagged_by_the_gate_at_its_commit(seed):
    pts = points(noisy(50, 0.003, seed, steps=[(23, 1.10)]))
    (f,) = detect(pts, prior=QUIET)
    assert (f.kind, f.index, f.before_commit, f.after_commit) == ("regression", 23, "c22", "c23")
    assert f.decided_index == 23 and f.by_gate  # one point is enough on a quiet series: compare says so too
    assert f.change == pytest.approx(0.10, abs=0.02) and f.after_ms / f.before_ms - 1 == pytest.approx(f.change)
    assert f.status == "open" and f.cause is None and f.verdict == "regression"


def test_improvement_and_regression_have_their_signs():
    (down,) = detect(points(noisy(40, 0.003, 1, steps=[(20, 1 / 1.12)])), prior=QUIET)
    assert down.kind == "improvement" and down.change < -0.08 and down.after_ms < down.before_ms
    (up,) = detect(points(noisy(40, 0.003, 1, steps=[(20, 1.12)])), prior=QUIET)
    assert up.kind == "regression" and up.change > 0.08 and up.after_ms > up.before_ms


@pytest.mark.parametrize("seed", [3, 6, 8])
def test_a_step_one_point_cannot_tell_is_found_with_the_next(seed):
    # 1% noise, judged as one of 36 lines of a commit: one point does not tell this 12% step from a
    # flip, the next one confirms it (every point after it stands beyond the level before)
    levels = noisy(40, 0.01, seed, steps=[(25, 1.12)])
    (f,) = detect(points(levels), prior=0.01, q=regress.Q / 36)
    assert (f.kind, f.index, f.decided_index) == ("regression", 25, 26) and not f.by_gate


@pytest.mark.parametrize("seed", range(8))
def test_a_step_two_points_confirm_together_is_found_within_two_commits(seed):
    # 0.5% noise, a 5% step after 6 points, judged as one of 36 lines of a commit: one point is not
    # enough at the gate's heavy tail, nor is the least of the two after it in a noise that counts
    # the step's own difference; the mean of the two, in the noise without it, is (regress._joint)
    levels = noisy(8, 0.005, seed, steps=[(6, 1.05)])
    flags = detect(points(levels), prior=0.005, q=regress.Q / 36)
    assert [(f.kind, f.index) for f in flags] == [("regression", 6)], f"seed {seed}: {flags}"
    assert flags[0].decided_index <= 7, f"seed {seed}"


@pytest.mark.parametrize("seed", range(8))
def test_the_joint_test_flags_no_noise(seed):
    # series without a step, quiet to noisy (moves past the 3% threshold are common at 1-2%): nothing
    for sigma in (0.003, 0.01, 0.02):
        levels = noisy(40, sigma, seed)
        assert detect(points(levels), prior=sigma, q=regress.Q / 36) == [], f"seed {seed}, sigma {sigma}"


@pytest.mark.parametrize("length", [2, 3])
def test_short_plateau_stays_flagged_as_recovered(length):
    levels = noisy(40, 0.003, 4, steps=[(20, 1.2), (20 + length, 1 / 1.2)])
    flags = detect(points(levels), prior=QUIET)
    assert [(f.kind, f.index) for f in flags] == [("regression", 20), ("improvement", 20 + length)]
    assert flags[0].status == "recovered" and flags[0].recovered_commit == f"c{20 + length}"
    assert flags[0].recovered_index == 20 + length


def test_a_regression_recovers_downwards_even_where_its_levels_came_out_below():
    # the machine's drift is estimated again as commits arrive, so a regression's levels as decided
    # can come out with the level after below the level before (the H200's sLSTM step loop at
    # 42d12b4: 10.80 ms before, 10.77 after); its way back is still down, past their middle
    y = [math.log(v) for v in (10.80, 10.80, 10.80, 10.77, 10.77, 10.44, 10.46)]
    before, after, log_t = math.log(10.80), math.log(10.77), math.log1p(0.03)
    assert regress._recovered(y, 4, before, after, log_t, up=True) == 5
    assert regress._recovered(y, 4, before, after, log_t, up=False) is None  # an improvement's way back is up


def test_flags_never_disappear_as_commits_accumulate():
    levels = noisy(45, 0.004, 5, steps=[(8, 1.15), (10, 1 / 1.15), (25, 1.06), (35, 0.9)])
    full = detect(points(levels), prior=QUIET)
    assert len(full) == 4
    for n in range(3, len(levels) + 1):
        prefix = detect(points(levels[:n]), prior=QUIET)
        key = lambda f: (f.kind, f.index, f.noise_sigmas, f.decided_index)  # noqa: E731
        assert [key(f) for f in prefix] == [key(f) for f in full if f.decided_index < n], n


def test_short_histories_lean_on_the_pooled_noise():
    for levels in ([1.0, 1.2], [1.0, 1.0, 1.2], [1.0, 1.0, 1.0, 1.2]):
        (f,) = detect(points(levels), prior=QUIET)
        assert f.index == len(levels) - 1 and f.kind == "regression"
        assert detect(points(levels), prior=0.10) == []


def test_threshold_respected():
    pts = points(noisy(40, 0.001, 5, steps=[(20, 1.02)]), spread=0.002)  # a clean 2% step
    assert detect(pts, prior=QUIET) == []  # default 3%
    (f,) = detect(pts, threshold=0.01, prior=QUIET)
    assert f.index == 20 and f.kind == "regression"


def test_step_within_the_series_noise_not_flagged():
    # 7% is over the threshold, but the series' points scatter by 6%
    assert [f for f in detect(points(noisy(40, 0.06, 6, steps=[(20, 1.07)])), prior=0.06) if f.index == 20] == []
    assert [f.index for f in detect(points(noisy(40, 0.002, 6, steps=[(20, 1.07)])), prior=QUIET)] == [20]


def test_environment_change_is_its_own_cause():
    levels = noisy(30, 0.003, 7, steps=[(15, 1.2)])
    (f,) = detect(points(levels, envs=["2.11"] * 15 + ["2.12"] * 15), prior=QUIET)
    assert f.index == 15 and f.verdict == "changed with the environment"
    assert f.cause == "environment: torch 2.11 -> 2.12; our code changed too: confirm"
    (ref,) = detect(points(levels, envs=["2.11"] * 15 + ["2.12"] * 15), prior=QUIET, ours=False)
    assert ref.cause == "environment: torch 2.11 -> 2.12"


def test_a_bimodal_series_learns_its_flips_and_stops_failing():
    # a kernel whose runs flip between two levels 25% apart at a fifth of its commits, our code
    # unchanged: once the flips are in its noise, they fail nothing (issue: 10-17% of commits)
    rng = np.random.default_rng(11)
    levels = np.where(rng.random(60) < 0.2, 1.25, 1.0) * np.exp(rng.normal(0, 0.003, 60))
    rows = [row(f"c{i:02d}", float(m), i, 0) for i, m in enumerate(levels)]
    unchanged = type("Git", (), {"status": lambda self, k, a, b: "unchanged", "method_changed": lambda self, k, a, b: False})()
    (r,) = analyse(rows, code=unchanged).values()
    late = [ln.verdict for ln in r.lines[20:]]
    assert late.count("moved") + late.count("regression") <= 1, late  # at most one in 40 commits
    assert r.noise.sigma > 0.05


def test_a_slow_slide_is_reported_and_fails_at_most_one_commit():
    levels = [1.0] * 10 + [1.01 ** k for k in range(1, 11)] + [1.01 ** 10] * 5
    levels = np.array(levels) * np.exp(np.random.default_rng(12).normal(0, 0.002, len(levels)))
    rows = [row(f"c{i:02d}", float(m), i, 0) for i, m in enumerate(levels)]
    (r,) = analyse(rows).values()  # our code changes at every commit (no git): each step is ours
    # in a series this quiet (0.2%) 3% over three commits of the slide is a real step and may be
    # flagged once, alone in its family (at Q, not Q / 36); never at every commit
    assert len([f for f in r.flags if f.kind == "regression"]) <= 1
    slide = max(r.slides, key=lambda s: s.change)  # measured over the 10 points up to its end
    assert slide.change > 0.03 and "c11" <= slide.end_commit <= "c24"


def test_noise_from_differences_and_reruns():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 0.01 * np.sqrt(2), 2000)  # differences of two measurements of 1% noise
    assert noise.sigma_of_differences(d) == pytest.approx(0.01 * 0.93, rel=0.1)  # winsorised at the 90th percentile
    d[::40] = 0.5  # a rare wild difference counts as the series' 90th percentile, not in full
    assert noise.sigma_of_differences(d) == pytest.approx(0.0095, rel=0.1)
    d[::4] = 0.2  # a quarter of flips: a bimodal series, counted in full
    assert noise.sigma_of_differences(d) > 0.06
    assert noise.typical(np.r_[np.full(9, 0.01 * np.sqrt(2) / 1.4826 * 1.0), 5.0]) == pytest.approx(0.01, rel=0.01)
    assert noise.combine(None, 0, None).sigma == noise.DEFAULT_SIGMA
    assert noise.combine(0.02, 4, 0.01).sigma == pytest.approx(np.sqrt((4 * 0.02 ** 2 + 4 * 0.01 ** 2) / 8))
    assert noise.combine(0.0, 100, 0.0).sigma == noise.SIGMA_FLOOR


def test_p_values_and_the_false_discovery_rate():
    # the calibrated tail: p falls with |z|, a short history (few degrees of freedom) keeps p high
    p = noise.p_values([0.0, 3.0, 10.0, -10.0], [100, 100, 100, 2])
    assert p[0] == pytest.approx(1.0) and p[1] > p[2] and p[3] > p[2]
    assert noise.fdr([0.001, 0.03, 0.04, 0.9], 0.05) == [True, False, False, False]
    assert noise.fdr([0.01, 0.02, 0.03, 0.04], 0.05) == [True, True, True, True]  # step-up: the largest rank passing


def test_one_comparison_of_hundreds_of_unchanged_lines_rarely_fails():
    # 300 lines of ours of the same code, each its noise drawn from the calibrated tail: the
    # comparison (not each line) fails at most at the false-discovery rate
    rng = np.random.default_rng(13)
    failing = 0
    for _ in range(100):
        lines = []
        for k in range(300):
            sigma = 0.003
            z = noise.GATE_TAIL[1] * rng.standard_t(noise.GATE_TAIL[0])
            a = Point("a", None, 1.0, 1.0, 1.0, 1, runs_ms=(1.0,))
            b = Point("b", None, math.exp(z * sigma * math.sqrt(2)), 1.0, 1.0, 1,
                      runs_ms=(math.exp(z * sigma * math.sqrt(2)),))
            side = lambda p: Side(p, "ok", "cuda-graph", "gpu", None)  # noqa: E731
            lines.append(Line(key=("k", "fwd", "triton", f"s{k}", "bf16"), a=side(a), b=side(b), code=CHANGED,
                              verdict="n/a", ours=True, noise=noise.Noise(sigma, 100, sigma)))
        failing += any(ln.gates for ln in verdicts.judge(lines, lambda kernel: 0.0).lines)
    assert failing <= 3  # Q is 1%: about 1 in 100, with room for chance


def test_points_group_repeated_runs_of_one_commit():
    rows = [row("b", 2.0, 2, 0), row("a", 1.0, 1, 0), row("b", 3.0, 2, 1), row("b", 2.2, 2, 2),
            row("c", 0.0, 3, 0, status="failed"), row("c", 9.0, 3, 1, status="unstable"), row("a", 1.1, 1, 1),
            row("d", 0.0468, 4, 0, recheck=0.006), row("d", 0.0059, 4, 1, recheck=0.006)]
    pts = points_from_rows(rows)
    assert [(p.commit, p.runs) for p in pts] == [("a", 2), ("b", 3), ("d", 1)]  # no time: failed, unstable,
    # and the 'ok' row its recheck contradicts (the history's f2cc07b +428%)
    a, b, d = pts
    assert a.median_ms == pytest.approx(math.sqrt(1.0 * 1.1))  # two runs: their geometric mean
    assert b.median_ms == pytest.approx(2.2) and b.runs_ms == (2.0, 3.0, 2.2)
    assert b.p20_ms == pytest.approx(2.0) and b.p80_ms == pytest.approx(3.0)  # band holds every run's median
    assert d.median_ms == pytest.approx(0.0059)
    assert b.commit_time == T0 + timedelta(hours=2) and dict(b.env)["torch"] == "2.11.0"
    assert not b.partial and points_from_rows([row("e", 1.0, 5, 0, run_status="interrupted")])[0].partial


def test_one_disturbed_run_of_two_widens_its_point_instead_of_moving_it():
    calm = Point("b", None, 1.0, 1.0, 1.0, 2, runs_ms=(1.0, 1.0))
    torn = Point("b", None, math.sqrt(1.0 * 5.0), 1.0, 5.0, 2, runs_ms=(1.0, 5.0))
    assert verdicts.point_variance(torn, 0.003) > 1000 * verdicts.point_variance(calm, 0.003)


def test_the_collector_never_stores_ok_what_the_analysis_would_call_disturbed():
    # the stability rule and its check at analysis time are one rule: every 'ok' verdict the
    # collector gives passes stability.disagrees on the row it stores
    rng = np.random.default_rng(14)

    def measured(ms, spread):
        t = timing.Timing("cuda-graph", ms, ms * (1 - spread / 2), ms * (1 + spread / 2), ms, 0.0, ms, 100)
        return stability.Measured(t)

    checked = 0
    for _ in range(3000):
        m = [measured(float(np.exp(rng.normal(0, 0.8))), float(rng.uniform(0, 0.8))) for _ in range(3)]
        v = stability.first_verdict(m[0], m[1], "cuda") or stability.second_verdict(*m, "cuda")
        if v.status == "ok":
            checked += 1
            t = v.timing
            stored = dict(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, recheck_ms=v.recheck_ms,
                          device_kind="cuda")
            assert not stability.disagrees(stored), (stored, [x.timing.median_ms for x in m])
    assert checked > 300


def test_aa_repeated_runs_raise_no_flag():
    rng = np.random.default_rng(8)
    rows = [row(f"c{i:02d}", float(np.exp(rng.normal(0, 0.005))), i, k) for i in range(40) for k in range(3)]
    assert detect_all(rows) == {}
    rows += [row("c20", 1.6, 20, 10)]  # one disturbed run of four: the median holds
    rows = [r for r in rows if not (r["git_commit"] == "c30" and r["run_id"] != "c30-0")]
    rows += [row("c30", 1.6, 30, 10)]  # one of two: their point is wide, not a step
    assert detect_all(rows) == {}


def references(levels_of_commit, n_refs=8, seed=0):
    """Rows of n_refs reference series (torch) following the per-commit factors, each with 0.3% noise."""
    rng = np.random.default_rng(seed)
    return [row(f"c{i:02d}", float(f * np.exp(rng.normal(0, 0.003))), i, 0, provider="torch", shape=f"M={s},N=8")
            for s in range(n_refs) for i, f in enumerate(levels_of_commit)]


def test_sticky_clock_is_the_machine_not_a_regression():
    clock = [1.0] * 12 + [1.12] * 3 + [1.0] * 10  # every series 12% slower on three commits
    ours = [row(f"c{i:02d}", float(f * m), i, 0) for i, (f, m) in enumerate(zip(clock, noisy(25, 0.003, 9)))]
    result = analyse(ours + references(clock))
    assert result[KEY].flags == []
    assert result[KEY].drift[13] == pytest.approx(np.log(1.12), abs=0.01)
    assert detect_all(ours) != {}  # without references the same series shows the plateau


def test_the_gate_corrects_a_host_that_costs_more_per_call():
    # commits 12-14 ran on a host whose calls cost 0.6 us more: 10% on a 6 us series, 0.06% on the
    # 1 ms references; 24 short references (6-60 us) move with it. Ours got 8% slower at c12, on
    # that host. The gate corrects by the fitted time per call: ours is the one regression, by 8%,
    # and the way off the host at c15 is no improvement. The history chains the drift's level only
    # (a fit per commit over lines of different intervals wanders when chained): the series'
    # recorded drift stays near 0
    rng = np.random.default_rng(4)
    extra = [0.0006 if 12 <= i <= 14 else 0.0 for i in range(25)]
    durations = [0.006 * 1.1 ** k for k in range(24)] + [1.0 * (1 + 0.1 * k) for k in range(8)]
    rows = [row(f"c{i:02d}", float(ms * np.exp(rng.normal(0, 0.003)) + x), i, 0, provider="torch", shape=f"M={k},N=8")
            for k, ms in enumerate(durations) for i, x in enumerate(extra)]
    ours = [row(f"c{i:02d}", float(0.006 * (1.08 if i >= 12 else 1.0) * np.exp(rng.normal(0, 0.003)) + x), i, 0)
            for i, x in enumerate(extra)]
    result = analyse(ours + rows)[KEY]
    at, off = result.lines[12], result.lines[15]
    assert at.verdict == "regression" and at.corrected == pytest.approx(0.08, abs=0.02), at
    assert off.verdict in ("same", "within noise") and abs(off.corrected) < 0.02, off
    assert max(abs(d) for d in result.drift) < 0.01
    # the median change alone (the engine before the time per call) took the host for ours
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verdicts, "MIN_SHORT", 10 ** 9)
        before = analyse(ours + rows)[KEY]
    assert before.lines[12].corrected > 0.13  # the host's 10% and ours' 8% as one regression


def test_analyse_keys_noise_and_what_stays_apart():
    levels = noisy(40, 0.002, 9, steps=[(20, 1.04)])
    rows = [row(f"c{i:02d}", float(m), i, 0) for i, m in enumerate(levels)]
    rows += [row(f"c{i:02d}", float(m), i, 0, kernel="gelu") for i, m in enumerate(levels)]
    # CPU rows of the same series, 100x slower, from commit 10 on: a series of their own
    rows += [row(f"c{i:02d}", 100.0, i, 1, gpu=None, device_kind="cpu", timing="cpu-clock") for i in range(10, 40)]
    # the same kernel timed with CUDA events, 3x slower: another series, not a step
    rows += [row(f"c{i:02d}", 3.0, i, 2, timing="cuda-events") for i in range(30, 40)]
    # the same GPU model in another machine, 10% slower: another series
    rows += [row(f"c{i:02d}", 1.1, i, 3, machine="box-2") for i in range(30, 40)]
    result = analyse(rows, thresholds={"gelu": 0.05})
    assert len(result) == 5
    assert [f.index for f in result[KEY].flags] == [20]
    assert result[KEY].noise.sigma < 0.006 and result[KEY].noise.n == 38
    assert result[KEY._replace(kernel="gelu")].flags == []  # 4% < its 5% threshold
    assert all(not r.flags for k, r in result.items() if k != KEY)
    assert list(detect_all(rows)) == [KEY, KEY._replace(kernel="gelu")]
    assert isinstance(detect_all(rows)[KEY][0], Flag)


def test_every_field_of_a_row_keeps_its_series_apart():
    # A field left out of the key would pool two series (bf16 with fp32 times, one machine with
    # another) into one history, and their difference would read as a regression.
    r = dict(kernel="swiglu", mode="fwd", provider="triton", shape="M=4096,N=14336", dtype="bfloat16",
             device_kind="cuda", gpu_name="NVIDIA H100", machine="rig-1", timing="cuda-graph")
    key = regress.series_key(r)
    assert key == SeriesKey("swiglu", "fwd", "triton", "M=4096,N=14336", "bfloat16", "NVIDIA H100", "rig-1",
                            "cuda-graph")
    others = dict(kernel="geglu", mode="bwd", provider="torch", shape="M=1,N=14336", dtype="float32",
                  gpu_name="NVIDIA H200", machine="rig-2", timing="cuda-events")
    for field, value in others.items():
        assert regress.series_key({**r, field: value}) != key, field


def test_a_peer_version_is_a_condition_of_that_peer_only():
    from kcollect.series import env_of

    base = dict(torch="2.11", triton="3.6", driver="580", cuda="13.0", peers='{"liger-kernel": "0.5", "quack": "0.1"}')
    upgraded = {**base, "peers": '{"liger-kernel": "0.6", "quack": "0.1"}'}
    assert env_of({**base, "ours": True}) == env_of({**upgraded, "ours": True})
    assert env_of({**base, "package": ""}) == env_of({**upgraded, "package": ""})  # eager torch, compile
    assert env_of({**base, "package": "quack"}) == env_of({**upgraded, "package": "quack"})
    assert env_of({**base, "package": "liger-kernel"}) != env_of({**upgraded, "package": "liger-kernel"})
    assert env_of({**base, "package": None}) != env_of({**upgraded, "package": None})  # before schema 8: unknown


def test_a_measurement_spread_past_max_spread_vouches_for_nothing_on_a_gpu():
    # the H200 A/A pair at 5b7eed9 that failed at +91%: rms_norm fwd M=999 N=5003 stored at 25.4 us
    # (p20 13.4, p80 32.3) beside a recheck of 28.8 us, both disturbed; its steady value is 12.8 us
    def measured(ms, p20, p80):
        return stability.Measured(timing.Timing("cuda-graph", ms, p20, p80, ms, 0.0, ms, 100))

    t1, r = measured(0.0254, 0.0134, 0.0323), measured(0.0288, 0.0280, 0.0296)
    assert stability.first_verdict(t1, r, "cuda") is None  # a full re-measurement decides
    assert stability.second_verdict(t1, r, measured(0.0128, 0.0127, 0.0130), "cuda").status == "unstable"
    assert stability.second_verdict(t1, r, measured(0.0287, 0.0281, 0.0293), "cuda").status == "ok"  # T2 and R agree
    stored = dict(median_ms=0.0254, p20_ms=0.0134, p80_ms=0.0323, recheck_ms=0.0288, device_kind="cuda")
    assert stability.disagrees(stored) and not stability.disagrees(stored | {"device_kind": "cpu"})


def test_the_walk_skips_only_points_where_no_step_or_slide_can_end(seeded):
    # persistence and slides are tried only where a series' last points moved by the threshold
    # (every point is tried for the calibration's record): on noisy series with steps, reruns and
    # rechecks, the flags and slides are those of trying every point
    rng = np.random.default_rng(seeded)
    rows = []
    for s in range(16):
        sigma = float(rng.choice([0.002, 0.01, 0.03]))
        steps = [(int(rng.integers(3, 40)), float(rng.choice([0.9, 1.05, 1.15]))) for _ in range(2)]
        for i, m in enumerate(noisy(45, sigma, int(rng.integers(2**31)), steps)):
            for run in range(1 + int(rng.random() < 0.3)):  # a rerun now and then
                ms = float(m * np.exp(rng.normal(0, sigma)))
                rows.append(row(f"c{i:02d}", ms, i, run, shape=f"N={s}", provider=["triton", "torch"][s % 2],
                                recheck=ms * float(np.exp(rng.normal(0, sigma))) if rng.random() < 0.5 else None))
    series, ours = regress.group_series(rows)
    skipping, trying = regress.walk(series, ours), regress.walk(series, ours, record=[])
    assert {k: (r.flags, r.slides) for k, r in skipping.items()} == {k: (r.flags, r.slides) for k, r in trying.items()}
    assert any(not f.by_gate for r in skipping.values() for f in r.flags)  # persistence found some


def test_the_drift_fit_holds_against_lines_that_moved_on_their_own():
    # 300 unchanged lines, 5 us to 5 ms, on a host 1% slower with 0.4 us more a call, 0.3% noise;
    # a tenth of them moved +30% on their own (a class of series that shifts between hosts)
    rng = np.random.default_rng(11)
    a = np.exp(rng.uniform(np.log(0.005), np.log(5.0), 300))
    b = a * np.exp(0.01 + rng.normal(0, 0.003, 300)) + 0.0004
    b[rng.permutation(300)[:30]] *= 1.3
    d = verdicts.fit_drift(np.log(b / a), 1 / a)
    assert d.level == pytest.approx(0.01, abs=0.002) and d.per_call == pytest.approx(0.0004, abs=0.00005), d
    assert d.at(1 / 0.01) == pytest.approx(np.log(np.exp(0.01) + 0.04), abs=0.003)  # a 10 us line: +5.1%
    long = a > verdicts.SHORT_MS  # too few short lines to fit a time per call: the median change alone
    only_long = verdicts.fit_drift(np.log(b / a)[long], 1 / a[long])
    assert only_long.per_call == 0.0 and only_long.level == pytest.approx(np.median(np.log(b / a)[long]))
