"""`kcollect run`: the options become a frozen RunConfig, the plan is measured case by case (here,
or over one worker process per GPU), and the rows go to the store as each case ends."""
from __future__ import annotations

import math
import os
import random
import time
import uuid
from dataclasses import replace
from pathlib import Path

import click

from .common import (ALLOC_CONF, DEFAULT_DB, check_choices, fail, kernel_module_option, load_registry, open_store,
                     pin_ptxas, resolve_device)
from .formats import format_option
from .names import DTYPE_CHOICES as DTYPES, MODES

# Defaults where the device decides. The CPU interpreter takes 0.1-1 s a call and its rows are a
# check that everything runs, never compared with GPU numbers: fewer repeats, and one worker per
# core (up to 4), since each interpreted call is single-threaded Python. torch.compile builds C++
# on the CPU, not the Triton code it builds on a GPU, at 3-8 s of CPU a shape from a cold cache
# (more than all the other providers of a case together): its CPU rows are `unavailable` unless
# --provider compile asks for them.
MIN_REPS = {"cuda": 10, "cpu": 2}
# Seconds one measurement may take before its worker is killed and the row is an `error`: past
# anything a compile or a timing budget needs on a GPU. None on the CPU, whose interpreter can
# take minutes a shape, and which measures in this process unless asked for workers.
MEASURE_TIMEOUT = {"cuda": 300.0, "cpu": None}
CPU_WORKERS_MAX = 4
CPU_COMPILE = ("compile", "on the CPU torch.compile builds C++, not the Triton code it runs on a GPU; "
                          "measured on GPUs (--provider compile runs it here)")


@click.command("run")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Run every kernel in the registry.")
@click.option("--changed", "changed", is_flag=False, flag_value="", default=None, metavar="[=REF]",
              help="Instead of naming kernels: those whose code or method changed since REF (default: each "
                   "kernel's last commit that this machine measured on this grid and HEAD descends from, from the "
                   "store; a kernel never measured here runs too), each over its whole grid, plus a few fixed "
                   "sentinel series that measure the machine's drift. Give REF as --changed=REF.")
@click.option("--quick/--full", "quick", default=None,
              help="Shape grid: quick (seconds) or full (realistic model shapes). Default: full on CUDA, "
                   "quick on the CPU (Triton interpreter).")
@click.option("--mode", "modes", multiple=True, help=f"Only these modes (repeatable): {', '.join(MODES)}.")
@click.option("--provider", "providers", multiple=True,
              help="Only these providers (repeatable), e.g. triton, torch, compile, liger.")
@click.option("--dtype", "dtypes", multiple=True,
              help=f"Only these dtypes (repeatable): {', '.join(DTYPES)}. Default: each kernel's bench dtypes.")
@click.option("--where", "where", multiple=True, metavar="DIM=VALUE",
              help="Only the grid's shapes whose DIM equals VALUE (repeatable; values of one DIM are "
                   "alternatives, different DIMs must all match), e.g. --where stream=1 --where B=1.")
@click.option("--shape", "shapes", multiple=True, metavar="LABEL",
              help="Only this shape (repeatable), by its label as `summary` prints it, e.g. --shape M=4096,N=8192: "
                   "a shape of the grid, or a new one with the kernel's dimensions.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Where to run; cpu uses Triton's interpreter and marks the rows so.")
@click.option("--warmup-ms", default="10", metavar="MS", show_default=True,
              help="Warm-up budget per measurement, in ms.")
@click.option("--rep-ms", default="40", metavar="MS", show_default=True,
              help="Timed budget per measurement, in ms (an upper bound: see --ci).")
@click.option("--min-reps", default=None, metavar="N",
              help=f"Floor on the number of timed calls, whatever the budget. Default: {MIN_REPS['cuda']} on CUDA, "
                   f"{MIN_REPS['cpu']} on the CPU.")
@click.option("--ci", "ci_pct", default="0.5", metavar="PCT", show_default=True,
              help="Stop timing a provider once the 95% confidence interval of its median is within ±PCT% of it "
                   "(after --min-reps); 0 spends the whole --rep-ms budget.")
@click.option("--cuda-graph/--no-cuda-graph", default=True, show_default=True,
              help="Time replays of a CUDA graph of each call, so that Python and autograd launch overhead "
                   "(hidden in real training, where the CPU runs ahead) is not timed; a provider that cannot "
                   "be captured is timed with plain CUDA events. Each row records which method timed it.")
@click.option("--recheck/--no-recheck", default=None,
              help="Measure a row again at the end of its case and store it as `unstable` when the two "
                   "disagree (collector/stability.py); a row not of ours within 1.5% of its series' last "
                   "stored time on this GPU model, with a steady spread, is not measured again (see "
                   "--recheck-all). Default: on CUDA; off on the CPU, whose interpreted rows are never "
                   "compared and whose shared cores would flag most of them.")
@click.option("--recheck-all", is_flag=True, default=False,
              help="Recheck every row, also those whose series' last stored time vouches for them.")
@click.option("--seed", type=int, default=None,
              help="Seed of the run's random inputs (each case's comes from it and the case's kernel, shape and "
                   "dtype, so --seed S with --shape, --dtype, --mode and --provider measures one row of a run of "
                   "seed S again on the same inputs). Default: a fresh one per run, recorded in its config.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file the rows are appended to.")
@click.option("--commit", default=None,
              help="Git commit to record (default: HEAD of the git checkout in the working directory); its time, "
                   "subject and author come from git where it is known here, otherwise give --commit-time and the "
                   "full SHA. A run whose kcollect was built from another commit of the same repository (a stale "
                   "or non-editable install) is refused unless --commit names the commit to key it by.")
@click.option("--commit-time", default=None, help="ISO time of --commit (UTC unless it has an offset).")
@click.option("--machine", default=None,
              help="Name of this machine in the history. Default: host name and GPU name.")
@click.option("--gpus", default=None, metavar="all|I,J,...",
              help="Spread the cases over one worker process per GPU (each its own run, keyed by its device).")
@click.option("--workers", default=None, metavar="N",
              help=f"On the CPU: spread the kernels over N worker processes (with one, it measures in this process "
                   f"unless --measure-timeout is given). Default: one per core, at most {CPU_WORKERS_MAX}.")
@click.option("--measure-timeout", default=None, metavar="SECONDS",
              help=f"Kill a worker that spends more than SECONDS on one measurement (a hang), store an `error` row "
                   f"for it and go on in a fresh worker, as when a measurement crashes its process. Default: "
                   f"{MEASURE_TIMEOUT['cuda']:g} on CUDA (where every run measures in a worker process), none on "
                   f"the CPU (given, it measures in worker processes even with one).")
@click.option("--shard", default=None, metavar="K/N",
              help="Measure only shard K of N of the plan (split by estimated cost, the same on every machine); "
                   "merge the machines' run folders with `kcollect import`.")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Folder of the persistent Triton and torch.compile caches. Default: $KCOLLECT_CACHE_DIR, "
                   "else ~/.cache/kcollect.")
@click.option("--precompile", default="auto", metavar="N|auto", show_default=True,
              help="Before measuring, build the plan's kernels (Triton, torch.compile, CuTe DSL) into the caches in N "
                   "parallel processes, where the caches lack them; 0: build each as the run meets it. auto: on CUDA "
                   "one process per core and per 4 GiB of memory (2 to 16 per GPU of the run), on the CPU 0 (the "
                   "interpreter builds nothing to keep). A build that runs past --measure-timeout there, or kills its "
                   "process itself (a compiler's assertion), is stored as an `error` row and not called again.")
@click.option("--precompile-limit", default=None, metavar="SECONDS",
              help="Stop the precompile pass after SECONDS in all (default: no limit); the builds it has not made "
                   "by then, those in flight included, are made by the run as it meets them, each within "
                   "--measure-timeout. For a run with a time budget: a build stuck in the pass then costs at most "
                   "SECONDS there, and the run goes on to measure (and store) the rest.")
@click.option("--profile", "profile_dir", default=None, metavar="DIR",
              help="Write a cProfile of each measuring process to DIR: RUN_ID.prof (pstats) and RUN_ID.txt (the "
                   "functions with the most cumulative time), for overhead the run's breakdown does not name.")
@click.option("--fail-on-incorrect", is_flag=True,
              help="Exit 1 when any row (a peer's or a baseline's too) failed its correctness gate or raised an error.")
@click.option("--verbose", "-v", is_flag=True,
              help="A line per finished measurement, and where each run's time went, on stderr.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (kernels, cases, rows, estimated seconds) and its estimated time; measure nothing.")
@format_option
@kernel_module_option
def run(names, all_, changed, quick, modes, providers, dtypes, where, shapes, device, warmup_ms, rep_ms, min_reps, ci_pct,
        cuda_graph, recheck, recheck_all, seed, db, commit, commit_time, machine, gpus, workers, measure_timeout, shard,
        cache_dir, precompile, precompile_limit, profile_dir, fail_on_incorrect, verbose, dry_run, fmt, kernel_modules) -> None:
    """Run kernels against their baselines, gate on correctness, time, and store one row per
    (kernel, mode, provider, shape, dtype). Progress goes to stderr (one line rewritten on a
    terminal; elsewhere a line every 30 s; --verbose: a line per measurement), then the table of
    the command's rows to stdout (--format csv or json for scripts).

    Exit status: 0; 3 when a row of ours (our own kernels' providers) failed its correctness gate or
    raised (each is named with the command that measures it again alone); 1 when the run did not
    finish (or, with --fail-on-incorrect, any row failed); 2 for bad input or a store this kcollect
    cannot use; 130 when interrupted (Ctrl-C, SIGTERM), its rows kept.

    PyTorch's CUDA allocator runs with expandable segments unless PYTORCH_CUDA_ALLOC_CONF is set,
    and every Triton kernel is built by the torch wheel's ptxas unless TRITON_PTXAS_PATH is set
    (README, "What a run does")."""
    started = time.perf_counter()
    # Before anything touches CUDA: the allocator reads this when it starts (see ALLOC_CONF).
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    ptxas = pin_ptxas()  # before any Triton kernel is compiled
    if (names, all_, changed) == ((), False, None):
        fail("name at least one kernel, or pass --all or --changed (see `kcollect list`)")
    if sum((bool(names), all_, changed is not None)) > 1:
        fail("give kernel names, --all or --changed, only one of them")
    check_choices("mode", modes, MODES)
    check_choices("dtype", dtypes, DTYPES)
    budget = dict(warmup_ms=_number("--warmup-ms", warmup_ms, 0), rep_ms=_number("--rep-ms", rep_ms, 0, open_=True),
                  ci_rel=_number("--ci", ci_pct, 0) / 100)
    from .environment import CommitError, code_identity, key_commit, resolve_commit

    try:  # before any measurement: a bad time must not cost the ceilings
        found = resolve_commit(Path.cwd(), commit, commit_time)
    except CommitError as e:
        fail(str(e))
    try:
        found, warning = key_commit(found, code_identity(), commit, Path.cwd())
    except CommitError as e:
        if not dry_run:  # a dry run keys nothing
            fail(str(e))
        warning = None
    found = replace(found, invocation=str(uuid.uuid4()))
    device = resolve_device(device)
    timeout = MEASURE_TIMEOUT[device] if measure_timeout is None else _number("--measure-timeout", measure_timeout, 0,
                                                                               open_=True)
    budget["min_reps"] = MIN_REPS[device] if min_reps is None else int(_number("--min-reps", min_reps, 1, integer=True))
    from .schedule import parse_shard

    try:
        shard_kn = parse_shard(shard) if shard else None
    except ValueError as e:
        fail(str(e))
    pool = _workers(device, gpus, workers)
    caches = None if dry_run else _caches(cache_dir)  # a dry run makes no folder
    if dry_run and cache_dir:  # but reads its manifest of builds (precompile.pending)
        os.environ["KCOLLECT_CACHE_DIR"] = cache_dir
    registry = load_registry(device, kernel_modules)
    check_choices("kernel", names, registry.names())
    grid = ("quick" if device == "cpu" else "full") if quick is None else ("quick" if quick else "full")
    sentinels = ()
    if changed is not None:
        selection = _changed(changed, found.sha, registry, grid, db, device, machine)
        click.echo(f"kcollect: {selection.note}", err=True)
        names, sentinels = tuple(selection.names), selection.sentinels
    specs = list(registry.specs) if all_ else [registry.get(n) for n in dict.fromkeys(names)]
    check_choices("provider", providers, dict.fromkeys(p for s in specs for p in s.provider_names))
    specs = _shapes(shapes, specs)
    where = _where(where, specs, grid)
    from .plan import RunConfig, plan

    config = RunConfig(kernels=tuple(s.name for s in specs), grid=grid, device=device, modes=modes or None,
                       providers=providers or None, dtypes=dtypes or None, where=where,
                       shapes=tuple(dict.fromkeys(shapes)), kernel_shapes=sentinels, cuda_graph=cuda_graph,
                       recheck=device == "cuda" if recheck is None else recheck, recheck_all=recheck_all,
                       seed=random.randrange(2**31) if seed is None else seed,
                       alloc_conf=os.environ["PYTORCH_CUDA_ALLOC_CONF"], ptxas=ptxas, machine=machine,
                       shard=shard, workers=max(1, len(pool)), caches=caches, measure_timeout=timeout,
                       unavailable=(CPU_COMPILE,) if device == "cpu" and "compile" not in providers else (),
                       profile=None if dry_run else _profile_dir(profile_dir),
                       precompile=_precompile(precompile, device, len(pool)),
                       precompile_limit=None if precompile_limit is None else _number(
                           "--precompile-limit", precompile_limit, 0, open_=True), **budget)
    cases = plan(specs, config)
    if not cases:
        fail("the selection leaves nothing to run (check --mode/--provider/--dtype/--where/--shape against "
             "`kcollect list`)")
    from .session import Output, dry_run as plan_lines, execute

    if dry_run:  # the store only for the seconds of past runs, read, never made
        store = open_store(db, read_only=True) if Path(db).exists() else None
        click.echo("\n".join(plan_lines(config, cases, shard_kn, pool, store, fmt)))
        return
    if warning:
        click.echo(f"kcollect: warning: {warning}", err=True)
    if found.sha is None:
        click.echo(f"kcollect: warning: {Path.cwd()} is not in a git checkout: the run records no commit "
                   "(run from the checkout, or give --commit and --commit-time)", err=True)
    execute(config, found, cases, shard_kn, pool, kernel_modules, open_store(db),
            Output(fmt, verbose, fail_on_incorrect), started)


def _shapes(labels: tuple[str, ...], specs: list) -> list:
    """The specs with their grids restricted to --shape's labels (as the workers' plan does), or a
    one-line error naming the kernel that cannot take one and what it can."""
    if not labels:
        return specs
    from .shapes import ShapeError, restrict

    try:
        return [restrict(s, labels) for s in specs]
    except ShapeError as e:
        fail(f"--shape: {e}")


def _changed(ref: str, head: str | None, registry, grid: str, db: str, device: str, machine: str | None):
    """run --changed's selection (changed.py), REF resolved by git; one line and exit 2 for a REF or
    a checkout git does not know."""
    from .changed import last_measured, select, select_each
    from .codechange import git

    if not head:
        fail("--changed needs the git checkout of the commit being run (no commit found here)")
    if ref:
        full = git(".", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if not full:
            fail(f"--changed={ref}: no such commit in this checkout")
        return select(registry.specs, full.strip(), head, grid)
    store = open_store(db, read_only=True) if Path(db).exists() else None
    try:
        return select_each(registry.specs, last_measured(store, head, device, machine, grid), head, grid)
    finally:
        if store is not None:
            store.close()


def _precompile(text: str, device: str, gpus: int = 1) -> int:
    from .precompile import default_procs

    if text == "auto":
        return default_procs(device, gpus)
    if not text.isdigit():
        fail(f"--precompile {text!r}: must be auto or a whole number >= 0")
    return int(text)


def _profile_dir(folder: str | None) -> str | None:
    """--profile's folder, made now (absolute: workers may run elsewhere), or a one-line error."""
    if folder is None:
        return None
    path = Path(folder).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--profile: cannot use {folder}: {e.strerror or e}")
    return str(path)


def _where(pairs: tuple[str, ...], specs, grid: str) -> tuple[tuple[str, str], ...]:
    """--where DIM=VALUE pairs, each DIM one the selected kernels' grid shapes have."""
    dims = {d for s in specs for shape in s.grid(grid) for d in shape.dims}
    out = []
    for pair in pairs:
        name, sep, value = (p.strip() for p in pair.partition("="))
        if not sep or not name or not value:
            fail(f"--where {pair!r}: must be DIM=VALUE, e.g. --where stream=1")
        if name not in dims:
            fail(f"--where {pair!r}: no shape of the selected kernels' {grid} grid has the dim {name!r} "
                 f"(they have: {', '.join(sorted(dims))})")
        out.append((name, value))
    return tuple(out)


def _number(name: str, text: str, minimum: float, open_: bool = False, integer: bool = False) -> float:
    """A finite number >= minimum (> minimum when open_), or a one-line error and exit 2."""
    try:
        x = int(text) if integer else float(text)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < minimum or (open_ and x == minimum):
        kind = "a whole number" if integer else "a finite number"
        fail(f"{name} {text!r}: must be {kind} {'>' if open_ else '>='} {minimum:g}")
    return x


def _workers(device: str, gpus: str | None, workers: str | None) -> list:
    """The worker processes to start ([] measures in this process). On CUDA there is always one:
    this process watches it, and survives a measurement that crashes it or hangs (collect.py)."""
    from .collect import WorkerSpec
    from .schedule import parse_gpus

    if gpus is not None and workers is not None:
        fail("give --gpus (CUDA) or --workers (CPU), not both")
    if workers is not None and device != "cpu":
        fail("--workers is for the CPU device; on CUDA use --gpus all or --gpus 0,1")
    if device == "cpu" and gpus is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        n = int(_number("--workers", workers, 1, integer=True)) if workers is not None else min(cores, CPU_WORKERS_MAX)
        return [WorkerSpec(f"cpu{i}", None, None) for i in range(n)]  # one: here, unless watched (session.py)
    if gpus is None:
        return [WorkerSpec("gpu0", None, 0)]
    if device != "cuda":
        fail("--gpus needs a CUDA device; on the CPU use --workers N")
    import torch

    try:
        ids = parse_gpus(gpus, torch.cuda.device_count())
    except ValueError as e:
        fail(str(e))
    # a worker sees one device; where the user narrowed the visible ones, index into their list
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else [str(i) for i in ids]
    return [WorkerSpec(f"gpu{i}", names[i] if visible else str(i), i) for i in ids]


def _caches(cache_dir: str | None) -> str:
    from . import caches

    try:
        return caches.use(cache_dir)
    except OSError as e:
        fail(f"--cache-dir: cannot use {cache_dir or caches.default_root()}: {e.strerror or e}")
