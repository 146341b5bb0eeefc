#!/usr/bin/env bash
# One GPU against all of a host's (`kcollect run --gpus all`), warm, without the order favouring
# either (issue 43). The job for lab/gpu_detached.sh on a host of two or more GPUs:
#   0. the committed history (data/runs) into $KC_DB, as the benchmark workflow has it, so that a
#      series' last time on this GPU can vouch for a row (stability.vouched) in every run below;
#   1. cold: a whole `--gpus all` run from empty caches (FILL=1: the plan's precompile pass alone,
#      the run stopped once the pass has built, then a whole `--gpus all` run as the warm-up);
#      either leaves in the caches what the pass does not make (cuDNN's runtime-compiled kernels,
#      the builds left to the run);
#   2. one GPU (`--gpus 0`), then 3. all GPUs again: the pair to compare, each after a whole run.
# lab/results/gpus_all_h200x2_aac9a5c.txt is why: with only 1 and then 3 and 2's order reversed,
# the several GPUs' run paid 84 s of first calls that the one GPU's, run after it, found cached.
# Every run lands in $KC_DB; `python -m lab.gpus_scaling --one <2's run> --several <3's runs>` reads them.
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash benchmarks/gpus_scaling.sh SHA ISO-TIME [KERNEL...]'
# (no kernels: the whole grid; ~26 min of a 2x H200 host for all kernels but rtu with FILL=1, 2026-11-29)
set -uo pipefail
commit=$1 commit_time=$2
shift 2
what=${*:---all}
log=${JOB_OUT:-.}
common="--full -v --measure-timeout 60 --commit $commit --commit-time $commit_time"
kcollect import data/runs --db "$KC_DB" > "$log/import.log" 2>&1
if [ "${FILL:-0}" = 1 ]; then
  echo "fill $(date +%T)"
  # shellcheck disable=SC2086  # $what and $common are lists of words
  kcollect run $what $common --gpus all --db "$log/fill.duckdb" > "$log/fill.log" 2>&1 &
  pid=$!
  until ! kill -0 $pid 2>/dev/null || grep -q -E "precompile: [0-9]+ of [0-9]+ built in|every build in the caches" "$log/fill.log"; do
    sleep 2
  done
  kill -TERM $pid 2>/dev/null; wait $pid
  first=warmup:all
else
  first=cold:all
fi
for step in $first one:0 several:all; do
  name=${step%%:*} gpus=${step#*:}
  echo "$name start $(date +%T)"
  # shellcheck disable=SC2086
  kcollect run $what $common --gpus "$gpus" --db "$KC_DB" > "$log/$name.log" 2>&1
  rc=$?
  echo "$name end $(date +%T) rc $rc"
  tail -n 1 "$log/$name.log"
done
