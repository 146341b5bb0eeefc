#!/usr/bin/env bash
# Before and after the measuring cuts in lab/cost_ab.patch, on one GPU: the same `kcollect run`
# arguments and seed measured by a copy of this tree with the patch reversed (before) and by the tree
# as it is (after), one after the other, each a fresh run into its own store. Prints each run's wall
# time and, row by row, the seconds of both (lab/grid_cost.py --against), with the ratio of their
# medians, so that a cut that moved the times would show.
#
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/cost_ab.sh rtu selective_scan --provider cortex_torch --provider eager'
#
# Writes before.duckdb and after.duckdb under $JOB_OUT (default: a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${JOB_OUT:-$(mktemp -d)}
mkdir -p "$out"
before=/tmp/kc_before
rm -rf "$before" /tmp/kc_before_path
mkdir -p "$before" /tmp/kc_before_path
cp -r collector kernels templates lab "$before"/
if ! (cd "$before" && patch -s -p1 -R < lab/cost_ab.patch); then
  echo "cost_ab: lab/cost_ab.patch does not reverse onto this tree; nothing measured" >&2
  exit 2
fi
# `kcollect` from the copy: a package folder on PYTHONPATH comes before the editable install's finder
ln -s "$before/collector" /tmp/kc_before_path/kcollect
ln -s "$before/kernels" "$before/collector/kernels"
ln -s "$before/templates" "$before/collector/templates"

seed=${SEED:-20261128}
py=${PYTHON:-python3}
measure() {  # name, PYTHONPATH prefix
  local t0=$SECONDS
  PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}" "$py" -m kcollect.cli run "${@:3}" --seed "$seed" --precompile 0 \
    --db "$out/$1.duckdb" > "$out/$1.log" 2>&1 || echo "cost_ab: $1 exited $? (its log: $out/$1.log)"
  echo "cost_ab: $1: wall $((SECONDS - t0)) s: kcollect run ${*:3}"
  tail -n 2 "$out/$1.log"
}
PYTHONPATH=/tmp/kc_before_path "$py" -c 'import kcollect, sys; sys.exit(0 if kcollect.__file__.startswith("/tmp/kc_before") else 1)' \
  || { echo "cost_ab: the copy's kcollect is not the one imported" >&2; exit 2; }
measure before /tmp/kc_before_path "$@"
measure after "" "$@"
[ -f "$out/after.duckdb" ] && [ -f "$out/before.duckdb" ] && "$py" -m lab.grid_cost --db "$out/after.duckdb" --against "$out/before.duckdb"
