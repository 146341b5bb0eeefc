"""A small real kcollect store for the site tests, written through the Store API.

Two GPU groups and the CPU interpreter; a memory-bound kernel (alpha) and a compute-bound one
(beta); a planted 25% slowdown on one GPU series, a failing and an erroring provider in the latest
runs, an A/A rerun of the last commit, and a CPU series with a 50% step (which must raise no flag:
CPU timings are not analysed). Distinctive numbers let the tests find where a value ended up.
"""
from __future__ import annotations

import atexit
import json
import math
import shutil
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from kcollect.store import Environment, Run, Store

H100 = Environment(env_id="env-h100", device_kind="cuda", gpu_name="NVIDIA H100 80GB HBM3", sm_count=132,
                   gpu_mem_bytes=80 * 2**30, driver="580.65.06", cuda="12.8", torch="2.11.0", triton="3.6.0",
                   python="3.11.7", interpreted=False)
H200 = Environment(env_id="env-h200", device_kind="cuda", gpu_name="NVIDIA H200", sm_count=132,
                   gpu_mem_bytes=141 * 2**30, driver="580.65.06", cuda="12.8", torch="2.11.0", triton="3.6.0",
                   python="3.11.7", interpreted=False)
CPU = Environment(env_id="env-cpu", device_kind="cpu", gpu_name=None, sm_count=None, gpu_mem_bytes=None,
                  driver=None, cuda=None, torch="2.13.0+cpu", triton="3.6.0", python="3.11.7", interpreted=True)

KERNELS = {
    "alpha": dict(bound="memory", modes=("fwd", "bwd"), dtypes=("bfloat16",),
                  shapes=("64x1024", "37x1000", "4096x14336"), providers=("triton", "torch", "compile", "liger")),
    "beta": dict(bound="compute", modes=("fwd",), dtypes=("bfloat16", "float16"),
                 shapes=("1024x1024x1024", "4096x4096x4096"), providers=("triton", "torch")),
}
SPEED = {"triton": 2.0, "torch": 1.0, "compile": 1.25, "liger": 1.6}  # over torch, the baseline
COMMITS = 12
STEP_AT, STEP = 6, 1.25  # H100 alpha fwd triton 4096x14336 is 25% slower from commit 6 on
STEP_SERIES = ("alpha", "fwd", "triton", "4096x14336", "bfloat16", "NVIDIA H100 80GB HBM3")
FAILED = ("alpha", "fwd", "compile", "37x1000")  # fails the gate in the last commit's runs
FAILED_MS = 0.0424242  # a time left on the failed row: it must never reach the site
ERRORED = ("alpha", "bwd", "liger", "64x1024")
CPU_MS = 123.456  # CPU-interpreter times are around this: far from every GPU time
T0 = datetime(2026, 3, 1, 12, 0)


def sha(i: int, salt: str = "") -> str:
    return f"{i:04d}{salt}".ljust(40, "c")


def _rows(run_id: str, env: Environment, kernels: dict, commit: int, rerun: int, last: bool) -> list[dict]:
    rows, seq = [], 0
    ceiling = 3000.0 if env is H100 else 4300.0
    for kernel, k in kernels.items():
        for s_i, shape in enumerate(k["shapes"]):
            for dtype in k["dtypes"]:
                for mode in k["modes"]:
                    for p in k["providers"]:
                        seq += 1
                        base = 0.01 * (s_i + 1) * (2 if mode == "bwd" else 1)
                        # deterministic 0.3% wiggle, different per commit, run and series
                        wiggle = 1 + 0.003 * math.sin(commit * 7.1 + rerun * 3.3 + seq * 1.7)
                        ms = base / SPEED.get(p, 1.0) * wiggle
                        if env is CPU:
                            ms = CPU_MS * (s_i + 1) / SPEED.get(p, 1.0) * wiggle
                            if p == "triton" and commit >= 4:
                                ms *= 1.5
                        key = (kernel, mode, p, shape, dtype, env.gpu_name)
                        if key == STEP_SERIES and commit >= STEP_AT:
                            ms *= STEP
                        nbytes = int(0.01 * (s_i + 1) * 1e6 * ceiling * 0.5)  # torch at half the ceiling
                        row = dict(run_id=run_id, kernel=kernel, mode=mode, provider=p, shape=shape,
                                   dims=json.dumps(dict(zip("MNK", shape.split("x")))), dtype=dtype,
                                   baseline="torch", bound=k["bound"], status="ok", error=None, rel_err=2e-3,
                                   tolerance=1.6e-2, timing="cpu-clock" if env is CPU else "cuda-events",
                                   median_ms=ms, p20_ms=ms * 0.995, p80_ms=ms * 1.01, mean_ms=ms, std_ms=ms * 0.01,
                                   min_ms=ms * 0.99, reps=100, peak_mem_bytes=None, bytes=nbytes,
                                   flops=nbytes * 50.0 if k["bound"] == "compute" else float(nbytes), seq=seq)
                        if env is CPU and p == "liger":
                            row.update(status="unavailable", error="liger_kernel needs a CUDA GPU", median_ms=None,
                                       p20_ms=None, p80_ms=None, rel_err=None, timing=None)
                        last_gpu = last and env is not CPU
                        if last_gpu and (kernel, mode, p, shape) == FAILED:
                            row.update(status="failed", rel_err=0.05, median_ms=FAILED_MS,
                                       error="relative error 0.05 over the tolerance 0.016")
                        if last_gpu and (kernel, mode, p, shape) == ERRORED:
                            row.update(status="error", error="OutOfMemoryError: CUDA out of memory", median_ms=None,
                                       p20_ms=None, p80_ms=None, rel_err=None)
                        rows.append(row)
    return rows


_CACHE: dict[str, Path] = {}


def build_store(path: Path, kernels: dict | None = None, cpu: bool = True, second_gpu: bool = True,
                commits: int = COMMITS) -> Path:
    """Writes the store at path and returns path. `kernels` replaces KERNELS (e.g. hostile names).
    Writing row by row through the Store API takes seconds, so each variant is written once per
    test session and copied after that."""
    key = repr((kernels, cpu, second_gpu, commits))
    if key not in _CACHE:
        folder = Path(tempfile.mkdtemp(prefix="kcollect-site-store-"))
        atexit.register(shutil.rmtree, folder, True)
        _CACHE[key] = _write(folder / "k.duckdb", KERNELS if kernels is None else kernels, cpu, second_gpu, commits)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_CACHE[key], path)
    return path


def _write(path: Path, kernels: dict, cpu: bool, second_gpu: bool, commits: int) -> Path:
    with Store(path) as store:
        plans = [(H100, [(i, 0) for i in range(commits)] + [(commits - 1, 1)])]
        if second_gpu:
            plans.append((H200, [(i, 0) for i in range(max(commits - 4, 0), commits)]))
        if cpu:
            plans.append((CPU, [(i, 0) for i in range(8)]))
        for env, runs in plans:
            store.add_environment(env)
            for commit, rerun in runs:
                run_id = f"{env.env_id}-{commit:03d}-{rerun}".ljust(36, "0")
                started = T0 + timedelta(days=commit, hours=1 + rerun)
                store.start_run(Run(run_id=run_id, env_id=env.env_id, started_at=started, finished_at=None,
                                    status="unfinished", git_commit=sha(commit), commit_time=T0 + timedelta(days=commit),
                                    git_dirty=False, grid="quick" if env is CPU else "full",
                                    copy_gbps=8.4 if env is CPU else (3000.0 if env is H100 else 4300.0),
                                    matmul_tflops=0.07 if env is CPU else 700.0, config="{}"))
                store.add_results(_rows(run_id, env, kernels, commit, rerun, last=commit == commits - 1))
                store.finish_run(run_id, "finished", started + timedelta(minutes=5))
    return path
