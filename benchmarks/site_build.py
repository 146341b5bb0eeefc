"""Size and speed benchmark of `kcollect build-site`: build time, largest page.

Writes a synthetic history into a fresh store: COMMITS commits x GPUS GPUs x the full grid of every
kernel in the registry (every mode, bench dtype and provider of each), plus one repeated run of the
last commit per GPU, a torch upgrade two thirds of the way, a few series whose timing method
changes, and one lab run per GPU; then builds the site from it, in-process and through the CLI, and
reports the build times and the largest output file other than the shared plotly.min.js.

The numbers in that store are invented by construction (a roofline model with noise, a few planted
steps, failing and erroring series): they exist to load the site builder and must never be
published. `--kernel-copies N` repeats every registry kernel N times under new names, to see how the
build scales with a larger registry.

    python benchmarks/site_build.py                      # 200 commits x 3 GPUs, the registry
    python benchmarks/site_build.py --kernel-copies 3    # the same with three times the kernels
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # the registry defines Triton kernels; no GPU needed

from kcollect.registry import load as load_registry  # noqa: E402
from kcollect.site import build_site  # noqa: E402
from kcollect.spec import DTYPE_NAMES  # noqa: E402
from kcollect.store import RESULT_COLUMNS, RUN_COLUMNS, Environment, Store  # noqa: E402

SPECS = load_registry(plugins=False).specs

# name, SMs, memory, copy GB/s, bf16 matmul TFLOP/s (ceilings of the order each GPU measures)
GPUS = (("NVIDIA H100 80GB HBM3", 132, 80, 3000.0, 720.0), ("NVIDIA H200", 132, 141, 4300.0, 740.0),
        ("NVIDIA A100-SXM4-80GB", 108, 80, 1750.0, 290.0), ("NVIDIA L40S", 142, 48, 780.0, 330.0))
EFFICIENCY = {"triton": 0.88, "liger": 0.80, "compile": 0.72, "torch": 0.50}  # fraction of the ceiling


def cases(copies: int) -> list[dict]:
    """Every (kernel, shape, dtype, mode, provider) of the full grids, with its bytes and flops."""
    out = []
    for k in range(copies):
        for spec in SPECS:
            name = spec.name if k == 0 else f"{spec.name}_copy{k}"
            for seq_shape, shape in enumerate(spec.grids["full"]):
                for dtype in spec.bench_dtypes:
                    for mode in spec.modes:
                        for p in spec.provider_names:
                            out.append(dict(kernel=name, mode=mode, provider=p, shape=shape.label,
                                            dims=json.dumps(dict(shape.dims)), dtype=DTYPE_NAMES[dtype],
                                            baseline=spec.baseline, bound=spec.bound,
                                            bytes=int(spec.bytes_moved(shape.dims, dtype, mode)),
                                            flops=float(spec.flops(shape.dims, mode)),
                                            tolerance=float(spec.tolerance[dtype])))
    return out


def _environment(name: str, sms: int, mem: int, torch: str) -> Environment:
    return Environment(env_id=uuid.uuid5(uuid.NAMESPACE_DNS, name + torch).hex[:16], device_kind="cuda",
                       gpu_name=name, sm_count=sms, gpu_mem_bytes=mem * 2**30, driver="580.65.06", cuda="12.8",
                       torch=torch, triton="3.6.0", python="3.11.7", interpreted=False,
                       peers=json.dumps({"liger-kernel": "0.6.1"}))


def _series(grid: list[dict], commits: int, rng: random.Random) -> list[dict]:
    """Per series: a fixed offset, maybe a planted step, maybe a failing or erroring provider, and
    for a few a timing method that changes (graph capture fixed at some commit)."""
    series = []
    for c in grid:
        # About 3% of series get a step (slower or faster, 7-12%) somewhere after the first tenth.
        step_at = rng.randrange(commits // 10, commits - 10) if rng.random() < 0.03 else None
        series.append({"level": math.exp(rng.gauss(0, 0.08)), "step_at": step_at,
                       "step": rng.uniform(1.07, 1.12) ** rng.choice((1, -1)),
                       "events_until": commits // 3 if rng.random() < 0.02 else 0,
                       "bad": "failed" if rng.random() < 0.004 else "error" if rng.random() < 0.002 else None})
    return series


def _result(c: dict, s: dict, i: int, copy_gbps: float, mm: float, rng: random.Random) -> dict:
    row = dict(c)
    if s["bad"] == "failed":
        row.update(status="failed", rel_err=c["tolerance"] * 3.1,
                   error=f"relative error {c['tolerance'] * 3.1:.3g} over the tolerance")
    elif s["bad"] == "error":
        row.update(status="error", error="OutOfMemoryError: CUDA out of memory (synthetic)")
    else:
        ideal = max(c["bytes"] / (copy_gbps * 1e6), c["flops"] / (mm * 1e9))
        t = (ideal / EFFICIENCY.get(c["provider"], 0.65) + 0.004) * s["level"]
        if s["step_at"] is not None and i >= s["step_at"]:
            t *= s["step"]
        events = i < s["events_until"]
        t *= math.exp(rng.gauss(0, 0.01)) * (1.3 if events else 1)
        row.update(status="ok", rel_err=c["tolerance"] / 4, timing="cuda-events" if events else "cuda-graph",
                   median_ms=t, p20_ms=t * (1 - 0.006 * rng.random()), p80_ms=t * (1 + 0.012 * rng.random()),
                   mean_ms=t, std_ms=t * 0.01, min_ms=t * 0.99, reps=100,
                   peak_mem_bytes=int(c["bytes"] * (1.5 if c["provider"] == "torch" else 0.1)),
                   config=json.dumps({"main": {"BLOCK": 1024, "num_warps": 4}}) if c["provider"] == "triton" else None)
    return row


def generate(db: Path, commits: int, gpus: int, copies: int, seed: int = 0) -> int:
    """The history: every GPU measures every commit (and reruns the last one); torch is upgraded
    two thirds of the way through; each GPU also has one lab run (two configs of one kernel)."""
    rng = random.Random(seed)
    grid = cases(copies)
    store = Store(db)
    t0 = datetime(2026, 1, 1)
    runs_csv, results_csv = db.with_suffix(".runs.csv"), db.with_suffix(".results.csv")
    shas = [f"{rng.getrandbits(160):040x}" for _ in range(commits)]
    upgrade = 2 * commits // 3
    n_rows = 0
    with open(runs_csv, "w", newline="") as rf, open(results_csv, "w", newline="") as xf:
        runs_w, res_w = csv.writer(rf), csv.writer(xf)
        for name, sms, mem, copy_gbps, mm in GPUS[:gpus]:
            envs = [_environment(name, sms, mem, torch) for torch in ("2.11.0+cu128", "2.12.0+cu128")]
            for env in envs:
                store.add_environment(env)
            series = _series(grid, commits, rng)
            plan = [(i, 0, "full") for i in range(commits)] + [(commits - 1, 1, "full"), (commits - 1, 2, "lab")]
            for i, rerun, grid_name in plan:
                run_id = str(uuid.UUID(int=rng.getrandbits(128)))
                commit = shas[i]  # the same commits on every GPU, as CI measures them
                started = t0 + timedelta(hours=6 * i + rerun)
                ceil_noise = math.exp(rng.gauss(0, 0.005))
                run = dict(run_id=run_id, env_id=envs[i >= upgrade].env_id, started_at=started,
                           finished_at=started + timedelta(minutes=8), status="finished", git_commit=commit,
                           commit_time=t0 + timedelta(hours=6 * i - 1), git_dirty=False, grid=grid_name,
                           copy_gbps=copy_gbps * ceil_noise, matmul_tflops=mm * ceil_noise, config="{}",
                           machine=f"ci-{name.split()[1].lower()}", commit_subject=f"Synthetic commit {i}",
                           commit_author="Bench Mark", commit_url=f"https://example.invalid/commit/{commit}")
                runs_w.writerow([run.get(col) for col in RUN_COLUMNS])
                if grid_name == "lab":
                    for seq, c in enumerate(c for c in grid if c["kernel"] == grid[0]["kernel"] and c["provider"] == "triton"):
                        for label, factor in (("a", 1.0), ("b", 0.95)):
                            row = _result(dict(c, provider=f"triton[{label}]"), series[0] | {"bad": None}, i,
                                          copy_gbps / factor, mm / factor, rng)
                            res_w.writerow([dict(row, run_id=run_id, seq=seq).get(col) for col in RESULT_COLUMNS])
                    continue
                for seq, (c, s) in enumerate(zip(grid, series)):
                    row = dict(_result(c, s, i, copy_gbps, mm, rng), run_id=run_id, seq=seq)
                    res_w.writerow([row.get(col) for col in RESULT_COLUMNS])
                    n_rows += 1
    con = store.con
    con.execute(f"COPY runs ({', '.join(RUN_COLUMNS)}) FROM '{runs_csv}' (FORMAT csv, HEADER false)")
    con.execute(f"COPY results ({', '.join(RESULT_COLUMNS)}) FROM '{results_csv}' (FORMAT csv, HEADER false)")
    con.execute("CHECKPOINT")
    store.close()
    runs_csv.unlink()
    results_csv.unlink()
    return n_rows


def sizes(out: Path) -> list[tuple[int, str]]:
    return sorted(((p.stat().st_size, str(p.relative_to(out))) for p in out.rglob("*") if p.is_file()),
                  reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=3, choices=range(1, len(GPUS) + 1))
    ap.add_argument("--kernel-copies", type=int, default=1, help="repeat the registry this many times")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kcollect-site-bench"))
    ap.add_argument("--repeat", type=int, default=3, help="timed builds (the best and all are reported)")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    db, out = args.work / "bench.duckdb", args.work / "site"

    t = time.perf_counter()
    n_rows = generate(db, args.commits, args.gpus, args.kernel_copies)
    gen_s = time.perf_counter() - t
    kernels = [s.name for s in SPECS]
    print(f"registry: {len(kernels)} kernels ({', '.join(kernels)}) x {args.kernel_copies} cop"
          f"{'y' if args.kernel_copies == 1 else 'ies'}; {args.commits} commits x {args.gpus} GPUs "
          f"(+1 rerun each) = {n_rows:,} rows; store {db.stat().st_size / 2**20:.1f} MiB, generated in {gen_s:.1f} s")

    inproc, cpu = [], []
    for _ in range(args.repeat):
        c = time.process_time()
        r = build_site(db, out)
        inproc.append(r.seconds)
        cpu.append(time.process_time() - c)  # this process's CPU time: other load on the machine aside
    cli = []
    kcollect = Path(sys.executable).with_name("kcollect")
    for _ in range(args.repeat):
        t = time.perf_counter()
        subprocess.run([str(kcollect), "build-site", "--db", str(db), "--out", str(out), "--data", ""], check=True,
                       stdout=subprocess.DEVNULL)
        cli.append(time.perf_counter() - t)
    files = sizes(out)
    pages = [(s, p) for s, p in files if p != "assets/plotly.min.js"]
    html = [(s, p) for s, p in files if p.endswith(".html")]
    print(f"build in-process: best {min(inproc):.2f} s wall (runs: {', '.join(f'{x:.2f}' for x in inproc)}; "
          f"CPU {', '.join(f'{x:.2f}' for x in cpu)} s); machine load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"build via `kcollect build-site` (process start and imports included): best {min(cli):.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in cli)})")
    print(f"output: {len(files)} files, {sum(s for s, _ in files) / 2**20:.1f} MiB in all")
    print(f"largest file other than plotly.min.js: {pages[0][1]} {pages[0][0] / 1024:.0f} KiB")
    print(f"largest HTML page: {html[0][1]} {html[0][0] / 1024:.0f} KiB")
    print("ten largest (plotly.min.js excluded):")
    for s, p in pages[:10]:
        print(f"  {s / 1024:8.0f} KiB  {p}")
    over = [p for s, p in pages if s > 2**20]
    print("every file other than plotly.min.js is under 1 MiB" if not over else f"OVER 1 MiB: {', '.join(over)}")


if __name__ == "__main__":
    main()
