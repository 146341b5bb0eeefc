"""The budgets page: does each backbone fit a frame's budget, on every GPU in the history, with
which provider and how much headroom.

Reads the store alone (results_v rows of the kernel 'backbone'), never a kernel. `load` queries,
`page` builds the page model (pure, so the tests can check what the page will say), `render`
writes budgets.html through the site's writer. Pass or fail is judged on a row's p99 (schema 4 on),
or on its p80 where the row is older (the page marks those). The sparklines draw the p80, which
every row has, so a trend does not jump where the store began to keep p99. CPU-interpreter rows
are left out: their times say nothing about a frame on a GPU.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import charts
from .store import Store

KERNEL = "backbone"
# A frame's budget at each frame rate the page offers (the URL hash's fps=); the first is the default.
BUDGETS = (("60", 1000 / 60), ("120", 1000 / 120))
NET_ORDER = ("mlp", "lstm", "attention", "mamba", "jamba")
PROVIDER_ORDER = ("kcollect", "eager", "compile")
TREND_POINTS = 40  # the newest commits a sparkline draws

SERIES = """
WITH v AS (
  SELECT *, device_kind || ':' || coalesce(gpu_name, '?') AS gkey,
         coalesce(git_commit, 'run:' || left(run_id, 8)) AS commit, coalesce(commit_time, started_at) AS ctime
  FROM results_v WHERE kernel = ? AND device_kind <> 'cpu')
"""


@dataclass
class BudgetData:
    tail: str  # what pass/fail is judged on: 'p99_ms' where any shown row has it, else 'p80_ms'
    # gkey -> for each (configuration, dtype), the rows of the latest run that measured it (a run
    # measures a configuration's providers together; a run of part of the grid, --where or one
    # stopped early, hides none of the others)
    latest: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # gkey -> those runs, newest first
    # (gkey, shape, dtype, provider) -> the p80 per commit, oldest first (passing rows only)
    trends: dict[tuple[str, str, str, str], list[float]] = field(default_factory=dict)
    cpu_rows: int = 0  # interpreter rows left out


def load(store: Store) -> BudgetData:
    columns = {row[0] for row in store.con.execute("DESCRIBE results_v").fetchall()}
    # a store older than schema 4 (opened read-only, unmigrated) has no p99 column
    p99 = "v.p99_ms" if "p99_ms" in columns else "NULL"
    rows = store.query(SERIES + f"""
        , latest AS (SELECT gkey, shape, dtype, arg_max(run_id, (ctime, started_at)) AS run_id FROM v GROUP BY ALL)
        SELECT v.gkey, v.run_id, v.commit, v.ctime, v.started_at, v.provider, v.shape, v.dims, v.dtype, v.status,
               v.error, v.rel_err, v.timing, v.median_ms, coalesce({p99}, v.p80_ms) AS tail_ms,
               CASE WHEN {p99} IS NULL THEN 'p80' ELSE 'p99' END AS tail_q
        FROM v JOIN latest USING (gkey, shape, dtype, run_id) ORDER BY v.gkey, v.seq""", [KERNEL])
    shown = {r["tail_q"] for r in rows if r["status"] == "ok"}
    data = BudgetData(tail="p99_ms" if "p99" in shown else "p80_ms")
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        r["dims"] = json.loads(r["dims"] or "{}")
        data.latest.setdefault(r["gkey"], []).append(r)
        runs.setdefault(r["gkey"], {}).setdefault(r["run_id"], {
            "commit": r["commit"], "ctime": r["ctime"], "started_at": r["started_at"], "run_id": r["run_id"]})
    data.runs = {g: sorted(by.values(), key=lambda u: (u["ctime"], u["started_at"]), reverse=True)
                 for g, by in runs.items()}
    trend_rows = store.con.execute(SERIES + """
        SELECT gkey, shape, dtype, provider, list(t ORDER BY ctime, commit)
        FROM (SELECT gkey, shape, dtype, provider, commit, min(ctime) AS ctime, median(p80_ms) AS t
              FROM v WHERE status = 'ok' AND p80_ms > 0 GROUP BY ALL)
        GROUP BY ALL""", [KERNEL]).fetchall()
    data.trends = {tuple(r[:4]): list(r[4])[-TREND_POINTS:] for r in trend_rows}
    data.cpu_rows = store.con.execute("SELECT count(*) FROM results_v WHERE kernel = ? AND device_kind = 'cpu'",
                                      [KERNEL]).fetchone()[0]
    return data


# -- the page model ---------------------------------------------------------------------------


def _ordered(values, preferred) -> list[str]:
    values = set(values)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def config_label(dims: dict[str, Any]) -> str:
    t = dims.get("T", "?")
    run = f"stream: 1 frame after {t - 1 if isinstance(t, int) else t}" if dims.get("stream") else f"window of {t}"
    return f"B={dims.get('B', '?')} · H={dims.get('H', '?')} · L={dims.get('L', '?')} · {run}"


def _row_key(r: dict[str, Any]) -> tuple:
    d = r["dims"]
    net = d.get("net", "?")
    return (NET_ORDER.index(net) if net in NET_ORDER else len(NET_ORDER), net, -int(d.get("H", 0)),
            int(d.get("B", 0)), int(d.get("stream", 0)), r["dtype"], r["shape"])


def fit(tail_ms: float) -> list[dict[str, Any]]:
    """Against each budget: does it fit, the share of the frame it takes, the headroom (budget -
    tail: what the frame leaves for everything else, the sensor input, other models, rendering) in
    ms and as a share, the badge and the text the page shows."""
    out = []
    for fps, budget in BUDGETS:
        room, used = budget - tail_ms, tail_ms / budget
        badge = (f"{used:.0%} of the frame" if used >= 0.01 else "<1% of the frame") if room >= 0 else f"{used:.1f}× the frame"
        text = (f"{room:.2f} ms left for the rest of the frame ({room / budget:.0%})" if room >= 0
                else f"{-room:.2f} ms over ({used:.1f}× the budget)")
        out.append({"fps": fps, "budget": budget, "ok": room >= 0, "room_ms": room, "room": room / budget,
                    "used": used, "badge": badge, "text": text})
    return out


def _cell(r: dict[str, Any], trend: list[float]) -> dict[str, Any]:
    """A provider's cell: times and fit only where the row passed the correctness gate."""
    if r["status"] != "ok" or not r["tail_ms"]:
        return {"ok": False, "status": r["status"], "reason": r["error"] or r["status"]}
    return {"ok": True, "status": "ok", "median": r["median_ms"], "tail": r["tail_ms"], "q": r["tail_q"],
            "timing": r["timing"],
            "fit": fit(r["tail_ms"]), "spark": charts.sparkline(trend),
            "spark_title": f"{len(trend)} commits: {trend[0]:.3g} → {trend[-1]:.3g} ms" if trend else ""}


def _section(g, data: BudgetData, providers: list[str]) -> dict[str, Any]:
    rows: dict[tuple, dict[str, Any]] = {}
    for r in sorted(data.latest[g.key], key=_row_key):
        line = rows.setdefault((r["shape"], r["dtype"]), {
            "net": r["dims"].get("net", "?"), "config": config_label(r["dims"]), "shape": r["shape"],
            "dtype": r["dtype"], "cells": {}})
        line["cells"][r["provider"]] = _cell(r, data.trends.get((g.key, r["shape"], r["dtype"], r["provider"]), []))
    for line in rows.values():
        passing = [(c["tail"], p) for p, c in line["cells"].items() if c["ok"]]
        line["best"] = min(passing)[1] if passing else None
    runs = [{"commit": u["commit"][:8], "commit_full": u["commit"], "run": u["run_id"][:8],
             "date": u["ctime"].strftime("%Y-%m-%d %H:%M") if u["ctime"] else ""} for u in data.runs[g.key]]
    return {"group": g, "providers": [p for p in providers if any(p in l["cells"] for l in rows.values())],
            "rows": list(rows.values()), "runs": runs}


def _glance(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (backbone, config, dtype) against every GPU: the fastest passing provider there."""
    lines: dict[tuple, dict[str, Any]] = {}
    for s in sections:
        for row in s["rows"]:
            line = lines.setdefault((row["shape"], row["dtype"]), {k: row[k] for k in ("net", "config", "dtype")}
                                    | {"cells": {}, "order": len(lines)})
            best = row["best"]
            line["cells"][s["group"].id] = ({"provider": best, **row["cells"][best]} if best else
                                            {"provider": None, "ok": False, "reason": "no provider passed"})
    return sorted(lines.values(), key=lambda l: l["order"])


def page(data: BudgetData, groups) -> dict[str, Any]:
    """The model budgets.html renders. `groups`: the site's device groups (key, id, label, kind),
    in the site's order, so that the device filter and the other pages agree."""
    gpus = [g for g in groups if g.kind == "gpu" and g.key in data.latest]
    providers = _ordered({r["provider"] for g in gpus for r in data.latest[g.key]}, PROVIDER_ORDER)
    sections = [_section(g, data, providers) for g in gpus]
    return {"sections": sections, "glance": _glance(sections), "gpus": [s["group"] for s in sections],
            "budgets": [{"fps": fps, "ms": ms} for fps, ms in BUDGETS],
            "tail": data.tail.removesuffix("_ms"), "has_p99": data.tail == "p99_ms", "cpu_rows": data.cpu_rows}


def render(writer, data: BudgetData, groups) -> None:
    """Writes budgets.html with the site's writer (Writer.page: the template, the common context)."""
    shown = page(data, groups)
    writer.page("budgets.html", "budgets.html", shown, title="Budgets", b=shown)
