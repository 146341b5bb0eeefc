"""The overview's model: what the last commit on each GPU changed, the open regressions of our
kernels across GPUs (most severe first), and where each kernel stands against the best other
provider of the same function on each GPU; below them, every provider's geometric-mean speedup per
GPU. Pure functions over SiteData and the flag rows (site_pages.flag_rows)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from . import charts
from .site_data import SiteData, annotate, cell, geomean, median
from .site_pages import _combos, _run_info, commit_info, needs_attention, open_regressions, severity

OPEN_LISTED = 8  # open regressions on the overview; the regressions page has them all


def raised_by_latest(r: dict[str, Any], last: int) -> bool:
    """Whether the latest commit raised this flag: the verdict engine decided it there (at its own
    commit, as compare's gate, or with the points up to it)."""
    return r["decided_ci"] == last


def latest_commits(data: SiteData, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU: its newest commit, the kernels measured there, and the regressions of our kernels
    that commit raised that nobody has acknowledged yet."""
    out = []
    for g in data.groups:
        if g.kind != "gpu" or not g.commits:
            continue
        last = len(g.commits) - 1
        kernels = sorted({k for (gk, k), rs in data.latest.items() if gk == g.key
                          and any(data.run_ci.get(r["run_id"]) == last for r in rs)})
        new = sorted((r for r in rows if r["gkey"] == g.key and needs_attention(r) and raised_by_latest(r, last)),
                     key=lambda r: -severity(r))
        out.append({"group": g, "commit": commit_info(g.commits[last]), "kernels": kernels, "new": new,
                    "run": _run_info(g.latest, g)})
    return out


def standing(rows: list[dict[str, Any]], excluded: set[str]) -> dict[str, Any]:
    """Ours against the fastest other provider of the same function, case by case (mode, shape,
    dtype) over the latest rows of one kernel on one GPU: how many cases ours is ahead in, the
    geometric mean of (that provider's time / ours), the provider that is fastest most often, and
    the median % of the speed of light of ours (the provider whose rows say `ours`). Only rows that
    passed and were steady count."""
    ours = next((r["provider"] for r in rows if r.get("ours")), None)
    cases: dict[tuple, dict[str, float]] = {}
    mine = [r for r in rows if r["provider"] == ours]
    for r in rows:
        if r["status"] == "ok" and r["median_ms"]:
            cases.setdefault((r["mode"], r["shape"], r["dtype"]), {})[r["provider"]] = r["median_ms"]
    ratios, rivals, ahead = [], Counter(), 0
    for times in cases.values():
        if ours not in times:
            continue
        peers = {p: t for p, t in times.items() if p != ours and p not in excluded and not p.startswith(ours + "[")}
        if not peers:
            continue
        best = min(peers, key=peers.get)
        ratios.append(peers[best] / times[ours])
        rivals[best] += 1
        ahead += times[ours] < peers[best]
    ok = [r for r in mine if r["status"] == "ok"]
    return {"measured": len(ratios), "ahead": ahead, "speedup": geomean(ratios),
            "rival": rivals.most_common(1)[0][0] if rivals else None,
            "sol": median([r["frac_of_peak"] for r in ok if r["frac_of_peak"] is not None]),
            "n": len(mine), "ok": len(ok), "status": _status(mine) if not ok else "ok", "ours": ours}


def _status(rows: list[dict[str, Any]]) -> str:
    """What to say of ours where no row passed: the most telling status."""
    have = {r["status"] for r in rows}
    return next((s for s in ("failed", "error", "unstable", "unavailable") if s in have), "not measured")


def leaderboard(data: SiteData, slugs: dict[str, str], other_function: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Kernel x GPU, the GPUs side by side: standing() of each, and the providers left out of it
    because they compute another function."""
    gpus = [g for g in data.groups if g.kind == "gpu"]
    rows = []
    for k in data.kernels:
        cells = {g.id: standing(data.latest[(g.key, k)], set(other_function.get(k, {})))
                 for g in gpus if k in g.kernels}
        rows.append({"kernel": k, "slug": slugs[k], "cells": cells,
                     "other": sorted(other_function.get(k, {}).items())})
    return {"gpus": gpus, "rows": rows}


def grids(data: SiteData, slugs: dict[str, str]) -> list[dict[str, Any]]:
    """Per device group: kernel x provider, the geometric-mean speedup over the kernel's baseline and
    the median % of speed of light (with its sparkline over commits), over every mode and dtype and
    for each."""
    sections = []
    for g in data.groups:
        providers = [p for p in data.providers
                     if any(r["provider"] == p for k in g.kernels for r in data.latest[(g.key, k)])]
        kernels = []
        for k in g.kernels:
            rows = annotate(data.latest[(g.key, k)])
            lines = []
            for mode, dtype in [("*", "*")] + _combos(rows, data.modes, data.dtypes):
                sel = [r for r in rows if mode == "*" or (r["mode"] == mode and r["dtype"] == dtype)]
                cells = {}
                for p in providers:
                    mine = [r for r in sel if r["provider"] == p]
                    if mine:
                        c = cell(mine)
                        spark = data.sparks.get((g.key, k, p, mode, dtype), [])
                        c["spark"] = charts.sparkline(spark)
                        c["spark_first"], c["spark_last"] = (spark[0], spark[-1]) if spark else (None, None)
                        cells[p] = c
                lines.append({"mode": mode, "dtype": dtype, "detail": mode != "*", "cells": cells})
            kernels.append({"name": k, "slug": slugs[k], "baseline": data.kernel_info[k]["baseline"], "lines": lines})
        sections.append({"group": g, "latest": _run_info(g.latest, g), "providers": providers, "kernels": kernels})
    return sections


def trust(data: SiteData, noise: dict[tuple, float | None]) -> dict[str, Any]:
    """What the numbers stand on: per GPU, the latest rows by status (only 'ok' ones carry a speed)
    and the machines; the typical run-to-run noise of our series (the median over them)."""
    gpus = []
    for g in data.groups:
        if g.kind != "gpu":
            continue
        rows = [r for (gk, _), rs in data.latest.items() if gk == g.key for r in rs]
        status = Counter(r["status"] for r in rows)
        gpus.append({"group": g, "rows": len(rows), "status": dict(status), "machines": g.machines,
                     "runs": sum(r["gkey"] == g.key for r in data.runs), "commits": len(g.commits)})
    mine = {(gk, r["kernel"], r["provider"]) for (gk, _), rs in data.latest.items() for r in rs if r.get("ours")}
    ours = [v for k, v in noise.items() if (k[0], k[1], k[4]) in mine and v is not None]
    return {"gpus": gpus, "noise": median(ours), "n_series": len(ours)}


def model(data: SiteData, rows: list[dict[str, Any]], slugs: dict[str, str],
          other_function: dict[str, dict[str, str]], noise: dict[tuple, float | None]) -> dict[str, Any]:
    opened = open_regressions(rows)
    return {"latest": latest_commits(data, rows), "opened": opened[:OPEN_LISTED], "n_opened": len(opened),
            "board": leaderboard(data, slugs, other_function), "grids": grids(data, slugs),
            "trust": trust(data, noise)}
