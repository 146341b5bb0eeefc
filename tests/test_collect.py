"""`kcollect run` over worker processes and shards, on the CPU with the planted kernels
(tests/planted_kernels.py): plain torch providers, so each run takes seconds, not minutes."""
import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import fragile_kernels
from kcollect.cli import main
from kcollect.store import Store

PLANTED = str(Path(__file__).resolve().parent / "planted_kernels.py")
KCOLLECT = [sys.executable, "-m", "kcollect.cli"]
FAST = ["--device", "cpu", "--kernel-module", PLANTED, "--rep-ms", "1", "--warmup-ms", "0", "--min-reps", "2"]
pytestmark = pytest.mark.e2e  # whole `kcollect run` processes


def kc_here(*args, cwd=None, timeout=300):
    """`kcollect` in this process (an interpreter's start and imports cost seconds; the workers of
    a run are processes all the same), for what needs no signal sent to it; the environment,
    signal handlers and working directory are put back. A command still running after `timeout`
    seconds ends this process with every thread's traceback, as a subprocess's timeout would fail."""
    environ, here = dict(os.environ), os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        os.chdir(cwd or here)
        return CliRunner().invoke(main, list(args))
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _stored(db):
    with Store(db, read_only=True) as s:
        return s.query("SELECT * FROM runs ORDER BY device_index, started_at"), s.query("SELECT * FROM results")


def test_two_workers_measure_the_plan_once_each_kernel_in_one_run(tmp_path):
    db = tmp_path / "k.duckdb"
    out = kc_here("run", "doubled", "scaled", *FAST, "--workers", "2", "--db", str(db))
    assert out.exit_code == 0, (out.stderr, out.exception)
    runs, rows = _stored(db)
    # a worker pulls kernels until none is left, and opens its run with its first: a worker that
    # starts late (imports under load) may find nothing left, and then writes no run
    assert len(runs) in (1, 2) and {r["status"] for r in runs} == {"finished"}
    assert all(r["phases"] and r["config"] for r in runs) and len({r["env_id"] for r in runs}) == 1
    # which boot of which host measured (hosts under one machine name differ): this machine's, no GPU
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert [json.loads(r["config"])["host"] for r in runs] == [{"boot_id": boot, "gpu_uuid": None}] * len(runs)
    keys = [(r["kernel"], r["mode"], r["provider"], r["shape"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * 2 * (3 + 2)  # every row of the plan, once
    run_of = {}
    for r in rows:
        assert run_of.setdefault(r["kernel"], r["run_id"]) == r["run_id"]  # a kernel is in one run (CPU workers)
    assert set(run_of.values()) == {r["run_id"] for r in runs}
    assert "cpu0: run" in out.stderr or "cpu1: run" in out.stderr
    # one table of every row of the command, whichever worker measured it, at its end and in `summary`
    # (which, by default, shows every run of the latest `kcollect run`)
    assert len({r["invocation"] for r in runs}) == 1 and runs[0]["invocation"]
    table = [line for line in out.stdout.splitlines() if line.startswith(("doubled ", "scaled "))]
    assert len(table) == len(rows)
    summary = kc_here("summary", "--db", str(db), "--format", "json")
    assert summary.exit_code == 0, summary.output
    assert sorted((r["kernel"], r["mode"], r["provider"], r["shape"]) for r in json.loads(summary.stdout)) == sorted(keys)
    # quiet by default: no line per measurement (--verbose has them)
    assert not re.search(r"^\[\d+/20\] (doubled|scaled) ", out.stderr, re.M), out.stderr


def test_ctrl_c_while_the_workers_start_prints_no_traceback(tmp_path):
    # Ctrl-C reaches the whole process group, the workers too, while they import kcollect and torch
    db = tmp_path / "k.duckdb"
    proc = subprocess.Popen(KCOLLECT + ["run", "doubled", "scaled", *FAST, "--workers", "2", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in proc.stderr:  # printed just before the workers are started
        seen.append(line)
        if line.startswith("measuring the device's ceilings"):
            break
    time.sleep(0.3)  # the workers are starting: a fresh interpreter takes seconds to import torch
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_gpu_workers_stay_on_their_kernel_and_share_only_the_last():
    # On several GPUs the tasks are single cases in kernel order; each worker takes the next case
    # of its kernel, then a kernel nobody is on, and only then shares one (a kernel's first calls,
    # paid by every worker that takes it up, are paid once where they can be)
    from types import SimpleNamespace

    from kcollect.collect import _Parent, _Slot

    kernels = ["a"] * 4 + ["b"] * 3 + ["c"] * 2
    cases = [SimpleNamespace(spec=SimpleNamespace(name=k)) for k in kernels]
    parent = _Parent(None, None, cases, lambda m: None, [[(i, None)] for i in range(len(cases))], True)
    sent = {}
    slots = parent.slots = [_Slot(SimpleNamespace(name=n)) for n in ("gpu0", "gpu1")]
    for slot in slots:
        slot.conn = SimpleNamespace(send=lambda tasks, name=slot.spec.name: sent.setdefault(name, []).append(tasks))

    def take(slot) -> str:
        parent.dispatch(slot, "want", None)
        task = slot.held.pop(0)  # begun, as the worker's "case" progress event does
        return kernels[task[0]]

    g0, g1 = slots
    assert [take(g0), take(g1)] == ["a", "b"]  # the two costliest kernels first, one each
    assert [take(g0), take(g0), take(g1)] == ["a", "a", "b"]
    assert [take(g0), take(g0)] == ["a", "c"]  # a done: c, which nobody is on, not b
    assert [take(g1), take(g0)] == ["b", "c"]
    parent.dispatch(g1, "want", None)
    assert sent["gpu1"][-1] is None and not parent.todo  # nothing left
    # the last kernel is shared: a worker whose kernel is done helps with the one still going
    parent.todo = [[(i, None)] for i in (0, 1, 2, 4)]  # a, a, a, b
    g0.kernel = g1.kernel = None
    assert [take(g0), take(g1), take(g1), take(g0)] == ["a", "b", "a", "a"] and not parent.todo


def test_shards_of_a_plan_merge_by_import_into_the_whole(tmp_path):
    dbs = []
    for k in (1, 2):
        db = tmp_path / f"s{k}.duckdb"
        out = kc_here("run", "doubled", "scaled", *FAST, "--shard", f"{k}/2", "--workers", "1", "--db", str(db))
        assert out.exit_code == 0, (out.stderr, out.exception)
        dbs.append(db)
    whole = tmp_path / "whole.duckdb"
    for db in dbs:  # `kcollect import` in a real process is test_cli's
        result = kc_here("import", str(db), "--db", str(whole))
        assert result.exit_code == 0, (result.output, result.exception)
    runs, rows = _stored(whole)
    assert sorted(r["shard"] for r in runs) == ["1/2", "2/2"]
    assert len({(r["kernel"], r["mode"], r["provider"], r["shape"]) for r in rows}) == 20
    kernels = [{r["kernel"] for r in rows if r["run_id"] == run["run_id"]} for run in runs]
    assert kernels[0].isdisjoint(kernels[1])


def test_a_signal_stops_every_worker_and_keeps_their_rows(tmp_path):
    # SIGTERM, a scheduler's; Ctrl-C's SIGINT takes the same handler (_trap), and test_cli's
    # killed-run test sends it to a real run
    sig = signal.SIGTERM
    db = tmp_path / "k.duckdb"
    proc = subprocess.Popen(KCOLLECT + ["run", "doubled", "scaled", *FAST, "--workers", "2", "--verbose", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "KCOLLECT_TEST_SLEEP": "0.5"})
    deadline = time.time() + 300
    for line in proc.stderr:  # 9 of 20 measurements: a worker has finished a case (4 each)
        if line.startswith("[9/"):
            break
        assert time.time() < deadline
    # the parent only, as a job scheduler's SIGTERM would be, and as `timeout` does, twice at once
    # (to the process group and from a wrapper script that forwards it): one signal, not a second
    os.kill(proc.pid, sig)
    time.sleep(0.05)  # handled apart (two pending signals would merge into one)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    runs, rows = _stored(db)
    # the worker measuring when the signal came marks its run interrupted, with its breakdown;
    # another may have finished the kernel it had before
    statuses = {r["status"] for r in runs}
    assert "interrupted" in statuses and statuses <= {"interrupted", "finished"}, runs
    assert all(r["phases"] for r in runs), runs
    assert 4 <= len(rows) < 20


def test_a_worker_deaf_to_the_signal_is_killed_and_its_run_still_says_interrupted(tmp_path):
    fragile = str(Path(__file__).resolve().parent / "fragile_kernels.py")
    db = tmp_path / "k.duckdb"
    proc = subprocess.Popen(KCOLLECT + ["run", "deaf", *FAST, "--kernel-module", fragile, "--mode", "fwd",
                                        "--workers", "1", "--measure-timeout", "600", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    for line in proc.stderr:  # deaf's call on the 3-row shape says so once it has blocked the signals
        if line.startswith(fragile_kernels.DEAF):
            break
        assert time.time() < deadline
    os.kill(proc.pid, signal.SIGTERM)  # forwarded to the worker, which does not hear it
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)  # a second signal: the parent kills what has not stopped
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "signal 9 (SIGKILL)" in err, err  # killed, not stopped by the first signal
    runs, rows = _stored(db)
    assert [r["status"] for r in runs] == ["interrupted"], runs
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}, rows


def _git_repo(path):
    def git(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    path.mkdir()
    git("init", "-q")
    git("remote", "add", "origin", "git@github.com:someone/kernels.git")
    (path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=Ada", "-c", "user.email=ada@example.com", "commit", "-qm", "faster rows")
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def inside_and_outside(tmp_path_factory):
    """One store, two runs of `scaled` fwd: in a git checkout with --machine, with torch alone;
    outside any checkout with --fail-on-incorrect, `wrong` included. (sha, db, inside, outside)"""
    tmp = tmp_path_factory.mktemp("commit")
    sha = _git_repo(tmp / "repo")
    db = tmp / "k.duckdb"
    args = ["run", "scaled", *FAST, "--mode", "fwd", "--workers", "1", "--db", str(db)]
    inside = kc_here(*args, "--provider", "torch", "--machine", "rig-7", cwd=tmp / "repo")
    outside = kc_here(*args, "--fail-on-incorrect", cwd=tmp)
    return sha, db, inside, outside


def test_fail_on_incorrect_exits_1(inside_and_outside):
    # without the flag the same failures exit 0: the run of `scaled` in
    # test_a_measurement_that_crashes_or_hangs_its_process_is_an_error_row_and_the_run_goes_on
    _, db, _, strict = inside_and_outside
    assert strict.exit_code == 1, (strict.stderr, strict.exception)
    assert "failed or errored" in strict.stderr
    runs, rows = _stored(db)
    (run,) = [r for r in runs if r["machine"] != "rig-7"]
    assert {r["status"] for r in rows if r["run_id"] == run["run_id"]} == {"ok", "failed"}  # stored all the same


def test_commit_comes_from_the_working_directory_and_the_machine_is_named(inside_and_outside):
    sha, db, inside, outside = inside_and_outside
    assert inside.exit_code == 0, (inside.stderr, inside.exception)
    assert "not in a git checkout" in outside.stderr and "not in a git checkout" not in inside.stderr
    runs, _ = _stored(db)
    by = {r["machine"]: r for r in runs}
    ours = by["rig-7"]
    assert (ours["git_commit"], ours["commit_subject"], ours["commit_author"]) == (sha, "faster rows",
                                                                                 "Ada <ada@example.com>")
    assert ours["commit_url"] == f"https://github.com/someone/kernels/commit/{sha}" and ours["git_dirty"] is False
    (other,) = [r for r in runs if r["machine"] != "rig-7"]
    assert other["git_commit"] is None and other["machine"].endswith(" CPU") and other["status"] == "finished"


HUNG_S = 3  # how long a hung process is left to hang before its watchdog's clock jumps past the limit


def _watchdog_clocks(monkeypatch, hangs: Path) -> None:
    """The run's and the precompile pass's watchdogs read, for a process that has hung for HUNG_S
    (fragile_kernels' `hang` leaves a file named by its pid), a clock a day ahead; for every other
    process the real one. A hang is then killed after HUNG_S whatever the limit, and no slow but
    working process is, however loaded the machine (a plain limit of a few seconds was both)."""
    from kcollect import collect, precompile

    def ahead(pid) -> float:
        mark = hangs / str(pid)
        return 86400.0 if mark.exists() and time.time() - mark.stat().st_mtime >= HUNG_S else 0.0

    overdue, late = collect._Slot.overdue, precompile.late
    monkeypatch.setattr(collect._Slot, "overdue",
                        lambda self, limit, now: overdue(self, limit, now + ahead(self.proc.pid)))
    monkeypatch.setattr(precompile, "late", lambda slot, now, limit: late(slot, now + ahead(slot["proc"].pid), limit))
    monkeypatch.setenv(fragile_kernels.HANGS, str(hangs))


def test_a_measurement_that_crashes_or_hangs_its_process_is_an_error_row_and_the_run_goes_on(tmp_path, monkeypatch):
    # fragile: torch, `crash` and `wreck` (abort on M=4), `hang` and `stuck` (sleep for ever on M=3),
    # on two shapes; then scaled, the next kernel of the same run. Each death costs a fresh worker;
    # the run is one. The precompile pass meets crash and hang first: it loses their processes, and
    # builds scaled's; it names crash's build as crashed and hang's as hung, and the run
    # records them without calling them again. `wreck` and `stuck` build nothing, so the pass leaves
    # them alone: they crash and hang the measuring process.
    fragile = str(Path(__file__).resolve().parent / "fragile_kernels.py")
    db, cache = tmp_path / "k.duckdb", tmp_path / "cache"
    (tmp_path / "hangs").mkdir()
    _watchdog_clocks(monkeypatch, tmp_path / "hangs")
    out = kc_here("run", "fragile", "scaled", *FAST, "--kernel-module", fragile, "--mode", "fwd", "--workers", "1",
                  "--measure-timeout", "300", "--precompile", "2", "--cache-dir", str(cache), "--db", str(db))
    assert out.exit_code == 0, (out.stderr, out.exception)
    # what each of their cases held besides is built too: before the crash or hang by the lost
    # process, after it by a fresh one; only the crashed and the hung builds are left to the run
    assert "precompile: 8 of 10 built in" in out.stderr and "2 left to the run" in out.stderr, out.stderr
    assert len(json.loads((cache / "built.json").read_text())) == 8
    runs, rows = _stored(db)
    assert [r["status"] for r in runs] == ["finished"]
    got = {(r["kernel"], r["provider"], r["shape"]): (r["status"], r["error"]) for r in rows}
    assert len(got) == len(rows) == 2 * 5 + 2 * 2  # every measurement once
    a, b = "M=4,N=8", "M=3,N=5"
    # the row quotes what the process said last (from its standard error, which reaches ours too)
    assert got["fragile", "wreck", a] == ("error", "the measuring process died: signal 6 (SIGABRT); its last "
                                          f"words: python3: {fragile_kernels.CRASH}")
    assert got["fragile", "crash", a] == ("error", "its build crashed the precompile pass's process: signal 6 "
                                          f"(SIGABRT); its last words: python3: {fragile_kernels.CRASH}")
    assert fragile_kernels.CRASH in out.stderr
    assert got["fragile", "stuck", b] == ("error", "no result within 300 s")
    status, why = got["fragile", "hang", b]
    hung = re.fullmatch(r"its build hung in the precompile pass for (\d+) s", why)
    assert status == "error" and hung and int(hung[1]) >= HUNG_S, why
    assert "1 hung and 1 crashed (the run records them as errors, without calling them)" in out.stderr
    # `hang` hung once, in the pass, and `stuck` once, in the run (each leaves a file named by its pid)
    assert len(list((tmp_path / "hangs").iterdir())) == 2
    # the measurements after each death, in that case and the next, and the ones before it
    assert {got["fragile", p, s][0] for p, s in [("torch", a), ("hang", a), ("stuck", a), ("torch", b),
                                                   ("crash", b), ("wreck", b)]} == {"ok"}
    assert {s for (k, _, _), (s, _) in got.items() if k == "scaled"} == {"ok", "failed"}
    assert len({r["seq"] for r in rows}) == len(rows)
    assert "fragile" in out.stderr and "goes on in a fresh process" in out.stderr
    # the run's breakdown covers its three processes, the hung one's HUNG_S among them (as "other":
    # after its last report), and the precompile pass before them (which waited for the hung case too)
    spent = json.loads(runs[0]["phases"])
    assert spent["other"] >= HUNG_S and spent["precompile"] >= HUNG_S, spent
    # (first_call is there but may round to 0: the planted providers' first calls take microseconds)
    assert spent["setup"] > 0 and "first_call" in spent and spent["wall"] >= spent["precompile"] + HUNG_S, spent

    # the next run here remembers them (lost.json): it neither builds them again nor calls them
    again = kc_here("run", "fragile", *FAST, "--kernel-module", fragile, "--mode", "fwd", "--workers", "1",
                    "--provider", "crash", "--provider", "hang", "--measure-timeout", "300", "--precompile", "2",
                    "--cache-dir", str(cache), "--db", str(db))
    assert again.exit_code == 0, (again.stderr, again.exception)
    # nor counts them among the builds to make (a pass with enough of those would start processes for them)
    assert "precompile: every build in the caches; 2 that hung or crashed an earlier pass" in again.stderr, again.stderr
    assert len(list((tmp_path / "hangs").iterdir())) == 2 and "goes on in a fresh process" not in again.stderr
    runs, rows = _stored(db)
    second = {(r["provider"], r["shape"]): (r["status"], r["error"]) for r in rows if r["run_id"] == runs[-1]["run_id"]}
    kept = f"(in an earlier run here; {cache / 'lost.json'} keeps it: delete it to try again)"
    assert second["crash", a] == ("error", f"{got['fragile', 'crash', a][1]} {kept}")
    assert second["hang", b][0] == "error" and second["hang", b][1].endswith(kept)
    assert second["crash", b][0] == second["hang", a][0] == "ok"


def test_a_build_that_repeats_a_crashed_one_is_not_begun(tmp_path):
    # torn's `tear` aborts in its backward on the 4-row shape: the pass loses a process to its bwd
    # build there, and does not give its fwd+bwd (the same backward again) to a fresh one to lose
    fragile = str(Path(__file__).resolve().parent / "fragile_kernels.py")
    db, cache = tmp_path / "k.duckdb", tmp_path / "cache"
    out = kc_here("run", "torn", *FAST, "--kernel-module", fragile, "--workers", "1", "--precompile", "2",
                  "--cache-dir", str(cache), "--db", str(db))
    assert out.exit_code == 0, (out.stderr, out.exception)
    assert "1 crashed and 1 that repeats one of them (the run records them" in out.stderr, out.stderr
    assert out.stderr.count(fragile_kernels.CRASH) == 1 and "goes on in a fresh process" not in out.stderr
    _, rows = _stored(db)
    got = {(r["provider"], r["mode"], r["shape"]): (r["status"], r["error"]) for r in rows}
    a, b = "M=4,N=8", "M=3,N=5"
    assert got["tear", "bwd", a][1].startswith("its build crashed the precompile pass's process: signal 6")
    assert got["tear", "fwd+bwd", a] == ("error", "not built: its bwd build crashed the precompile pass's process, "
                                          "and fwd+bwd runs it again")
    assert {got["tear", m, s][0] for m, s in [("fwd", a), ("fwd", b), ("bwd", b), ("fwd+bwd", b)]} == {"ok"}
    lost = json.loads((cache / "lost.json").read_text())
    assert sorted(v.split(":")[0] for v in lost.values()) == ["its build crashed the precompile pass's process",
                                                              "not built"], lost


def test_each_row_keeps_its_seconds_and_the_next_run_here_estimates_from_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KCOLLECT_TEST_SLEEP", "0.05")  # each call: so that a measurement takes a while
    db = tmp_path / "k.duckdb"
    args = ("run", "scaled", *FAST, "--workers", "1", "--db", str(db))
    out = kc_here(*args)
    assert out.exit_code == 0 and "from the last run here" not in out.stderr, out.stderr
    _, rows = _stored(db)
    assert all(r["seconds"] >= 0.05 for r in rows), [r["seconds"] for r in rows]
    out = kc_here(*args)
    first = out.stderr.splitlines()[0]
    assert "measuring" in first and "(one worker, 8 of them from the last run here)" in first, first
    estimated = sum(r["seconds"] for r in rows)
    shown = first.split("measuring ")[1].split(" ")[0]  # the rows' part of the estimate (start-up aside)
    assert shown == f"{round(estimated)}s", (shown, estimated)
