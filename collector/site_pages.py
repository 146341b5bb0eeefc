"""The page models: plain dicts and lists that the templates render, built from SiteData and the
regression flags. Pure functions (no I/O), so the tests can check what a page will say.

Every element a filter acts on carries data-gpu / data-mode / data-dtype / data-provider values
taken from here; site.js hides what does not match the filters in the URL.
"""
from __future__ import annotations

import json
from typing import Any

from . import charts
from .site_data import Group, SiteData, annotate, cell


def kernel_slugs(kernels: list[str]) -> dict[str, str]:
    from .site_data import slug

    taken: set[str] = {"index"}
    return {k: slug(k, taken) for k in kernels}


def _run_info(run: dict[str, Any] | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"commit": run["commit"], "short": run["commit"][:8], "dirty": bool(run["git_dirty"]),
            "date": run["started_at"].strftime("%Y-%m-%d %H:%M") if run["started_at"] else "",
            "run": run["run_id"][:8], "status": run["status"], "grid": run["grid"],
            "copy_gbps": run["copy_gbps"], "matmul_tflops": run["matmul_tflops"]}


def _combos(rows: list[dict[str, Any]], modes: list[str], dtypes: list[str]) -> list[tuple[str, str]]:
    have = {(r["mode"], r["dtype"]) for r in rows}
    return [(m, d) for m in modes for d in dtypes if (m, d) in have]


def _shapes(rows: list[dict[str, Any]]) -> list[str]:
    """Shapes in the order they were measured (the kernel's grid order)."""
    return list(dict.fromkeys(r["shape"] for r in sorted(rows, key=lambda r: r["seq"] or 0)))


# -- overview ---------------------------------------------------------------------------------


def overview(data: SiteData, slugs: dict[str, str]) -> list[dict[str, Any]]:
    sections = []
    for g in data.groups:
        providers = [p for p in data.providers
                     if any(r["provider"] == p for k in g.kernels for r in data.latest[(g.key, k)])]
        kernels = []
        for k in g.kernels:
            rows = annotate(data.latest[(g.key, k)])
            levels = [("*", "*")] + _combos(rows, data.modes, data.dtypes)
            lines = []
            for mode, dtype in levels:
                sel = [r for r in rows if mode == "*" or (r["mode"] == mode and r["dtype"] == dtype)]
                cells = {}
                for p in providers:
                    mine = [r for r in sel if r["provider"] == p]
                    if mine:
                        c = cell(mine)
                        c["spark"] = charts.sparkline(data.sparks.get((g.key, k, p, mode, dtype), []))
                        c["spark_first"], c["spark_last"] = _ends(data.sparks.get((g.key, k, p, mode, dtype)))
                        cells[p] = c
                lines.append({"mode": mode, "dtype": dtype, "detail": mode != "*", "cells": cells})
            kernels.append({"name": k, "slug": slugs[k], "baseline": data.kernel_info[k]["baseline"],
                            "lines": lines})
        sections.append({"group": g, "latest": _run_info(g.latest), "providers": providers, "kernels": kernels,
                         "n_commits": len(g.commits)})
    return sections


def _ends(values: list[float] | None) -> tuple[float | None, float | None]:
    return (values[0], values[-1]) if values else (None, None)


# -- one kernel -------------------------------------------------------------------------------


def kernel_page(data: SiteData, kernel: str, slugs: dict[str, str], flags: list[dict[str, Any]],
                trend_files: dict[tuple[str, str, str, str], str]) -> dict[str, Any]:
    info = data.kernel_info[kernel]
    colors = charts.provider_colors(data.providers)
    sections = []
    for g in data.groups:
        if kernel not in g.kernels:
            continue
        rows = annotate(data.latest[(g.key, kernel)])
        run = rows[0]
        ceiling = run["matmul_tflops"] if info["bound"] == "compute" else run["copy_gbps"]
        ceiling_name = "bf16 matmul" if info["bound"] == "compute" else "copy bandwidth"
        dims = json.loads(run["dims"] or "{}")
        axis = "shape (" + "×".join(dims) + ")" if dims else "shape"
        parts = []
        for mode, dtype in _combos(rows, data.modes, data.dtypes):
            sel = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
            shapes = _shapes(sel)
            order = {p: i for i, p in enumerate(data.providers)}
            table = sorted(sel, key=lambda r: (shapes.index(r["shape"]), order.get(r["provider"], 99)))
            trend_shapes = list(dict.fromkeys(shapes + sorted(
                {s for ser in data.trends.get((g.key, kernel, mode, dtype), {}).values() for s in ser} - set(shapes))))
            parts.append({
                "mode": mode, "dtype": dtype, "rows": table, "shapes": shapes,
                "figure": charts.shape_figure(sel, shapes, data.providers, colors, info["unit"], ceiling,
                                              ceiling_name, axis),
                "trend_file": trend_files.get((g.key, kernel, mode, dtype)), "trend_shapes": trend_shapes,
                "flags": [f for f in flags if f["gkey"] == g.key and f["mode"] == mode and f["dtype"] == dtype],
            })
        sections.append({"group": g, "latest": _run_info(next(r for r in data.runs if r["run_id"] == run["run_id"])),
                         "ceiling": ceiling, "ceiling_name": ceiling_name, "parts": parts})
    return {"name": kernel, "slug": slugs[kernel], "info": info, "sections": sections,
            "flags": flags, "colors": colors,
            "commits": {g.id: [[c["short"], c["date"]] for c in g.commits] for g in data.groups
                        if kernel in g.kernels}}


# -- regressions ------------------------------------------------------------------------------


def flag_rows(data: SiteData, flags_by_series: dict[tuple, list[Any]], slugs: dict[str, str]) -> list[dict[str, Any]]:
    """Flat rows for every flag, newest first; `open` marks the last flag of its series (the step
    the series still stands on), the others are history."""
    gpu_groups = {g.key.partition(":")[2]: g for g in data.groups if g.kind == "gpu"}
    rows = []
    for key, flags in flags_by_series.items():
        kernel, mode, provider, shape, dtype, gpu_name = key
        g = gpu_groups.get(gpu_name)
        if g is None or kernel not in slugs:
            continue
        index = {c["sha"]: i for i, c in enumerate(g.commits)}
        for j, f in enumerate(flags):
            ci = index.get(f.after_commit)
            rows.append({
                "kind": f.kind, "open": j == len(flags) - 1, "kernel": kernel, "slug": slugs[kernel],
                "gkey": g.key, "gid": g.id, "glabel": g.label, "mode": mode, "dtype": dtype, "provider": provider,
                "shape": shape, "before": f.before_commit[:8], "after": f.after_commit[:8], "ci": ci,
                "before_ms": f.before_ms, "after_ms": f.after_ms, "change": f.change, "sigmas": f.noise_sigmas,
                "date": g.commits[ci]["date"] if ci is not None else ""})
    opened = sorted((r for r in rows if r["open"]), key=lambda r: r["date"], reverse=True)
    history = sorted((r for r in rows if not r["open"]), key=lambda r: r["date"], reverse=True)
    return opened + history


# -- compare ----------------------------------------------------------------------------------


def compare_page(data: SiteData, trend_files: dict[tuple[str, str, str, str], str],
                 slugs: dict[str, str]) -> dict[str, Any]:
    groups = [{"id": g.id, "label": g.label, "kind": g.kind,
               "commits": [[c["short"], c["date"]] for c in g.commits]} for g in data.groups]
    ids = {g.key: g.id for g in data.groups}
    manifest = [{"g": ids[gk], "k": k, "s": slugs[k], "m": m, "d": d, "f": f} for (gk, k, m, d), f in sorted(trend_files.items())]
    return {"groups": groups, "manifest": manifest}


# -- environments -----------------------------------------------------------------------------

RUNS_LISTED = 100


def environments(data: SiteData) -> list[dict[str, Any]]:
    out = []
    for g in data.groups:
        envs = [e for e in data.environments if e["gkey"] == g.key]
        runs = [r for r in data.runs if r["gkey"] == g.key]  # newest first
        # The newest runs only: the page must stay small however long the history grows.
        out.append({"group": g, "envs": envs, "runs": runs[:RUNS_LISTED], "n_runs": len(runs)})
    return out


def group_options(groups: list[Group]) -> list[dict[str, str]]:
    return [{"id": g.id, "label": g.label, "kind": g.kind} for g in groups]
