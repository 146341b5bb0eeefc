"""The last stored time of each series on each GPU model: a first measurement that agrees with it
needs no recheck (stability.vouched), so that a run measures again only the rows in doubt."""
from __future__ import annotations

from . import stability

# (gpu name or None for the CPU, kernel, mode, provider, shape, dtype)
Key = tuple
# (median, p20, p80 in ms, timing method) of the series' last time
Time = tuple


def previous_times(store, kernels: tuple[str, ...]) -> dict[Key, Time]:
    """Each series' newest stored time of `kernels` per GPU model: its newest row that is a time
    (ok, a positive median, not contradicted by its own recheck: stability.disagree)."""
    if store is None or not kernels:
        return {}
    marks = ", ".join("?" * len(kernels))
    rows = store.query(
        "SELECT e.gpu_name, e.device_kind, r.kernel, r.mode, r.provider, r.shape, r.dtype, r.median_ms, r.p20_ms, "
        "r.p80_ms, r.recheck_ms, r.timing FROM results r JOIN runs u ON r.run_id = u.run_id "
        "JOIN environments e ON u.env_id = e.env_id "
        f"WHERE r.status = 'ok' AND r.median_ms > 0 AND r.kernel IN ({marks}) "
        "ORDER BY u.started_at DESC, r.seq DESC", list(kernels), by_column=True)
    out: dict[Key, Time] = {}
    for r in rows:
        key = (r["gpu_name"], r["kernel"], r["mode"], r["provider"], r["shape"], r["dtype"])
        if key in out or stability.disagree(r["median_ms"], r["recheck_ms"], r["p20_ms"], r["p80_ms"],
                                            r["device_kind"]):
            continue
        out[key] = (r["median_ms"], r["p20_ms"], r["p80_ms"], r["timing"])
    return out
