"""The launches and SASS of gelu, geglu, swiglu, rope and fp8_quant on an emulated H100 and H200
(lab/fingerprint.py): every full-grid shape x every mode, in bf16 and fp32. Run it on two trees and
compare the files: equal tables mean the same binaries launched the same way.

    python lab/elementwise_fingerprint.py --out before.json          # a few minutes of CPU
    python lab/elementwise_fingerprint.py --compare before.json after.json [--dropped NC]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab import fingerprint as fp  # noqa: E402  (first: compiles for the GPU, not the interpreter)

from kcollect.registry import builtin_spec  # noqa: E402
from kcollect.spec import DTYPES  # noqa: E402

OPS = ("gelu", "geglu", "swiglu", "rope", "fp8_quant")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the table (JSON) here")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated ops (default {','.join(OPS)})")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated dtypes (default bfloat16,float32)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two tables")
    ap.add_argument("--dropped", default="", help="comma-separated constexprs the change removed (compared without)")
    args = ap.parse_args()
    if args.compare:
        before, after = (json.load(open(p)) for p in args.compare)
        diffs = fp.compare(before, after, tuple(n for n in args.dropped.split(",") if n))
        print("\n".join(diffs))
        binaries = {launch["sass"] for rows in after.values() for launch in rows}
        print(f"{len(after)} cases, {sum(map(len, after.values()))} launches, {len(binaries)} distinct binaries; "
              f"{len(diffs)} cases differ")
        return 1 if diffs else 0
    if not args.out:
        ap.error("give --out FILE or --compare BEFORE AFTER")
    rows = {}
    for op in args.ops.split(","):
        spec = builtin_spec(op)
        print(f"{op}: {len(spec.grids['full'])} shapes x {spec.modes}", flush=True)
        dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
        rows.update(fp.table(spec, spec.grids["full"], spec.modes, dtypes, log=lambda m: print(m, flush=True)))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1, sort_keys=True)
    print(f"{len(rows)} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
