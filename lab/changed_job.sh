#!/usr/bin/env bash
# The job for lab/gpu_detached.sh after a kernel change (issue 43's per-push run, issue 40's gate):
#   1. the full grids of NAMES (quoted, space-separated) at commit SHA (ISO time T), from empty
#      caches, with the committed history imported. The device's copy of the tree has no .git,
#      where `kcollect run --changed` would run every kernel: NAMES is what it selects here
#      (`kcollect run --changed --dry-run --machine "vm NVIDIA H200" --full` lists them);
#   2. the GPU tests of TESTS (a pytest path, `-k gpu`: the others run on the interpreter; '-' none);
#   3. the awkward sweep (lab.awkward) of OPS (comma-separated ops; '-' for none) in FAMILY at
#      SEED for LIMIT seconds;
#   4. NAMES again, warm: the per-push cost once the caches hold the commit's builds, and a
#      same-commit pair (A/A).
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash lab/changed_job.sh SHA T "NAMES" TESTS FAMILY OPS SEED LIMIT'
set -uo pipefail
sha=$1 t=$2 names=$3 tests=$4 family=$5 ops=$6 seed=$7 limit=$8
log=${JOB_OUT:-.}
python3 -m lab.peers > "$log/peers.txt" 2>&1
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
common="--full -v --measure-timeout 60 --commit $sha --commit-time $t --db $KC_DB"
echo "cold start $(date +%T)"
# shellcheck disable=SC2086
kcollect run $names $common > "$log/cold.log" 2>&1
echo "cold end $(date +%T) rc $?"
if [ "$tests" != - ]; then
  TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -k gpu "$tests" > "$log/pytest.txt" 2>&1
  echo "tests end $(date +%T) rc $?"
fi
if [ "$ops" != - ]; then
  timeout $((limit + 60)) python3 -m lab.awkward --family "$family" --ops "$ops" --cases 3000 --seed "$seed" \
    --device cuda --workers 15 --time-limit "$limit" --grace 20 --out "$log/awkward" > "$log/awkward.txt" 2>&1
  echo "sweep end $(date +%T) rc $?"
fi
echo "warm start $(date +%T)"
# shellcheck disable=SC2086
kcollect run $names $common > "$log/warm.log" 2>&1
echo "warm end $(date +%T) rc $?"
