"""The lab's A/B harness (lab/ab.py) on the CPU: variants forced, gated, timed interleaved, stored."""
import json
from pathlib import Path

import pytest

from kcollect.store import Store
from lab import ab


def test_ab_stores_each_variant_with_its_config(tmp_path):
    db = tmp_path / "lab.duckdb"
    rc = ab.main(["swiglu", "--shape", "M=5,N=37", "--dtype", "float32", "--variant", "tiny=SwiGLUConfig(block=16, warps=1)",
                  "--variant", "one=changed(SwiGLUConfig, warps=1)", "--provider", "torch", "--rounds", "2", "--rep-ms", "1", "--device", "cpu", "--db", str(db)])
    assert rc == 0
    with Store(db, read_only=True) as store:
        (run,) = store.query("SELECT * FROM runs")
        rows = {r["provider"]: r for r in store.query("SELECT * FROM results")}
    assert run["grid"] == "lab" and run["status"] == "finished"
    assert set(rows) == {"triton[default]", "triton[tiny]", "triton[one]", "torch"}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in rows.values())
    assert json.loads(rows["triton[tiny]"]["config"]) == {"forced": {"block": 16, "warps": 1}}
    assert json.loads(rows["triton[one]"]["config"]) == {"changed": {"ElementwiseConfig": {"warps": 1}}}  # its class
    assert rows["triton[default]"]["config"] is None and rows["triton[tiny]"]["shape"] == "M=5,N=37"


def test_a_provider_that_refuses_a_shape_or_the_device_is_stored_unavailable(tmp_path):
    # F.conv1d takes no resets (the first shape has them, the second not); cortex is not installed here
    db = tmp_path / "lab.duckdb"
    rc = ab.main(["conv1d", "--shape", "B=1,T=16,F=16,K=4,groups=depthwise,resets=1,p=0.2", "--shape",
                  "B=1,T=16,F=16,K=4,groups=depthwise,resets=0,p=0", "--dtype", "float32", "--provider", "cudnn",
                  "--provider", "cortex", "--rounds", "1", "--rep-ms", "1", "--device", "cpu", "--db", str(db)])
    assert rc == 0
    with Store(db, read_only=True) as store:
        rows = {(r["provider"], r["shape"][-3:]): r for r in store.query("SELECT * FROM results")}
    assert rows[("cudnn", "0.2")]["status"] == "unavailable" and "no resets" in rows[("cudnn", "0.2")]["error"]
    assert rows[("cudnn", "p=0")]["status"] == "ok"
    assert {r["status"] for (p, _), r in rows.items() if p == "cortex"} == {"unavailable"}
    assert {r["status"] for (p, _), r in rows.items() if p == "triton[default]"} == {"ok"}


def test_a_config_the_backward_picks_is_forced_and_one_no_pick_takes_is_unavailable(tmp_path):
    # rms_norm picks its backward's config in the backward (not in the forward a bwd measurement
    # builds once): the variant must be forced there too; a CoopConfig (the wide rows' backward) is
    # taken by no pick of this narrow shape's forward, so its variant measured nothing of its own
    db = tmp_path / "lab.duckdb"
    rc = ab.main(["rms_norm", "--shape", "M=3,N=37", "--mode", "bwd", "--dtype", "float32", "--variant",
                  "one=changed(BwdRowsConfig, rows=1)", "--rounds", "1", "--rep-ms", "1", "--device", "cpu",
                  "--db", str(db)])
    rc2 = ab.main(["rms_norm", "--shape", "M=3,N=37", "--mode", "fwd", "--dtype", "float32", "--variant",
                   "coop=CoopConfig()", "--rounds", "1", "--rep-ms", "1", "--device", "cpu", "--db", str(db)])
    assert rc == rc2 == 0
    with Store(db, read_only=True) as store:
        rows = {(r["mode"], r["provider"]): r for r in store.query("SELECT * FROM results")}
    assert rows[("bwd", "triton[one]")]["status"] == "ok"
    assert rows[("fwd", "triton[coop]")]["status"] == "unavailable"
    assert "no pick took its CoopConfig" in rows[("fwd", "triton[coop]")]["error"]
    assert rows[("fwd", "triton[default]")]["status"] == "ok"


def test_a_changed_field_keeps_the_rest_of_each_shapes_pick():
    from kcollect.kernels._host.config import changed, forced
    from kcollect.kernels.lstm.config import LSTMConfig, pick

    with forced(changed(LSTMConfig, prefetch=False)):
        small, wide = pick(2, 16, "cpu"), pick(2, 200, "cpu")
    assert not small.prefetch and not wide.prefetch
    assert (small.hb, wide.hb) == (pick(2, 16, "cpu").hb, pick(2, 200, "cpu").hb) == (16, 256)
    assert pick(2, 16, "cpu").prefetch
    with pytest.raises(ValueError, match="no field nothing"):
        changed(LSTMConfig, nothing=1)


def test_bad_variant_and_shape_are_refused():
    with pytest.raises(ValueError, match="NAME=EXPR"):
        ab.variants("swiglu", ["nothing"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        ab.parse_shape("4096x8192")
    assert ab.parse_shape("M=3,N=5,approx=tanh") == {"M": 3, "N": 5, "approx": "tanh"}


def test_every_mutation_applies_to_this_tree():
    # lab/mutations.py breaks the code on purpose and expects the named test to fail; a search string
    # that a refactor moved (found 0 times) or that became ambiguous (2+) would make it mutate nothing
    # or the wrong place. Only the strings are checked here: the script itself runs the tests.
    from lab import mutations

    assert mutations.check_applies() == []
    # node ids too: the rope mutation named test_layouts[hf] after test_layouts took a second parameter
    assert mutations.check_tests_exist() == []
    for m in mutations.MUTATIONS:
        assert m.search != m.replace and "::" in m.test, m.name
    assert len({m.name for m in mutations.MUTATIONS}) == len(mutations.MUTATIONS)


def test_scans_ab_threshold_is_where_lanes_wins_from_on():
    from lab.scans_ab import lanes_from

    assert lanes_from([(10, 1.2), (100, 0.9), (1000, 0.5)]) == 100
    assert lanes_from([(10, 0.5), (100, 1.0), (1000, 0.5)]) == 1000  # a loss between: from past it
    assert lanes_from([(10, 0.5), (1000, 0.99)]) is None  # within the margin at the largest: never


def test_flush_variants_write_or_only_read_the_buffer():
    # lab/flush_ab.py: `read` must leave the buffer as it was (no dirty lines), `write` and `clean` zero it
    import torch

    from lab import flush_ab

    for variant, zeroed in (("write", True), ("clean", True), ("read", False)):
        buf = torch.randint(1, 100, (4096,), dtype=torch.int8)
        before = buf.clone()
        flush_ab._Flush(buf, variant).zero_()
        assert torch.equal(buf, torch.zeros_like(buf)) if zeroed else torch.equal(buf, before), variant
    with pytest.raises(SystemExit) as e:
        flush_ab.main(["--variants", "write,cold"])
    assert e.value.code == 2


def test_capture_spread_refuses_a_bad_case_or_k():
    from lab import capture_spread

    for argv in (["softmax:M=1"], ["--k", "1", "softmax:M=1,N=64:fwd"], ["--variants", "hot", "softmax:M=1,N=64:fwd"]):
        with pytest.raises(SystemExit) as e:
            capture_spread.main(argv)
        assert e.value.code == 2, argv


def test_detached_job_outlives_its_start_and_is_packed_once_done(tmp_path):
    # lab/gpu_detached.sh: a job started in its own session (a device call ends; the job runs on),
    # waited for later, packed with its status; an exit inside the job still records its status
    import os
    import subprocess
    import tarfile
    import time

    env = dict(os.environ, KC_INSTALLED="1", KC_DETACHED=str(tmp_path / "state"), OUT_DIR=str(tmp_path / "out"))

    def call(*args):
        return subprocess.run(["bash", "lab/gpu_detached.sh", *args], env=env, capture_output=True, text=True)

    assert call("wait", "1").returncode == 2  # nothing started
    started = call("start", "sleep 6; echo done > $JOB_OUT/mark; exit 4")
    assert started.returncode == 0, started.stderr
    assert call("wait", "1").returncode == 75 and (tmp_path / "out" / "progress.txt").exists()
    assert call("wait", "60").returncode == 4
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        names = set(tar.getnames())
        assert {"./out/mark", "./log.txt", "./status"} <= names
        assert tar.extractfile("./out/mark").read() == b"done\n"
    assert call("bogus").returncode == 2

    # the job runs in a copy of the tree: a later device call replaces the tree it was started from
    assert call("start", "pwd > $JOB_OUT/cwd; test -f lab/gpu_detached.sh").returncode == 0
    assert call("wait", "60").returncode == 0
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        assert tar.extractfile("./out/cwd").read().decode().strip() == str(tmp_path / "state" / "tree")
        assert not any(n.startswith("./tree") for n in tar.getnames())

    # of the runs the job's store exports, those the tree's history holds already do not come back
    known = sorted(p.name for p in Path("data/runs").iterdir())[0]
    stub = tmp_path / "bin" / "kcollect"
    stub.parent.mkdir()
    stub.write_text(f"#!/usr/bin/env bash\nout=${{@: -1}}\nmkdir -p $out/{known} $out/20991231T000000-gpu-new\n")
    stub.chmod(0o755)
    env["PATH"] = f"{stub.parent}:{env['PATH']}"
    assert call("start", "touch $KC_DB").returncode == 0
    assert call("wait", "60").returncode == 0
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        runs = {n for n in tar.getnames() if n.startswith("./runs/")}
    assert runs == {"./runs/20991231T000000-gpu-new"}, runs

    # stop: SIGTERM to the job's process group, its own exit status packed; a job deaf to it is killed
    assert call("start", "trap 'echo kept > $JOB_OUT/mark; exit 130' TERM; sleep 60 & wait").returncode == 0
    time.sleep(1)  # the job's trap set
    assert call("stop", "20").returncode == 130
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        assert tar.extractfile("./out/mark").read() == b"kept\n"
    assert call("start", "trap '' TERM; sleep 60").returncode == 0
    assert call("stop", "2").returncode == 137

    # `timeout` runs its command in a process group of its own: stop reaches it all the same, and
    # packs only once it has finished (a store written as it stops is not exported half-written)
    slow_exit = "trap 'sleep 2; echo stored > $JOB_OUT/mark; exit 130' TERM; touch $JOB_OUT/ready; sleep 60 & wait"
    assert call("start", f"timeout 60 bash -c \"{slow_exit}\"").returncode == 0
    ready = tmp_path / "state" / "out" / "ready"
    for _ in range(300):  # its trap set, however loaded the machine
        if ready.exists():
            break
        time.sleep(0.1)
    assert call("stop", "20").returncode == 130
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        assert tar.extractfile("./out/mark").read() == b"stored\n"


@pytest.mark.parametrize("fill", ["0", "1"])
def test_gpus_scaling_imports_the_history_then_measures_cold_one_gpu_and_all(tmp_path, fill):
    # benchmarks/gpus_scaling.sh with a stand-in kcollect: the history into $KC_DB first, then a cold
    # run on all GPUs (FILL=1: a fill stopped once its precompile pass has built, then a whole
    # warm-up run), one GPU, all GPUs, each into $KC_DB
    import os
    import stat
    import subprocess

    calls = tmp_path / "calls"
    stub = tmp_path / "bin" / "kcollect"
    stub.parent.mkdir()
    stub.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {calls}
case "$*" in
  *fill.duckdb*) trap 'echo stopped >> {calls}; exit 130' TERM
                 echo "precompile: 3 of 3 built in 1.0 s"; sleep 60 & wait ;;
  *) echo "3 rows in db (run x, finished) in 1s" ;;
esac
""")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{stub.parent}:{os.environ['PATH']}", KC_DB=str(tmp_path / "job.duckdb"),
               JOB_OUT=str(tmp_path), FILL=fill)
    done = subprocess.run(["bash", "benchmarks/gpus_scaling.sh", "abc123", "2026-11-29T00:00:00+00:00", "rms_norm"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    assert lines[0] == f"import data/runs --db {tmp_path / 'job.duckdb'}"
    runs = [line for line in lines if "--gpus" in line]
    assert [line.split("--gpus ")[1].split()[0] for line in runs] == ["all"] * (fill == "1") + ["all", "0", "all"]
    if fill == "1":
        assert "fill.duckdb" in lines[1] and lines[2] == "stopped"
    measured = runs[1:] if fill == "1" else runs
    assert all(f"--db {tmp_path / 'job.duckdb'}" in line for line in measured)
    assert all(line.startswith("run rms_norm --full") and "--commit abc123" in line for line in runs)
    assert [line.split(" start")[0] for line in done.stdout.splitlines() if " start " in line] == (
        ["warmup", "one", "several"] if fill == "1" else ["cold", "one", "several"])


def test_rejudge_calibration_judges_a_valid_order_of_eager():
    # eager with its units permuted is a valid fp32 computation: on a well-conditioned case it
    # passes the sweep's bar by far (a permutation applied wrongly would be O(1) off)
    from lab import rejudge_calibration as rc

    case = {"op": "lstm", "dtype": "float32", "dims": {"B": 2, "H": 16, "I": 16, "T": 5}, "refusal": None, "seed": 3,
            "options": {"resets": "edges", "gates": "typical", "x_scale": 1.0, "layout": "contiguous",
                        "grad_layout": "strided"}}
    verdict = rc.judge(case)
    assert set(verdict["fails"]) == set(rc.KS) and not any(verdict["fails"].values())
    assert 0 < verdict["worst"] < 1
    with pytest.raises(SystemExit):
        rc.main(["--ops", "axon"])


def test_pair_compares_two_sweeps_case_by_case(tmp_path, capsys):
    """lab.awkward.pair: the cases both sweeps checked, per dtype; verdicts changed, the worst part
    over its gate (B against A), cases and parts moved by more than 10%; cases only one sweep
    checked, or without parts (not run), left out."""
    from lab.awkward import pair

    def row(seed, dtype, status, errors, index):
        parts = [{"name": n, "ours": e, "eager": e, "spread": 0.0, "gate": 0.03} for n, e in errors.items()]
        case = {"op": "mlstm", "dtype": dtype, "dims": {"B": 1, "NH": 1, "DH": 3, "T": 5}, "options": {},
                "refusal": None, "seed": seed}
        return json.dumps(case | {"index": index, "verdict": {"status": status, "parts": parts}})

    a = [row(1, "bfloat16", "ok", {"dq": 0.02, "dk": 0.01}, 0), row(2, "bfloat16", "over_tolerance", {"dq": 0.06}, 1),
         row(3, "float32", "ok", {"dq": 1e-6}, 2), row(4, "bfloat16", "ok", {"dq": 0.01}, 3)]
    b = [row(1, "bfloat16", "ok", {"dq": 0.02, "dk": 0.005}, 5), row(2, "bfloat16", "ok", {"dq": 0.015}, 6),
         row(3, "float32", "ok", {"dq": 1e-6}, 7), json.dumps(json.loads(row(4, "bfloat16", "ok", {}, 8)) | {
             "verdict": {"status": "not_run"}})]
    (tmp_path / "a.jsonl").write_text("\n".join(a) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(b) + "\n")
    rows = {r["dtype"]: r for r in pair.compare(pair.load(str(tmp_path / "a.jsonl")), pair.load(str(tmp_path / "b.jsonl")))}
    bf = rows["bfloat16"]
    assert (bf["cases"], bf["verdict_changed"], bf["better"], bf["worse"]) == (2, 1, 1, 0)
    assert (bf["parts_better"], bf["parts_worse"]) == (2, 0)
    assert bf["geomean"] == pytest.approx((1.0 * 0.25) ** 0.5)  # seed 1's worst unchanged, seed 2's a quarter
    assert (rows["float32"]["cases"], rows["float32"]["geomean"]) == (1, 1.0)
    assert pair.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert "bfloat16" in capsys.readouterr().out
    (tmp_path / "c.jsonl").write_text(b[3] + "\n")
    assert pair.main([str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 2
