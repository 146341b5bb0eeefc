"""`kcollect run --changed [REF]`: the kernels whose code or method differs from REF (default: each
kernel's own last commit measured on this machine, on this grid, that HEAD descends from; a kernel
never measured here runs), each over its whole grid, plus the sentinels, a few fixed series of
cheap kernels measured at every such run with every provider: the other providers' code never
changes between our commits, so their points say how the machine moved (its drift) at a commit
whose own kernels did not all run, and the verdicts correct by it.

Whose code changed is decided as the verdicts decide it (codechange.Repo: the files a kernel's
providers import, and its spec's method files; an edit of the timing harness, codechange.HARNESS,
changes every kernel's method, so every kernel runs). Where git cannot tell, every kernel runs.
Each kernel against its own last commit, not the machine's: a kernel that a run left out (a push
whose run was interrupted, a run of some kernels by name) is measured at the next, not skipped for
good (backbone, lstm, rtu and slstm changed after the H200's last run of them at 11076cc, while
later commits were benchmarked for other kernels).
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
    ref: str | None  # the commit compared with (None: each kernel's own, or none found: everything runs)
    kernels: dict[str, str]  # kernel -> 'changed', 'method', 'new' (never measured here) or 'unknown' (git
    # could not tell)
    sentinels: tuple[tuple[str, tuple[str, ...]], ...]  # (kernel, shapes) not already in `kernels`
    note: str  # one line for the run's log

    @property
    def names(self) -> list[str]:
        return list(self.kernels) + [k for k, _ in self.sentinels]


def last_measured(store, head: str, device: str, machine: str | None, grid: str, root=".") -> dict[str, str]:
    """{kernel: the newest commit (by commit time) that HEAD descends from with a row of the kernel's
    own providers in a run of this machine on `grid`}."""
    if store is None:
        return {}
    where, args = machine_filter(device, machine)
    rows = store.query(f"SELECT r.kernel, u.git_commit, max(u.commit_time) AS t FROM results r JOIN runs u USING (run_id) "
                       f"WHERE {where} AND u.grid = ? AND r.ours AND u.git_commit IS NOT NULL "
                       "GROUP BY r.kernel, u.git_commit ORDER BY t DESC NULLS LAST", [*args, grid])
    ancestor: dict[str, bool] = {}
    last: dict[str, str] = {}
    for r in rows:
        sha = r["git_commit"]
        if r["kernel"] in last:
            continue
        if sha not in ancestor:
            ancestor[sha] = git(root, "merge-base", "--is-ancestor", sha, head) is not None
        if ancestor[sha]:
            last[r["kernel"]] = sha
    return last


def select_each(specs, last: dict[str, str], head: str, grid: str = "full", root=".") -> Selection:
    """`select` with each kernel against its own last measured commit (`last_measured`): those whose
    code or method changed since, and those never measured here ('new')."""
    if not last:
        return select(specs, None, head, grid, root)
    repo, changes, kernels = Repo(root), {}, {}
    for spec in specs:
        ref = last.get(spec.name)
        if ref is None:
            kernels[spec.name] = "new"
            continue
        if ref not in changes:
            changes[ref] = repo.changed_kernels(ref, head)
        status = "unknown" if changes[ref] is None else changes[ref].get(spec.name)
        if status is not None:
            kernels[spec.name] = status
    since = ", ".join(_label(k, s, f" since {last[k][:12]}" if k in last else "") for k, s in kernels.items())
    return _with_sentinels(specs, None, kernels, grid, f"--changed since each kernel's last run here: {since or 'none'}")


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
    listed = ", ".join(_label(k, s) for k, s in kernels.items()) or "none"
    return _with_sentinels(specs, ref, kernels, grid, f"--changed since {ref[:12]}: {listed}")


def _label(kernel: str, status: str, since: str = "") -> str:
    """'rtu (code)', 'swiglu (method since 1a2b3c4d5e6f)': a selected kernel in the run's note."""
    return f"{kernel} ({'code' if status == CHANGED else status}{since})"


def _with_sentinels(specs, ref: str | None, kernels: dict[str, str], grid: str, note: str) -> Selection:
    """The selection of `kernels` and the sentinels not among them (their full-grid shapes, or on
    the quick grid each sentinel kernel's first quick shape)."""
    known = {s.name: s for s in specs}
    by_kernel: dict[str, tuple[str, ...]] = {}
    for kernel, shape in SENTINELS:
        if kernel in known and kernel not in kernels:
            shape = shape if grid == "full" else known[kernel].grid(grid)[0].label
            if shape not in by_kernel.get(kernel, ()):
                by_kernel[kernel] = by_kernel.get(kernel, ()) + (shape,)
    note += "; sentinels: " + (", ".join(f"{k} {s}" for k, shapes in by_kernel.items() for s in shapes)
                               or "in the kernels above")
    return Selection(ref, kernels, tuple(by_kernel.items()), note)
