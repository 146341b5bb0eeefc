"""`kcollect run`: the options become a frozen RunConfig, the plan is measured case by case, and
the rows go to the store as each case ends."""
from __future__ import annotations

import os
import random
import signal
import sys

import click

from .common import (ALLOC_CONF, DEFAULT_DB, ROOT, check_choices, fail, kernel_module_option, load_registry, open_store,
                  pin_ptxas, resolve_device)
from .spec import DTYPES, MODES
from .store import Store, StoreError


@click.command("run")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Run every kernel in the registry.")
@click.option("--quick/--full", "quick", default=None,
              help="Shape grid: quick (seconds) or full (realistic model shapes). Default: full on CUDA, "
                   "quick on the CPU (Triton interpreter).")
@click.option("--mode", "modes", multiple=True, help=f"Only these modes (repeatable): {', '.join(MODES)}.")
@click.option("--provider", "providers", multiple=True,
              help="Only these providers (repeatable), e.g. triton, torch, compile, liger.")
@click.option("--dtype", "dtypes", multiple=True,
              help=f"Only these dtypes (repeatable): {', '.join(DTYPES)}. Default: each kernel's bench dtypes.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Where to run; cpu uses Triton's interpreter and marks the rows so.")
@click.option("--warmup-ms", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Warm-up budget per measurement, in ms.")
@click.option("--rep-ms", type=click.FloatRange(min=0), default=40.0, show_default=True,
              help="Timed budget per measurement, in ms.")
@click.option("--min-reps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Floor on the number of timed calls, whatever the budget.")
@click.option("--cuda-graph/--no-cuda-graph", default=True, show_default=True,
              help="Time replays of a CUDA graph of each call, so that Python and autograd launch overhead "
                   "(hidden in real training, where the CPU runs ahead) is not timed; a provider that cannot "
                   "be captured is timed with plain CUDA events. Each row records which method timed it.")
@click.option("--seed", type=int, default=None, help="Seed for the random inputs. Default: a fresh one per run.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file the rows are appended to.")
@click.option("--commit", default=None,
              help="Git commit to record, for a copy of the tree without .git. Default: read from git.")
@click.option("--commit-time", default=None, help="ISO time of --commit (UTC).")
@kernel_module_option
def run(names, all_, quick, modes, providers, dtypes, device, warmup_ms, rep_ms, min_reps, cuda_graph, seed, db,
        commit, commit_time, kernel_modules) -> None:
    """Run kernels against their baselines, gate on correctness, time, and store one row per
    (kernel, mode, provider, shape, dtype). PyTorch's CUDA allocator runs with expandable segments
    unless PYTORCH_CUDA_ALLOC_CONF is set, and every Triton kernel is built by the torch wheel's
    ptxas unless TRITON_PTXAS_PATH is set (README, "What a run does")."""
    # Before anything touches CUDA: the allocator reads this when it starts (see ALLOC_CONF).
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    ptxas = pin_ptxas()  # before any Triton kernel is compiled
    if not names and not all_:
        fail("name at least one kernel, or pass --all (see `kcollect list`)")
    if names and all_:
        fail("give kernel names or --all, not both")
    check_choices("mode", modes, MODES)
    check_choices("dtype", dtypes, DTYPES)
    device = resolve_device(device)
    registry = load_registry(device, kernel_modules)
    check_choices("kernel", names, registry.names())
    specs = list(registry.specs) if all_ else [registry.get(n) for n in dict.fromkeys(names)]
    check_choices("provider", providers, dict.fromkeys(p for s in specs for p in s.provider_names))
    grid = ("quick" if device == "cpu" else "full") if quick is None else ("quick" if quick else "full")
    from .runner import RunConfig, plan  # after load_registry: it imports Triton

    config = RunConfig(kernels=tuple(s.name for s in specs), grid=grid, device=device, modes=modes or None,
                       providers=providers or None, dtypes=dtypes or None, warmup_ms=warmup_ms, rep_ms=rep_ms,
                       min_reps=min_reps, cuda_graph=cuda_graph,
                       seed=random.randrange(2**31) if seed is None else seed, commit=commit,
                       commit_time=commit_time, alloc_conf=os.environ["PYTORCH_CUDA_ALLOC_CONF"], ptxas=ptxas)
    cases = plan(specs, config)
    if not cases:
        fail("the selection leaves nothing to run (check --mode/--provider/--dtype against `kcollect list`)")
    store = open_store(db)
    _execute(config, store, cases)


def _progress(cases):
    """A progress bar on a terminal; elsewhere (CI logs, a device's captured output) one line per
    case with the elapsed time, so a log shows where the time went."""
    import time

    def label(case):
        return f"{case.spec.name} {case.shape.label} {str(case.dtype).split('.')[-1]}" if case else ""

    if sys.stderr.isatty():
        with click.progressbar(cases, label="collecting", item_show_func=label, file=sys.stderr,
                               show_pos=True) as bar:
            yield from bar
        return
    t0 = time.perf_counter()
    for i, case in enumerate(cases, 1):
        yield case
        click.echo(f"[{i}/{len(cases)}] {label(case)}  {time.perf_counter() - t0:.1f} s", err=True)


def _execute(config, store: Store, cases) -> None:
    from .environment import describe
    from .report import table_lines
    from .runner import Runner

    runner = Runner(config, store)
    runner.warn = lambda message: click.echo(f"kcollect: warning: {message}", err=True)
    # Ctrl-C and SIGTERM (a job scheduler's time limit) end the run: rows kept, run marked. The
    # signal is also remembered and checked after each case, because a library can swallow the
    # KeyboardInterrupt it raises: in CI a SIGINT once left a run that ended "finished", exit 0.
    # DuckDB, which turns an interrupt inside a query into its own InterruptException, is the
    # likely place; we have not reproduced it.
    signals: list[int] = []

    def on_signal(signum, _frame):
        signals.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rows: list[dict] = []
    status, run = "unfinished", None
    try:
        click.echo("measuring the device's ceilings (copy bandwidth, bf16 matmul)...", err=True)
        run = runner.start(ROOT)
        click.echo(f"run {run.run_id[:8]} on {describe(runner.env)}: copy {run.copy_gbps:.0f} GB/s, "
                   f"matmul {run.matmul_tflops:.1f} TFLOP/s; {len(cases)} cases, grid {config.grid}", err=True)

        for case in _progress(cases):
            rows.extend(runner.run_case(case))
            if signals:
                raise KeyboardInterrupt
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
    except StoreError as e:
        status = "unfinished"
        click.echo(f"kcollect: error: {e}", err=True)
    except Exception:
        if not signals:
            raise
        status = "interrupted"  # the signal surfaced as a library's own exception
    finally:
        try:
            runner.finish(status)
        except StoreError:
            pass
        store.close()
    if rows and run is not None:
        click.echo("\n".join(table_lines(rows, run.copy_gbps, run.matmul_tflops)))
    failed = sum(r["status"] in ("failed", "error") for r in rows)
    click.echo(f"{len(rows)} rows in {store.path} (run {runner.run_id[:8]}, {status})"
               + (f"; {failed} failed or errored" if failed else ""), err=True)
    if status == "interrupted":
        sys.exit(130)
    if status != "finished":
        sys.exit(1)


