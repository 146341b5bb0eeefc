"""The page models: plain dicts and lists that the templates render, built from SiteData and the
regression analysis. Pure functions (no I/O), so the tests can check what a page will say.

Every element a filter acts on carries data-gpu / data-mode / data-dtype / data-provider (and, on
the regressions page, data-kind / data-kernel / data-machine) values taken from here; site.js hides
what does not match the filters in the URL.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from . import charts
from .site_data import SPARK_POINTS, Group, SiteData, annotate, downsample

OURS = charts.OURS

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


# -- regressions ------------------------------------------------------------------------------

# The order of the regressions page: what needs someone first, what is settled last.
STATE_ORDER = {("regression", "open", True): 0, ("regression", "open", False): 1,
               ("regression", "ended", True): 2, ("regression", "ended", False): 3,
               ("regression", "recovered", True): 4, ("regression", "recovered", False): 5}
STATE_LABEL = {"open": "open regression", "ended": "regression, no longer measured",
               "recovered": "recovered regression", "held": "improvement", "lost": "improvement, since lost"}
KIND_FILTER = {"open": "open", "ended": "recovered", "recovered": "recovered", "held": "improvement",
               "lost": "improvement"}


def to_confirm(f: dict[str, Any]) -> str | None:
    """Why a step of our provider is not counted as a regression of our code (the engine's cause:
    our code did not change, a partial run, the environment), or None."""
    if not f.get("mine") or f["ours"]:
        return None
    return (f.get("cause") or "not a step of our code").removesuffix(": confirm")


def _label(f: dict[str, Any]) -> str:
    """A step's label; an open regression of ours to confirm says why."""
    why = to_confirm(f) if f["state"] == "open" else None
    return f"open regression to confirm: {why}" if why else STATE_LABEL[f["state"]]


def flag_rows(data: SiteData, flags: list[dict[str, Any]], changes: list[dict[str, Any]],
              slugs: dict[str, str]) -> list[dict[str, Any]]:
    """One row per step and per change of measuring conditions, in the page's order: open
    regressions (ours first, the most severe first), then regressions that recovered or are no
    longer measured, then improvements, then changes of method, machine or environment."""
    rows = []
    for f in flags:
        if f["kernel"] not in slugs:
            continue
        g = data.group(f["gkey"])
        values = downsample(f["values"], SPARK_POINTS)
        mark = min(f["step_at"] * len(values) // len(f["values"]), len(values) - 1)
        end = g.commits[f["end_ci"]] if f["end_ci"] is not None else None
        rows.append(_row(data, f, slugs) | {
            "filter_kind": KIND_FILTER[f["state"]], "label": _label(f),
            "z": f["z"], "p": f["p"], "noise": f["noise"], "spark": charts.sparkline(values, mark=mark),
            "end": commit_info(end) if end else None, "end_ci": f["end_ci"],
            "order": STATE_ORDER.get((f["kind"], f["state"], f["ours"]), 6),
            "undoes": commit_info(g.commits[f["undoes"]]) if f.get("undoes") is not None else None,
            "undoes_ci": f.get("undoes"), "n_after": len(f["values"]) - f["step_at"], "decided_ci": f["decided_ci"]})
    for c in changes:
        if c["kernel"] not in slugs:
            continue
        rows.append(_row(data, c, slugs) | {
            "id": None, "kind": c["kind"], "state": "condition", "filter_kind": c["kind"],
            "label": f"{c['kind']} change", "z": None, "p": None, "noise": None, "spark": None, "end": None,
            "end_ci": None, "undoes": None, "undoes_ci": None, "n_after": None, "decided_ci": None, "what": c["what"],
            "ours": c.get("ours", False), "order": 7})
    rows.sort(key=lambda r: (r["order"], -severity(r), r["kernel"], r["shape"]))
    return rows


def _row(data: SiteData, f: dict[str, Any], slugs: dict[str, str]) -> dict[str, Any]:
    g = data.group(f["gkey"])
    before, after = g.commits[f["before_ci"]], g.commits[f["after_ci"]]
    return {
        "id": f.get("id"), "kind": f["kind"], "state": f.get("state"), "ours": f.get("ours"), "mine": f.get("mine"),
        "kernel": f["kernel"], "slug": slugs[f["kernel"]], "gkey": g.key, "gid": g.id, "glabel": g.label,
        "machine": f.get("machine") or NOT_RECORDED, "mode": f["mode"], "dtype": f["dtype"],
        "provider": f["provider"], "shape": f["shape"], "before": commit_info(before), "after": commit_info(after),
        "before_ci": f["before_ci"], "after_ci": f["after_ci"], "n_commits": f["after_ci"] - f["before_ci"],
        "range_url": range_url(before, after), "before_ms": f["before_ms"], "after_ms": f["after_ms"],
        "change": f["change"], "what": f.get("what"), "timing": f.get("timing"), "confirm": to_confirm(f)}


def confidence(p: float | None) -> float:
    """How sure the verdict engine is of a step: 1 - the p-value it decided it with (the gate's
    calibrated tail, or for a step found with more points the persistence test's, times the
    candidates it tried; regress.Flag.p). A change of conditions has none: 1."""
    return 1.0 if p is None else max(0.0, 1.0 - p)


def severity(r: dict[str, Any]) -> float:
    """The order of the open regressions, across GPUs: how much slower (the log of the time ratio)
    times how sure the engine is (confidence)."""
    return abs(math.log1p(r["change"])) * confidence(r.get("p"))


def detector_threshold() -> float:
    """The smallest relative step the regression detector flags: its own constant, read here so
    that no page restates it."""
    from . import regress

    return regress.DEFAULT_THRESHOLD


def detector_fdr() -> float:
    """The false-discovery rate at which the detector decides the series of one commit together
    (verdicts.Q, its own constant)."""
    from . import verdicts

    return verdicts.Q


def needs_attention(r: dict[str, Any]) -> bool:
    """An open regression of our kernels that nobody has acknowledged or ignored."""
    return r["kind"] == "regression" and r["state"] == "open" and bool(r["ours"]) and "ack" not in r


def open_regressions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The open regressions of our kernels that need someone, most severe first, across GPUs."""
    return sorted((r for r in rows if needs_attention(r)), key=lambda r: -severity(r))


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

    others = [r for r in rows if r["state"] == "open" and not r["ours"] and "ack" not in r]
    return {"open_ours": n(needs_attention),
            # steps of our kernels that something else may explain: a partial run, code that did not change
            "open_confirm": sum(1 for r in others if r.get("mine")),
            "open_other": sum(1 for r in others if not r.get("mine")),
            "acknowledged": n(lambda r: r["state"] == "open" and "ack" in r),
            "recovered": n(lambda r: r["state"] in ("recovered", "ended")),
            "improvements": n(lambda r: r["kind"] == "improvement"),
            "conditions": n(lambda r: r["state"] == "condition")}


# The regressions table's columns, as its data file carries them (site.js draws the rows).
FLAG_COLUMNS = ("id", "state", "kind", "label", "ours", "kernel", "slug", "gid", "machine", "mode", "dtype",
                "provider", "shape", "b", "a", "end", "undoes", "n_commits", "before_ms", "after_ms", "change",
                "z", "noise", "what", "spark", "order", "ack", "filter_kind")


def flag_table(data: SiteData, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The regressions table as data: columns, one list per row, and each GPU's commits
    [short, date, subject, url] that the rows point into."""
    out = []
    for r in rows:
        ack = r.get("ack")
        out.append([r["id"], r["state"], r["kind"], r["label"], bool(r["ours"]), r["kernel"], r["slug"], r["gid"],
                    r["machine"], r["mode"], r["dtype"], r["provider"], r["shape"], r["before_ci"], r["after_ci"],
                    r["end_ci"], r["undoes_ci"], r["n_commits"],
                    sig(r["before_ms"]), sig(r["after_ms"]), sig(r["change"]), sig(r["z"]), sig(r["noise"]),
                    r["what"], r["spark"] or None, r["order"],
                    {"state": ack["state"], "reason": ack["reason"], "by": ack.get("by")} if ack else None,
                    r["filter_kind"]])
    return {"cols": FLAG_COLUMNS, "rows": out, "labels": {g.id: g.label for g in data.groups}}


def commit_lists(data: SiteData) -> dict[str, list[list]]:
    """Each group's commits for the scripts: [short, date, subject, url]."""
    return {g.id: [[c["short"], c["date"], c.get("subject") or "", safe_url(c.get("url")) or ""] for c in g.commits]
            for g in data.groups}


def sig(v: float | None, digits: int = 6) -> float | None:
    """A number for a data file: 6 significant digits, past any measurement's precision."""
    return None if v is None else float(f"{v:.{digits}g}")


# -- one kernel -------------------------------------------------------------------------------

OPEN_ON_KERNEL = 5  # open flags listed above a kernel page's results; the rest are one click away


def kernel_page(data: SiteData, kernel: str, slugs: dict[str, str], rows_of_flags: list[dict[str, Any]],
                trend_files: dict[tuple[str, str, str, str], str], colors: dict[str, str],
                part_files: dict[tuple[str, str, str, str], str]) -> dict[str, Any]:
    """The page model: its sections and parts (their rows are in the part files), its open flags,
    and what its scripts need (colours, commits, the trend marks)."""
    info = data.kernel_info[kernel]
    steps = [r for r in rows_of_flags if r["state"] != "condition"]
    opened = sorted((r for r in steps if r["state"] == "open" and "ack" not in r),
                    key=lambda r: (not r["ours"], -severity(r)))
    sections = []
    for g in data.groups:
        if kernel not in g.kernels:
            continue
        rows = data.latest[(g.key, kernel)]
        latest = next(r for r in data.runs if r["run_id"] == rows[0]["run_id"])
        parts = [{"mode": m, "dtype": d, "file": part_files[(g.key, kernel, m, d)],
                  "trend_file": trend_files.get((g.key, kernel, m, d)),
                  "trend_shapes": _trend_shapes(data, g, kernel, m, d, rows),
                  "trend_providers": [p for p in data.providers if p in data.trends.get((g.key, kernel, m, d), {})],
                  "n_rows": sum(r["mode"] == m and r["dtype"] == d for r in rows),
                  "has_memory": any(r["peak_mem_bytes"] is not None for r in rows if r["mode"] == m and r["dtype"] == d)}
                 for m, d in _combos(rows, data.modes, data.dtypes)]
        sections.append({"group": g, "latest": _run_info(latest, g), "older": _older_runs(data, rows), "parts": parts})
    return {"name": kernel, "slug": slugs[kernel], "info": info, "sections": sections, "colors": colors,
            "opened": opened[:OPEN_ON_KERNEL], "n_opened": len(opened), "n_steps": len(steps),
            "n_conditions": len(rows_of_flags) - len(steps),
            "conditions": {str(i): _condition_label(c) for i, c in data.conditions.items()}}


def _trend_shapes(data: SiteData, g: Group, kernel: str, mode: str, dtype: str, rows: list[dict[str, Any]]) -> list[str]:
    shapes = _shapes([r for r in rows if r["mode"] == mode and r["dtype"] == dtype])
    older = {s for ser in data.trends.get((g.key, kernel, mode, dtype), {}).values() for s in ser} - set(shapes)
    return shapes + sorted(older)


def _older_runs(data: SiteData, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs other than the newest that the rows' cases come from (a later run measured only
    part of the grid), newest first, with how many cases each gives."""
    cases: dict[str, set] = {}
    for r in rows:
        cases.setdefault(r["run_id"], set()).add((r["shape"], r["dtype"]))
    by_id = {r["run_id"]: r for r in data.runs}
    return [{"run": rid[:8], "commit": by_id[rid]["commit"][:8], "cases": len(c)} for rid, c in list(cases.items())[1:]]


# One part's table, as its data file carries it (site.js draws the table and the charts from it).
PART_COLUMNS = ("shape", "provider", "status", "median_ms", "p20_ms", "p80_ms", "reps", "rate", "frac_of_peak",
                "tokens_per_s", "vs_base", "vs_best", "peak_mem_bytes", "rel_err", "tolerance", "config",
                "mean_ms", "std_ms", "min_ms", "p99_ms", "max_ms", "timing", "mixed", "error", "ci")


def part_data(data: SiteData, g: Group, kernel: str, mode: str, dtype: str) -> dict[str, Any]:
    """One (GPU, mode, dtype) of a kernel: its latest rows (shape by shape, in grid order, the
    providers in the site's order) and what its charts need."""
    info = data.kernel_info[kernel]
    # every provider of a case shares its mode and dtype: annotating this part's rows alone is enough
    sel = annotate([r for r in data.latest[(g.key, kernel)] if r["mode"] == mode and r["dtype"] == dtype])
    shapes = _shapes(sel)
    order = {p: i for i, p in enumerate(data.providers)}
    index = {s: i for i, s in enumerate(shapes)}
    table = sorted(sel, key=lambda r: (index[r["shape"]], order.get(r["provider"], 99)))
    run = sel[0]
    ceiling = run["matmul_tflops"] if info["bound"] == "compute" else run["copy_gbps"]
    ticks, title = charts.compact(shapes)
    rows = [[r["shape"], r["provider"], r["status"], *(sig(r[k]) for k in (
        "median_ms", "p20_ms", "p80_ms")), r["reps"], *(sig(r[k]) for k in (
        "rate", "frac_of_peak", "tokens_per_s", "vs_base", "vs_best")), r["peak_mem_bytes"], sig(r["rel_err"]),
        sig(r["tolerance"]), config_text(r.get("config"))[0] or None,
        *(sig(r[k]) for k in ("mean_ms", "std_ms", "min_ms", "p99_ms", "max_ms")), r["timing"],
        r["vs_base_mixed"] or r["vs_best_mixed"], r["error"] if r["status"] != "ok" else None,
        data.run_ci.get(r["run_id"])] for r in table]
    return {"cols": PART_COLUMNS, "rows": rows, "shapes": shapes, "ticks": ticks, "xtitle": title,
            "ylog": charts.log_axis([r["rate"] for r in sel]),
            "memlog": charts.log_axis([r["peak_mem_bytes"] for r in sel]),
            "unit": info["unit"], "baseline": info["baseline"], "ceiling": sig(ceiling),
            "ceiling_name": "bf16 matmul" if info["bound"] == "compute" else "copy bandwidth",
            "has_tokens": any(r.get("tokens") for r in sel), "has_config": any(r.get("config") for r in sel)}


def _condition_label(c: dict[str, Any]) -> str:
    env = ", ".join(f"{k} {c[k]}" for k in ("torch", "triton", "driver", "cuda") if c.get(k))
    peers = ", ".join(f"{k} {v}" for k, v in sorted(c["peers"].items()))
    return "; ".join(x for x in (c["timing"], c["machine"], env, peers) if x)


# -- the feed ---------------------------------------------------------------------------------

FEED_ENTRIES = 50


def feed_entries(data: SiteData, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest regressions of our kernels (by the date of the commit they happened at), the
    ignored ones left out, each with the state it is in now."""
    picked = [r for r in rows if r["kind"] == "regression" and r["ours"] and
              (r.get("ack") or {}).get("state") != "ignored"]
    when = {id(r): data.group(r["gkey"]).commits[r["after_ci"]].get("time") for r in picked}
    picked.sort(key=lambda r: (when[id(r)] or datetime.min, -severity(r)), reverse=True)
    return [dict(r, updated=when[id(r)]) for r in picked[:FEED_ENTRIES]]


# -- compare ----------------------------------------------------------------------------------


def compare_page(data: SiteData, trend_files: dict[tuple[str, str, str, str], str],
                 slugs: dict[str, str], recent_files: dict[tuple[str, str, str, str], tuple[str, int]] | None = None,
                 flags: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The compare page's data: each GPU's commits and a manifest of the trend files, each with the
    commits it has points at ("c") and, where written, the file of its points from commit index
    "rs" on ("r"), so that comparing two commits loads only the files that hold them, and of
    recent commits only their recent points (the first load of a history of many commits stays
    light); and the verdict engine's steps (`steps`), so that the page says which of the moves
    between two commits the engine finds real, as the regressions page and `kcollect compare` do."""
    commits = commit_lists(data)
    groups = [{"id": g.id, "label": g.label, "kind": g.kind, "commits": commits[g.id]} for g in data.groups]
    ids = {g.key: g.id for g in data.groups}
    recent_files = recent_files or {}
    manifest = [{"g": ids[key[0]], "k": key[1], "s": slugs[key[1]], "m": key[2], "d": key[3], "f": f,
                 "c": sorted({c for shapes in data.trends[key].values() for ci, *_ in shapes.values() for c in ci}),
                 **({"r": recent_files[key][0], "rs": recent_files[key][1]} if key in recent_files else {})}
                for key, f in sorted(trend_files.items())]
    return {"groups": groups, "manifest": manifest, "threshold": detector_threshold(),
            "steps": engine_steps(flags or [], ids)}


def engine_steps(flags: list[dict[str, Any]], ids: dict[str, str]) -> dict[str, list]:
    """The flags as steps: "series" [group id, kernel, mode, dtype, provider, shape], each once, and
    "steps" [series index, commit index before, after, +1 slower / -1 faster, 1 if of our code]."""
    series: list[list] = []
    index: dict[tuple, int] = {}
    steps = []
    for f in flags:
        key = (ids[f["gkey"]], f["kernel"], f["mode"], f["dtype"], f["provider"], f["shape"])
        if key not in index:
            index[key] = len(series)
            series.append(list(key))
        steps.append([index[key], f["before_ci"], f["after_ci"], 1 if f["kind"] == "regression" else -1,
                      int(bool(f["ours"]))])
    return {"series": series, "steps": steps}


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
