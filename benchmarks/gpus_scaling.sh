#!/usr/bin/env bash
# One GPU against all of a host's (`kcollect run --gpus all`), warm, without the order favouring
# either (issue 43). The job for lab/gpu_detached.sh on a host of two or more GPUs:
#   1. fill: the plan's precompile pass alone (the run is stopped once the pass has built);
#   2. warm-up: a whole `--gpus all` run, which leaves in the caches what the pass does not make
#      (cuDNN's runtime-compiled kernels, the builds left to the run);
#   3. one GPU (`--gpus 0`), then 4. all GPUs again: the pair to compare, each after a whole run.
# lab/results/gpus_all_h200x2_aac9a5c.txt is why: with only 1 and then 3 and 4's order reversed,
# the several GPUs' run paid 84 s of first calls that the one GPU's, run after it, found cached.
# Every run lands in $KC_DB; `python -m lab.gpus_scaling --one <3's run> --several <4's runs>` reads them.
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'bash benchmarks/gpus_scaling.sh SHA ISO-TIME [KERNEL...]'
# (no kernels: the whole grid; ~26 min of a 2x H200 host for all kernels but rtu, 2026-11-29)
set -uo pipefail
commit=$1 commit_time=$2
shift 2
what=${*:---all}
log=${JOB_OUT:-.}
common="--full --measure-timeout 60 --commit $commit --commit-time $commit_time"
echo "fill $(date +%T)"
# shellcheck disable=SC2086  # $what and $common are lists of words
kcollect run $what $common --gpus all --db "$log/fill.duckdb" > "$log/fill.log" 2>&1 &
pid=$!
until ! kill -0 $pid 2>/dev/null || grep -q -E "precompile: [0-9]+ of [0-9]+ built in|every build in the caches" "$log/fill.log"; do
  sleep 2
done
kill -TERM $pid 2>/dev/null; wait $pid
for step in warmup:all one:0 several:all; do
  name=${step%%:*} gpus=${step#*:}
  echo "$name start $(date +%T)"
  # shellcheck disable=SC2086
  kcollect run $what $common --gpus "$gpus" --db "$KC_DB" > "$log/$name.log" 2>&1
  rc=$?
  echo "$name end $(date +%T) rc $rc"
  tail -n 1 "$log/$name.log"
done
