"""Small real kcollect stores for the compare, confirm and regression tests, written through Store."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta

from kcollect.store import Environment, Run, Store

T0 = datetime(2026, 11, 1)
GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "cpu": None}
PACKAGES = {"liger": "liger-kernel", "quack": "quack-kernels"}  # the peers' distributions (Provider.package)


def env(key, torch="2.11.0", peers=None):
    return Environment(env_id=f"{key}-{torch}-{peers}", device_kind="cpu" if key == "cpu" else "cuda",
                       gpu_name=GPUS[key], sm_count=None, gpu_mem_bytes=None, driver=None, cuda=None, torch=torch,
                       triton="3.6.0", python="3.11", interpreted=key == "cpu", peers=peers)


def result(run_id, provider, ms, status="ok", kernel="swiglu", spread=0.01, timing=None, shape="M=4096,N=14336",
           mode="fwd", dtype="bfloat16", ours=None, recheck=None):
    ok = status in ("ok", "unstable")
    ours = provider == "triton" if ours is None else ours  # the test kernels' own provider is 'triton'
    return dict(run_id=run_id, kernel=kernel, mode=mode, provider=provider, shape=shape, dims="{}",
                ours=ours, package="" if ours or provider in ("torch", "compile") else PACKAGES.get(provider, provider),
                recheck_ms=recheck,
                dtype=dtype, baseline="torch", bound="memory", status=status,
                error=None if status == "ok" else f"{status}: the reason",
                timing=timing or ("cpu-clock" if run_id.endswith("cpu") else "cuda-graph"),
                median_ms=ms if ok else None, p20_ms=ms * (1 - spread) if ok else None,
                p80_ms=ms * (1 + spread) if ok else None, reps=100, bytes=1 << 30, flops=0.0, seq=1)


def ok(provider, ms, **kw):
    return dict(provider=provider, ms=ms, **kw)


def make_db(path, runs, machine=None):
    """runs: [(gpu key, commit, hours after T0, [ok(...) or dict(provider=, ms=, status=, ...)])], or
    4-tuples with a dict of options last: {'torch': version, 'machine': name, 'status': run status,
    'peers': JSON of peer versions}."""
    with Store(path) as s:
        for n, (key, commit, hours, rows, *opts) in enumerate(runs):
            opts = opts[0] if opts else {}
            e = env(key, opts.get("torch", "2.11.0"), opts.get("peers"))
            s.add_environment(e)
            rid = f"run-{n:04d}-{key}"
            t = T0 + timedelta(hours=hours)
            s.start_run(Run(run_id=rid, env_id=e.env_id, started_at=t + timedelta(minutes=n), finished_at=None,
                            status=opts.get("status", "finished"), git_commit=commit, commit_time=t, git_dirty=False,
                            grid=opts.get("grid", "full"),
                            copy_gbps=3000.0, matmul_tflops=800.0, config="{}", machine=opts.get("machine", machine)))
            s.add_results([result(rid, r.pop("provider"), r.pop("ms"), **r) for r in (dict(x) for x in rows)])
    return str(path)


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_files(repo, files: dict[str, str], message: str) -> str:
    """Writes the files into the repository (created on first use), commits them, returns the sha."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")
