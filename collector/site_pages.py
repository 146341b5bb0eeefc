"""The page models: plain dicts and lists that the templates render, built from SiteData and the
regression analysis. Pure functions (no I/O), so the tests can check what a page will say.

Every element a filter acts on carries data-gpu / data-mode / data-dtype / data-provider (and, on
the regressions page, data-kind / data-kernel / data-machine) values taken from here; site.js hides
what does not match the filters in the URL.
"""
from __future__ import annotations

import json
import re
from typing import Any

from . import charts
from .site_data import SPARK_POINTS, Group, SiteData, annotate, cell, downsample

NOT_RECORDED = "(not recorded)"  # the machine of runs from before machines were recorded


def kernel_slugs(kernels: list[str]) -> dict[str, str]:
    from .site_data import slug

    taken: set[str] = {"index"}
    return {k: slug(k, taken) for k in kernels}


def safe_url(url: str | None) -> str | None:
    """Only web links leave the site: a URL from the data that is not http(s) is dropped."""
    return url if url and re.match(r"https?://[^\s\"'<>]+$", url) else None


def commit_info(c: dict[str, Any]) -> dict[str, Any]:
    """A commit as the templates show it: short hash, and on hover its subject, author and date."""
    who = " — ".join(x for x in (c.get("author"), c.get("date")) if x)
    hover = "\n".join(x for x in (c["sha"], c.get("subject"), who) if x)
    return {"sha": c["sha"], "short": c["short"], "date": c.get("date") or "", "subject": c.get("subject"),
            "author": c.get("author"), "url": safe_url(c.get("url")), "hover": hover}


def range_url(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """A link to the diff between two commits, where their URLs have the usual /commit/<sha> form
    (GitHub and GitLab both take /compare/<a>...<b> beside it)."""
    ua, ub = safe_url(a.get("url")), safe_url(b.get("url"))
    if not ua or not ub or not ub.endswith("/commit/" + b["sha"]):
        return ub
    return ub[: -len("/commit/" + b["sha"])] + f"/compare/{a['sha']}...{b['sha']}"


def _run_info(run: dict[str, Any] | None, group: Group | None = None) -> dict[str, Any] | None:
    if run is None:
        return None
    c = group.commits[run["ci"]] if group is not None and run.get("ci") is not None else {
        "sha": run["commit"], "short": run["commit"][:8]}
    return {"commit": commit_info(c), "dirty": bool(run["git_dirty"]),
            "date": run["started_at"].strftime("%Y-%m-%d %H:%M") if run["started_at"] else "",
            "run": run["run_id"][:8], "status": run["status"], "grid": run["grid"],
            "machine": run.get("machine") or NOT_RECORDED,
            "copy_gbps": run["copy_gbps"], "matmul_tflops": run["matmul_tflops"]}


def _combos(rows: list[dict[str, Any]], modes: list[str], dtypes: list[str]) -> list[tuple[str, str]]:
    have = {(r["mode"], r["dtype"]) for r in rows}
    return [(m, d) for m in modes for d in dtypes if (m, d) in have]


def _shapes(rows: list[dict[str, Any]]) -> list[str]:
    """Shapes in the order they were measured (the kernel's grid order)."""
    return list(dict.fromkeys(r["shape"] for r in sorted(rows, key=lambda r: r["seq"] or 0)))


def config_text(config: str | None) -> tuple[str, str]:
    """(short text, full JSON) of a row's tuned config: {name: {field: value}} -> 'name: a=1 b=2'."""
    if not config:
        return "", ""
    try:
        value = json.loads(config)
    except ValueError:
        return config[:60], config
    if isinstance(value, dict):
        parts = []
        for name, fields in value.items():
            inner = " ".join(f"{k}={v}" for k, v in fields.items()) if isinstance(fields, dict) else str(fields)
            parts.append(f"{name}: {inner}")
        return "; ".join(parts), json.dumps(value, indent=1, sort_keys=True)
    return str(value), config


# -- overview ---------------------------------------------------------------------------------

OPEN_LISTED = 8  # open regressions on the overview; the regressions page has them all


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
                        spark = data.sparks.get((g.key, k, p, mode, dtype), [])
                        c["spark"] = charts.sparkline(spark)
                        c["spark_first"], c["spark_last"] = (spark[0], spark[-1]) if spark else (None, None)
                        cells[p] = c
                lines.append({"mode": mode, "dtype": dtype, "detail": mode != "*", "cells": cells})
            kernels.append({"name": k, "slug": slugs[k], "baseline": data.kernel_info[k]["baseline"],
                            "lines": lines})
        sections.append({"group": g, "latest": _run_info(g.latest, g), "providers": providers, "kernels": kernels,
                         "n_commits": len(g.commits)})
    return sections


def open_regressions(flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open regressions of our kernels, newest first (then the largest against its noise)."""
    mine = [f for f in flags if f["kind"] == "regression" and f["state"] == "open" and f["ours"]]
    return sorted(mine, key=lambda f: (-f["after_ci"], -(f["z"] or 0)))


# -- regressions ------------------------------------------------------------------------------

# The order of the regressions page: what needs someone first, what is settled last.
STATE_ORDER = {("regression", "open", True): 0, ("regression", "open", False): 1,
               ("regression", "ended", True): 2, ("regression", "ended", False): 3,
               ("regression", "recovered", True): 4, ("regression", "recovered", False): 5}
STATE_LABEL = {"open": "open regression", "ended": "regression, no longer measured",
               "recovered": "recovered regression", "held": "improvement", "lost": "improvement, since lost"}
KIND_FILTER = {"open": "open", "ended": "recovered", "recovered": "recovered", "held": "improvement",
               "lost": "improvement"}


def flag_rows(data: SiteData, flags: list[dict[str, Any]], changes: list[dict[str, Any]],
              slugs: dict[str, str]) -> list[dict[str, Any]]:
    """One row per step and per change of measuring conditions, in the page's order: open
    regressions (ours first, newest first), then regressions that recovered or are no longer
    measured, then improvements, then changes of method, machine or environment."""
    rows = []
    for f in flags:
        if f["kernel"] not in slugs:
            continue
        g = data.group(f["gkey"])
        values = downsample(f["values"], SPARK_POINTS)
        mark = min(f["step_at"] * len(values) // len(f["values"]), len(values) - 1)
        end = g.commits[f["end_ci"]] if f["end_ci"] is not None else None
        rows.append(_row(data, f, slugs) | {
            "filter_kind": KIND_FILTER[f["state"]], "label": STATE_LABEL[f["state"]],
            "z": f["z"], "noise": f["noise"], "spark": charts.sparkline(values, mark=mark),
            "end": commit_info(end) if end else None, "order": STATE_ORDER.get((f["kind"], f["state"], f["ours"]), 6),
            "undoes": commit_info(g.commits[f["undoes"]]) if f.get("undoes") is not None else None})
    for c in changes:
        if c["kernel"] not in slugs:
            continue
        rows.append(_row(data, c, slugs) | {
            "id": None, "kind": c["kind"], "state": "condition", "filter_kind": c["kind"],
            "label": f"{c['kind']} change", "z": None, "noise": None, "spark": None, "end": None, "undoes": None,
            "what": c["what"], "ours": c.get("ours", False), "order": 7})
    rows.sort(key=lambda r: (r["order"], -r["after_ci"], -(r["z"] or 0), r["kernel"], r["shape"]))
    return rows


def _row(data: SiteData, f: dict[str, Any], slugs: dict[str, str]) -> dict[str, Any]:
    g = data.group(f["gkey"])
    before, after = g.commits[f["before_ci"]], g.commits[f["after_ci"]]
    return {
        "id": f.get("id"), "kind": f["kind"], "state": f.get("state"), "ours": f.get("ours"),
        "kernel": f["kernel"], "slug": slugs[f["kernel"]], "gkey": g.key, "gid": g.id, "glabel": g.label,
        "machine": f.get("machine") or NOT_RECORDED, "mode": f["mode"], "dtype": f["dtype"],
        "provider": f["provider"], "shape": f["shape"], "before": commit_info(before), "after": commit_info(after),
        "before_ci": f["before_ci"], "after_ci": f["after_ci"], "n_commits": f["after_ci"] - f["before_ci"],
        "range_url": range_url(before, after), "before_ms": f["before_ms"], "after_ms": f["after_ms"],
        "change": f["change"], "what": f.get("what"), "timing": f.get("timing")}


def event_rows(data: SiteData, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        g = data.group(e["gkey"])
        out.append(dict(e, gid=g.id, glabel=g.label, before=commit_info(g.commits[e["before_ci"]]),
                        after=commit_info(g.commits[e["ci"]])))
    return out


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    def n(pred) -> int:
        return sum(1 for r in rows if pred(r))

    return {"open_ours": n(lambda r: r["state"] == "open" and r["ours"]),
            "open_other": n(lambda r: r["state"] == "open" and not r["ours"]),
            "recovered": n(lambda r: r["state"] in ("recovered", "ended")),
            "improvements": n(lambda r: r["kind"] == "improvement"),
            "conditions": n(lambda r: r["state"] == "condition")}


# -- one kernel -------------------------------------------------------------------------------


def kernel_page(data: SiteData, kernel: str, slugs: dict[str, str], rows_of_flags: list[dict[str, Any]],
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
        parts = [_part(data, g, kernel, mode, dtype, rows, colors, info, ceiling, ceiling_name, trend_files,
                       rows_of_flags)
                 for mode, dtype in _combos(rows, data.modes, data.dtypes)]
        latest = next(r for r in data.runs if r["run_id"] == run["run_id"])
        sections.append({"group": g, "latest": _run_info(latest, g), "older": _older_runs(data, rows),
                         "ceiling": ceiling, "ceiling_name": ceiling_name, "parts": parts})
    groups = [g for g in data.groups if kernel in g.kernels]
    return {"name": kernel, "slug": slugs[kernel], "info": info, "sections": sections,
            "flags": rows_of_flags, "colors": colors,
            "commits": {g.id: [[c["short"], c["date"], c.get("subject") or ""] for c in g.commits] for g in groups},
            "conditions": {str(i): _condition_label(c) for i, c in data.conditions.items()},
            "marks": [{k: f[k] for k in ("kind", "state", "label", "gid", "mode", "dtype", "provider", "shape",
                                         "after_ci", "after_ms", "change", "what")} for f in rows_of_flags]}


def _older_runs(data: SiteData, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs other than the newest that the rows' cases come from (a later run measured only
    part of the grid), newest first, with how many cases each gives."""
    cases: dict[str, set] = {}
    for r in rows:
        cases.setdefault(r["run_id"], set()).add((r["shape"], r["dtype"]))
    by_id = {r["run_id"]: r for r in data.runs}
    return [{"run": rid[:8], "commit": by_id[rid]["commit"][:8], "cases": len(c)} for rid, c in list(cases.items())[1:]]


def _part(data: SiteData, g: Group, kernel: str, mode: str, dtype: str, rows: list[dict[str, Any]],
          colors: dict[str, str], info: dict[str, Any], ceiling: float | None, ceiling_name: str,
          trend_files: dict, flags: list[dict[str, Any]]) -> dict[str, Any]:
    sel = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
    shapes = _shapes(sel)
    order = {p: i for i, p in enumerate(data.providers)}
    index = {s: i for i, s in enumerate(shapes)}
    table = sorted(sel, key=lambda r: (index[r["shape"]], order.get(r["provider"], 99)))
    for i, r in enumerate(table):
        r["config_text"], r["config_json"] = config_text(r.get("config"))
        r["first"] = i == 0 or r["shape"] != table[i - 1]["shape"]
    trend_shapes = list(dict.fromkeys(shapes + sorted(
        {s for ser in data.trends.get((g.key, kernel, mode, dtype), {}).values() for s in ser} - set(shapes))))
    return {
        "mode": mode, "dtype": dtype, "rows": table, "shapes": shapes,
        "has_config": any(r["config_text"] for r in table),
        "has_tokens": any(r.get("tokens") for r in table),
        "figure": charts.shape_figure(sel, shapes, data.providers, colors, info["unit"], ceiling, ceiling_name),
        "memory": charts.memory_figure(sel, shapes, data.providers, colors),
        "trend_file": trend_files.get((g.key, kernel, mode, dtype)), "trend_shapes": trend_shapes,
        "flags": [f for f in flags if f["gkey"] == g.key and f["mode"] == mode and f["dtype"] == dtype],
    }


def _condition_label(c: dict[str, Any]) -> str:
    env = ", ".join(f"{k} {c[k]}" for k in ("torch", "triton", "driver", "cuda") if c.get(k))
    peers = ", ".join(f"{k} {v}" for k, v in sorted(c["peers"].items()))
    return "; ".join(x for x in (c["timing"], c["machine"], env, peers) if x)


# -- compare ----------------------------------------------------------------------------------


def compare_page(data: SiteData, trend_files: dict[tuple[str, str, str, str], str],
                 slugs: dict[str, str]) -> dict[str, Any]:
    groups = [{"id": g.id, "label": g.label, "kind": g.kind,
               "commits": [[c["short"], c["date"], c.get("subject") or ""] for c in g.commits]} for g in data.groups]
    ids = {g.key: g.id for g in data.groups}
    manifest = [{"g": ids[gk], "k": k, "s": slugs[k], "m": m, "d": d, "f": f} for (gk, k, m, d), f in sorted(trend_files.items())]
    return {"groups": groups, "manifest": manifest}


# -- experiments (lab runs) -------------------------------------------------------------------


def experiments(data: SiteData) -> list[dict[str, Any]]:
    """Each lab run with its rows by (kernel, mode, dtype): the variants of an A/B study are
    providers named `triton[<config label>]`; each row is compared with the rows' baseline where
    it is one of them (the harness names `triton[default]`, the heuristic's own pick), else with
    the first variant."""
    out = []
    for run in data.lab:
        parts = {}
        for r in run["rows"]:
            parts.setdefault((r["kernel"], r["mode"], r["dtype"]), []).append(r)
        tables = []
        for (kernel, mode, dtype), rows in parts.items():
            variants = list(dict.fromkeys(r["provider"] for r in rows))
            ref = rows[0]["baseline"] if rows[0]["baseline"] in variants else next(
                (p for p in variants if p.startswith("triton[")), variants[0])
            annotate(rows, baseline=ref)
            for r in rows:
                r["config_text"], r["config_json"] = config_text(r.get("config"))
            tables.append({"kernel": kernel, "mode": mode, "dtype": dtype, "reference": ref, "rows": rows,
                           "variants": variants})
        try:
            note = json.loads(run["run_config"] or "{}").get("note")
        except (ValueError, AttributeError):
            note = None
        out.append({"run": run, "commit": {"short": (run["git_commit"] or "")[:8], "subject": run["commit_subject"],
                                           "url": safe_url(run["commit_url"])}, "note": note,
                    "label": run["gpu_name"] or "CPU", "machine": run["machine"] or NOT_RECORDED, "tables": tables})
    return out


# -- environments -----------------------------------------------------------------------------

RUNS_LISTED = 100


def environments(data: SiteData) -> list[dict[str, Any]]:
    out = []
    for g in data.groups:
        envs = [e for e in data.environments if e["gkey"] == g.key]
        runs = [dict(r, subject=g.commits[r["ci"]].get("subject")) for r in data.runs if r["gkey"] == g.key]
        # The newest runs only: the page must stay small however long the history grows.
        out.append({"group": g, "envs": envs, "runs": runs[:RUNS_LISTED], "n_runs": len(runs)})
    return out


def group_options(groups: list[Group]) -> list[dict[str, str]]:
    return [{"id": g.id, "label": g.label, "kind": g.kind} for g in groups]
