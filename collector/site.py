"""`kcollect build-site`: the static dashboard, rendered from the store alone.

Publishing follows asv's publish: check the output folder, fold the Parquet history into the
store, query, run the pure analysis (site_flags: steps, their state, changes of conditions), render,
then swap the new site in. The site is built in a staging folder beside the output, so a failed
build leaves the old site whole.

The output works from file:// and from GitHub Pages: relative links only (the commits' own pages
excepted), plotly.js shipped once as a local asset, data for the trend charts in small .js files
loaded with <script> tags (fetch() of a local JSON file is blocked under file://), and beside every
page its data as JSON under json/, for scripts.
"""
from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import json
import shutil
import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import click
import jinja2
import markupsafe

from . import charts, plotly_bundle, site_budgets, site_cache, site_config, site_data, site_flags, site_git, site_index, site_pages
from .common import DEFAULT_DB, fail
from .store import Store, StoreError

MARKER = ".kcollect-site"  # written into every output; a folder without it is never wiped
# kcollect.templates is the repository's templates/ folder (see pyproject's package-dir).
TEMPLATES = Path(importlib.import_module("kcollect.templates").__file__).resolve().parent
STATIC = ("style.css", "site.js")
DEFAULT_CONFIG = "data/site.toml"


class SiteError(Exception):
    """An output folder or asset problem, explained in one sentence."""


@dataclass
class BuildResult:
    out: Path
    files: int
    pages: int
    largest: tuple[str, int]  # the largest file other than plotly.js: (relative path, bytes)
    seconds: float
    imported: int
    notes: list[str]  # what the caller should tell: a config entry that matches nothing, a plotly shipped whole
    unchanged: bool = False  # nothing it reads changed since the build that wrote `out`: left as it was


# -- the output folder ------------------------------------------------------------------------


def check_out(out: Path) -> None:
    """Refuses to touch a folder this command did not write: it wipes what it is given."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SiteError(f"{out} exists and is not a folder; choose another --out")
    if (out / MARKER).is_file() or not any(out.iterdir()):
        return
    raise SiteError(f"refusing to wipe {out}: it is not empty and holds no {MARKER} marker from an earlier "
                    "build-site; choose another --out or empty it yourself")


def plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise SiteError(f"the plotly package has no {path.name} (looked in {path.parent}); reinstall plotly")
    return path


def _swap(staging: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.kcollect-old")
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    if old.exists():
        shutil.rmtree(old)


# -- rendering --------------------------------------------------------------------------------


def _fmt(spec: str):
    def f(v: Any) -> str:
        return "—" if v is None else format(v, spec)

    return f


def _pct(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.0f}%" if v >= 0.01 or v == 0 else f"{100 * v:.1g}%"  # interpreter rows: 0.02%


def _speedup(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}×" if v >= 100 else f"{v:.1f}×" if v >= 10 else f"{v:.2f}×" if v >= 0.1 else f"{v:.2g}×"


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    # Jinja keys a compiled template by its name and source only, not by the environment's
    # settings (autoescape, filters): the files are named after this module's own source too, so
    # that a kcollect whose settings changed never runs templates compiled under the old ones.
    tag = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    try:
        return jinja2.FileSystemBytecodeCache(pattern=f"__kcollect_{tag}_%s.cache")
    except RuntimeError:  # no private folder can be made: compile every time
        return None


def _count(v: float | None) -> str:
    """A large count per second, three figures and an SI prefix (tokens/s): 12.3M."""
    if v is None:
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g}{prefix}"
    return f"{v:.3g}"


def environment() -> jinja2.Environment:
    # Autoescape everything: kernel names, shapes, error messages and GPU names come from the data.
    # The compiled templates are kept in Jinja's per-user cache in the temporary folder (keyed by
    # each template's source and this module's): compiling them is a sixth of a build.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             bytecode_cache=_bytecode_cache())
    env.filters.update({
        "ms": _fmt(".4g"), "num": _fmt(",.0f"), "sci": _fmt(".1e"),
        "rate": lambda v: "—" if v is None else (format(v, ",.0f") if v >= 100 else format(v, ".3g")),
        "pct": _pct, "x": _speedup, "count": _count,
        "sig": site_pages.sig,  # a number for a CSV, to 6 significant digits
        "signed_pct": lambda v: "—" if v is None else f"{100 * v:+.1f}%",
        "gib": lambda v: "—" if not v else f"{v / 2**30:.0f} GiB",
        "mib": lambda v: "—" if v is None else f"{v / 2**20:,.3g} MiB" if v < 2**30 else f"{v / 2**30:,.3g} GiB",
        "when": lambda v: "—" if v is None else v.strftime("%Y-%m-%d %H:%M"),
        "iso": lambda v: (v or datetime(1970, 1, 1)).strftime("%Y-%m-%dT%H:%M:%SZ"),  # the store's times are UTC
        "noise": lambda v: "—" if v is None else f"±{100 * v:.2g}%",
        # shape labels (M=4096,N=14336) may wrap after a comma, never inside a number
        "wrap": lambda v: markupsafe.Markup(",<wbr>").join(str(v).split(",")),
        # and kernel names (fused_linear_cross_entropy) after an underscore
        "wrap_words": lambda v: markupsafe.Markup("_<wbr>").join(str(v).split("_")),
    })
    return env


class Writer:
    """Writes pages, their data as JSON, and data files under the staging root, counting sizes."""

    def __init__(self, root: Path, env: jinja2.Environment, common: dict[str, Any]):
        self.root, self.env, self.common = root, env, common
        self.sizes: dict[str, int] = {}
        self.pages = 0

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        path.write_bytes(data)
        self.sizes[rel] = len(data)

    def page(self, rel: str, template: str, payload: Any, **ctx: Any) -> None:
        """The page at rel, and beside it (under json/) the data it shows, for scripts."""
        root = "../" * rel.count("/")
        json_rel = "json/" + rel.removesuffix(".html") + ".json"
        self.write(json_rel, to_json(payload))
        self.write(rel, self.env.get_template(template).render(**self.common, root=root, here=rel,
                                                                json_href=root + json_rel, **ctx))
        self.pages += 1


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def _plain(obj: Any) -> Any:
    if isinstance(obj, (datetime, date)):
        return obj.isoformat()
    if isinstance(obj, site_data.Group):
        return {"id": obj.id, "label": obj.label, "kind": obj.kind, "machines": obj.machines}
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


class JSONText(str):
    """A payload already serialised (to_json), for one that a page and a data file both carry."""


def to_json(payload: Any) -> str:
    return payload if isinstance(payload, JSONText) else json.dumps(payload, default=_plain, separators=(",", ":"))


def data_js(name: str, payload: Any) -> str:
    """A data file: one call that hands the payload to site.js under its path."""
    return f"KC.put({json.dumps(name)},{to_json(payload)});\n"


def packed(payload: dict) -> dict:
    """A table payload ({cols, rows}) whose columns of strings hold indexes into one list of their
    values ("strings"; "enc": those columns), which site.js's KC.put unpacks. A shape, a config or
    an unavailable peer's reason repeats on every row of its shape or provider: packed, the kernels'
    data files weigh 29% less (574 of 2008 KB on the committed history)."""
    rows = payload["rows"]
    enc = [c for c in range(len(payload["cols"])) if any(isinstance(r[c], str) for r in rows)
           and all(r[c] is None or isinstance(r[c], str) for r in rows)]
    if not enc:
        return payload
    index: dict[str, int] = {}
    out = [list(r) for r in rows]
    for r in out:
        for c in enc:
            if r[c] is not None:
                r[c] = index.setdefault(r[c], len(index))
    return {**payload, "rows": out, "strings": list(index), "enc": enc}


# A trend file's band edges as offsets from their median in 1/BANDS of it (-13: 1.3% below), which
# site.js turns back into times: 2-3 characters where a time took 7, a quarter of the trend files'
# bytes on the committed history. A band is drawn (0.1% is below a pixel) and shown on hover to 4
# digits, which the rounding (at most 0.05% of the median) may change in the last one
BANDS = 1000


def _trend_payload(series: dict[str, dict[str, list]], noise: dict[tuple, float | None], key: tuple,
                   marks: list[dict[str, Any]]) -> dict:
    """A trend file: {"series": provider -> shape -> [commit indexes, median, p20, p80 (as offsets:
    BANDS), condition ids, {condition id: relative noise}], "marks": the flags and changes of
    conditions the charts mark, "bands": BANDS}."""
    out: dict[str, dict[str, list]] = {}
    for provider, shapes in series.items():
        out[provider] = {}
        for shape, (ci, med, p20, p80, cond) in shapes.items():
            n = {k: noise.get((*key, provider, shape, k)) for k in set(cond)}
            lo, hi = ([round(BANDS * (e / m - 1)) for e, m in zip(edge, med)] for edge in (p20, p80))
            out[provider][shape] = [ci, med, lo, hi, cond, {k: round(v, 5) for k, v in n.items() if v is not None}]
    return {"series": out, "marks": marks, "bands": BANDS}


# The compare page's commits within this many of a GPU's newest are read from files of those points
# only: comparing the newest commits of a whole-grid history loaded every trend file whole (1.6 MB)
RECENT_COMMITS = 12


def _recent(payload: dict, start: int) -> dict | None:
    """The compare page's file of a trend file's points at commit indexes from `start` on: each
    series' [commit indexes, medians, 0, 0, condition ids] (the page reads no bands, noise or
    marks); None where the trend file has no point before `start` (it is as light)."""
    out: dict[str, dict[str, list]] = {}
    older = False
    for provider, shapes in payload["series"].items():
        for shape, (ci, med, _lo, _hi, cond, _noise) in shapes.items():
            keep = [j for j, c in enumerate(ci) if c >= start]
            older = older or len(keep) < len(ci)
            if keep:
                out.setdefault(provider, {})[shape] = [[ci[j] for j in keep], [med[j] for j in keep], 0, 0,
                                                       [cond[j] for j in keep]]
    return {"series": out} if older else None


MARK_FIELDS = ("kind", "state", "label", "provider", "shape", "after_ci", "change", "what")
COMMITS_FILE = "data/commits.js"  # each group's commits [short, date, subject, url], for every page's scripts


# -- what each page offers as JSON: its data, without the drawing material (sparklines)


def _index_json(m: dict[str, Any], count: dict[str, int]) -> dict:
    return {"counts": count,
            "latest": [{"gpu": x["group"].label, "commit": x["commit"], "kernels": x["kernels"],
                        "new_regressions": [_without(f, "spark") for f in x["new"]]} for x in m["latest"]],
            "open_regressions": [_without(f, "spark") for f in m["opened"]], "n_open": m["n_opened"],
            "leaderboard": m["board"]["rows"], "trust": dict(m["trust"], gpus=[
                dict(_without(x, "group"), gpu=x["group"].label) for x in m["trust"]["gpus"]]),
            "groups": [dict(_without(s, "kernels"), kernels=[
                dict(k, lines=[dict(line, cells={p: _without(c, "spark") for p, c in line["cells"].items()})
                               for line in k["lines"]]) for k in s["kernels"]]) for s in m["grids"]]}


def render(data: site_data.SiteData, analysis: site_flags.Analysis, staging: Path, db: Path,
           problems: list[tuple[str, str]], config: site_config.SiteConfig) -> tuple[Writer, list[str]]:
    """Writes every page but the budgets into staging. Returns the writer and the config's
    warnings (entries that match no flag)."""
    slugs = site_pages.kernel_slugs(data.kernels)
    ids = {g.key: g.id for g in data.groups}
    rows = site_pages.flag_rows(data, analysis.flags, analysis.changes, slugs)
    warnings = site_config.apply(config, rows)
    count = site_pages.counts(rows)
    colors = charts.provider_colors(data.providers)
    now = datetime.now(timezone.utc)
    common = {
        "built": now.strftime("%Y-%m-%d %H:%M UTC"), "built_iso": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "db_name": db.name,
        "kernels": [(k, slugs[k]) for k in data.kernels], "groups": site_pages.group_options(data.groups),
        "modes": data.modes, "dtypes": data.dtypes, "providers": data.providers, "colors": colors,
        "n_runs": len(data.runs), "n_open": count["open_ours"], "n_problems": len(problems),
        "threshold": site_pages.detector_threshold(), "fdr": site_pages.detector_fdr(),
    }
    w = Writer(staging, environment(), common)
    w.write(COMMITS_FILE, data_js(COMMITS_FILE, site_pages.commit_lists(data)))
    marks: dict[tuple, list] = {}
    for r in rows:
        marks.setdefault((r["gkey"], r["kernel"], r["mode"], r["dtype"]), []).append(
            {k: site_pages.sig(r[k]) if k == "change" else r[k] for k in MARK_FIELDS})
    trend_files: dict[tuple[str, str, str, str], str] = {}
    recent_files: dict[tuple[str, str, str, str], tuple[str, int]] = {}
    n_commits = {g.key: len(g.commits) for g in data.groups}
    for n, (key, series) in enumerate(sorted(data.trends.items())):
        gkey, kernel = key[0], key[1]
        if kernel not in slugs:
            continue
        rel = f"data/{slugs[kernel]}.{ids[gkey]}.{n}.js"
        payload = _trend_payload(series, analysis.noise, key, marks.get(key, []))
        w.write(rel, data_js(rel, payload))
        trend_files[key] = rel
        start = n_commits[gkey] - RECENT_COMMITS
        recent = _recent(payload, start)
        if recent is not None:
            rel = f"data/{slugs[kernel]}.{ids[gkey]}.{n}.recent.js"
            w.write(rel, data_js(rel, recent))
            recent_files[key] = (rel, start)
    m = site_index.model(data, rows, slugs, config.other_function, analysis.noise)
    w.page("index.html", "overview.html", _index_json(m, count), title="Overview", m=m, counts=count)
    rows_of: dict[str, list] = {}
    for r in rows:
        rows_of.setdefault(r["kernel"], []).append(r)
    for k in data.kernels:
        part_files, parts_json = {}, []
        for g in data.groups:
            if k not in g.kernels:
                continue
            for mode, dtype in site_pages._combos(data.latest[(g.key, k)], data.modes, data.dtypes):
                rel = f"data/{slugs[k]}.{g.id}.{len(part_files)}.part.js"
                payload = site_pages.part_data(data, g, k, mode, dtype)
                w.write(rel, data_js(rel, packed(payload)))
                part_files[(g.key, k, mode, dtype)] = rel
                parts_json.append({"gpu": g.label, "mode": mode, "dtype": dtype, "cols": payload["cols"],
                                   "rows": payload["rows"]})
        model = site_pages.kernel_page(data, k, slugs, rows_of.get(k, []), trend_files, colors,
                                       part_files)
        w.page(f"kernels/{slugs[k]}.html", "kernel.html",
               {"name": k, "info": model["info"], "open_flags": [_without(f, "spark") for f in model["opened"]],
                "parts": parts_json}, title=k, k=model)
    machines = sorted({r["machine"] or site_pages.NOT_RECORDED for r in data.runs if r["device_kind"] != "cpu"})
    events = site_pages.event_rows(data, analysis.events)
    flags = site_pages.flag_table(data, rows)
    spark = flags["cols"].index("spark")  # drawing material, as elsewhere under json/
    table = JSONText(to_json({**flags, "cols": [c for c in flags["cols"] if c != "spark"],
                              "rows": [r[:spark] + r[spark + 1:] for r in flags["rows"]]}))
    w.write(FLAGS_FILE, data_js(FLAGS_FILE, packed(flags)))  # the page's copy packed, json/'s plain
    w.page("regressions.html", "regressions.html",
           JSONText(f'{{"counts":{to_json(count)},"flags":{table},"events":{to_json(events)}}}'),
           title="Regressions", events=events, counts=count, machines=machines, n_rows=len(rows),
           n_gpu_groups=sum(g.kind == "gpu" for g in data.groups), has_cpu=any(g.kind == "cpu" for g in data.groups))
    w.write("regressions.atom", w.env.get_template("feed.atom").render(
        **common, entries=site_pages.feed_entries(data, rows)))
    cmp = site_pages.compare_page(data, trend_files, slugs, recent_files, analysis.flags)
    w.page("compare.html", "compare.html", cmp, title="Compare", cmp=cmp)
    lab = site_pages.experiments(data)
    w.page("experiments.html", "experiments.html", lab, title="Experiments", lab=lab)
    envs = site_pages.environments(data)
    w.page("environments.html", "environments.html", envs, title="Environments", sections=envs)
    listed = [{"folder": f, "reason": why} for f, why in problems]
    w.page("imports.html", "imports.html", listed, title="Import problems", problems=listed)
    return w, warnings


FLAGS_FILE = "data/flags.js"  # every flag row, for the regressions table and each kernel's folded flags


# -- the build --------------------------------------------------------------------------------


def import_history(db: Path, data_dir: Path | None, cache: site_cache.Cache | None = None
                   ) -> tuple[int, list[tuple[str, str]]]:
    """Folds the Parquet history into the store (idempotent), so that a clean checkout builds the
    site from data/ with one command. Nothing to do when the folder holds no runs, or when neither
    it nor the store changed since the last import (the cache knows).
    -> (runs added, [(folder, why)] for the run folders that could not be imported): the site
    names those on a page of their own and builds from the rest."""
    from .common import DEFAULT_DB
    from .history import import_path, run_folders

    if data_dir is None or not data_dir.is_dir() or not run_folders(data_dir):
        return 0, []
    stamp, known = site_cache.import_unchanged(cache, db, data_dir)
    if known is not None:
        return 0, [tuple(p) for p in known]
    problems: list = []
    with Store(db, create_folder=str(db) == DEFAULT_DB) as store:  # another --db's folder must exist
        added, _ = import_path(store, data_dir, problems)
    listed = [(str(folder), why) for folder, why in problems]
    site_cache.imported(cache, db, stamp, listed)
    return added, listed


def _inputs(db: Path, config: Path | None, commit_url: str | None, git_root: Path | None,
            problems: list[tuple[str, str]]) -> str:
    """A digest of everything a build reads: the store file, the config, the options, this
    kcollect's code and templates, the plotly package, the checkout's remote (commit links) and
    refs (the commits it knows: their subjects, and whose code changed)."""
    code = sorted([*Path(__file__).parent.glob("*.py"), *TEMPLATES.iterdir()])
    h = hashlib.sha256()
    for f in code:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    st, pl = db.stat(), plotly_js().stat()
    remote, refs = (site_git.remote(git_root), site_git.refs(git_root)) if git_root is not None else (None, None)
    h.update(repr([st.st_size, st.st_mtime_ns, pl.st_size, pl.st_mtime_ns, config.read_bytes() if config else None,
                   commit_url, remote, refs, sorted(problems)]).encode())
    return h.hexdigest()


def _unchanged(out: Path, inputs: str) -> tuple[int, int] | None:
    """(pages, files) of the site at out where its build read exactly these inputs, else None."""
    try:
        lines = (out / MARKER).read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    files = sum(1 for f in out.rglob("*") if f.is_file())
    if fields.get("inputs") != inputs or fields.get("files") != str(files):
        return None
    return int(fields.get("pages", 0)), files


def partial_plotly(cache: site_cache.Cache | None) -> tuple[bytes, str | None]:
    return plotly_bundle.build(plotly_js(), cache.root if cache else None)


def _without_gc(build):
    """Python's cycle collector paused while `build` runs: the history's analysis keeps millions of
    small objects alive to its end, and each full pass of the collector walks all of them (on the 8x
    history of benchmarks/site_history8.py that was a quarter of the build's CPU); whatever cycles
    the build leaves are collected once it returns."""
    @functools.wraps(build)
    def wrapped(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return build(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()
    return wrapped


@_without_gc
def build_site(db: str | Path, out: str | Path, data_dir: str | Path | None = None,
               problems: list[tuple[str, str]] | None = None, git_root: Path | None = None,
               commit_url: str | None = None, config: str | Path | None = None,
               cache_dir: str | Path | None = None) -> BuildResult:
    """Builds the site from the store at db into out. `problems`: run folders that could not be
    imported, with why, listed on the import page beside those this build met itself. `git_root`:
    a checkout that fills in the commit subjects, authors and links the store lacks, and says whose
    code changed at each commit (None: our code counts as changed at every commit).
    `commit_url`: a template of a commit's web page ({sha} is replaced), which every commit's link
    then follows. `config`: the site's TOML (site_config), None for none. `cache_dir`: where a
    rebuild finds what it can reuse (None: nothing is cached).
    Raises StoreError or SiteError."""
    t0 = time.perf_counter()
    db, out = Path(db), Path(out)
    if out.is_symlink():
        out = out.resolve()
    check_out(out)
    if commit_url is not None:
        site_git.check_template(commit_url)
    try:
        cfg = site_config.load(Path(config) if config is not None else None)
    except site_config.ConfigError as e:
        raise SiteError(str(e)) from None
    cache = site_cache.Cache(Path(cache_dir)) if cache_dir is not None else None
    imported, skipped = import_history(db, Path(data_dir) if data_dir else None, cache)
    inputs = (_inputs(db, Path(config) if config is not None else None, commit_url, git_root,
                      [*(problems or []), *skipped]) if db.is_file() else "")  # no store: Store says why below
    same = _unchanged(out, inputs) if cache is not None and inputs else None
    if same is not None:
        return BuildResult(out=out, files=same[1], pages=same[0], largest=("", 0), seconds=time.perf_counter() - t0,
                           imported=imported, notes=[], unchanged=True)
    plotly, plotly_note = partial_plotly(cache)
    with Store(db, read_only=True) as store:
        data = site_data.load(store)
        budgets = site_budgets.load(store)
    commits = [c for g in data.groups for c in g.commits]
    if git_root is not None:
        site_git.fill(commits, git_root)
    if commit_url is not None:
        site_git.apply_template(commits, commit_url)
    analysis = site_cache.analyse(data, cache, git_root)
    staging = out.with_name(f".{out.name}.kcollect-staging")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        (staging / ".nojekyll").write_text("")  # GitHub Pages: serve the files as they are
        (staging / "assets").mkdir()
        (staging / "assets" / "plotly.min.js").write_bytes(plotly)
        for name in STATIC:
            shutil.copyfile(TEMPLATES / name, staging / "assets" / name)
        w, warnings = render(data, analysis, staging, db, [*(problems or []), *skipped], cfg)
        site_budgets.render(w, budgets, data.groups)
        files = sum(1 for f in staging.rglob("*") if f.is_file()) + 1
        (staging / MARKER).write_text("Written by `kcollect build-site`, which wipes and rewrites this folder.\n"
                                      f"inputs: {inputs}\npages: {w.pages}\nfiles: {files}\n")
        _swap(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for name in (*STATIC, "plotly.min.js"):
        w.sizes["assets/" + name] = (out / "assets" / name).stat().st_size
    largest = max(((k, v) for k, v in w.sizes.items() if k != "assets/plotly.min.js"), key=lambda kv: kv[1])
    return BuildResult(out=out, files=files, pages=w.pages, largest=largest,
                       seconds=time.perf_counter() - t0, imported=imported,
                       notes=[*([plotly_note] if plotly_note else []), *(f"{config}: {x}" for x in warnings)])


@click.command("build-site")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB store to read.")
@click.option("--out", default="site", show_default=True,
              help="Output folder; wiped and rewritten (only if empty or written by build-site before).")
@click.option("--data", "data_dir", default="data/runs", show_default=True,
              help="Parquet history folded into --db first when it holds runs; '' to skip.")
@click.option("--git/--no-git", "use_git", default=True, show_default=True,
              help="Read the git checkout here: the commit subjects, authors and links the store lacks, and "
                   "whose code changed at each commit (without git, our code counts as changed at every commit).")
@click.option("--commit-url", default=None, metavar="TEMPLATE",
              help="Link every commit to this page, {sha} replaced by its hash "
                   "(e.g. https://github.com/OWNER/REPO/commit/{sha}).")
@click.option("--config", "config", default=None, metavar="FILE",
              help=f"The site's decisions: acknowledged or ignored flags, providers of another function "
                   f"[default: {DEFAULT_CONFIG} where it exists].")
@click.option("--cache/--no-cache", "use_cache", default=True, show_default=True,
              help="Reuse the analysis of unchanged history and skip an import of unchanged run folders "
                   "(kept under $KCOLLECT_CACHE_DIR, else ~/.cache/kcollect).")
def build_site_cmd(db: str, out: str, data_dir: str, use_git: bool, commit_url: str | None, config: str | None,
                   use_cache: bool) -> None:
    """Render the static dashboard (overview, one page per kernel, regressions and their feed,
    compare, budgets, experiments, environments) from the store into --out."""
    from .caches import default_root

    if config is None and Path(DEFAULT_CONFIG).is_file():
        config = DEFAULT_CONFIG
    try:
        result = build_site(db, out, data_dir or None, git_root=Path.cwd() if use_git else None,
                            commit_url=commit_url, config=config,
                            cache_dir=default_root() / "site" if use_cache else None)
    except StoreError as e:
        fail(str(e), e.code)
    except SiteError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write the site: {e.strerror or e}", 1)
    for note in result.notes:
        click.echo(f"kcollect: note: {note}", err=True)
    if result.imported:
        click.echo(f"imported {result.imported} run(s) from {data_dir} into {db}", err=True)
    if result.unchanged:
        click.echo(f"site in {result.out}/ is up to date: nothing it is built from changed since its last build "
                   f"({result.pages} pages, {result.files} files); open {result.out}/index.html")
        return
    rel, size = result.largest
    click.echo(f"site written to {result.out}/ ({result.pages} pages, {result.files} files, largest "
               f"{rel} {size / 1024:.0f} KiB) in {result.seconds:.1f} s; open {result.out}/index.html")
