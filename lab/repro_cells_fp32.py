"""Issue 40's cells cases over the fp32 bar on the GPU, run again one by one: our error against
float64 beside eager's, per output and gradient, with the mLSTM's stabiliser values where its gates
are wild.

    python -m lab.repro_cells_fp32 --out DIR [--fresh 24] [--seed 0] [--time-limit 170]
        [--dot picked|ieee|tf32x3]

Runs, on cuda, (1) the worst cases that lab/results/awkward_h200_cells_bcd216a.txt lists (read from
that file), (2) a fresh draw of `--fresh` cells cases whose gates are wild or saturated (lab.awkward's
generator, any dtype), each through lab.awkward.cells.check (the sweep's verdict, the reordered-
eager rule included), and for every mLSTM case with wild gates, (3) the stabiliser m_t, the
normaliser and the input and forget gates' gradients element by element (ours, eager, float64), to
see a quotient or an exponential past fp32's range. Writes DIR/repro_cells_fp32.jsonl (one line a
case: the case and its verdict) and DIR/repro_cells_fp32.txt (what it prints). One GPU; meant for
one call of under 4 minutes: no case starts after --time-limit seconds, and the narrow shapes go
first (the compiles of wide fp32 heads dominate)."""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
LISTED = ROOT / "lab" / "results" / "awkward_h200_cells_bcd216a.txt"


def listed_cases() -> list[dict]:
    """The cases the H200 sweep's summary names."""
    from lab.awkward.sweep import worst_cases

    return worst_cases(LISTED)


def fresh_cases(n: int, seed: int) -> list[dict]:
    """n cases of the sweep's generator with wild (sLSTM, mLSTM) or saturated (LSTM) gates."""
    from lab.awkward import cells

    rng, out = random.Random(f"repro-{seed}"), []
    while len(out) < n:
        case = cells.draw(rng, "cuda")
        if case["options"]["gates"] in ("wild", "saturated") and not case["refusal"]:
            out.append(case)
    return out


def _width(case: dict) -> int:
    return case["dims"].get("DH", case["dims"].get("H", 0))


def _line(part: dict) -> str:
    def g(x):
        return "-" if x is None else f"{x:.3g}"

    return (f"    {part['name']:<10} ours {g(part['ours'])}  eager {g(part['eager'])}  reordered eager "
            f"{g(part.get('reordered'))}  spread {g(part['spread'])}  gate {g(part['gate'])}")


def mlstm_details(case: dict, device: str = "cuda") -> list[str]:
    """Element by element, for an mLSTM case: i, f, our stabiliser m_t and normaliser, and di, df of
    ours, eager and float64 (the largest ten errors of each)."""
    from kcollect.kernels.mlstm import MLSTMFunction
    from lab.awkward import cells, common

    s = cells.subject(case, device)
    _, want_grads, dys = common._reference(s)
    names = list(s.grad_inputs)
    runs = {"ours": common._run(s.ours, s, dys), "eager": common._run(s.eager, s, dys)}
    inputs = s.make_inputs()
    with torch.no_grad():  # the stabiliser and normaliser our forward saves for the backward
        q, k, v, i, f = (inputs[n] for n in ("q", "k", "v", "i", "f"))
        saved = {}

        class Probe(torch.autograd.function.FunctionCtx):
            def save_for_backward(self, *xs):
                saved["xs"] = xs

            def mark_non_differentiable(self, *xs):
                pass

        flat = (x.contiguous() for x in (q, k, v, i, f))
        MLSTMFunction.forward(Probe(), *flat, inputs["resets"], None)
        mo, den = saved["xs"][-2], saved["xs"][-1]
    lines = []
    for name in ("i", "f"):
        j = names.index(name)
        want = want_grads[j].flatten()
        ours, eager = (r.grads[j].flatten().double() if r.grads else None for r in runs.values())
        err = (ours - want).abs()
        for e in err.argsort(descending=True)[:10].tolist():
            lines.append(f"    d{name}[{e}]: i {i.flatten()[e].item():.6g} f {f.flatten()[e].item():.6g} "
                         f"m {mo.flatten()[e].item():.6g} den {den.flatten()[e].item():.6g}  ours "
                         f"{ours[e].item():.6g} eager {eager[e].item() if eager is not None else float('nan'):.6g} "
                         f"float64 {want[e].item():.6g}")
    return lines


def _force_dot(mode: int) -> None:
    """Every cell kernel's fp32 tl.dot in one mode (the modules' own name for kernels/_host/dot.py's
    dot_f32, replaced)."""
    import importlib

    from kcollect.kernels._host import dot

    def forced(dtype, device, fp32=dot.IEEE):
        return dot.dot_f32(dtype, device, mode)

    for name in ("lstm.sequence", "slstm.sequence", "mlstm"):
        importlib.import_module(f"kcollect.kernels.{name}").dot_f32 = forced


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--fresh", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=170.0)
    ap.add_argument("--dot", choices=("picked", "ieee", "tf32x3"), default="picked",
                    help="how every cell kernel's fp32 tl.dot multiplies (kernels/_host/dot.py), to compare")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("repro_cells_fp32: needs a CUDA GPU (it checks the compiled kernels)", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    from lab.awkward import cells

    args.out.mkdir(parents=True, exist_ok=True)
    text = open(args.out / "repro_cells_fp32.txt", "w")
    rows = open(args.out / "repro_cells_fp32.jsonl", "w")

    def say(line: str) -> None:
        print(line, flush=True)
        text.write(line + "\n")

    if args.dot != "picked":
        _force_dot({"ieee": 1, "tf32x3": 3}[args.dot])
    say(f"repro_cells_fp32 on {torch.cuda.get_device_name()}, torch {torch.__version__}, fp32 dot {args.dot}")
    start = time.time()
    # narrow heads first: a wide fp32 head's kernels compile for a minute or more, so they come last
    cases = sorted([("listed", c) for c in listed_cases()] + [("fresh", c) for c in fresh_cases(args.fresh, args.seed)],
                   key=lambda oc: (oc[0] != "listed", _width(oc[1])))
    for origin, case in cases:
        if time.time() - start > args.time_limit:
            say(f"time limit: {origin} case {case['seed']} and the rest not run")
            break
        t0 = time.time()
        try:
            verdict = cells.check(case, "cuda")
        except Exception as e:  # noqa: BLE001 (one case's failure is a finding, not the end)
            verdict = {"status": "crash", "message": f"{type(e).__name__}: {e}"[:400]}
        say(f"{origin} {case['op']} {case['dtype']} {case['dims']} {case['options']} seed {case['seed']}: "
            f"{verdict['status']} ({time.time() - t0:.1f} s) {verdict.get('message') or ''}")
        for part in verdict.get("parts", []):
            say(_line(part))
        if case["op"] == "mlstm" and case["options"]["gates"] == "wild":
            try:
                for line in mlstm_details(case):
                    say(line)
            except Exception as e:  # noqa: BLE001
                say(f"    (details failed: {type(e).__name__}: {e})")
        rows.write(json.dumps({"origin": origin, "case": case, "verdict": verdict}, default=str) + "\n")
        rows.flush()
    say(f"done in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
