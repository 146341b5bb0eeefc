"""A row's recheck is skipped only where its series' last stored time vouches for its first
measurement (stability.vouched, previous.previous_times)."""
import pytest

from compare_store import make_db, ok
from kcollect import stability, timing
from kcollect.previous import previous_times
from kcollect.store import Store


def measured(ms, spread=0.01, method="cuda-graph", retries=0):
    return stability.Measured(timing.Timing(method, ms, ms * (1 - spread / 2), ms * (1 + spread / 2), ms, 0.0, ms, 50),
                              retries)


@pytest.mark.parametrize("t1, previous, vouched", [
    (measured(1.010), (1.0, 0.99, 1.01, "cuda-graph"), True),  # 1.0% away, steady
    (measured(0.986), (1.0, 0.99, 1.01, "cuda-graph"), True),  # 1.4% faster
    (measured(1.020), (1.0, 0.99, 1.01, "cuda-graph"), False),  # 2% away: in doubt
    (measured(0.980), (1.0, 0.99, 1.01, "cuda-graph"), False),
    (measured(1.000, spread=0.08), (1.0, 0.99, 1.01, "cuda-graph"), False),  # its own samples spread
    (measured(1.000, retries=1), (1.0, 0.99, 1.01, "cuda-graph"), False),  # the allocator retried
    (measured(1.000, method="cuda-events"), (1.0, 0.99, 1.01, "cuda-graph"), False),  # timed another way
    (measured(1.000), None, False),  # a new series
])
def test_a_last_time_vouches_only_for_a_steady_first_measurement_close_to_it(t1, previous, vouched):
    assert stability.vouched(t1, previous) is vouched


def test_previous_times_are_each_series_newest_time_per_gpu_model(tmp_path):
    db = make_db(tmp_path / "k.duckdb", [
        ("h200", "c1", 0, [ok("triton", 1.0), ok("torch", 2.0), ok("liger", 3.0)]),
        ("h200", "c2", 1, [ok("triton", 1.1), ok("torch", 2.2, recheck=4.0),  # contradicted by its recheck
                           dict(provider="liger", ms=9.0, status="unstable")]),
        ("h100", "c2", 2, [ok("triton", 5.0, timing="cuda-events")]),
        ("h200", "c3", 3, [ok("triton", 1.2)], {"status": "interrupted"}),  # a time all the same
    ])
    with Store(db) as store:
        got = previous_times(store, ("swiglu",))
        assert previous_times(store, ("rope",)) == {}
    key = lambda gpu, provider: (gpu, "swiglu", "fwd", provider, "M=4096,N=14336", "bfloat16")  # noqa: E731
    assert len(got) == 4
    assert got[key("NVIDIA H200", "triton")][0] == pytest.approx(1.2)
    assert got[key("NVIDIA H200", "torch")][0] == pytest.approx(2.0)  # the newer one is no time
    assert got[key("NVIDIA H200", "liger")][0] == pytest.approx(3.0)  # nor is an unstable row
    h100 = got[key("NVIDIA H100 80GB HBM3", "triton")]
    assert h100[:3] == pytest.approx((5.0, 4.95, 5.05)) and h100[3] == "cuda-events"
