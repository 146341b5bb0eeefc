"""One `kcollect run` from its plan to its exit code: the shard, the workers or this process, the
progress, and the report at the end (summary table, where the time went, what failed)."""
from __future__ import annotations

import sys
from dataclasses import replace

import click

from . import phases as phase_report
from . import precompile
from .collect import Outcome, run_here, run_workers
from .environment import Commit
from .progress import Progress
from .report import cost_lines, table_lines
from .plan import Case, RunConfig
from .schedule import estimator, past_seconds, shard, tasks
from .store import Store


def execute(config: RunConfig, commit: Commit, cases: list[Case], shard_kn: tuple[int, int] | None, pool: list,
            kernel_modules, store: Store, fail_on_incorrect: bool, started: float | None = None) -> None:
    """`started`: when the command began (perf_counter), so that imports count in the breakdown."""
    indices = shard(cases, *shard_kn, config.device) if shard_kn else list(range(len(cases)))
    mine = [cases[i] for i in indices]
    todo = tasks(indices, cases, config.device, len(pool))
    pool = pool[:max(1, len(todo))]  # a worker per task at most
    if len(pool) == 1 and config.device == "cpu" and config.measure_timeout is None:
        pool = []  # one CPU worker, nothing to watch for: measure in this process
    config = replace(config, workers=max(1, len(pool)))
    cost, known = estimator(mine, config.device, past_seconds(store, config.device, config.machine))
    progress = Progress(mine, config.device, workers=max(1, len(pool)), cost=cost, known=known)

    def warn(message: str) -> None:
        progress.say(f"kcollect: warning: {message}")

    where = f"shard {config.shard}: {len(mine)} of {len(cases)} cases" if shard_kn else f"{len(cases)} cases"
    progress.say(f"{where}, grid {config.grid}; {progress.plan_line()}")
    try:
        visible = [w.visible for w in pool] or [None]
        ahead = precompile.run(config, cases, indices, kernel_modules, config.precompile, visible, progress.say,
                               config.measure_timeout).seconds
    except KeyboardInterrupt:
        progress.close()
        store.close()
        click.echo("kcollect: interrupted while building ahead; nothing was measured", err=True)
        sys.exit(130)
    progress.say("measuring the device's ceilings (copy bandwidth, bf16 matmul)...")
    try:
        if pool:
            out = run_workers(config, commit, cases, todo, store, progress, warn, pool, kernel_modules, ahead_s=ahead)
        else:
            index = 0 if config.device == "cuda" else None
            out = run_here(config, commit, cases, indices, store, progress, warn, index, started, ahead)
    finally:
        progress.close()
        store.close()
    _report(out, store, fail_on_incorrect)


def _report(out: Outcome, store: Store, fail_on_incorrect: bool) -> None:
    for error in out.errors:
        click.echo(f"kcollect: error: {error}", err=True)
    for run_id, run in out.runs.items():
        rows = [r for r in out.rows if r["run_id"] == run_id]
        if rows:
            click.echo("\n".join(table_lines(rows, run.copy_gbps, run.matmul_tflops)))
        if out.phases.get(run_id):
            click.echo(f"where the time went (run {run_id[:8]}):", err=True)
            click.echo("\n".join(phase_report.lines(out.phases[run_id])), err=True)
        if len({r["kernel"] for r in rows}) > 1:  # with one kernel, the breakdown above says it
            click.echo("\n".join(cost_lines(rows, "table")[1:]), err=True)
    bad = sum(r["status"] in ("failed", "error") for r in out.rows)
    unstable = sum(r["status"] == "unstable" for r in out.rows)
    ids = ", ".join(r[:8] for r in out.runs) or "none started"
    click.echo(f"{len(out.rows)} rows in {store.path} (run {ids}, {out.status})"
               + (f"; {bad} failed or errored" if bad else "") + (f"; {unstable} unstable" if unstable else ""),
               err=True)
    if out.status == "interrupted":
        sys.exit(130)
    if out.status != "finished" or (fail_on_incorrect and bad):
        sys.exit(1)
