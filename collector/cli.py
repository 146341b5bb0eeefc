"""kcollect: the command line. Builds a frozen RunConfig from the options and hands it down.

Bad input exits 2 with one line saying what is wrong and what is valid; a store that cannot be
opened or written exits 1 with one line; Ctrl-C exits 130 after marking the run interrupted.
"""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import sys
from pathlib import Path

import click

from .spec import DTYPES, MODES
from .store import Store, StoreError

ROOT = Path(__file__).resolve().parent.parent  # the checkout: git commit, data/
DEFAULT_DB = "data/kbench.duckdb"
DEFAULT_RUNS = "data/runs"
# PyTorch's CUDA allocator for `kcollect run`, unless PYTORCH_CUDA_ALLOC_CONF is set already.
# Expandable segments map each pool into one growing address range instead of one cudaMalloc per
# large block. With the default allocator, where a provider's tensors landed depended on what the
# cases before had allocated and freed, and that alone moved a time by 10%: our swiglu backward at
# 16384x14336 took 610 us after the float64 reference had been computed and 547 us without it, in
# one process, with the same launch (torch.compile's: 547 both times); with expandable segments,
# 548 in every order (docs/evidence/swiglu_context_check_h200_run1.txt, run2.txt). Each run records
# the setting in its config.
ALLOC_CONF = "expandable_segments:True"


def pin_ptxas() -> str:
    """TRITON_PTXAS_PATH for every Triton kernel of a run (ours, Liger's, torch.compile's), unless
    the user set it: the ptxas that torch.compile's inductor itself switches the whole process to
    the first time it compiles (torch/bin/ptxas, where the torch wheel ships one; on the H200
    machine CUDA 13.0's, where Triton bundles its own). Left to inductor, the kernels built before
    the first torch.compile provider ran (ours, of a run's first cases) got Triton's ptxas and every
    later one torch's: a kernel's binary depended on the cases before it. No time has been seen to
    move with it (docs/evidence/rope_context_check_h200.txt, run 5: Liger's rope forward is faster
    after torch.compile has run with the ptxas pinned as well); the pin makes the toolchain one per
    run and each run records the path in its config ("" where Triton's own ptxas is used)."""
    if "TRITON_PTXAS_PATH" not in os.environ:
        spec = importlib.util.find_spec("torch")
        ptxas = Path(spec.origin).parent / "bin" / "ptxas" if spec and spec.origin else None
        if ptxas is not None and ptxas.is_file() and os.access(ptxas, os.X_OK):
            os.environ["TRITON_PTXAS_PATH"] = str(ptxas)
    return os.environ.get("TRITON_PTXAS_PATH", "")


def fail(message: str, code: int = 2) -> None:
    click.echo(f"kcollect: error: {message}", err=True)
    sys.exit(code)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is visible here; valid: auto, cpu")
    return device


def load_registry(device: str):
    """Imports the kernels; on the CPU, Triton's interpreter must be on before they are defined."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from . import kernels  # noqa: F401  (kcollect.kernels)

    return kernels


def open_store(path: str, read_only: bool = False) -> Store:
    try:
        return Store(path, read_only=read_only)
    except StoreError as e:
        fail(str(e), code=1)


def check_choices(kind: str, given: tuple[str, ...], valid) -> None:
    valid = list(valid)
    for g in given:
        if g not in valid:
            fail(f"unknown {kind} {g!r}; valid: {', '.join(valid)}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Benchmark Triton kernels against their baselines, store results in DuckDB, publish a site."""


@main.command("list")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="Device whose provider availability is shown.")
def list_cmd(device: str) -> None:
    """List kernels, their modes, providers (available here or why not) and grid sizes."""
    device = resolve_device(device)
    registry = load_registry(device)
    for spec in registry.SPECS:
        grids = ", ".join(f"{g}: {len(shapes)} shapes" for g, shapes in spec.grids.items())
        click.echo(f"{spec.name}  ({spec.description})")
        click.echo(f"  modes: {', '.join(spec.modes)} | dtypes: {', '.join(str(d).split('.')[-1] for d in spec.dtypes)}"
                   f" | {grids} | baseline: {spec.baseline}")
        for p in spec.providers:
            reason = p.available(device)
            click.echo(f"  - {p.name:<12} {'available' if reason is None else 'unavailable: ' + reason}")


@main.command()
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
def run(names, all_, quick, modes, providers, dtypes, device, warmup_ms, rep_ms, min_reps, cuda_graph, seed, db,
        commit, commit_time) -> None:
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
    registry = load_registry(device)
    check_choices("kernel", names, registry.names())
    specs = list(registry.SPECS) if all_ else [registry.get(n) for n in dict.fromkeys(names)]
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


@main.command()
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--run", "run_id", default=None, help="Run id (or a prefix). Default: the latest run.")
@click.option("--markdown", is_flag=True, help="Print a Markdown table.")
def summary(db, run_id, markdown) -> None:
    """Print the summary table of one run."""
    from .report import markdown_lines, table_lines

    store = open_store(db, read_only=True)
    runs = store.query("SELECT * FROM runs ORDER BY started_at DESC")
    if run_id:
        runs = [r for r in runs if r["run_id"].startswith(run_id)]
    if not runs:
        fail(f"no run {'matching ' + repr(run_id) if run_id else ''} in {db}", code=1 if not run_id else 2)
    run = runs[0]
    rows = store.query("SELECT * FROM results WHERE run_id = ? ORDER BY seq", [run["run_id"]])
    fmt = markdown_lines if markdown else table_lines
    click.echo("\n".join(fmt(rows, run["copy_gbps"], run["matmul_tflops"])))


@main.command("export")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--out", default=DEFAULT_RUNS, show_default=True, help="Folder that receives one folder per run.")
@click.option("--run", "run_ids", multiple=True, help="Only these run ids (repeatable). Default: every run.")
def export_cmd(db, out, run_ids) -> None:
    """Write runs as Parquet folders (the history kept in git); runs already exported are skipped."""
    from .history import export_runs

    store = open_store(db, read_only=True)
    known = store.run_ids()
    full_ids = []
    for rid in run_ids:
        match = [k for k in known if k.startswith(rid)]
        if len(match) != 1:
            fail(f"run {rid!r} matches {len(match)} runs in {db}")
        full_ids.append(match[0])
    try:
        written = export_runs(store, Path(out), full_ids or None)
    except OSError as e:
        fail(f"cannot write to {out}: {e.strerror or e}", code=1)
    for w in written:
        click.echo(f"wrote {w}")
    click.echo(f"{len(written)} run(s) exported to {out}", err=True)


@main.command("import")
@click.argument("paths", nargs=-1)
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to fold the runs into.")
def import_cmd(paths, db) -> None:
    """Fold run folders, folders of them (default: data/runs) or other kcollect DuckDB files into the
    store. Idempotent: runs already there are skipped."""
    from .history import import_path

    store = open_store(db)
    added = skipped = 0
    try:
        for p in paths or (DEFAULT_RUNS,):
            a, s = import_path(store, Path(p))
            added, skipped = added + a, skipped + s
    except StoreError as e:
        fail(str(e), code=1)
    finally:
        store.close()
    click.echo(f"{added} run(s) imported, {skipped} already present, into {db}")


# build-site lives in site.py (it reads the store only); registered here so `kcollect` lists it.
from .site import build_site_cmd  # noqa: E402

main.add_command(build_site_cmd)


# compare lives in compare.py (it reads the store only); registered here so `kcollect` lists it.
from .compare import compare_cmd  # noqa: E402

main.add_command(compare_cmd)


if __name__ == "__main__":
    main()
