"""Check again, on this machine, the worst cases a sweep's results file lists (its "worst cases"
lines), op by op: python -m lab.awkward.recheck FILE OP... [--device cuda]. Prints each case's
status and its parts' errors against float64 (ours / eager); exits 1 when any is not ok."""
from __future__ import annotations

import argparse
import json
import os
import sys

from pathlib import Path

from . import sweep


def worst_cases(path: str, ops: set[str]) -> list[dict]:
    """The case dicts FILE lists under its worst cases (sweep.worst_cases) whose op is in `ops`."""
    return [c for c in sweep.worst_cases(Path(path)) if c.get("op") in ops]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.awkward.recheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("ops", nargs="+", choices=[o for f in sweep.FAMILIES for o in sweep.ops_of(f)])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "cpu":  # Triton's interpreter, set before the families import the kernels
        os.environ["TRITON_INTERPRET"] = "1"
    bad = 0
    for case in worst_cases(args.file, set(args.ops)):
        family = next(f for f in sweep.FAMILIES if case["op"] in sweep.ops_of(f))
        verdict = sweep.family_module(family).check(case, args.device)
        bad += verdict["status"] not in ("ok", "refused")
        parts = " ".join(f"{p['name']} {p['ours']:.3g}/{p['eager']:.3g}" for p in verdict.get("parts", []))
        print(f"{verdict['status']}: {json.dumps(case)}\n    {parts}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
