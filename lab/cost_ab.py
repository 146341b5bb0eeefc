"""Before and after the measuring changes in lab/cost_ab.patch, on one GPU: the same `kcollect run`
arguments and seed measured by a copy of this tree with the patch taken back (before) and by the
tree as it is (after), one after the other, each a fresh run into its own store. Prints each run's
wall time and, row by row, the seconds of both with the ratio of their medians (lab/grid_cost.py
--against), so that a change that moved the times would show.

    OUT_DIR=$OUT bash lab/gpu_call.sh 'python3 -m lab.cost_ab rtu selective_scan --provider cortex_torch'

Writes before.duckdb, after.duckdb and their logs under $JOB_OUT (default: a temporary folder).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "lab" / "cost_ab.patch"
SEED = "20261128"


def hunks(patch: str) -> list[tuple[str, str, str]]:
    """(file, its text after, its text before) of each hunk of a unified diff."""
    out, path, new, old = [], None, [], []
    for line in patch.splitlines(keepends=True) + ["@@ end\n"]:
        if line.startswith(("@@", "diff ", "--- ", "+++ ")):
            if new or old:
                out.append((path, "".join(new), "".join(old)))
            new, old = [], []
            if line.startswith("+++ "):
                path = line[4:].strip().removeprefix("b/")
        elif line.startswith((" ", "+", "-")) and path:
            (new if line[0] != "-" else []).append(line[1:])
            (old if line[0] != "+" else []).append(line[1:])
    return out


def take_back(tree: Path, patch: str) -> None:
    """Undoes the patch in `tree`: each hunk's text after, found exactly once, becomes its text before."""
    for path, new, old in hunks(patch):
        f = tree / path
        text = f.read_text()
        if text.count(new) != 1:
            sys.exit(f"cost_ab: {path}: a hunk of {PATCH.name} is not in this tree; nothing measured")
        f.write_text(text.replace(new, old))


def before_tree() -> Path:
    """A copy of the tree with the patch taken back, importable as `kcollect` from the folder returned."""
    base = Path(tempfile.mkdtemp(prefix="kc_before_"))
    tree = base / "tree"
    for name in ("collector", "kernels", "templates"):
        shutil.copytree(ROOT / name, tree / name, symlinks=True)
    take_back(tree, PATCH.read_text())
    # as the editable install maps them: kcollect -> collector/, kcollect.kernels -> kernels/, ...
    (tree / "collector" / "kernels").symlink_to(tree / "kernels")
    (tree / "collector" / "templates").symlink_to(tree / "templates")
    (base / "path").mkdir()
    (base / "path" / "kcollect").symlink_to(tree / "collector")
    return base / "path"


def measure(name: str, path: str | None, args: list[str], out: Path) -> None:
    env = dict(os.environ)
    if path:  # a folder on PYTHONPATH comes before the editable install's finder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    where = subprocess.run([sys.executable, "-c", "import kcollect; print(kcollect.__file__)"], env=env,
                           capture_output=True, text=True).stdout.strip()
    if path and not where.startswith(path):
        sys.exit(f"cost_ab: {name}: kcollect comes from {where or 'nowhere'}, not the copy; nothing measured")
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.call([sys.executable, "-m", "kcollect.cli", "run", *args, "--seed", SEED, "--precompile", "0",
                                "--db", str(out / f"{name}.duckdb")], env=env, stdout=log, stderr=subprocess.STDOUT,
                               cwd=ROOT)
    tail = (out / f"{name}.log").read_text().strip().splitlines()[-1:]
    print(f"cost_ab: {name} (kcollect from {where}): exit {code}, wall {time.perf_counter() - t0:.1f} s: "
          f"kcollect run {' '.join(args)}; {' '.join(tail)}", flush=True)


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        sys.exit(__doc__)
    out = Path(os.environ.get("JOB_OUT") or tempfile.mkdtemp(prefix="cost_ab_"))
    out.mkdir(parents=True, exist_ok=True)
    measure("before", str(before_tree()), args, out)
    measure("after", None, args, out)
    if (out / "before.duckdb").exists() and (out / "after.duckdb").exists():
        subprocess.call([sys.executable, "-m", "lab.grid_cost", "--db", str(out / "after.duckdb"), "--against",
                         str(out / "before.duckdb")], cwd=ROOT)


if __name__ == "__main__":
    main()
