"""The process `kcollect compare --confirm` keeps in a git worktree of one commit.

It runs that commit's own `kcollect run` (its collector and its kernels, or, in a repository that
is not kcollect's, the installed kcollect with the worktree's files for `--kernel-module`) once each
time it reads a line on stdin, and answers `done <exit status>` on stdout; everything the run prints
goes to stderr. One process per side for all rounds, so that torch, Triton and the kernels are
imported and compiled once and the rounds stay short; the caller alternates the two sides.

Only the cases being confirmed are measured: one `kcollect run` per kernel each round, restricted to
the shape labels given with --cases by the commit's own `--shape` or, in commits that predate it,
its `--where DIM=VALUE` (the labels' dims: a superset of the cases, which the caller picks by key)
and, where the plan is made in this process (the CPU), its plan filtered to the cases. The
measuring processes a GPU run spawns plan afresh: a filter patched into this process alone would
let each round measure the kernel's whole grid. Commits from before the named
shape labels (schema 1) run too: the label is made from the shape's dims, and the caller migrates
the run's store when it reads it.

Standalone on purpose: it must import the kcollect of the worktree, not the caller's, so it is run
as a file and imports nothing of kcollect before it has pointed the imports at the worktree.
"""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path


class Tree(importlib.abc.MetaPathFinder):
    """`kcollect` -> <root>/collector and `kcollect.kernels` -> <root>/kernels, as the package's
    setuptools mapping does for an installed checkout. It answers for every `kcollect.*` module, so
    that none falls through to the caller's installed kcollect (whose editable finder would find
    `kcollect.store` in the caller's checkout)."""

    def __init__(self, root: Path):
        self.root = root
        self.folders = {"kcollect": root / "collector", "kcollect.kernels": root / "kernels",
                        "kcollect.templates": root / "templates"}

    def find_spec(self, name, path=None, target=None):
        if name != "kcollect" and not name.startswith("kcollect."):
            return None
        folder = self.folders.get(name)
        if folder is not None and (folder / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
        spec = importlib.machinery.PathFinder.find_spec(name, path) if path else None
        if spec is None:
            raise ModuleNotFoundError(f"no module named {name!r} in the worktree {self.root}", name=name)
        return spec


def shim(root: Path) -> Path:
    """A folder holding a package `kcollect` that is the worktree's (collector/ as the package, its
    kernels/ and templates/ beside), for processes that start without Tree: spawned children import
    by sys.path, where the caller's editable install would otherwise answer."""
    folder = Path(tempfile.mkdtemp(prefix="kcollect-tree-")) / "kcollect"
    folder.mkdir()
    tree = str(root)
    (folder / "__init__.py").write_text(
        f"# kcollect as the worktree {tree} has it (written by confirm_worker.shim)\n"
        "import os as _os\n"
        f"__path__ = [_os.path.join({tree!r}, 'collector'), {tree!r}]\n"
        f"__file__ = _os.path.join({tree!r}, 'collector', '__init__.py')\n"
        "with open(__file__) as _f:\n"
        "    exec(compile(_f.read(), __file__, 'exec'))\n")
    atexit.register(shutil.rmtree, folder.parent, True)
    return folder.parent


def filter_plan(wanted: set[tuple[str, str, str]]) -> None:
    """This process's plan (kcollect.plan.plan, which the run imports when it plans, and the name
    runner.py re-exports): only the wanted cases, from whichever grid of the kernel holds them."""
    import kcollect.runner as runner
    from kcollect.spec import DTYPE_NAMES

    try:
        import kcollect.plan as planning
    except ImportError:  # commits whose runner.py made the plan
        planning = runner
    plan = planning.plan

    def only_wanted(specs, config):
        cases, seen = [], set()
        for spec in specs:
            for grid in spec.grids:
                for case in plan([spec], dataclasses.replace(config, grid=grid)):
                    # the label with the dims' names, as the store keeps it (older commits label 4096x14336)
                    label = ",".join(f"{k}={v}" for k, v in case.shape.dims.items())
                    key = (case.spec.name, label, DTYPE_NAMES.get(case.dtype, str(case.dtype)))
                    if key in wanted and key not in seen:
                        seen.add(key)
                        cases.append(case)
        return cases

    planning.plan = runner.plan = only_wanted


def filter_args(run_command, labels: list[str]) -> list[str]:
    """The commit's own options that keep only these shapes: --shape each label, or, before it
    existed, --where each of the labels' dims' values (their product may hold more shapes)."""
    options = {o for p in run_command.params for o in getattr(p, "opts", ())}
    if "--shape" in options:
        return [a for label in labels for a in ("--shape", label)]
    if "--where" not in options:
        return []
    values: dict[str, list[str]] = {}
    for label in labels:
        for part in label.split(","):
            name, _, value = part.partition("=")
            if value and value not in values.setdefault(name, []):
                values[name].append(value)
    return [a for name, vs in values.items() for v in vs for a in ("--where", f"{name}={v}")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="the worktree of the commit")
    ap.add_argument("--cases", required=True, help="JSON list of [kernel, shape label, dtype]")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="`kcollect run` arguments")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    if (root / "collector" / "__init__.py").is_file():
        sys.meta_path.insert(0, Tree(root))
        paths = [str(shim(root))]
    else:
        paths = [str(root), str(root / "src")]
    # the processes the run starts (a GPU's measuring processes, the precompile pass) import kcollect
    # afresh: through these paths they import the worktree's, not the caller's installed one
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    os.chdir(root)
    run_args = [a for a in args.run_args if a != "--"]  # run, then its options (no kernel: see calls)
    if "cpu" in run_args[run_args.index("--device") + 1:run_args.index("--device") + 2]:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    from kcollect.cli import main as cli

    cases = [tuple(c) for c in json.loads(args.cases)]
    filter_plan(set(cases))
    labels: dict[str, list[str]] = {}
    for kernel, label, _ in cases:
        if label not in labels.setdefault(kernel, []):
            labels[kernel].append(label)
    run_command = cli.commands["run"]
    calls = [[run_args[0], kernel, *filter_args(run_command, shapes), *run_args[1:]] for kernel, shapes in labels.items()]
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the run prints (and any library below it) goes to the log, not the replies
    sys.stdout = sys.stderr
    for _ in sys.stdin:
        worst = 0
        for call in calls:
            try:
                cli.main(args=call, prog_name="kcollect", standalone_mode=False)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
            worst = worst or code
        reply.write(f"done {worst}\n")
        reply.flush()


if __name__ == "__main__":
    main()
