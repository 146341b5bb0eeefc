"""The awkward-input sweep (`python -m lab.awkward`): N cases per family, checked in worker processes,
one JSONL per family and a summary table.

    python -m lab.awkward --family attention,scans,cells --cases 2000 --seed 0 --device cuda --out DIR
        [--workers 16] [--time-limit 420] [--grace 20] [--case-timeout 240] [--bounds]

On the GPU, compiling each new kernel variant dominates (CPU-bound, one core a compile), so the cases
of a family are grouped by what decides their compiled variants (the module's `variant`, where it
has one; the groups in a seeded random order, so that a sweep cut short covers every op and dtype)
and handed out in small batches to --workers processes, which share Triton's disk cache. A
worker whose case crashes the CUDA context (an illegal address) or dies is replaced, its case
recorded as a crash; a case past --case-timeout is a crash too ('hung'). After --time-limit seconds
no further case starts (the summary counts them as not run), and --grace seconds later the cases
still running are abandoned (not run too), so that the sweep ends within its machine's budget with
everything it did written.

Files under DIR: <family>.jsonl (one line a case: the case and its verdict), summary.txt (the table)
and summary.json (the same numbers)."""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import queue
import random
import sys
import time
from pathlib import Path

FAMILIES = ("attention", "scans", "cells")
BATCH = 4  # cases a worker takes at once (neighbours in variant order: they share compiles)


def family_module(name: str):
    return importlib.import_module(f"lab.awkward.{name}")


def ops_of(family: str) -> tuple[str, ...]:
    """The ops a family's cases are drawn for (attention's: attention)."""
    return getattr(family_module(family), "OPS", (family,))


def draw_cases(family: str, n: int, seed: int, device: str) -> list[dict]:
    """n cases of a family, indexed in draw order, grouped by compiled variant, the groups in a seeded
    random order: in the variants' name order a sweep cut short by its time limit ran one op's and one
    dtype's cases only (seed 66 on an H200: 814 mlstm cases run, 0 of 1451 slstm; fp32 sorted last)."""
    module = family_module(family)
    rng = random.Random(f"{seed}-{family}")
    cases = [dict(module.draw(rng, device), index=i) for i in range(n)]
    key = getattr(module, "variant", lambda c: c.get("op", ""))
    groups: dict[str, list[dict]] = {}
    for c in sorted(cases, key=lambda c: c["index"]):
        groups.setdefault(key(c), []).append(c)
    order = sorted(groups)
    random.Random(f"{seed}-{family}-order").shuffle(order)
    return [c for g in order for c in groups[g]]


def _worker(tasks, results, stop, device: str, bounds: bool = False) -> None:
    """Check batches of (family, case) until the queue is empty or the stop event is set; a fatal
    crash (the CUDA context lost) ends the process after its report (the parent starts another).
    bounds: every interpreted load and store checked against its launch's tensors (bounds.py)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    if bounds:
        from lab.awkward import bounds as checker

        checker.install()
    import warnings

    warnings.filterwarnings("ignore")
    modules = {}
    while not stop.is_set():
        try:
            batch = tasks.get(timeout=0.5)
        except queue.Empty:
            return
        results.put(("take", os.getpid(), batch))
        for family, case in batch:
            if stop.is_set():
                return
            results.put(("start", os.getpid(), family, case["index"]))
            module = modules.setdefault(family, family_module(family))
            try:
                verdict = module.check(case, device)
            except Exception as e:  # noqa: BLE001 (a check that fails is the case's crash)
                verdict = {"status": "crash", "message": f"the check itself failed: {type(e).__name__}: {e}"[:500]}
            results.put(("done", os.getpid(), family, case["index"], verdict))
            if verdict.get("fatal"):
                return


class Sweep:
    """The parent: hands out batches, watches workers (dead, hung), collects verdicts."""

    def __init__(self, args, cases: dict[str, list[dict]]):
        import multiprocessing as mp

        self.ctx = mp.get_context("spawn")
        self.args, self.cases = args, cases
        self.by_index = {(f, c["index"]): c for f, cs in cases.items() for c in cs}
        self.tasks, self.results, self.stop = self.ctx.Queue(), self.ctx.Queue(), self.ctx.Event()
        self.verdicts: dict[tuple[str, int], dict] = {}
        self.running: dict[int, tuple[str, int, float]] = {}  # pid -> (family, index, start)
        self.taken: dict[int, list] = {}  # pid -> the (family, case) pairs of its batch not yet done
        self.workers: dict[int, object] = {}
        self.started, self.useful = 0, set()  # processes started; those that took a batch
        for family, cs in cases.items():
            for i in range(0, len(cs), BATCH):
                self.tasks.put([(family, c) for c in cs[i:i + BATCH]])

    def _start_worker(self) -> None:
        p = self.ctx.Process(target=_worker, args=(self.tasks, self.results, self.stop, self.args.device,
                                                   self.args.bounds), daemon=True)
        p.start()
        self.workers[p.pid] = p
        self.started += 1

    def _lost(self, pid: int, why: str) -> None:
        """A worker gone (died, killed, or done): its running case is a crash, the rest of its batch
        goes back to the queue."""
        if pid in self.running:
            family, index, _ = self.running.pop(pid)
            self.verdicts[(family, index)] = {"status": "crash", "message": why, "fatal": True}
        rest = [(f, c) for f, c in self.taken.pop(pid, []) if (f, c["index"]) not in self.verdicts]
        if rest and not self.stop.is_set():
            self.tasks.put(rest)
        self.workers.pop(pid, None)

    def _take(self, msg) -> None:
        if msg[0] == "take":
            self.taken[msg[1]] = msg[2]
            self.useful.add(msg[1])
        elif msg[0] == "start":
            self.running[msg[1]] = (msg[2], msg[3], time.monotonic())
        else:
            self.running.pop(msg[1], None)
            self.verdicts[(msg[2], msg[3])] = msg[4]

    def run(self) -> None:
        start = time.monotonic()
        for _ in range(self.args.workers):
            self._start_worker()
        total = len(self.by_index)
        last_report = start
        while len(self.verdicts) < total and self.workers:
            if not self.stop.is_set() and time.monotonic() - start > self.args.time_limit:
                print(f"time limit {self.args.time_limit} s: no further case starts", flush=True)
                self.stop.set()
            if self.stop.is_set() and time.monotonic() - start > self.args.time_limit + self.args.grace:
                print(f"{self.args.grace} s past the time limit: {len(self.running)} running cases left "
                      "unchecked (not run)", flush=True)
                for p in self.workers.values():
                    p.kill()
                break
            try:
                self._take(self.results.get(timeout=1.0))
            except queue.Empty:
                pass
            self._watch()
            if time.monotonic() - last_report > 30:
                last_report = time.monotonic()
                print(f"{time.monotonic() - start:6.0f} s: {len(self.verdicts)} of {total} cases checked", flush=True)
        for p in self.workers.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        self.tasks.cancel_join_thread()  # batches left after a time limit: do not wait to flush them

    def _watch(self) -> None:
        now = time.monotonic()
        for pid, p in list(self.workers.items()):
            family_index = self.running.get(pid)
            if family_index and now - family_index[2] > self.args.case_timeout:
                p.kill()
                p.join()
                self._lost(pid, f"hung: past {self.args.case_timeout} s")
            elif not p.is_alive():
                self._drain()
                self._lost(pid, f"the worker process died (exit code {p.exitcode})")
            else:
                continue
            if self.started - len(self.useful) > 2 * self.args.workers:
                print("workers keep dying before taking a case: stopping", flush=True)
                self.stop.set()
            if not self.stop.is_set() and (not self.tasks.empty() or not self.workers):
                self._start_worker()

    def _drain(self) -> None:
        """Take in what a finished worker reported before it went (its last verdict)."""
        time.sleep(0.2)  # the queue's feeder thread may still be delivering
        while True:
            try:
                self._take(self.results.get_nowait())
            except queue.Empty:
                return


def summarise(cases: dict[str, list[dict]], verdicts: dict) -> tuple[str, dict]:
    """(the table, its numbers): per family and op, cases and each kind of failure."""
    cols = ("cases", "ok", "refused", "crash", "wrong_shape", "inplace", "fp32>2x_eager", "lowp>gate",
            "floor_only", "invalid", "not_run")
    numbers: dict[str, dict[str, int]] = {}
    for family, cs in cases.items():
        for c in cs:
            op = c.get("op", family)
            for key in (family, "/".join(x for x in (family, op if op != family else "", c.get("path", "")) if x)):
                row = numbers.setdefault(key, dict.fromkeys(cols, 0))
                row["cases"] += 1
                v = verdicts.get((family, c["index"]))
                if v is None:
                    row["not_run"] += 1
                    continue
                s = v["status"]
                if s == "over_tolerance":
                    row["lowp>gate" if c["dtype"] in ("bfloat16", "float16") else "fp32>2x_eager"] += 1
                elif s in row:
                    row[s] += 1
                if v.get("floor_only"):
                    row["floor_only"] += 1
    width = max((len(k) for k in numbers), default=6) + 2
    lines = ["".ljust(width) + " ".join(f"{c:>15}" for c in cols)]
    lines += [k.ljust(width) + " ".join(f"{row[c]:>15}" for c in cols) for k, row in numbers.items()]
    return "\n".join(lines), numbers


def pooled(cases: dict[str, list[dict]], verdicts: dict) -> list[str]:
    """Per op, each part's fp32 error against eager's over the cases where both have one: the
    geometric mean of the cases' ratios (each held to [1e-3, 1e3]), and the sum of ours over the sum
    of eager's. A case's bar (2x eager's on that draw) is a noisy test where a part is a few numbers
    (a parameter's gradient at H 1, dA at D 1): their ratio to eager's error ranges over a decade
    from draw to draw, for eager as for ours. The geometric mean is the typical case; the ratio of
    sums is the cases of large errors (eager's blow-ups pull it under 1)."""
    acc: dict[str, dict[str, list]] = {}
    for family, cs in cases.items():
        for c in cs:
            v = verdicts.get((family, c["index"]))
            if c["dtype"] != "float32" or not v or not v.get("parts"):
                continue
            op = acc.setdefault(f"{family}/{c.get('op', family)}", {})
            for p in v["parts"]:
                o, e = p.get("ours"), p.get("eager")
                if o is None or e is None or not (math.isfinite(o) and math.isfinite(e)) or o + e == 0:
                    continue
                ratio = min(1e3, max(1e-3, o / e)) if e > 0 else 1e3
                op.setdefault(p["name"], []).append((math.log(ratio), o, e))
    lines = []
    for key, parts in acc.items():
        cells = []
        for name, xs in parts.items():
            geo = math.exp(sum(r for r, _, _ in xs) / len(xs))
            ours, eager = sum(o for _, o, _ in xs), sum(e for *_, e in xs)
            cells.append(f"{name} {geo:.2f} ({ours / eager:.2f})" if eager > 0 else f"{name} {geo:.2f} (-)")
        lines.append(f"  {key} ({max(len(xs) for xs in parts.values())} cases): " + ", ".join(cells))
    return lines


def _worst(family: str, cases: list[dict], verdicts: dict, n: int = 15) -> list[str]:
    bad = [(verdicts[(family, c["index"])], c) for c in cases
           if (family, c["index"]) in verdicts and verdicts[(family, c["index"])]["status"] not in ("ok", "refused")]
    from .common import STATUSES

    bad.sort(key=lambda vc: (STATUSES.index(vc[0]["status"]) if vc[0]["status"] in STATUSES else 0,
                             -(vc[0].get("error") or 0) / (vc[0].get("gate") or 1)))
    return [f"  {v['status']}: {json.dumps({k: c[k] for k in c if k != 'index'})} -> {v.get('message', '')[:300]}"
            for v, c in bad[:n]]


def worst_cases(summary: Path) -> list[dict]:
    """The cases a summary.txt lists under its worst cases (_worst's lines), as drawn."""
    cases = []
    for line in summary.read_text().splitlines():
        start = line.find("{") if line.startswith("  ") and ": {" in line else -1
        if start >= 0:
            cases.append(json.JSONDecoder().raw_decode(line, start)[0])
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.awkward", description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="attention,scans", help=f"comma-separated, of {', '.join(FAMILIES)}")
    ap.add_argument("--cases", type=int, default=100, help="cases per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True, help="folder for the JSONL files and the summary")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the CPU cores, at most 16)")
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds after which no case starts")
    ap.add_argument("--grace", type=float, default=20.0,
                    help="seconds after --time-limit that running cases may take to finish; then their workers "
                         "are killed and the cases count as not run, so that the files are always written")
    ap.add_argument("--case-timeout", type=float, default=240.0, help="seconds after which a case is a hang")
    ap.add_argument("--accurate", action="store_true",
                    help="attention's cases call attention(accurate=True) (default: the defaults, as a user's call)")
    ap.add_argument("--ops", default="",
                    help="comma-separated ops to keep of the families' draws (e.g. slstm): the same cases as "
                         "the whole sweep of that seed holds for them (default: every op)")
    ap.add_argument("--bounds", action="store_true",
                    help="with --device cpu: every load and store of the interpreted kernels checked against "
                         "its launch's tensors (an out-of-bounds access is the case's crash)")
    args = ap.parse_args(argv)
    families = [f for f in args.family.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families or args.cases < 1:
        why = (f"unknown family {', '.join(unknown)}" if unknown else "no family" if not families
               else f"--cases {args.cases}")
        print(f"python -m lab.awkward: {why}; valid: --family from {', '.join(FAMILIES)}, --cases >= 1",
              file=sys.stderr)
        return 2
    ops = [o for o in args.ops.split(",") if o]
    known = [o for f in families for o in ops_of(f)]
    if [o for o in ops if o not in known]:
        print(f"python -m lab.awkward: unknown op {', '.join(o for o in ops if o not in known)} for "
              f"{', '.join(families)}; valid: --ops from {', '.join(known)}", file=sys.stderr)
        return 2
    if args.bounds and args.device != "cpu":
        print("python -m lab.awkward: --bounds checks the CPU interpreter's accesses; valid with --device cpu",
              file=sys.stderr)
        return 2
    args.workers = args.workers or min(16, os.cpu_count() or 1)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        import torch

        from kcollect.common import pin_ptxas

        if not torch.cuda.is_available():
            print("python -m lab.awkward: no CUDA GPU here (--device cpu checks the cases on the interpreter)",
                  file=sys.stderr)
            return 2
        pin_ptxas()  # the collector's ptxas, for every worker (they inherit the environment)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cases = {f: [c for c in draw_cases(f, args.cases, args.seed, args.device) if not ops or c["op"] in ops]
             for f in families}
    for c in cases.get("attention", []) if args.accurate else []:
        c["options"]["accurate"] = True  # in the case's JSON, so that a recheck calls the same
    sweep = Sweep(args, cases)
    sweep.run()
    for family, cs in cases.items():
        with open(out / f"{family}.jsonl", "w") as fh:
            for c in sorted(cs, key=lambda c: c["index"]):
                v = sweep.verdicts.get((family, c["index"]), {"status": "not_run"})
                fh.write(json.dumps({**c, "verdict": v}) + "\n")
    table, numbers = summarise(cases, sweep.verdicts)
    device = _device_line(args.device)
    called = (f", only {', '.join(ops)}" if ops else "") + (", attention(accurate=True)" if args.accurate else "")
    header = (f"awkward sweep: {', '.join(families)}, {args.cases} cases each, seed {args.seed}, {device}, "
              f"{args.workers} workers, {time.time() - started:.0f} s{called}")
    worst = [line for f, cs in cases.items() for line in [f"{f}:"] + _worst(f, cs, sweep.verdicts)]
    ratios = pooled(cases, sweep.verdicts)
    title = "fp32 error, ours / eager's, per part: geometric mean of the cases (ratio of sums):"
    pooled_text = ["", title, *ratios] if ratios else []
    text = "\n".join([header, "", table, *pooled_text, "", "worst cases (crash, wrong shape, in place, over the gate):",
                      *worst])
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps({"header": header, "numbers": numbers, "pooled": ratios}, indent=1)
                                      + "\n")
    print(text)
    return 0


def _device_line(device: str) -> str:
    import torch

    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "CPU (interpreter)"
    return f"{gpu}, torch {torch.__version__}"


