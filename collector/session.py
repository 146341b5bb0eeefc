"""One `kcollect run` from its plan to its exit code: the shard, the workers or this process, the
progress, and the report at the end (the table of the command's rows, what failed)."""
from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace

import click

from . import phases as phase_report
from . import precompile
from .collect import Outcome, run_here, run_workers
from .environment import Commit
from .progress import Progress, _clock
from .report import cost_lines, is_ours, lines, run_records
from .formats import render
from .plan import Case, RunConfig
from .previous import previous_times
from .schedule import estimator, overhead, past_seconds, shard, tasks
from .spec import DTYPE_NAMES
from .store import Store

# The exit status of a run in which a row of ours failed its correctness gate or raised (README,
# `run --help`): apart from 1 (the run did not finish, or --fail-on-incorrect), 2 (bad input) and
# 130 (interrupted), so that CI can tell our kernel's failure from the rest.
OURS_FAILED = 3
SHOWN_FAILURES = 10  # failing rows of ours named one by one at the end of a run


@dataclass(frozen=True)
class Output:
    """How a run reports: the format of its table of rows (stdout), a line per measurement, and
    whether any failing row (not only ours) fails it."""
    fmt: str = "table"
    verbose: bool = False
    fail_on_incorrect: bool = False


@dataclass
class Layout:
    """What this process measures of a plan, and with how many workers."""
    indices: list[int]  # the cases of this shard, into the plan
    todo: list[list[int]]  # the tasks the workers take
    pool: list  # the worker processes ([]: this process)
    config: RunConfig


def layout(config: RunConfig, cases: list[Case], shard_kn: tuple[int, int] | None, pool: list) -> Layout:
    indices = shard(cases, *shard_kn, config.device) if shard_kn else list(range(len(cases)))
    todo = tasks(indices, cases, config.device, len(pool))
    pool = pool[:max(1, len(todo))]  # a worker per task at most
    if len(pool) == 1 and config.device == "cpu" and config.measure_timeout is None:
        pool = []  # one CPU worker, nothing to watch for: measure in this process
    return Layout(indices, todo, pool, replace(config, workers=max(1, len(pool))))


def _planned(lay: Layout, cases: list[Case]) -> tuple[dict, dict]:
    """The precompile pass's builds of the run's cases and those the caches lack (precompile.pending),
    read once for the run's estimate and its pass."""
    return precompile.pending(lay.config, cases, lay.indices) if lay.config.precompile > 0 else ({}, {})


def _progress(lay: Layout, cases: list[Case], store: Store | None, planned: tuple[dict, dict],
              verbose: bool = False) -> Progress:
    mine = [cases[i] for i in lay.indices]
    config = lay.config
    past = past_seconds(store, config.device, config.machine) if store is not None else {}
    cost, known = estimator(mine, config.device, past)
    return Progress(mine, config.device, workers=config.workers, cost=cost, known=known, verbose=verbose,
                    overhead=overhead(config, planned[1], cases))


def execute(config: RunConfig, commit: Commit, cases: list[Case], shard_kn: tuple[int, int] | None, pool: list,
            kernel_modules, store: Store, output: Output, started: float | None = None) -> None:
    """`started`: when the command began (perf_counter), so that imports count in the breakdown."""
    lay = layout(config, cases, shard_kn, pool)
    config, pool = lay.config, lay.pool
    planned = _planned(lay, cases)
    progress = _progress(lay, cases, store, planned, output.verbose)

    def warn(message: str) -> None:
        progress.say(f"kcollect: warning: {message}")

    where = (f"shard {config.shard}: {len(lay.indices)} of {len(cases)} cases" if shard_kn
             else f"{len(cases)} cases")
    progress.say(f"{where}, grid {config.grid}; {progress.plan_line()}")
    try:
        visible = [w.visible for w in pool] or [None]
        ahead = precompile.run(config, cases, planned, kernel_modules, config.precompile, visible, progress.say,
                               config.measure_timeout)
    except KeyboardInterrupt:
        progress.close()
        store.close()
        click.echo("kcollect: interrupted while building ahead; nothing was measured", err=True)
        sys.exit(130)
    previous = previous_times(store, config.kernels) if config.recheck and not config.recheck_all else {}
    progress.say("measuring the device's ceilings (copy bandwidth, bf16 matmul)...")
    try:
        if pool:
            out = run_workers(config, commit, cases, lay.todo, store, progress, warn, pool, kernel_modules,
                              ahead_s=ahead.seconds, skips=ahead.skips(), previous=previous)
        else:
            index = 0 if config.device == "cuda" else None
            out = run_here(config, commit, cases, lay.indices, store, progress, warn, index, started, ahead.seconds,
                           ahead.skips(), previous)
    finally:
        progress.close()
        store.close()
    wall = time.perf_counter() - (started if started is not None else progress.started)
    sys.exit(_report(out, config, store, output, wall))


def _report(out: Outcome, config: RunConfig, store: Store, output: Output, wall: float) -> int:
    """Prints the end of a run (the rows on stdout, the rest on stderr); its exit status."""
    for error in out.errors:
        click.echo(f"kcollect: error: {error}", err=True)
    runs = [{**asdict(run), **_device(out.envs.get(run.env_id))} for run in out.runs.values()]
    order = {k: i for i, k in enumerate(config.kernels)}
    rows = out.rows
    # the kernels in the order asked for, whichever worker measured them (stable: as measured within)
    recs = sorted(run_records(runs, rows), key=lambda r: order.get(r["kernel"], len(order)))
    if output.fmt in ("table", "markdown") and len({(r["gpu"], r["machine"]) for r in recs}) == 1:
        for r in recs:  # one device: the run line above names it
            r["gpu"] = r["machine"] = None
    if recs or output.fmt in ("csv", "json"):
        click.echo("\n".join(lines(recs, output.fmt)))
    if output.verbose:
        for run_id, phases in out.phases.items():
            if phases:
                click.echo(f"where the time went (run {run_id[:8]}):", err=True)
                click.echo("\n".join(phase_report.lines(phases)), err=True)
        if len({r["kernel"] for r in rows}) > 1:  # with one kernel, the breakdown above says it
            click.echo("\n".join(cost_lines(rows, "table")[1:]), err=True)
    bad = [r for r in rows if r["status"] in ("failed", "error")]
    ours = [r for r in bad if is_ours(r)]
    unstable = sum(r["status"] == "unstable" for r in rows)
    timed = [r for r in rows if r["status"] == "ok" and r.get("median_ms")]
    vouched = sum(r.get("recheck_ms") is None for r in timed) if config.recheck else 0  # ours never are
    ids = ", ".join(r[:8] for r in out.runs) or "none started"
    click.echo(f"{len(rows)} rows in {store.path} (run {ids}, {out.status}) in {_clock(wall)}"
               + (f"; {len(bad)} failed or errored ({len(ours)} of ours)" if bad else "")
               + (f"; {unstable} unstable" if unstable else "")
               + (f"; {vouched} of {len(timed)} ok rows not rechecked, their last times vouching for them"
                  if vouched else "")
               + ("" if output.verbose else "; `kcollect summary` (or --verbose) shows where the time went"),
               err=True)
    for r in ours[:SHOWN_FAILURES]:
        click.echo(f"kcollect: error: ours failed: {r['kernel']} {r['mode']} {r['provider']} {r['shape']} "
                   f"{r['dtype']} is {r['status']} ({r.get('error') or 'no reason'}); alone: "
                   f"{reproduce(r, config)}", err=True)
    if len(ours) > SHOWN_FAILURES:
        click.echo(f"kcollect: error: ... and {len(ours) - SHOWN_FAILURES} more rows of ours failed", err=True)
    if out.status == "interrupted":
        return 130
    if out.status != "finished":
        return 1
    if ours:
        return OURS_FAILED
    return 1 if output.fail_on_incorrect and bad else 0


def _device(env) -> dict:
    return {"device_kind": env.device_kind, "gpu_name": env.gpu_name} if env is not None else {}


def reproduce(row: dict, config: RunConfig) -> str:
    """The command that measures this one row again, on the same inputs (the case's seed comes
    from the run's and the row's identity alone: seeds.case_seed)."""
    args = ["kcollect", "run", row["kernel"], "--shape", row["shape"], "--dtype", row["dtype"], "--mode", row["mode"],
            "--provider", row["provider"], "--seed", str(config.seed)]
    if config.device == "cpu":
        args += ["--device", "cpu"]
    return " ".join(shlex.quote(a) for a in args)


def dry_run(config: RunConfig, cases: list[Case], shard_kn: tuple[int, int] | None, pool: list,
            store: Store | None, fmt: str) -> list[str]:
    """The plan, kernel by kernel (cases, rows, estimated seconds), and its estimated wall time,
    as the run would announce it; nothing is built or measured."""
    lay = layout(config, cases, shard_kn, pool)
    progress = _progress(lay, cases, store, _planned(lay, cases))
    by: dict[str, dict] = {}
    for i in lay.indices:
        c = cases[i]
        k = by.setdefault(c.spec.name, {"kernel": c.spec.name, "cases": 0, "rows": 0, "seconds": 0.0,
                                        "dtypes": set(), "modes": c.modes, "providers": c.providers})
        k["cases"] += 1
        k["rows"] += len(c.modes) * len(c.providers)
        k["seconds"] += sum(progress.cost(c, m, p) for m in c.modes for p in c.providers)
        k["dtypes"].add(DTYPE_NAMES[c.dtype])
    recs = [{**k, "dtypes": ",".join(sorted(k["dtypes"])), "modes": ",".join(k["modes"]),
             "providers": ",".join(k["providers"])} for k in by.values()]
    columns = ("kernel", "cases", "rows", "seconds", "modes", "providers", "dtypes")
    text = [{"seconds": f"{r['seconds']:.1f}"} for r in recs]
    out = render(recs, fmt, columns, text, right=("cases", "rows", "seconds"))
    if fmt in ("table", "markdown"):
        where = f"shard {config.shard}: " if shard_kn else ""
        out += ["", f"{where}{len(lay.indices)} cases, grid {config.grid}; {progress.plan_line()}; "
                    "seconds: each kernel's estimated measuring time, one worker"]
    return out
