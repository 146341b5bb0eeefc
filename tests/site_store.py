"""A small real kcollect store for the site tests (schema 2, created by the Store API).

Two GPU groups and the CPU interpreter; a memory-bound kernel (alpha) and a compute-bound one
(beta). Planted on the H100 (machine h100-a; the H200's runs record no machine, like old runs):
- a 25% slowdown of our kernel from commit 6 on (STEP_SERIES): an open regression;
- a 30% slowdown of our kernel over commits 3-5 that the next commit undoes (RECOVERED);
- a provider timed with CUDA events up to commit 4 and with CUDA graphs after (METHOD): 40%
  "faster", a change of timing method, never a flag;
- a torch upgrade at commit 9 (environment 2.11 -> 2.12, liger's version recorded from then on)
  that makes eager torch 12% slower on beta (ENV_SERIES): a change of environment, never a flag;
- liger timed with CUDA events throughout (graphs cannot capture it): its speedups are not like
  for like with the graph-timed baseline;
- a failing, an erroring and an unstable provider in the latest runs, an A/A rerun of the last
  commit, commit subjects, authors and URLs, tuned configs and peak memory on our rows;
- a CPU series with a 50% step (which must raise no flag: CPU timings are not analysed);
- one lab run (grid 'lab') with two variants of our kernel.
Distinctive numbers let the tests find where a value ended up.
"""
from __future__ import annotations

import atexit
import json
import math
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import astuple, fields, replace
from datetime import datetime, timedelta
from pathlib import Path

from kcollect.store import RESULT_COLUMNS, Environment, Run, Store

H100 = Environment(env_id="env-h100", device_kind="cuda", gpu_name="NVIDIA H100 80GB HBM3", sm_count=132,
                   gpu_mem_bytes=80 * 2**30, driver="580.65.06", cuda="12.8", torch="2.11.0", triton="3.6.0",
                   python="3.11.7", interpreted=False)
H100_NEW = replace(H100, env_id="env-h100-t212", torch="2.12.0", peers=json.dumps({"liger-kernel": "0.6.1"}))
H200 = Environment(env_id="env-h200", device_kind="cuda", gpu_name="NVIDIA H200", sm_count=132,
                   gpu_mem_bytes=141 * 2**30, driver="580.65.06", cuda="12.8", torch="2.11.0", triton="3.6.0",
                   python="3.11.7", interpreted=False)
CPU = Environment(env_id="env-cpu", device_kind="cpu", gpu_name=None, sm_count=None, gpu_mem_bytes=None,
                  driver=None, cuda=None, torch="2.13.0+cpu", triton="3.6.0", python="3.11.7", interpreted=True)
MACHINE = "h100-a"

KERNELS = {
    "alpha": dict(bound="memory", modes=("fwd", "bwd"), dtypes=("bfloat16",),
                  shapes=("M=64,N=1024", "M=37,N=1000", "M=4096,N=14336"), providers=("triton", "torch", "compile", "liger")),
    "beta": dict(bound="compute", modes=("fwd",), dtypes=("bfloat16", "float16"), tokens=True,
                 shapes=("M=1024,N=1024,K=1024", "M=4096,N=4096,K=4096"), providers=("triton", "torch", "compile")),
}
SPEED = {"triton": 2.0, "torch": 1.0, "compile": 1.25, "liger": 1.6}  # over torch, the baseline
COMMITS = 12
H100_NAME = H100.gpu_name
STEP_AT, STEP = 6, 1.25
STEP_SERIES = ("alpha", "fwd", "triton", "M=4096,N=14336", "bfloat16", H100_NAME)
RECOVERED = ("alpha", "bwd", "triton", "M=4096,N=14336", "bfloat16", H100_NAME)
RECOVERED_AT, RECOVERED_UNTIL = 3, 6  # 30% slower at commits 3, 4, 5
METHOD = ("beta", "fwd", "compile", "M=1024,N=1024,K=1024", "float16", H100_NAME)
METHOD_UNTIL = 5  # cuda-events before this commit (and 1.6x the time), cuda-graph from it on
ENV_AT = 9  # the H100's torch upgrade
ENV_SERIES = ("beta", "torch")  # eager torch 12% slower on beta after it
FAILED = ("alpha", "fwd", "compile", "M=37,N=1000")  # fails the gate in the last commit's runs
FAILED_MS = 0.0424242  # a time left on the failed row: it must never reach the site
ERRORED = ("alpha", "bwd", "liger", "M=64,N=1024")
UNSTABLE = ("beta", "fwd", "triton", "M=4096,N=4096,K=4096", "float16")  # disturbed in the last runs
UNSTABLE_MS = 0.0313131
CPU_MS = 123.456  # CPU-interpreter times are around this: far from every GPU time
T0 = datetime(2026, 3, 1, 12, 0)
URL = "https://github.com/example/kcollect/commit/"
CONFIG = {"block": {"BLOCK": 1024, "num_warps": 4}}


def sha(i: int, salt: str = "") -> str:
    return f"{i:04d}{salt}".ljust(40, "c")


def subject(i: int) -> str:
    return "Unroll alpha's inner loop twice" if i == STEP_AT else f"Commit number {i} of the test history"


def dims_of(shape: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in shape.split(","))}


def _ms(env: Environment, key: tuple, p: str, s_i: int, mode: str, commit: int, rerun: int, seq: int) -> float:
    base = 0.01 * (s_i + 1) * (2 if mode == "bwd" else 1)
    # deterministic 0.3% wiggle, different per commit, run and series
    wiggle = 1 + 0.003 * math.sin(commit * 7.1 + rerun * 3.3 + seq * 1.7)
    if env is CPU:
        return CPU_MS * (s_i + 1) / SPEED.get(p, 1.0) * wiggle * (1.5 if p == "triton" and commit >= 4 else 1)
    ms = base / SPEED.get(p, 1.0) * wiggle
    on_h100 = env.gpu_name == H100_NAME
    if key == STEP_SERIES and commit >= STEP_AT:
        ms *= STEP
    if key == RECOVERED and RECOVERED_AT <= commit < RECOVERED_UNTIL:
        ms *= 1.3
    if key == METHOD and commit < METHOD_UNTIL:
        ms *= 1.6
    if on_h100 and commit >= ENV_AT and (key[0], key[2]) == ENV_SERIES:
        ms *= 1.12
    return ms


def _rows(run_id: str, env: Environment, kernels: dict, commit: int, rerun: int, last: bool) -> list[dict]:
    rows, seq = [], 0
    ceiling = 3000.0 if env.gpu_name == H100_NAME else 4300.0
    for kernel, k in kernels.items():
        for s_i, shape in enumerate(k["shapes"]):
            for dtype in k["dtypes"]:
                for mode in k["modes"]:
                    for p in k["providers"]:
                        seq += 1
                        key = (kernel, mode, p, shape, dtype, env.gpu_name)
                        ms = _ms(env, key, p, s_i, mode, commit, rerun, seq)
                        nbytes = int(0.01 * (s_i + 1) * 1e6 * ceiling * 0.5)  # torch at half the ceiling
                        # liger cannot be captured in a CUDA graph: always timed with events
                        timing = "cpu-clock" if env is CPU else (
                            "cuda-events" if (key == METHOD and commit < METHOD_UNTIL) or p == "liger" else "cuda-graph")
                        row = dict(run_id=run_id, kernel=kernel, mode=mode, provider=p, shape=shape,
                                   ours=p == "triton", package="liger-kernel" if p == "liger" else "",
                                   dims=json.dumps(dims_of(shape)) if "=" in shape else "{}", dtype=dtype,
                                   baseline="torch", bound=k["bound"], status="ok", error=None, rel_err=2e-3,
                                   tolerance=1.6e-2, timing=timing, median_ms=ms, p20_ms=ms * 0.995, p80_ms=ms * 1.01,
                                   mean_ms=ms, std_ms=ms * 0.01, min_ms=ms * 0.99, p99_ms=ms * 1.05, max_ms=ms * 1.25, reps=100 + seq,
                                   peak_mem_bytes=(s_i + 1) * 3 * 2**20 if env is not CPU else None,
                                   config=json.dumps(CONFIG) if p == "triton" else None,
                                   bytes=nbytes, flops=nbytes * 50.0 if k["bound"] == "compute" else float(nbytes), seq=seq,
                                   tokens=dims_of(shape)["M"] if k.get("tokens") else None)
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
                        if last_gpu and (kernel, mode, p, shape, dtype) == UNSTABLE:
                            row.update(status="unstable", median_ms=UNSTABLE_MS,
                                       error="disturbed while timed: recheck 40% slower than the measurement")
                        rows.append(row)
    return rows


def _insert(store: Store, table: str, cols: list[str], rows: list[list]) -> None:
    """One multi-row INSERT: the Store API's executemany and checkpoint per call cost seconds per
    run on a busy machine, and the fixture writes dozens of runs."""
    one = "(" + ", ".join("?" * len(cols)) + ")"
    store.con.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES " + ", ".join([one] * len(rows)),
                      [v for row in rows for v in row])


_CACHE: dict[str, Path] = {}


def build_store(path: Path, kernels: dict | None = None, cpu: bool = True, second_gpu: bool = True,
                commits: int = COMMITS, lab: bool = True) -> Path:
    """Writes the store at path and returns path. `kernels` replaces KERNELS (e.g. hostile names).
    Each variant is written once per test session and copied after that."""
    key = repr((kernels, cpu, second_gpu, commits, lab))
    if key not in _CACHE:
        folder = Path(tempfile.mkdtemp(prefix="kcollect-site-store-"))
        atexit.register(shutil.rmtree, folder, True)
        _CACHE[key] = _write(folder / "k.duckdb", KERNELS if kernels is None else kernels, cpu, second_gpu,
                             commits, lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_CACHE[key], path)
    return path


def _run(env: Environment, commit: int, rerun: int, grid: str = "full") -> Run:
    started = T0 + timedelta(days=commit, hours=1 + rerun)
    on_h100 = env.gpu_name == H100_NAME
    run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{env.env_id}/{commit}/{rerun}/{grid}"))
    return Run(run_id=run_id, env_id=env.env_id,
               started_at=started, finished_at=None, status="unfinished", git_commit=sha(commit),
               commit_time=T0 + timedelta(days=commit), git_dirty=False, grid="quick" if env is CPU else grid,
               copy_gbps=8.4 if env is CPU else (3000.0 if on_h100 else 4300.0),
               matmul_tflops=0.07 if env is CPU else 700.0, config="{}", machine=MACHINE if on_h100 else None,
               commit_subject=subject(commit), commit_author="Ada Lovelace", commit_url=URL + sha(commit))


def _write(path: Path, kernels: dict, cpu: bool, second_gpu: bool, commits: int, lab: bool) -> Path:
    envs, runs, results = {}, [], []
    h100_runs = [(i, 0) for i in range(commits)] + [(commits - 1, 1)]
    plans = [(lambda i: H100_NEW if i >= ENV_AT else H100, h100_runs)]
    if second_gpu:
        plans.append((lambda i: H200, [(i, 0) for i in range(max(commits - 4, 0), commits)]))
    if cpu:
        plans.append((lambda i: CPU, [(i, 0) for i in range(8)]))
    for env_of, plan in plans:
        for commit, rerun in plan:
            env = env_of(commit)
            envs[env.env_id] = env
            run = _run(env, commit, rerun)
            runs.append(replace(run, status="finished", finished_at=run.started_at + timedelta(minutes=5)))
            results += _rows(run.run_id, env, kernels, commit, rerun, last=commit == commits - 1)
    if lab:
        run = _run(H100, commits - 1, 2, grid="lab")
        runs.append(replace(run, status="finished", finished_at=run.started_at + timedelta(minutes=1),
                            config=json.dumps({"argv": ["alpha"], "note": "does a wider block help alpha?"})))
        results += _lab_rows(run.run_id)
    with Store(path) as store:
        with store.transaction():
            _insert(store, "environments", [f.name for f in fields(Environment)], [astuple(e) for e in envs.values()])
            _insert(store, "runs", [f.name for f in fields(Run)], [astuple(r) for r in runs])
            cols = list(RESULT_COLUMNS)
            _insert(store, "results", cols, [[row.get(c) for c in cols] for row in results])
        store.con.execute("CHECKPOINT")
    return path


# As lab/ab.py writes them: the heuristic's own pick and a forced config, against the default.
LAB_VARIANTS = {"triton[default]": (1.0, 1024), "triton[wide]": (0.8, 2048)}  # time factor, BLOCK


def _lab_rows(run_id: str) -> list[dict]:
    rows = []
    for seq, (shape, (variant, (factor, block))) in enumerate(
            (s, v) for s in KERNELS["alpha"]["shapes"] for v in LAB_VARIANTS.items()):
        ms = 0.0077 * factor
        rows.append(dict(run_id=run_id, kernel="alpha", mode="fwd", provider=variant, shape=shape, ours=True,
                         dims=json.dumps(dims_of(shape)), dtype="bfloat16", baseline="triton[default]",
                         bound="memory", status="ok", rel_err=1e-3, tolerance=1.6e-2, timing="cuda-graph",
                         median_ms=ms, p20_ms=ms * 0.99, p80_ms=ms * 1.01, reps=200, peak_mem_bytes=2**20, seq=seq,
                         config=json.dumps({"block": {"BLOCK": block}}), bytes=10**6, flops=1e6))
    return rows


HISTORY = Path(__file__).resolve().parent.parent / "data" / "runs"  # the committed history


def history_store(path: Path) -> Path:
    """A store holding the committed history (data/runs), imported once per test session."""
    from kcollect.history import import_path

    if "history" not in _CACHE:
        folder = Path(tempfile.mkdtemp(prefix="kcollect-site-history-"))
        atexit.register(shutil.rmtree, folder, True)
        with Store(folder / "k.duckdb") as store:
            import_path(store, HISTORY)
        _CACHE["history"] = folder / "k.duckdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_CACHE["history"], path)
    return path


def commits_missing(commits) -> int:
    """How many of `commits` this checkout's git lacks (a shallow clone): the tests that read whose
    code changed from git skip then."""
    wanted = sorted(set(commits) - {None})
    out = subprocess.run(["git", "-C", str(HISTORY.parent.parent), "cat-file", "--batch-check"], capture_output=True,
                         text=True, input="".join(f"{c}^{{commit}}\n" for c in wanted))
    return out.stdout.count(" missing") if out.returncode == 0 else len(wanted)


def data_file(path: Path):
    """The payload of one of the site's data files (`KC.put("name", payload);`)."""
    text = path.read_text()
    head = f"KC.put({json.dumps(path.relative_to(path.parent.parent).as_posix())},"
    assert text.startswith(head) and text.endswith(");\n"), path
    payload = json.loads(text[len(head):-3])
    for row in payload.get("rows", []) if "enc" in payload else ():  # unpacked as site.js does
        for c in payload["enc"]:
            if row[c] is not None:
                row[c] = payload["strings"][row[c]]
    for shapes in payload["series"].values() if "bands" in payload else ():  # a trend file's band edges
        for s in shapes.values():
            s[2], s[3] = ([m * (1 + d / payload["bands"]) for d, m in zip(s[e], s[1])] for e in (2, 3))
    return payload


def table_rows(payload: dict) -> list[dict]:
    """A data file's table ({cols, rows}) as one dict per row."""
    return [dict(zip(payload["cols"], row)) for row in payload["rows"]]


def part_rows(site: Path, kernel: str, gid: str, mode: str, dtype: str) -> tuple[dict, list[dict]]:
    """(the part's data, its rows as dicts) of one kernel's (GPU, mode, dtype) table."""
    html = (site / "kernels" / f"{kernel}.html").read_text()
    files = re.findall(r'data-mode="([^"]+)" data-dtype="([^"]+)" id="[^"]+" data-part="([^"]+)"', html)
    for m, d, rel in files:
        if (m, d) == (mode, dtype) and f".{gid}." in rel:
            payload = data_file(site / rel)
            return payload, table_rows(payload)
    raise KeyError((kernel, gid, mode, dtype, files))


def flag_rows(site: Path) -> list[dict]:
    return table_rows(data_file(site / "data" / "flags.js"))
