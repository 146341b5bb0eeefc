"""A/B of the scan ops' lanes paths against their tiles paths on one GPU (issue 42): at each shape
and mode, every candidate config of both paths is checked against the float64 reference (the
collector's gate) and then timed in interleaved rounds (A B C ... A B C ...: CUDA-graph replays,
L2 flushed before each, the median of each round's median), with the copy bandwidth measured once
here. Prints a table per shape and mode (config, ms, the rounds' spread, GB/s, % of copy, error),
then per shape the best of each path and the pick, and for each op and direction the value of
config.LANES_*_FROM that the measurements support. Rows also go to --out as JSON lines.

    python -m lab.scans_ab --out $OUT                 # every shape, about 5 minutes on an H100
    python -m lab.scans_ab --only rtu:target          # one shape (op:label, comma-separated)
    python -m lab.scans_ab --device cpu               # a dry run on the interpreter at tiny shapes

Candidates: the tiles path's pick and the best of lab/results/scans_tune_h100.txt where it differs;
the lanes path's own heuristic (config.lanes) and a grid around it (tile, chunk, channels a
program, warps, segments). A backward candidate is a whole config: the bwd mode's forward
(untimed) keeps the states at its chunk. The selective scan's backward is the tiles path's either
way: forward only.

Acting on it: the last block says which LANES_*_FROM each op's config.py should get (the smallest
B*T*H, or B*T*D, from which the lanes heuristic beat the tiles pick by 2% at every larger measured
shape); where a grid row beat the heuristic's by more, config.lanes is the place to follow it.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import statistics
import sys
import time

from kcollect.common import ALLOC_CONF

from . import common
from .device import device_line, open_device
from .scans_tune import _rtu, _warm

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # as `kcollect run` does, before CUDA starts

SHAPES = [  # (op, label, dims, modes): the targets first, then the real-time and the rest of the grids
    ("rtu", "target", _rtu(8, 8192, 1024, "diag", 0.01), ("fwd", "bwd")),
    ("selective_scan", "target", {"B": 8, "T": 2048, "D": 2048, "N": 16}, ("fwd",)),
    ("selective_scan", "realtime-B1", {"B": 1, "T": 60, "D": 512, "N": 16}, ("fwd",)),
    ("selective_scan", "realtime-B32", {"B": 32, "T": 60, "D": 512, "N": 16}, ("fwd",)),
    ("rtu", "cortex-B4", _rtu(4, 128, 64, "diag", 0.0), ("fwd", "bwd")),
    ("rtu", "cortex-B8", _rtu(8, 1024, 64, "diag", 0.1), ("fwd", "bwd")),
    ("rtu", "wide", _rtu(32, 2048, 2048, "diag", 0.1), ("fwd", "bwd")),
    ("rtu", "T1024", _rtu(64, 1024, 1024, "diag", 0.01), ("fwd", "bwd")),
    ("rtu", "no-resets", _rtu(8, 8192, 1024, "diag", 0.0), ("fwd", "bwd")),
    ("rtu", "awkward", _rtu(4, 3000, 1000, "diag", 0.01), ("fwd", "bwd")),
    ("selective_scan", "mamba-130m", {"B": 16, "T": 1024, "D": 1536, "N": 16}, ("fwd",)),
    ("selective_scan", "wide", {"B": 8, "T": 2048, "D": 4096, "N": 16}, ("fwd",)),
    ("selective_scan", "long", {"B": 4, "T": 4096, "D": 2048, "N": 16}, ("fwd",)),
    ("selective_scan", "awkward", {"B": 3, "T": 1000, "D": 1000, "N": 16}, ("fwd",)),
]
CPU_SHAPES = [
    ("rtu", "tiny", _rtu(2, 40, 16, "diag", 0.1), ("fwd", "bwd")),
    ("selective_scan", "tiny", {"B": 1, "T": 24, "D": 16, "N": 4}, ("fwd",)),
]
TILES_TUNED = {  # lab/results/scans_tune_h100.txt's best at B8 T8192 H1024 where it is not the pick
    ("rtu", "fwd"): dict(chunk=128, block_h=16, warps=2),
    ("rtu", "bwd"): dict(chunk=64, bwd_block_h=32, bwd_warps=4),
}


def _work(op: str, dims: dict) -> int:
    return dims["B"] * dims["T"] * (dims["H"] if op == "rtu" else dims["D"])


def _around(n: int, top: int) -> list[int]:
    """n/2, n, 2n (at least 1, at most top)."""
    return sorted({max(1, min(top, v)) for v in (n // 2, n, 2 * n)})


def candidates(op: str, mode: str, dims: dict, device: str) -> list[tuple[str, object]]:
    """(label, config) of both paths at one shape and mode, the picks first."""
    cfg = importlib.import_module(f"kcollect.kernels.{op}.config")
    work = (dims["B"], dims["T"], dims["H"] if op == "rtu" else dims["D"])
    if op == "rtu":
        pick = cfg.tiles(*work, device)
        heur = cfg.lanes(*work, device)
        out = [("tiles pick", pick), ("lanes heuristic", heur)]
        if (op, mode) in TILES_TUNED:
            out.append(("tiles tuned", dataclasses.replace(pick, **TILES_TUNED[op, mode])))
        if device != "cuda":
            return out
        top = -(-dims["T"] // 16)  # chunks of the backward
        if mode == "fwd":
            for tile in (16, 32):
                for block_h, warps in ((64, 1), (32, 1), (128, 2), (256, 4)):
                    for segs in _around(heur.segments * block_h // (64 * warps), -(-dims["T"] // tile)):
                        out.append(("lanes", dataclasses.replace(heur, steps=tile, block_h=block_h, warps=warps,
                                                                 segments=segs)))
        else:
            for chunk, block_h, warps in ((16, 32, 1), (16, 64, 1), (16, 64, 2), (16, 128, 4), (32, 32, 1)):
                for segs in _around(heur.bwd_segments * block_h // (32 * warps), top):
                    out.append(("lanes", dataclasses.replace(heur, chunk=chunk, bwd_block_h=block_h, bwd_warps=warps,
                                                             bwd_segments=segs)))
    else:
        pick = cfg.tiles(dims["B"], work[2], device)
        heur = cfg.lanes(*work, device)
        out = [("tiles pick", pick), ("lanes heuristic", heur)]
        if device != "cuda":
            return out
        top = -(-dims["T"] // 4)
        for block_d, warps in ((32, 1), (64, 2), (128, 4), (64, 1)):
            for steps in (4, 8):
                for segs in _around(heur.segments * block_d // (32 * warps), top):
                    out.append(("lanes", dataclasses.replace(heur, block_d=block_d, warps=warps, steps=steps,
                                                             segments=segs)))
    return unique(out)


def unique(out: list) -> list:
    """(label, config) pairs, each config once (the first label that names it)."""
    seen, kept = set(), []
    for label, c in out:
        if c not in seen:
            seen.add(c)
            kept.append((label, c))
    return kept


def time_shape(op, label, dims, mode, dtype, pool, args, copy_gbps, log, cands=None) -> list[dict]:
    """Gate and time every candidate (label, config) at one shape and mode (default: candidates()):
    one row (a dict) each."""
    import torch

    from kcollect import timing, verify
    from kcollect.kernels._host.config import forced

    spec = importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC
    cands = cands if cands is not None else candidates(op, mode, dims, args.device)
    broken = common.precompile(pool, _warm, (op, dims, args.dtype, mode), [c for _, c in cands])
    inputs = spec.make_inputs(dims, dtype, args.device, 0)
    dys, want = verify.reference_answers(spec, inputs, mode, 1)
    fn = spec.provider("triton").fn
    rows, calls = [], {}
    for i, (kind, c) in enumerate(cands):
        row = dict(op=op, shape=label, dims=dims, mode=mode, dtype=args.dtype, kind=kind, path=_path(op, mode, c),
                   config=dataclasses.asdict(c), work=_work(op, dims), ms=None, err=None, note="")
        rows.append(row)
        if c in broken:
            row["note"] = broken[c]
            continue

        def call_with(c=c):
            def run(**x):
                with forced(c):
                    return fn(**x)
            return run

        try:
            call = verify.build_call(spec, call_with(), verify.clone_inputs(inputs), mode, dys)
            row["err"] = verify.error_of(spec, call(), want, mode)
        except Exception as e:
            row["note"] = f"error: {type(e).__name__}: {str(e)[:120]}"
            continue
        if not row["err"] <= spec.tolerance[dtype]:
            row["note"] = common.FAILS
            continue
        calls[i] = call
    budget = timing.Budget(warmup_ms=args.rep_ms / 2, rep_ms=args.rep_ms, min_reps=5 if args.device == "cuda" else 1)
    flush = torch.empty(timing.L2_FLUSH_BYTES, dtype=torch.int8, device=args.device) if args.device == "cuda" else None
    rounds: dict[int, list[float]] = {i: [] for i in calls}
    for _ in range(args.rounds):
        for i, call in calls.items():
            try:
                t = (timing.time_cuda_graph(call, budget, flush) if args.device == "cuda"
                     else timing.time_cpu(call, budget))
                rounds[i].append(t.median_ms)
            except Exception as e:
                rows[i]["note"] = f"timing: {type(e).__name__}: {str(e)[:120]}"
    nbytes = spec.bytes_moved(dims, dtype, mode)
    for i, ms in rounds.items():
        if ms and not rows[i]["note"]:
            rows[i].update(ms=statistics.median(ms), lo=min(ms), hi=max(ms), gbps=nbytes / (statistics.median(ms) * 1e6))
            rows[i]["pct_copy"] = 100 * rows[i]["gbps"] / copy_gbps if copy_gbps else None
    print_table(f"{op} {label} {mode} {args.dtype} {dims}", rows)
    for r in rows:
        log.write(json.dumps(r) + "\n")
    del calls, inputs, want, dys
    common.release(args.device)
    return rows


def _path(op: str, mode: str, c) -> str:
    return (c.path if mode == "fwd" else c.bwd_path) if op == "rtu" else c.path


def print_table(title: str, rows: list[dict]) -> None:
    nan = float("nan")
    print(f"\n== {title}")
    print(f"  {'kind':<16} {'config':<136} {'ms':>8} {'rounds':>15} {'GB/s':>6} {'%copy':>6}  note")
    for r in sorted(rows, key=lambda r: (r["ms"] is None, r["ms"] or 0)):
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        spread = f"{r['lo']:.4f}-{r['hi']:.4f}" if r["ms"] else ""
        note = r["note"] or f"err {r['err']:.1e}"
        print(f"  {r['kind']:<16} {cfg:<136} {r['ms'] or nan:8.4f} {spread:>15} {r.get('gbps') or nan:6.0f} "
              f"{r.get('pct_copy') or nan:6.1f}  {note}")


def by_case(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The rows grouped by (op, shape label, mode), in the order they came."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["op"], r["shape"], r["mode"]), []).append(r)
    return out


def summary(all_rows: list[dict]) -> None:
    """Per shape and mode: the best of each path, the heuristics' rows and the pick; per op and
    direction: the LANES_*_FROM the measurements support (the smallest B*T*H (B*T*D) from which the
    lanes heuristic beat the tiles pick at every measured shape; None if it lost at the largest)."""
    print("\n== best per shape (ms, % of copy); 'heur' = config.lanes, the row LANES_*_FROM would switch to")
    verdicts: dict[tuple, list[tuple[int, float]]] = {}
    for (op, shape, mode), rows in by_case(all_rows).items():
        timed = [r for r in rows if r["ms"]]
        best = {p: min((r for r in timed if r["path"] == p), key=lambda r: r["ms"], default=None)
                for p in ("tiles", "lanes")}
        kinds = {r["kind"]: r for r in timed}
        pick, heur = kinds.get("tiles pick"), kinds.get("lanes heuristic")
        cells = []
        for name, r in (("tiles pick", pick), ("tiles best", best["tiles"]), ("lanes heur", heur),
                        ("lanes best", best["lanes"])):
            cells.append(f"{name} {r['ms']:.4f} ({r.get('pct_copy') or float('nan'):.1f}%)" if r else f"{name} -")
        winner = min((r for r in (best["tiles"], best["lanes"]) if r), key=lambda r: r["ms"], default=None)
        print(f"  {op:<15} {shape:<13} {mode}  " + "  ".join(cells) + f"  -> {winner['path'] if winner else '-'}")
        if best["lanes"]:
            print(f"      lanes best: {short_cfg(best['lanes'])}")
        if pick and heur:
            verdicts.setdefault((op, mode), []).append((rows[0]["work"], heur["ms"] / pick["ms"]))
    print("\n== heuristic: lanes heuristic / tiles pick per shape (below 1: lanes faster), by B*T*H (B*T*D)")
    names = {("rtu", "fwd"): "kernels/rtu/config.py LANES_FWD_FROM", ("rtu", "bwd"): "kernels/rtu/config.py LANES_BWD_FROM",
             ("selective_scan", "fwd"): "kernels/selective_scan/config.py LANES_FROM"}
    for key, pairs in sorted(verdicts.items()):
        pairs.sort()
        print(f"  {key[0]} {key[1]}: " + ", ".join(f"{w}: {ratio:.3f}" for w, ratio in pairs))
        print(f"      supports {names[key]} = {lanes_from(pairs)}")


def lanes_from(pairs: list[tuple[int, float]], margin: float = 0.98) -> int | None:
    """The smallest work (B*T*H or B*T*D) from which every measured shape has the lanes heuristic
    below `margin` x the tiles pick's time, from (work, lanes / tiles) pairs; None where the
    largest shape's does not (the lanes path then never switches on)."""
    pairs = sorted(pairs)
    for w, _ in pairs:
        if all(ratio < margin for v, ratio in pairs if v >= w):
            return w
    return None


def short_cfg(r: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in r["config"].items())


def parse(name: str, doc: str, shapes, cpu_shapes, time_limit_s: float, argv):
    """The options of this script and lab/ss_variants.py (`name`), and the shapes asked for
    (argparse's error, exit 2, for an unknown one)."""
    ap = argparse.ArgumentParser(prog=f"python -m lab.{name}", description=doc.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated op:label (default: every shape); labels: "
                    + ", ".join(f"{op}:{label}" for op, label, _, _ in shapes))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--out", default=None, help=f"folder for {name}.jsonl (one row a candidate)")
    ap.add_argument("--time-limit-s", type=float, default=time_limit_s, help="start no shape past this many seconds")
    common.search_options(ap, rep_ms=4.0, quick="(unused)")
    args = ap.parse_args(argv)
    chosen = cpu_shapes if args.device == "cpu" else shapes
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        known = {f"{op}:{label}" for op, label, _, _ in chosen}
        if wanted - known:
            ap.error(f"unknown shape {', '.join(sorted(wanted - known))}; known: {', '.join(sorted(known))}")
        chosen = [s for s in chosen if f"{s[0]}:{s[1]}" in wanted]
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    return args, chosen


def begin(args, name: str):
    """(torch, the copy bandwidth measured (None on the CPU), the output folder) with the header
    printed; None where the device cannot be opened."""
    torch = open_device(args.device, name)
    if torch is None:
        return None
    from kcollect import timing

    copy_gbps = timing.measure_ceilings(args.device)[0] if args.device == "cuda" else None
    print(f"{device_line(torch, args.device)}  dtype {args.dtype}  copy {copy_gbps or float('nan'):.0f} GB/s")
    out_dir = args.out or "."
    os.makedirs(out_dir, exist_ok=True)
    return torch, copy_gbps, out_dir


def sweep(name: str, doc: str, shapes, cpu_shapes, time_limit_s: float, argv, summarise,
          cands=lambda op, label, dims, device: None) -> int:
    """A script's whole run (this one's and lab/ss_variants.py's): its options, then every shape and
    mode asked for (a shape's modes a tuple, or one mode) timed by time_shape with `cands`' candidates
    (None: candidates()), rows into `name`.jsonl as they come, `summarise`(rows) at the end."""
    args, shapes = parse(name, doc, shapes, cpu_shapes, time_limit_s, argv)
    start = time.monotonic()
    opened = begin(args, name)
    if opened is None:
        return 2
    torch, copy_gbps, out_dir = opened
    dtype = getattr(torch, args.dtype)
    rows = []
    with open(os.path.join(out_dir, f"{name}.jsonl"), "w") as log, contextlib.ExitStack() as stack:
        pool = common.compile_pool(stack, args.device, args.jobs)
        for op, label, dims, modes in shapes:
            for mode in (modes,) if isinstance(modes, str) else modes:
                if time.monotonic() - start > args.time_limit_s:
                    print(f"\n(time limit: {op} {label} {mode} not run)")
                    continue
                rows += time_shape(op, label, dims, mode, dtype, pool, args, copy_gbps, log,
                                   cands=cands(op, label, dims, args.device))
                log.flush()
    summarise(rows)
    print(f"\n{time.monotonic() - start:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return sweep("scans_ab", __doc__, SHAPES, CPU_SHAPES, 400.0, argv, summary)


if __name__ == "__main__":
    sys.exit(main())
