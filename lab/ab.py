"""The lab's A/B harness: two or more configs (or functions) of one op, same inputs, checked against
the float64 reference by the collector's gate, then timed interleaved (A B C A B C ...) by the
collector's timing, and stored as a run of grid 'lab' whose rows the site's experiments page shows.

    python -m lab.ab rms_norm --shape M=4096,N=8192 --mode fwd \\
        --variant "wide=RMSNormFwdConfig(warps=16)" --variant "narrow=RMSNormFwdConfig(warps=4)"

A variant is NAME=EXPR, EXPR a Python expression evaluated in the op's config module (its config
classes; `changed(LSTMConfig, prefetch=False)`: each shape's own pick with that field changed),
forced with kcollect.kernels._host.config.forced while the op's `triton` provider runs; the
variant `default` (the heuristic's own pick) is always there. `--provider NAME` adds a provider of
the spec (a peer, eager) to the same interleaved rounds. Rows: provider `triton[NAME]`, the forced
config in the `config` column. Why interleaved rounds: a clock or thermal drift during the A/B then
moves every variant alike, and the spread of the per-round ratios says whether a difference is real.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import uuid
from pathlib import Path
from datetime import datetime, timezone
from typing import Any, Callable

from kcollect.common import ALLOC_CONF, DEFAULT_DB, pin_ptxas
from kcollect.names import DTYPE_CHOICES, MODES

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts


def parse_shape(text: str) -> dict[str, Any]:
    """M=4096,N=8192 -> {'M': 4096, 'N': 8192} (values that are not integers stay strings)."""
    dims = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if not key or not value:
            raise ValueError(f"bad shape {text!r}: expected NAME=VALUE,NAME=VALUE (e.g. M=4096,N=8192)")
        dims[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return dims


def variants(op: str, specs: list[str]) -> dict[str, Any]:
    """{name: forced config or None (the default pick)} from NAME=EXPR texts."""
    from kcollect.kernels._host.config import changed

    module = importlib.import_module(f"kcollect.kernels.{op}.config")
    out: dict[str, Any] = {"default": None}
    for text in specs:
        name, _, expr = text.partition("=")
        if not name or not expr:
            raise ValueError(f"bad variant {text!r}: expected NAME=EXPR, e.g. wide=RowsConfig(warps=16)")
        out[name.strip()] = eval(expr, {"changed": changed, **vars(module)})  # noqa: S307 (the user's own, as a CLI)
    return out


class Forcing:
    """A variant's config forced around what runs it: the provider's function (the forward a bwd
    measurement builds once, where ops such as the LSTM pick the backward's config too) and the
    measured call (ops such as rms_norm pick the backward's config in the backward). `taken`: whether
    any pick took it (kernels/_host/config.py: forced); nothing is forced for None."""

    def __init__(self, config: Any):
        self.config, self.taken = config, False

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self.config is None:
            return fn
        from kcollect.kernels._host.config import forced, kind_of

        def run(*args: Any, **kwargs: Any) -> Any:
            with forced(self.config) as taken:
                out = fn(*args, **kwargs)
            self.taken = self.taken or kind_of(self.config) in taken
            return out

        return run


def checked_call(spec: Any, fn: Callable[..., Any], inputs: dict, mode: str, dys: tuple, want: Any,
                 config: Any) -> tuple[Callable[[], Any], float]:
    """(the measured call, its error against `want`) of fn on a copy of `inputs` in `mode`, with
    `config` forced (Forcing); kcollect.spec.Unavailable where no pick took the config."""
    from kcollect import verify
    from kcollect.kernels._host.config import kind_of
    from kcollect.spec import Unavailable

    force = Forcing(config)
    call = force.wrap(verify.build_call(spec, force.wrap(fn), verify.clone_inputs(inputs), mode, dys))
    error = verify.error_of(spec, call(), want, mode)
    if config is not None and not force.taken:
        raise Unavailable(f"no pick took its {kind_of(config).__name__} here: the op ran another path, whose "
                          "config is of another class")
    return call, error


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int, time_one: Callable) -> dict[str, list]:
    """{name: [Timing per round]}: every call timed once per round, in the same order each round."""
    out: dict[str, list] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            out[name].append(time_one(call))
    return out


def ratio_band(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round ratios b/a: b faster than a where all are below 1."""
    ratios = [y / x for x, y in zip(a, b)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("op")
    ap.add_argument("--shape", action="append", required=True, help="NAME=VALUE,... (repeatable)")
    ap.add_argument("--mode", default="fwd", choices=MODES)
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES)
    ap.add_argument("--variant", action="append", default=[], help="NAME=EXPR (repeatable)")
    ap.add_argument("--provider", action="append", default=[], help="another provider of the op (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep-ms", type=float, default=20.0)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--db", default=DEFAULT_DB, help="store the rows go to (a run of grid 'lab')")
    ap.add_argument("--note", default="", help="what the experiment asks, stored with the run")
    args = ap.parse_args(argv)
    if args.rounds < 1 or not math.isfinite(args.rep_ms) or args.rep_ms <= 0:
        ap.error("--rounds must be >= 1 and --rep-ms a positive number")

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    pin_ptxas()
    from kcollect import timing, verify
    from kcollect.environment import fingerprint, resolve_commit
    from kcollect.registry import load
    from kcollect.spec import DTYPES, Unavailable, shape_label
    from kcollect.store import Run, Store

    spec = load().get(args.op)
    chosen = variants(args.op, args.variant)
    dtype = DTYPES[args.dtype]
    budget = timing.Budget(warmup_ms=args.rep_ms / 4, rep_ms=args.rep_ms, min_reps=10)
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if device == "cuda" else None

    def time_one(call):
        if device != "cuda":
            return timing.time_cpu(call, budget)
        return timing.time_cuda_graph(call, budget, flush)

    env = fingerprint(device)
    run_id = str(uuid.uuid4())
    head = resolve_commit(Path(os.getcwd()))
    copy_gbps, matmul_tflops = timing.measure_ceilings(device)
    rows, seq = [], 0
    for shape_text in args.shape:
        dims = parse_shape(shape_text)
        inputs = spec.make_inputs(dims, dtype, device, seed=0)
        dys, want = verify.reference_answers(spec, inputs, args.mode, seed=1)
        triton_fn = spec.provider("triton").fn
        # label -> (function, the config forced while it runs: None for a peer)
        fns = {f"triton[{name}]": (triton_fn, cfg) for name, cfg in chosen.items()}
        fns.update({p: (spec.provider(p).fn, None) for p in args.provider})
        calls, errors = {}, {}
        unavailable = {p: r for p in args.provider if (r := spec.provider(p).available(device))}  # on this device
        for name, (fn, config) in fns.items():
            if name in unavailable:
                print(f"{name}: unavailable here ({unavailable[name]})", file=sys.stderr)
                continue
            try:
                call, errors[name] = checked_call(spec, fn, inputs, args.mode, dys, want, config)
            except Unavailable as e:  # a peer that does not take this shape (cuDNN's LSTM with resets)
                unavailable[name] = str(e)
                print(f"{name}: unavailable at {shape_label(dims)} ({e})", file=sys.stderr)
                continue
            if errors[name] <= spec.tolerance[dtype]:
                calls[name] = call
            else:
                print(f"{name}: fails the gate (error {errors[name]:.3g}), not timed", file=sys.stderr)
        samples = interleaved(calls, args.rounds, time_one)
        base = samples.get("triton[default]")
        print(f"\n{args.op} {args.mode} {shape_label(dims)} {args.dtype}: {args.rounds} interleaved rounds")
        for name in fns:
            seq += 1
            row = dict(run_id=run_id, kernel=spec.name, mode=args.mode, provider=name, shape=shape_label(dims),
                       dims=json.dumps(dims), dtype=args.dtype, baseline="triton[default]", bound=spec.bound,
                       rel_err=errors.get(name), tolerance=spec.tolerance[dtype], seq=seq,
                       bytes=int(spec.bytes_moved(dims, dtype, args.mode)), flops=float(spec.flops(dims, args.mode)),
                       config=_record(fns[name][1]))
            if name in unavailable:
                row.update(status="unavailable", error=unavailable[name], rel_err=None)
                rows.append(row)
                continue
            if name not in samples:
                row.update(status="failed", error=f"relative error {errors[name]:.3g} over the tolerance")
                rows.append(row)
                continue
            medians = [t.median_ms for t in samples[name]]
            t = timing.summarize(samples[name][0].method, medians)
            row.update(status="ok", timing=t.method, median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms,
                       mean_ms=t.mean_ms, std_ms=t.std_ms, min_ms=t.min_ms, reps=sum(s.reps for s in samples[name]))
            rows.append(row)
            band = ""
            if base is not None and name != "triton[default]":
                mid, lo, hi = ratio_band([s.median_ms for s in base], medians)
                band = f"  x{mid:.3f} of default (rounds {lo:.3f}-{hi:.3f})"
            print(f"  {name:<32} {t.median_ms:9.4f} ms  error {errors[name]:.2e}{band}")
    with Store(args.db) as store:
        store.add_environment(env)
        store.start_run(Run(run_id=run_id, env_id=env.env_id, started_at=_now(), finished_at=None,
                            status="unfinished", git_commit=head.sha, commit_time=head.time, git_dirty=head.dirty,
                            grid="lab", copy_gbps=copy_gbps, matmul_tflops=matmul_tflops,
                            config=json.dumps({"argv": argv or sys.argv[1:], "note": args.note})))
        store.add_results(rows)
        store.finish_run(run_id, "finished", _now())
    print(f"\nrun {run_id[:8]} (grid lab) in {args.db}")
    return 0


def _record(config: Any) -> str | None:
    """The `config` column of a forced variant's rows (None: the heuristic's own pick)."""
    from kcollect.kernels._host.config import Changed, config_record

    if isinstance(config, Changed):
        return json.dumps({"changed": {config.kind.__name__: dict(config.fields)}})
    return json.dumps(config_record(forced=config)) if config is not None else None


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


if __name__ == "__main__":
    sys.exit(main())
