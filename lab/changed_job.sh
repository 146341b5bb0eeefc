#!/usr/bin/env bash
# The job for lab/gpu_detached.sh after a kernel change (issue 43's per-push run, issue 40's gate):
#   1. `kcollect run --changed` at commit SHA (ISO time T) from empty caches, with the committed
#      history imported (each kernel against its own last measured commit, as the workflow runs it);
#   2. the GPU tests of TESTS (a pytest path; '-' for none) with compiled kernels;
#   3. the awkward sweep (lab.awkward) of OPS (comma-separated cells/scans/attention ops; '-' for
#      none) in FAMILY at SEED for LIMIT seconds;
#   4. `kcollect run --changed=REF` again, warm (the same kernels when REF is the parent): the
#      per-push cost once the caches hold the commit's builds, and a same-commit pair (A/A).
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash lab/changed_job.sh SHA T REF TESTS FAMILY OPS SEED LIMIT'
set -uo pipefail
sha=$1 t=$2 ref=$3 tests=$4 family=$5 ops=$6 seed=$7 limit=$8
log=${JOB_OUT:-.}
git log -1 --format='git here: %H' > "$log/git.txt" 2>&1 || echo "no git here: --changed runs every kernel" >> "$log/git.txt"
python3 -m lab.peers > "$log/peers.txt" 2>&1
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
common="--full -v --measure-timeout 60 --commit $sha --commit-time $t --db $KC_DB"
echo "cold start $(date +%T)"
# shellcheck disable=SC2086
kcollect run --changed $common > "$log/cold.log" 2>&1
echo "cold end $(date +%T) rc $?"
if [ "$tests" != - ]; then
  TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider "$tests" > "$log/pytest.txt" 2>&1
  echo "tests end $(date +%T) rc $?"
fi
if [ "$ops" != - ]; then
  timeout $((limit + 60)) python3 -m lab.awkward --family "$family" --ops "$ops" --cases 3000 --seed "$seed" \
    --device cuda --workers 15 --time-limit "$limit" --grace 20 --out "$log/awkward" > "$log/awkward.txt" 2>&1
  echo "sweep end $(date +%T) rc $?"
fi
echo "warm start $(date +%T)"
# shellcheck disable=SC2086
kcollect run --changed="$ref" $common > "$log/warm.log" 2>&1
echo "warm end $(date +%T) rc $?"
