"""Cold caches filled in parallel before a run measures anything (`kcollect run --precompile`).

A cold run spends most of its wall time in first calls: on one H100, 251 s of a 338 s run of the
memory-bound grid were torch.compile, Triton and CuTe DSL builds, made one after another by the
one process that measures. The builds land in the persistent caches (caches.py), so several
processes can make them first: each takes whole cases and calls every provider that builds code
(Provider.builds) once per mode, then drops the result (no check, no timing). The measuring pass
then finds its builds on disk. Nothing is timed while these processes run: they end before the
run measures its ceilings. On one H100 the same cold grid took 225 s with 8 such processes and
361 s without (runs a65c4eec and 43aebe2b, each from an empty cache).

Nothing tuned here is kept. The processes share the GPU, so a choice timed under their load
(Triton's autotuner in the peers that use it, inductor's pick among a kernel's configs) could be a
worse one: Triton's is not saved here, and inductor's saved picks are deleted at the end
(forget_tuning). The measuring pass makes those choices on a quiet GPU, as without this pass,
from builds that are already on disk.

A manifest in the cache folder (built.json) names each (kernel, mode, provider, shape, dtype)
built so far, keyed by the GPUs, torch and Triton, and the source of the kernel's folder (so a
change to a kernel builds that kernel again). A plan that is all in it (a warm run) starts no
process. A peer upgraded under the same torch is not seen: its builds are then made by the
measuring pass, one by one, as without this pass. A call that fails here counts as done (it
would fail again); one that crashes or hangs its process does not. Such a build the measuring
pass records at once as an `error` row saying so (Report.skips, Runner.skips), without calling it:
a hung one (past --measure-timeout, the measuring pass's own limit) would wait out the limit a
second time, and one that killed its process by a signal of its own (a compiler's assertion:
SIGABRT; SIGSEGV and the like) would kill a measuring process too, each a fresh process's start
(mlstm_kernels' builds under Triton 3.6 on an H200: 9 of them took a 75-row run past 5 minutes).
A process killed from outside (SIGKILL: out of host memory, under the pass's load) is not one of
those: the measuring pass calls its build again.

A build that repeats a hung or crashed one (FOLLOWS: the fwd+bwd of a backward that hung) is not
begun: it would hang or crash as that one did, and is recorded beside it. Once every case has
begun, a build in flight for TAIL_FACTOR times the longest build finished (TAIL_MIN_S at least)
counts as hung too: the whole pass would otherwise wait on it alone, up to --measure-timeout.

A hung or crashed build is remembered (lost.json beside the manifest, under the manifest's key and
the version of the peer package it calls): a later run's pass neither builds it again nor leaves it
to the measuring pass, which records it as an `error` row saying so, without calling it. Otherwise
every warm run paid for it again: a warm plan leaves too few builds for the pass to start a
process (processes()), so the measuring pass met them itself, a hung one for --measure-timeout
(Cortex's LSTM backward at one shape: 300 s on an H200) and each crash a measuring process. A new
peer version, kernel source, torch, Triton or GPU tries it again; so does deleting the file.

The pass waits on no process without a bound, so that its progress lines go on and its limits hold
whatever a build does: a killed process is reaped once it is gone (one inside the GPU driver goes
only when the driver lets it), and at the end each gets REAP_S before it is named and left behind.
`--precompile-limit` bounds the whole pass, for a run with a time budget: what it has not built by
then, the builds in flight included, the measuring pass builds as it meets them, each within its
own --measure-timeout (such a build is not counted as hung: it may only have been slow). Ctrl-C or
SIGTERM in the pass names each build in flight and for how long, so that a stuck one is seen.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

from .plan import Case, RunConfig
from .spawn import start_quietly

# Processes per GPU the run uses, one a core: on a one-H200 host of 16 cores the whole grid's 1847
# cold builds took 243.5 s in 16 processes (run 54b380fd) against 326.7 s in 8 (1c1d4661); on a 4x
# H200 host the full grid's 2111 took 150 s in 30 processes, 239 of 240 cases 366 s in 8 on three GPUs.
PROCS_MAX = 16
# Each process holds torch, inductor and the peers' compilers: the one-H200 host's memory in use
# peaked at 27.7 GiB during the run with 16 (1.7 GiB a process at most); this is that, doubled and
# rounded up, as a margin (a 32 GiB workstation gets 8).
HOST_GIB_PER_PROC = 4
# Fewer units than this per process: not worth a process's start (imports, CUDA), seconds each.
UNITS_PER_PROC = 2
MANIFEST = "built.json"
LOST = "lost.json"  # the builds that hung or crashed the pass: {key and peer version: the error row's text}
# A process's start (torch, the registry, CUDA) is not its case's time: `timeout` counts from its
# "ready", and the start gets at least this (a loaded 2-core machine takes more than 5 s for it).
STARTUP_S = 300.0
# Once every case has begun, a build in flight for TAIL_FACTOR times the longest build the pass
# finished, and TAIL_MIN_S at least, counts as hung (as past --measure-timeout): the pass would
# otherwise wait on it alone. A cold whole grid on an H200 (run b021ddd6, 14 processes) had every
# case but one built by 197 s, then waited 196 s more on Cortex's LSTM backward at one shape until
# the 300 s limit; its longest finished build took 49 s (61 s in the cold run before it).
TAIL_FACTOR = 2.5
TAIL_MIN_S = 120.0
# The pass's clock (seconds); tests inject their own to check the time limits without waiting.
clock = time.monotonic


@dataclass
class Report:
    seconds: float = 0.0
    planned: int = 0  # units the plan builds
    todo: int = 0  # of which not in the manifest
    built: int = 0
    # seconds of each build made: {(kernel, shape label, dtype, mode, provider): s}, for where a
    # cold pass's time goes (the slowest are named at its end)
    times: dict = field(default_factory=dict)
    # the builds killed when they passed the limit, same keys: seconds each ran
    hung: dict = field(default_factory=dict)
    # the builds whose process died of a signal of its own (CRASH_SIGNALS), same keys: why
    crashed: dict = field(default_factory=dict)

    # the builds not begun because one they repeat hung or crashed (FOLLOWS), same keys: the error row's text
    follows: dict = field(default_factory=dict)
    # the builds that hung or crashed an earlier run's pass (lost.json), same keys: the error row's text
    known: dict = field(default_factory=dict)

    def skips(self) -> dict:
        """{key: the error row's text} of the builds the measuring pass records without calling
        them (Runner.skips)."""
        out = dict(self.known)
        out.update((k, f"its build hung in the precompile pass for {s:.0f} s") for k, s in self.hung.items())
        out.update((k, f"its build crashed the precompile pass's process: {why}") for k, why in self.crashed.items())
        out.update(self.follows)
        return out


# A mode whose first call runs another's calls again, so that it hangs or crashes where that one did:
# fwd+bwd is bwd's forward and backward. (fwd is not bwd's forward: bwd runs it with gradients.)
# A cold H200 pass waited out Cortex's LSTM backward at one shape for --measure-timeout, then its
# fwd+bwd, requeued to a fresh process, for as long again: 150 s of the pass's 500.
FOLLOWS = {"bwd": ("fwd+bwd",)}


def followers(building: tuple[str, str], rest: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The builds among `rest` that repeat the hung or crashed `building` (mode, provider)."""
    mode, provider = building
    return [(m, p) for m, p in rest if p == provider and m in FOLLOWS.get(mode, ())]


# Deaths a build causes itself (a compiler's assertion aborts; a bad access faults), which would
# kill a measuring process the same way
CRASH_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)


def default_procs(device: str, gpus: int = 1) -> int:
    """On a GPU, a process per core and per HOST_GIB_PER_PROC of memory, 2 to PROCS_MAX per GPU of
    the run; on the CPU none (its interpreter builds nothing that a cache keeps)."""
    if device != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        gib = HOST_GIB_PER_PROC * PROCS_MAX * gpus
    return max(2, min(PROCS_MAX * max(1, gpus), cores, int(gib // HOST_GIB_PER_PROC)))


def units(cases: list[Case], indices: list[int], config: RunConfig) -> dict[int, list[tuple[str, str]]]:
    """case index -> the (mode, provider) pairs whose first call builds code."""
    off = dict(config.unavailable)
    out = {}
    for i in indices:
        case = cases[i]
        pairs = [(m, p) for m in case.modes for p in case.providers
                 if p not in off and case.spec.provider(p).builds]
        if pairs:
            out[i] = pairs
    return out


def manifest_path() -> Path:
    from .caches import default_root

    return default_root() / MANIFEST


def _read(path: Path) -> set[str]:
    try:
        return set(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def lost_key(case: Case, provider: str, key_: str) -> str:
    """A lost build's entry: its manifest key and the version of the peer package it calls."""
    package = case.spec.provider(provider).package
    return f"{key_} | {package} {_version(package)}".rstrip() if package else key_


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str:
    """A distribution's version ('' where it is not installed), once per package: every planned
    build of a peer asks, twice a run (pending and run)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _read_lost(path: Path) -> dict[str, str]:
    try:
        got = json.loads(path.read_text())
        return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _write_lost(path: Path, lost: dict[str, str]) -> None:
    """Adds entries to lost.json (another run may have added some meanwhile), atomically."""
    lost = {**_read_lost(path), **lost}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".lost-")
    with os.fdopen(fd, "w") as f:
        json.dump(lost, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def _write(path: Path, keys: set[str]) -> None:
    """Adds keys to the manifest (another run may have added some meanwhile), atomically."""
    keys = keys | _read(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".built-")
    with os.fdopen(fd, "w") as f:
        json.dump(sorted(keys), f)
    os.replace(tmp, path)


def stack(device: str) -> str:
    """What every build depends on: the GPUs (by name, without touching CUDA here), torch, Triton."""
    gpus = "cpu"
    if device == "cuda":
        try:
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                   text=True, timeout=30).stdout.split("\n")
            gpus = "+".join(sorted({n.strip() for n in names if n.strip()})) or "cuda"
        except (OSError, subprocess.SubprocessError):
            gpus = "cuda"
    versions = []
    for dist in ("torch", "triton", "pytorch-triton"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return f"{gpus} | {', '.join(versions)}"


COLLECTOR = Path(__file__).resolve().parent
SHARED = ("_jit", "_host", "_spec")  # what several ops of kernels/ share, beside their folders


def source_hash(case: Case, memo: dict[str, str]) -> str:
    """A hash of the .py files of the folders the kernel's code is in (kernels/<op>/, and the
    shared folders beside it: _jit, _host, _spec), found from its reference, inputs and providers;
    the collector's own folder (where torch.compile's wrapper lives) is left out: a change there
    builds nothing anew."""
    spec = case.spec
    if spec.name not in memo:
        folders = set()
        for fn in (spec.reference, spec.make_inputs, *(p.fn for p in spec.providers)):
            try:
                folder = Path(inspect.getfile(fn)).resolve().parent
            except TypeError:  # a builtin or a partial: no source of its own
                continue
            if folder != COLLECTOR:
                folders.update({folder, *(d for d in map(folder.parent.joinpath, SHARED) if d.is_dir())})
        h = hashlib.sha1()
        for folder in sorted(folders):
            for f in sorted(folder.glob("*.py")):
                h.update(f.name.encode() + f.read_bytes())
        memo[spec.name] = h.hexdigest()[:16]
    return memo[spec.name]


def key(case: Case, mode: str, provider: str, stack_: str, memo: dict[str, str]) -> str:
    from .spec import DTYPE_NAMES

    return (f"{stack_} | {source_hash(case, memo)} | {case.spec.name} {mode} {provider} {case.shape.label} "
            f"{DTYPE_NAMES[case.dtype]}")


def run(config: RunConfig, cases: list[Case], planned: tuple[dict, dict], kernel_modules, procs: int,
        visible: list[str | None], say: Callable[[str], None], timeout: float | None = None) -> Report:
    """Builds `planned`'s builds that the manifest lacks (pending()'s answer for the run's cases, which
    its estimate read too) in `procs` processes, spread over the
    `visible` devices (CUDA_VISIBLE_DEVICES values; None: this process's own), each build at most
    `timeout` seconds (a hung peer's build costs that, not the whole case's share), the whole pass
    at most config.precompile_limit seconds (what it has not built then is the run's to build).
    Ctrl-C or SIGTERM stops every process, names the builds in flight and raises KeyboardInterrupt."""
    t0 = time.perf_counter()
    report = Report()
    if procs <= 0:
        return report
    keys, todo = planned
    lost_path = manifest_path().with_name(LOST)
    report.known = _known(cases, keys, _read_lost(lost_path), lost_path)
    report.planned = len(keys)
    report.todo = sum(len(v) for v in todo.values())
    procs = processes(todo, procs)
    if not procs:
        if report.todo:
            say(f"precompile: {report.todo} of {report.planned} builds not in the caches; "
                "the run makes them as it meets them" + _skipped(report))
        elif report.known:
            say(f"precompile: every build in the caches{_skipped(report)}")
        return report
    path = manifest_path()
    order = _interleaved(cases, todo, config.device)
    say(f"precompile: {report.todo} of {report.planned} builds not in the caches; building them in {procs} "
        f"process{'es' if procs > 1 else ''} before measuring")
    built: set[str] = set()
    started = time.time()
    try:
        for index, pairs, seconds in _pool(config, kernel_modules, procs, visible, order, todo, timeout, say, t0,
                                           cases, report, config.precompile_limit):
            built.update(keys[index, m, p] for m, p in pairs)
            report.times.update(((*_label(cases[index]), m, p), s) for (m, p), s in zip(pairs, seconds))
    finally:
        forget_tuning(started)
        if report.times:
            say(slowest(report.times))
        if built:
            try:
                _write(path, built)
            except OSError as e:
                say(f"precompile: cannot write {path}: {e}")
        lost = _lost(cases, keys, report)
        if lost:
            try:
                _write_lost(lost_path, lost)
            except OSError as e:
                say(f"precompile: cannot write {lost_path}: {e}")
        report.seconds = time.perf_counter() - t0
    report.built = len(built)
    say(f"precompile: {report.built} of {report.todo} built in {report.seconds:.1f} s"
        + (f"; {report.todo - report.built} left to the run" if report.built < report.todo else "")
        + _skipped(report))
    return report


def _known(cases: list[Case], keys: dict, lost: dict[str, str], path: Path) -> dict:
    """Report.known: the planned builds that lost.json names (pending() left them out of the
    builds to make), with their error rows' text."""
    known = {}
    for (i, m, p), k in keys.items():
        why = lost.get(lost_key(cases[i], p, k))
        if why is not None:
            known[(*_label(cases[i]), m, p)] = f"{why} (in an earlier run here; {path} keeps it: delete it to try again)"
    return known


def _lost(cases: list[Case], keys: dict, report: Report) -> dict[str, str]:
    """lost.json's new entries: this pass's hung and crashed builds, and those that repeat them."""
    by_label = {(*_label(cases[i]), m, p): (cases[i], p, k) for (i, m, p), k in keys.items()}
    skips = report.skips()
    return {lost_key(*by_label[where]): skips[where] for where in (*report.hung, *report.crashed, *report.follows)
            if where in by_label}


def _skipped(report: Report) -> str:
    """The closing line's note of the builds the run records without calling them."""
    parts = [f"{len(report.hung)} hung"] * bool(report.hung) + [f"{len(report.crashed)} crashed"] * bool(report.crashed)
    n = len(report.follows)
    parts += [f"{n} that repeat{'s' * (n == 1)} one of them"] * bool(n)
    parts += [f"{len(report.known)} that hung or crashed an earlier pass"] * bool(report.known)
    return f"; {' and '.join(parts)} (the run records them as errors, without calling them)" if parts else ""


def _label(case: Case) -> tuple[str, str, str]:
    from .spec import DTYPE_NAMES

    return case.spec.name, case.shape.label, DTYPE_NAMES[case.dtype]


def slowest(times: dict, n: int = 5) -> str:
    """One line: the builds' seconds by kernel, largest first, and the n slowest builds."""
    by: dict[str, float] = {}
    for (kernel, *_), s in times.items():
        by[kernel] = by.get(kernel, 0.0) + s
    kernels = ", ".join(f"{k} {s:.0f} s" for k, s in sorted(by.items(), key=lambda kv: -kv[1]))
    builds = "; ".join(f"{k} {m} {p} {shape} {dt} {s:.0f} s" for (k, shape, dt, m, p), s in
                       sorted(times.items(), key=lambda kv: -kv[1])[:n])
    return f"precompile: build seconds by kernel: {kernels}; slowest: {builds}"


def pending(config: RunConfig, cases: list[Case], indices: list[int]) -> tuple[dict, dict[int, list[tuple[str, str]]]]:
    """The plan's builds, {(case index, mode, provider): manifest key}, and those of them the
    manifest lacks (the caches' cold part), case index -> (mode, provider) pairs. A build that hung
    or crashed an earlier pass (lost.json) is not among the latter: the run records it unbuilt."""
    planned = units(cases, indices, config)
    if not planned:
        return {}, {}
    stack_ = stack(config.device)
    memo: dict[str, str] = {}
    keys = {(i, m, p): key(cases[i], m, p, stack_, memo) for i, pairs in planned.items() for m, p in pairs}
    done, lost = _read(manifest_path()), _read_lost(manifest_path().with_name(LOST))
    todo: dict[int, list[tuple[str, str]]] = {}
    for (i, m, p), k in keys.items():
        if k not in done and lost_key(cases[i], p, k) not in lost:
            todo.setdefault(i, []).append((m, p))
    return keys, todo


def processes(todo: dict[int, list], procs: int) -> int:
    """How many processes the pass starts for `todo` with `procs` allowed: none where there are too
    few builds to be worth their start (the run makes them as it meets them), at most one a case."""
    if procs <= 0 or sum(len(v) for v in todo.values()) < UNITS_PER_PROC * procs:
        return 0
    return min(procs, len(todo))


def forget_tuning(since: float) -> int:
    """Deletes the choices inductor's kernels saved among their configs (.best_config files beside
    them) since `since` (time.time()): made under the pass's load, the measuring pass makes them
    again. (Switching the saving off in the pass instead would not do: inductor writes that switch
    into the kernels' generated code, which the cache keeps, and the measuring pass's kernels then
    never saved their choice: their first calls took 1.6x longer in every warm run.) How many."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    gone = 0
    for f in Path(root).rglob("*.best_config") if root and Path(root).is_dir() else ():
        try:
            if f.stat().st_mtime >= since:
                f.unlink()
                gone += 1
        except OSError:
            pass
    return gone


def _interleaved(cases: list[Case], todo, device: str) -> list[int]:
    """The cases kernel by kernel in turn, each kernel's costliest first: the processes work on
    different kernels at once (one kernel's largest cases together could fill the device), and
    the last cases to finish are short ones."""
    from itertools import chain, zip_longest

    from .schedule import case_cost

    by: dict[str, list[int]] = {}
    for i in sorted(todo, key=lambda i: -case_cost(cases[i], device)):
        by.setdefault(cases[i].spec.name, []).append(i)
    return [i for i in chain.from_iterable(zip_longest(*by.values())) if i is not None]


def _pool(config, kernel_modules, procs, visible, order, todo, timeout, say, t0, cases, report: Report,
          limit: float | None = None):
    """Yields (case index, the (mode, provider) pairs built, each one's seconds) as a process
    finishes a case, or dies or hangs in one. A process that dies, or spends more than `timeout` on
    one build, is replaced while cases are left, unless as many have died before they were ready as
    there are processes (they cannot start here: the pass ends). A build that passed `timeout` goes
    into `report.hung` (its keys: seconds it ran); one whose process died of a CRASH_SIGNALS
    signal into `report.crashed` (the signal and its last words), and those of its case that repeat
    it (followers) into `report.follows`, not begun. The builds its case had not begun go
    back to the front of the queue, for a fresh process: left to the measuring pass, each that
    crashes as its sibling did (mlstm_kernels' bwd and fwd+bwd under one LLVM assertion on an H200)
    killed a measuring process, whose start is tens of seconds, 6 times in one run. Past `limit`
    seconds in all the pass stops, its builds in flight left to the run. Nothing here waits on a
    process without a bound (see REAP_S), so that the progress lines go on and every limit is kept
    whatever a build does."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from .worker_log import Tail

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    threads = max(1, (os.cpu_count() or 2) // procs)
    queue = list(order)
    todo = dict(todo)  # a case's entry shrinks to the builds not begun when its process is lost
    signals: list[int] = []
    handlers = {s: signal.signal(s, lambda signum, _f: signals.append(signum)) for s in (signal.SIGINT,
                                                                                          signal.SIGTERM)}
    slots: list[dict] = []
    killed: list = []  # processes killed while the pass goes on, reaped when they are gone
    logs = tempfile.TemporaryDirectory(prefix="kcollect-precompile-")  # each process's standard error

    def start(n: int) -> dict:
        mine, theirs = ctx.Pipe()
        dev = visible[n % len(visible)] if visible else None
        tail = Tail(os.path.join(logs.name, f"{n}-{clock()}.log"))
        proc = ctx.Process(target=_worker, args=(config, kernel_modules, dev, threads, theirs, tail.path),
                           name=f"kcollect-precompile{n}", daemon=True)
        start_quietly(proc)  # no traceback from its start-up on a Ctrl-C (spawn.py)
        theirs.close()
        return dict(n=n, proc=proc, conn=mine, case=None, since=clock(), ready=False, building=None, tail=tail)

    def give(slot: dict) -> None:
        # (a send does not block: a process holds one task at a time, far below a pipe's buffer)
        slot["case"] = queue.pop(0) if queue else None
        slot["since"], slot["building"], slot["done"] = clock(), None, []
        tail = slot["tail"]  # its last words are this case's, and only they are shown (with a crash)
        tail.offset = os.path.getsize(tail.path)
        tail.mark(tail.offset)
        try:
            slot["conn"].send((slot["case"], todo[slot["case"]]) if slot["case"] is not None else None)
        except OSError:  # it has just died (a signal to the process group): the loop finds it dead
            pass

    def interrupted(live: list[dict]) -> None:
        if signals:
            say(f"precompile: interrupted; in flight: {_in_flight(live, cases) or 'none'}")
            raise KeyboardInterrupt

    began = last_say = clock()
    finished = unborn = 0
    longest = 0.0  # seconds of the longest build finished
    try:
        slots = [start(n) for n in range(procs)]
        for slot in slots:
            give(slot)
        while live := [s for s in slots if s["case"] is not None]:
            interrupted(live)
            if limit is not None and clock() - began > limit:
                say(f"precompile: stopped at its limit (--precompile-limit {limit:g} s); left to the run: "
                    f"{_in_flight(live, cases)}" + (f" and {len(queue)} cases not begun" if queue else ""))
                return  # the processes are stopped below; their builds are the measuring pass's
            wait([s["conn"] for s in live] + [s["proc"].sentinel for s in live], timeout=0.5)
            # before reading the deaths: a signal to the process group (`timeout`, Ctrl-C) kills the
            # processes too, and its builds in flight are the ones they died in
            interrupted(live)
            killed[:] = [p for p in killed if p.is_alive()]  # is_alive reaps, without waiting
            for slot in live:
                got = _messages(slot)
                longest = max([longest, *(sec for _, sec in slot["done"])])
                if got is not None:
                    finished += 1
                    longest = max([longest, *got[1]])
                    yield slot["case"], todo[slot["case"]], got[1]
                    give(slot)
                    continue
                alive = slot["proc"].is_alive()
                limit_now = timeout if queue else tail_limit(timeout, longest)
                if alive and not late(slot, clock(), limit_now):  # each build a measurement's
                    continue
                index, building = slot["case"], slot["building"]
                rest = todo[index][todo[index].index(building) + 1:] if building is not None else []
                if building is not None:
                    where, lost = (*_label(cases[index]), *building), None
                    if alive:  # hung in that build
                        report.hung[where], lost = clock() - slot["since"], "hung in the precompile pass"
                        if limit_now != timeout:
                            say(f"precompile: {' '.join(map(str, where))} built for {report.hung[where]:.0f} s, over "
                                f"{TAIL_FACTOR:g} times the longest build finished ({longest:.0f} s) with every case "
                                "begun: counted as hung")
                    elif -(slot["proc"].exitcode or 0) in CRASH_SIGNALS:
                        report.crashed[where], lost = _crash(slot), "crashed the precompile pass's process"
                    for pair in followers(building, rest) if lost else ():
                        rest.remove(pair)
                        report.follows[(*_label(cases[index]), *pair)] = (
                            f"not built: its {building[0]} build {lost}, and {pair[0]} runs it again")
                if alive:  # it hangs: killed, not waited for (a process in the GPU driver goes when it can)
                    slot["proc"].kill()
                    killed.append(slot["proc"])
                if slot["done"]:
                    yield index, [pair for pair, _ in slot["done"]], [s for _, s in slot["done"]]
                if rest:
                    todo[index] = rest  # not begun: a fresh process's
                    queue.insert(0, index)
                else:
                    finished += 1  # the rest of the case is the measuring pass's
                unborn += not slot["ready"]
                if unborn >= procs:
                    say("precompile: its processes die before they are ready; the run builds as it goes")
                    return
                if queue:
                    slot.update(start(slot["n"]))
                    give(slot)
                else:  # nothing left to give: no fresh process (its start is seconds of imports)
                    slot["case"] = None
            if clock() - last_say > 15:
                last_say, oldest = clock(), _oldest(slots)
                say(f"precompile: {finished}/{len(order)} cases, {time.perf_counter() - t0:.0f} s"
                    + (f" (longest: {_in_flight([oldest], cases)})" if oldest else ""))
        interrupted([])  # one that came as the last case ended: not lost (the run would go on measuring)
    finally:
        _stop(slots, killed, say)
        for s, h in handlers.items():
            signal.signal(s, h)
        logs.cleanup()


# Seconds the pass waits at its end for the processes it stopped to be gone. A SIGKILL is not
# instant for a process inside the GPU driver (it goes once the driver lets it); one still there
# after this is named and left behind, so that the run goes on to measure.
REAP_S = 5.0


def _stop(slots: list[dict], killed: list, say) -> None:
    """Ends the pass's processes: those told there is nothing left get REAP_S to exit on their own
    (their compilers' pools end cleanly), the others are killed; none is waited for past REAP_S."""
    idle = [s["proc"] for s in slots if s["case"] is None and s["proc"] not in killed]
    busy = [s for s in slots if s["case"] is not None]
    for slot in busy:
        if slot["proc"].is_alive():
            slot["proc"].kill()
    for proc in _gone(idle, REAP_S):
        proc.kill()
    left = _gone(idle + killed + [s["proc"] for s in busy], REAP_S)
    if left:
        say(f"precompile: {len(left)} of its processes still there {REAP_S:g} s after they were killed "
            f"(pid {', '.join(str(p.pid) for p in left)}: a build stuck in a driver?); the run goes on without them")


def _gone(procs: list, seconds: float) -> list:
    """Waits up to `seconds` for `procs` to end; those still running. (Not join(): its wait on a
    process's sentinel also waits for any child it left holding that pipe.)"""
    deadline = time.monotonic() + seconds
    while (left := [p for p in procs if p.is_alive()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _crash(slot: dict) -> str:
    """A crashed build's signal and the last line its process wrote (a compiler's assertion)."""
    code = -slot["proc"].exitcode
    said = slot["tail"].last_line()
    return f"signal {code} ({signal.Signals(code).name})" + (f"; its last words: {said}" if said else "")


def _oldest(slots: list[dict]) -> dict | None:
    """The process that has been on its current build longest, for a pass that seems stuck on one."""
    busy = [s for s in slots if s["case"] is not None and s["ready"]]
    return min(busy, key=lambda s: s["since"]) if busy else None


def _in_flight(slots: list[dict], cases: list[Case]) -> str:
    """What each process is on and for how long: its build (kernel mode provider shape dtype, as the
    closing line of slowest builds names it), else its case and why no build yet."""
    now, parts = clock(), []
    for slot in slots:
        kernel, shape, dtype = _label(cases[slot["case"]])
        if slot["building"] is not None:
            what = f"{kernel} {' '.join(slot['building'])} {shape} {dtype}"
        else:
            what = f"{kernel} {shape} {dtype} ({'between builds' if slot['ready'] else 'its process starting'})"
        parts.append(f"{what} for {now - slot['since']:.0f} s")
    return "; ".join(parts)


def _messages(slot: dict):
    """Reads what a process said since: "ready" and ("build", mode, provider) (a build starts: its
    limit counts from now; the one before it is done, into slot["done"] with its seconds) update the
    slot; a finished case's (index, seconds) is returned, else None.
    (recv() after poll() does not wait: each message is far below a pipe's atomic write, so a
    readable pipe holds it whole.)"""
    try:
        while slot["conn"].poll():
            got = slot["conn"].recv()
            if got == "ready" or got[0] == "build":
                if slot.get("building") is not None:
                    slot["done"].append((slot["building"], clock() - slot["since"]))
                ready(slot, clock())
                slot["building"] = got[1:] if got != "ready" else None
            else:
                return got
    except (EOFError, OSError):
        pass
    return None


def ready(slot: dict, now: float) -> None:
    """A process said it is ready: its case's time counts from `now` (its start is not its case's)."""
    slot["ready"], slot["since"] = True, now


def tail_limit(timeout: float | None, longest: float) -> float | None:
    """A build's limit once every case has begun: `timeout`, or TAIL_FACTOR times the `longest`
    build finished (TAIL_MIN_S at least) where that is less."""
    tail = max(TAIL_MIN_S, TAIL_FACTOR * longest)
    return tail if timeout is None or tail < timeout else timeout


def late(slot: dict, now: float, limit: float | None) -> bool:
    """Whether a process has had its time at `now`: `limit` seconds from its ready (None: no limit),
    and at least STARTUP_S from its start while it is not ready yet."""
    if limit is None:
        return False
    return now - slot["since"] > (limit if slot["ready"] else max(limit, STARTUP_S))


def _worker(config: RunConfig, kernel_modules, visible: str | None, threads: int, conn, log: str) -> None:
    """Builds the cases it is sent, (index, pairs) at a time, answering with the index when done,
    until it is sent None. Its output goes to a null device, its standard error to `log` (the
    parent quotes a crash's last line from it, and shows none of it: a failure here is the
    measuring pass's to report)."""
    from .worker_log import redirect

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    redirect(log)
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # tuned under load: not kept (see the module's docstring)
    from .common import load_registry
    from .plan import plan

    registry = load_registry(config.device, kernel_modules)
    cases = plan([registry.get(n) for n in config.kernels], config)
    if config.device == "cuda":
        from .runner import _raise_recompile_limit

        _raise_recompile_limit()
    conn.send("ready")
    while (task := conn.recv()) is not None:
        index, pairs = task
        conn.send((index, _build(cases[index], pairs, config, lambda m, p: conn.send(("build", m, p)))))


def _build(case: Case, pairs: list[tuple[str, str]], config: RunConfig, starting=lambda m, p: None) -> list[float]:
    """Calls each pair once; each one's seconds. One that fails is done too: a build that
    fails fails again (the manifest's key changes with the kernel's source and the versions), and
    a failure would otherwise bring the pass back in every run (a peer unavailable on a GPU, or
    Cortex's dtype errors: 74 of the scans' 291 units)."""
    import torch

    from . import memory, verify

    device = config.device
    inputs = case.spec.make_inputs(case.shape.dims, case.dtype, device, config.seed)
    seconds = []
    for mode, name in pairs:
        provider = case.spec.provider(name)
        call = None
        starting(mode, name)  # the parent's limit on this build counts from here
        t0 = time.perf_counter()
        try:
            if provider.available(device) is None:
                spec = verify.gated_spec(case.spec, provider)
                dys = () if mode == "fwd" else verify.upstream(spec, provider.fn, inputs, config.seed)
                call = verify.build_call(spec, provider.fn, verify.clone_inputs(inputs), mode, dys)
                call()
                if device == "cuda":
                    torch.cuda.synchronize()
        except Exception:  # refused, or failed: the measuring pass meets it again and records it
            pass
        finally:
            call = None
            memory.release(device)
            seconds.append(time.perf_counter() - t0)
    memory.release(device, compiled=True, case_end=True)
    return seconds
