#!/usr/bin/env bash
# A/A pairs for the verdict engine's evaluation (docs/regressions.md): back-to-back runs of one commit
# on one GPU, the memory-bound grid's kernels with ours and eager torch (torch.compile and the peers
# are left out: on a fresh machine their builds take most of a run). One device call: runs until
# PAIRS pairs are done, or stops before a run that would end past BUDGET_S seconds from the start
# (the last run's time is the estimate), so that the call ends with every run whole. The runs go to
# $OUT/gpu.duckdb (scripts/gpu_collect.sh installs kcollect and collects) and, as run folders, to
# $OUT/runs, which `kcollect import` folds into data/runs. Every pair of them is an A/A comparison:
# `python benchmarks/regress_eval.py --runs <folder with them>` counts the ones that would fail.
# Usage: bash benchmarks/aa_pairs.sh COMMIT COMMIT_TIME   (PAIRS=3 BUDGET_S=450 by default)
set -uo pipefail
commit=$1 commit_time=$2
pairs=${PAIRS:-3} budget=${BUDGET_S:-450}
kernels="add_rms_norm cross_entropy fp8_quant fused_linear_cross_entropy geglu gelu layer_norm rms_norm rope softmax swiglu"
start=$SECONDS last=0
for i in $(seq $((2 * pairs))); do
  if [ "$i" -gt 1 ] && [ $((SECONDS - start + last)) -gt "$budget" ]; then
    echo "aa_pairs: stopped before run $i: $((SECONDS - start)) s spent, the last run took $last s"
    break
  fi
  t0=$SECONDS
  # shellcheck disable=SC2086  # the kernels are a list of names
  bash scripts/gpu_collect.sh "$commit" "$commit_time" $kernels --provider triton --provider torch \
    || echo "aa_pairs: run $i exited $?"
  last=$((SECONDS - t0))
  echo "aa_pairs: run $i took $last s"
done
kcollect export --db "$OUT/gpu.duckdb" --out "$OUT/runs"
