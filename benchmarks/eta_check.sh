#!/usr/bin/env bash
# The plan's ETA against the measured wall on one GPU: from an empty cache folder (cold), then again
# (warm), a dry run of KERNELS (its store has no past runs: the committed cost model alone) and then
# the run itself (scripts/gpu_collect.sh installs kcollect and collects into $OUT/gpu.duckdb). Prints
# each dry run's estimate, the run's own announcement and its final line (its wall time, precompile
# and start-up included); `kcollect summary` on the store shows where each run's time went.
# Usage: bash benchmarks/eta_check.sh COMMIT COMMIT_TIME [KERNELS...]   (default: four memory-bound ones)
set -uo pipefail
commit=$1 commit_time=$2
shift 2
kernels=${*:-rms_norm softmax layer_norm cross_entropy}
KCOLLECT_CACHE_DIR=$(mktemp -d)  # cold: nothing built yet
export KCOLLECT_CACHE_DIR
for pass in cold warm; do
  echo "eta_check: $pass" >> "$OUT/run.log"
  # shellcheck disable=SC2086  # the kernels are a list of names
  bash scripts/gpu_collect.sh "$commit" "$commit_time" $kernels --dry-run --db "$OUT/no_past.duckdb" > /dev/null
  # shellcheck disable=SC2086
  bash scripts/gpu_collect.sh "$commit" "$commit_time" $kernels --verbose > /dev/null || echo "eta_check: $pass run exited $?"
done
grep -E "^eta_check|measurements; estimated|rows in .* in " "$OUT/run.log"
