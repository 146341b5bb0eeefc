"""The precompile pass (`kcollect run --precompile N`, collector/precompile.py) on the CPU with the
planted kernels: what it builds, what it remembers, and Ctrl-C while it works (a crash and a hang
in it: test_collect's fragile-run test); with stalling_kernels.py, a build that never ends there:
its process not going when killed, SIGTERM while it is in flight, and --precompile-limit."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_collect import FAST, KCOLLECT, PLANTED, _stored, kc_here

from kcollect import precompile
from kcollect.plan import RunConfig, plan
from kcollect.kernels.rms_norm.spec import SPEC as RMS_NORM

FRAGILE = str(Path(__file__).resolve().parent / "fragile_kernels.py")
pytestmark = pytest.mark.e2e  # whole `kcollect run` processes with their precompile pass


def _phases(db):
    runs, _ = _stored(db)
    return [json.loads(r["phases"]) for r in runs]


# Each call in the pass's processes saves a tuning choice where inductor saves its own.
MARK = '''

def _tuned():
    import multiprocessing
    if multiprocessing.current_process().name.startswith("kcollect-pre"):
        with open(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "k.best_config"), "w") as f:
            f.write("{}")
'''


def test_precompile_builds_each_unit_once_and_again_when_the_kernel_source_changes(tmp_path, monkeypatch):
    module = tmp_path / "mine" / "planted_kernels.py"
    module.parent.mkdir()
    module.write_text(Path(PLANTED).read_text().replace("    def call(x):\n", "    def call(x):\n        _tuned()\n")
                      + MARK)
    cache, db = tmp_path / "cache", tmp_path / "k.duckdb"
    inductor = tmp_path / "inductor"
    inductor.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    older = inductor / "older.best_config"  # a pick from before the pass: kept
    older.write_text("{}")
    os.utime(older, (time.time() - 60, time.time() - 60))
    fast = [a if a != PLANTED else str(module) for a in FAST]  # the copy instead of the original
    args = ("run", "scaled", *fast, "--precompile", "2", "--cache-dir", str(cache),
            "--db", str(db))
    out = kc_here(*args)
    assert out.exit_code == 0, (out.stderr, out.exception)
    assert "precompile: 8 of 8 builds not in the caches; building them in 2 processes" in out.stderr
    assert "precompile: 8 of 8 built in" in out.stderr
    # where the pass's time went: seconds by kernel and the slowest builds, each measured
    line = next(x for x in out.stderr.splitlines() if x.startswith("precompile: build seconds by kernel: scaled "))
    assert line.count(" s; ") + line.count(" s") >= 6 and "slowest: scaled " in line, line
    keys = json.loads((cache / "built.json").read_text())
    assert len(keys) == 8 and all(k.startswith("cpu | torch ") for k in keys)
    assert {k.split(" | ")[-1].split()[2] for k in keys} == {"torch", "wrong"}
    (first,) = _phases(db)
    assert 0 < first["precompile"] < first["wall"]
    assert older.exists() and not (inductor / "k.best_config").exists()  # the pass's picks are forgotten
    # warm: no process, no line, no phase; the same rows
    out = kc_here(*args)
    assert out.exit_code == 0 and "precompile:" not in out.stderr, out.stderr
    assert "precompile" not in _phases(db)[1]
    # a change to the kernel's file builds its units again
    module.write_text(module.read_text() + "\n# changed\n")
    out = kc_here(*args)
    assert "precompile: 8 of 8 builds not in the caches" in out.stderr, out.stderr
    assert len(json.loads((cache / "built.json").read_text())) == 16
    _, rows = _stored(db)
    assert len(rows) == 3 * 8


def test_a_case_s_time_limit_counts_from_ready_on_the_pass_s_clock():
    # explicit times instead of waiting on the wall clock (which a loaded machine stretches): a
    # process that took 6 s to start has 2 s for its build from its ready, not from its start
    slot = {"ready": False, "since": 0.0}
    assert not precompile.late(slot, 6.0, 2.0)  # still starting: it gets STARTUP_S
    precompile.ready(slot, 6.0)
    assert not precompile.late(slot, 7.5, 2.0) and precompile.late(slot, 8.5, 2.0)
    assert precompile.late({"ready": False, "since": 0.0}, precompile.STARTUP_S + 1, 2.0)
    assert not precompile.late(slot, 1e9, None)  # no --measure-timeout: no limit


def test_once_every_case_has_begun_a_build_far_past_the_longest_counts_as_hung():
    # the tail's limit: TAIL_FACTOR times the longest build finished, TAIL_MIN_S at least, never
    # past --measure-timeout
    assert precompile.tail_limit(300.0, 10.0) == precompile.TAIL_MIN_S
    assert precompile.tail_limit(300.0, 100.0) == precompile.TAIL_FACTOR * 100.0
    assert precompile.tail_limit(300.0, 1000.0) == 300.0
    assert precompile.tail_limit(None, 100.0) == precompile.TAIL_FACTOR * 100.0


def test_the_pass_does_not_wait_out_the_limit_on_its_last_build(tmp_path):
    # sticky's build never ends; the other case's build takes a fraction of a second. With every
    # case begun, sticky's counts as hung at the tail's limit (its floor set to 10 s here), not at
    # --measure-timeout's 300 s: the run records it as an error and measures the rest. (A floor of
    # 2 s failed once on a 2-core machine busy with two other test runs: sticky's quick build at
    # M=4,N=8 took over 2 s and was counted as hung too.)
    start = time.monotonic()
    proc, stuck = _stall_run(tmp_path, "--measure-timeout", "300", env={"KCOLLECT_TEST_TAIL_MIN": "10"})
    err = _finish(proc, stuck)
    assert proc.returncode == 0, err
    assert time.monotonic() - start < 150, err
    assert re.search(r"precompile: stall M=3,N=5 bfloat16 fwd sticky built for \d+ s, over 2.5 times the longest "
                     r"build finished \(\d+ s\) with every case begun: counted as hung", err), err
    _, rows = _stored(tmp_path / "k.duckdb")
    got = {(r["provider"], r["shape"]): (r["status"], r["error"]) for r in rows}
    assert got["sticky", "M=4,N=8"][0] == got["torch", "M=3,N=5"][0] == "ok", got
    status, why = got["sticky", "M=3,N=5"]
    assert status == "error" and why.startswith("its build hung in the precompile pass for "), why


def test_a_case_s_time_limit_counts_from_ready(tmp_path):
    # the pass's processes take 6 s to start (a loaded machine's imports): their cases are built all
    # the same (the limit's rule itself: the test above, on explicit times; the limit here is wide,
    # so that a build slowed down by the machine's load does not fail this test)
    module = tmp_path / "slow_start" / "planted_kernels.py"
    module.parent.mkdir()
    module.write_text(Path(PLANTED).read_text() + "\n\nimport multiprocessing as _mp\n"
                      "if _mp.current_process().name.startswith('kcollect-pre'):\n    time.sleep(6)\n")
    fast = [a if a != PLANTED else str(module) for a in FAST]
    out = kc_here("run", "scaled", *fast, "--precompile", "2", "--measure-timeout", "120",
                  "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "k.duckdb"))
    assert out.exit_code == 0, (out.stderr, out.exception)
    assert "precompile: 8 of 8 built in" in out.stderr, out.stderr


def test_ctrl_c_while_building_ahead_stops_every_process_and_measures_nothing(tmp_path):
    db = tmp_path / "k.duckdb"
    proc = subprocess.Popen(KCOLLECT + ["run", "fragile", *FAST, "--kernel-module", FRAGILE, "--where", "M=3",
                                        "--precompile", "2", "--measure-timeout", "120",
                                        "--cache-dir", str(tmp_path / "cache"), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    for line in proc.stderr:
        if "building them in" in line:
            break
        assert time.time() < deadline
    time.sleep(3)  # the processes are up, one of them in `hang`
    started = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted while building ahead; nothing was measured" in err
    assert time.time() - started < 20
    assert not db.exists() or _stored(db) == ([], [])
    assert not _alive_in_group(proc.pid)


def _alive_in_group(pgid: int) -> list[str]:
    """The processes of a process group that still run (a zombie, exited and not yet reaped, does not)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        state, _, group = text[text.rindex(")") + 2:].split()[:3]  # after "pid (comm) "
        if int(group) == pgid and state != "Z":
            alive.append(text)
    return alive


def test_the_pass_builds_only_providers_that_build_code():
    config = RunConfig(kernels=("rms_norm",), grid="quick", device="cpu")
    cases = plan([RMS_NORM], config)
    units = precompile.units(cases, list(range(len(cases))), config)
    providers = {p for pairs in units.values() for _, p in pairs}
    assert providers == {"triton", "compile", "liger", "quack"}  # not torch, torch_fused (native PyTorch)
    assert sum(len(v) for v in units.values()) == len(cases) * 3 * 4


def test_precompile_takes_auto_or_a_count(tmp_path):
    out = kc_here("run", "scaled", *FAST, "--precompile", "some", "--db", str(tmp_path / "k.duckdb"))
    assert out.exit_code == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last == "kcollect: error: --precompile 'some': must be auto or a whole number >= 0"
    assert precompile.default_procs("cpu") == 0 and 2 <= precompile.default_procs("cuda") <= precompile.PROCS_MAX


def test_auto_processes_scale_with_the_run_s_gpus_within_cores_and_memory(monkeypatch):
    def host(cores, gib):
        monkeypatch.setattr(precompile.os, "sched_getaffinity", lambda _pid: set(range(cores)))
        monkeypatch.setattr(precompile.os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else gib * 2**18)

    host(128, 512)  # a 4-GPU host
    assert [precompile.default_procs("cuda", g) for g in (1, 2, 4)] == [16, 32, 64]
    host(16, 128)  # one GPU's share of cores caps it
    assert precompile.default_procs("cuda", 4) == 16
    host(64, 48)  # and memory
    assert precompile.default_procs("cuda", 4) == 12
    host(2, 8)
    assert precompile.default_procs("cuda") == 2


def test_tuning_saved_during_the_pass_is_forgotten_and_older_tuning_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    old, new = tmp_path / "ab" / "old.best_config", tmp_path / "cd" / "new.best_config"
    for f in (old, new, tmp_path / "cd" / "new.py"):
        f.parent.mkdir(exist_ok=True)
        f.write_text("{}")
    since = time.time()
    os.utime(old, (since - 60, since - 60))
    os.utime(new, (since + 1, since + 1))
    assert precompile.forget_tuning(since) == 1
    assert old.exists() and not new.exists() and (tmp_path / "cd" / "new.py").exists()


def test_the_pass_ends_when_its_processes_cannot_start(tmp_path, monkeypatch):
    # a kernel module that cannot be loaded in the pass's processes (as an op whose import crashes
    # there would): each dies at once; after as many deaths as processes, the pass gives up and the
    # run measures everything itself
    module = tmp_path / "late.py"
    die = ('import multiprocessing\nimport os\n'
           'if os.environ.get("KCOLLECT_TEST_DIE") and \\\n'
           '        multiprocessing.current_process().name.startswith("kcollect-pre"):\n'
           '    os._exit(3)\n')
    module.write_text(Path(PLANTED).read_text().replace("import os\n", die, 1))
    fast = [a if a != PLANTED else str(module) for a in FAST]
    db = tmp_path / "k.duckdb"
    out = kc_here("run", "doubled", *fast, "--precompile", "2", "--cache-dir", str(tmp_path / "cache"), "--db", str(db))
    assert out.exit_code == 0 and "building them in 2 processes" in out.stderr, out.stderr
    monkeypatch.setenv("KCOLLECT_TEST_DIE", "1")  # the pass's processes die as they load it
    module.write_text(module.read_text() + "\n# changed: builds again\n")
    out = kc_here("run", "doubled", *fast, "--precompile", "2", "--cache-dir", str(tmp_path / "cache"), "--db", str(db))
    assert out.exit_code == 0, out.stderr
    assert "precompile: its processes die before they are ready; the run builds as it goes" in out.stderr
    runs, rows = _stored(db)
    assert [r["status"] for r in runs] == ["finished", "finished"] and len(rows) == 2 * 12


STALLING = str(Path(__file__).resolve().parent / "stalling_kernels.py")


def _stall_run(tmp_path, *extra, env=None):
    """`kcollect run stall` fwd (two cases, `sticky`'s on M=3 stuck for ever in the pass) in its own
    process group; (process, folder of the stuck processes' files)."""
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    args = ["run", "stall", *FAST, "--kernel-module", STALLING, "--mode", "fwd", "--precompile", "2",
            "--cache-dir", str(tmp_path / "cache"), "--db", str(tmp_path / "k.duckdb"), *extra]
    proc = subprocess.Popen(KCOLLECT + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "KCOLLECT_TEST_STUCK": str(stuck), **(env or {})})
    return proc, stuck


def _finish(proc, stuck, timeout=120) -> str:
    """The run's standard error once it ends; whatever it left stuck is killed (a failing test's too)."""
    try:
        _, err = proc.communicate(timeout=timeout)
        return err
    finally:
        for f in stuck.iterdir():
            try:
                os.kill(int(f.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_a_build_whose_process_does_not_go_when_killed_does_not_hold_the_pass(tmp_path):
    # `sticky` hangs past its limit (its watchdog's clock jumps: stalling_kernels.py) and its process
    # does not go at SIGKILL (as one inside the GPU driver): the pass names it hung, waits REAP_S for it at its end, names it and goes on; the
    # run measures every row (a pass that waited for it never ended: the run was killed, nothing stored)
    proc, stuck = _stall_run(tmp_path, "--measure-timeout", "300", env={"KCOLLECT_TEST_HOLD_KILL": "1"})
    err = _finish(proc, stuck)
    assert proc.returncode == 0, err
    assert "precompile: 1 of its processes still there 1 s after they were killed" in err, err
    assert "1 hung (the run records them as errors, without calling them)" in err, err
    _, rows = _stored(tmp_path / "k.duckdb")
    got = {(r["provider"], r["shape"]): (r["status"], r["error"]) for r in rows}
    assert len(rows) == 4 and got["sticky", "M=4,N=8"][0] == got["torch", "M=3,N=5"][0] == "ok", got
    status, why = got["sticky", "M=3,N=5"]
    assert status == "error" and why.startswith("its build hung in the precompile pass for "), why


def test_sigterm_in_the_pass_names_the_builds_in_flight(tmp_path):
    proc, stuck = _stall_run(tmp_path, "--measure-timeout", "300")
    try:
        deadline = time.time() + 120
        while not any(stuck.iterdir()):  # the pass's process is in sticky's build
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does: the whole process group
    finally:
        err = _finish(proc, stuck)
    assert proc.returncode == 130, err
    # each process's build and how long it has been on it (the other case may still be building too)
    head = "precompile: interrupted; in flight: "
    line = next((x for x in err.splitlines() if x.startswith(head)), err)
    assert "stall fwd sticky M=3,N=5 bfloat16" in line, line
    assert all(re.fullmatch(r"stall (fwd \w+ )?M=\d,N=\d bfloat16( \(.+\))? for \d+ s", part)
               for part in line[len(head):].split("; ")), line
    assert "interrupted while building ahead; nothing was measured" in err


def test_the_pass_stops_at_its_limit_and_the_run_builds_the_rest(tmp_path):
    # sticky's build never ends in the pass; past --precompile-limit the pass stops (wherever its
    # processes are: a loaded machine may still be starting them) and the run makes every build
    # itself, sticky's included (it is not a hang of the pass's limit: called again, it answers)
    proc, stuck = _stall_run(tmp_path, "--measure-timeout", "300", "--precompile-limit", "3")
    err = _finish(proc, stuck)
    assert proc.returncode == 0, err
    assert "precompile: stopped at its limit (--precompile-limit 3 s); left to the run: " in err, err
    _, rows = _stored(tmp_path / "k.duckdb")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}, rows


def test_precompile_limit_takes_seconds(tmp_path):
    out = kc_here("run", "scaled", *FAST, "--precompile-limit", "-1", "--db", str(tmp_path / "k.duckdb"))
    assert out.exit_code == 2
    assert out.stderr.strip().splitlines()[-1] == "kcollect: error: --precompile-limit '-1': must be a finite number > 0"
