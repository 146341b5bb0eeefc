"""`kcollect run --changed [REF]`: the kernels whose code or method differs from REF (default: the last
commit this machine benchmarked that HEAD descends from), each over its whole grid, plus the
sentinels, a few fixed series of cheap kernels measured at every such run with every provider: the
other providers' code never changes between our commits, so their points say how the machine moved
(its drift) at a commit whose own kernels did not all run, and the verdicts correct by it.

Whose code changed is decided as the verdicts decide it (codechange.Repo: the files a kernel's
providers import, and its spec's method files; an edit of the timing harness, codechange.HARNESS,
changes every kernel's method, so every kernel runs). Where git cannot tell, every kernel runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from .codechange import CHANGED, Repo, git
from .schedule import machine_filter

# (kernel, shape of its full grid): a bandwidth-bound row, a launch-bound one (a CPU or driver that
# got slower shows there first), a reduction, and an elementwise op; about a minute warm on an H100.
SENTINELS = (("rms_norm", "M=8192,N=4096"), ("rms_norm", "M=1,N=4096"), ("softmax", "M=4096,N=4096"),
             ("gelu", "M=16384,N=4096,approx=tanh"))


@dataclass(frozen=True)
class Selection:
    ref: str | None  # the commit compared with (None: none found, everything runs)
    kernels: dict[str, str]  # kernel -> 'changed' or 'method' (or 'unknown' where git could not tell)
    sentinels: tuple[tuple[str, tuple[str, ...]], ...]  # (kernel, shapes) not already in `kernels`
    note: str  # one line for the run's log

    @property
    def names(self) -> list[str]:
        return list(self.kernels) + [k for k, _ in self.sentinels]


def last_benchmarked(store, head: str, device: str, machine: str | None, root=".") -> str | None:
    """The newest commit (by commit time) with a run on this machine that HEAD descends from."""
    if store is None:
        return None
    where, args = machine_filter(device, machine)
    rows = store.query(f"SELECT git_commit, max(commit_time) AS t FROM runs u WHERE {where} AND git_commit IS NOT NULL "
                       "GROUP BY git_commit ORDER BY t DESC NULLS LAST", args)
    for r in rows:
        if git(root, "merge-base", "--is-ancestor", r["git_commit"], head) is not None:
            return r["git_commit"]
    return None


def select(specs, ref: str | None, head: str, grid: str = "full", root=".") -> Selection:
    """What `run --changed` measures, of the registry's kernels `specs`, from `ref` to `head`; the
    sentinels at their full-grid shapes, or on the quick grid (the CPU) at its first shape."""
    known = {s.name: s for s in specs}
    changes = Repo(root).changed_kernels(ref, head) if ref else None
    if changes is None:
        why = (f"git cannot tell what changed from {ref[:12]}" if ref else
               "no benchmarked commit of this machine that HEAD descends from")
        return Selection(ref, {k: "unknown" for k in known}, (), f"--changed: {why}; measuring every kernel")
    kernels = {k: s for k, s in changes.items() if k in known}
    by_kernel: dict[str, tuple[str, ...]] = {}
    for kernel, shape in SENTINELS:
        if kernel in known and kernel not in kernels:
            shape = shape if grid == "full" else known[kernel].grid(grid)[0].label
            if shape not in by_kernel.get(kernel, ()):
                by_kernel[kernel] = by_kernel.get(kernel, ()) + (shape,)
    listed = ", ".join(f"{k} ({'code' if s == CHANGED else s})" for k, s in kernels.items()) or "none"
    note = (f"--changed since {ref[:12]}: {listed}; sentinels: "
            + (", ".join(f"{k} {s}" for k, shapes in by_kernel.items() for s in shapes) or "in the kernels above"))
    return Selection(ref, kernels, tuple(by_kernel.items()), note)
