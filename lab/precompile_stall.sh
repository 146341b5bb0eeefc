#!/usr/bin/env bash
# Issue 43: a cold `kcollect run lstm slstm` under `timeout 240` on one H200 printed no precompile
# progress line after 46 s and measured nothing. One GPU call (under lab/gpu_call.sh, ~7 minutes):
#
#   OUT_DIR=$OUT bash lab/gpu_call.sh 'bash lab/precompile_stall.sh'
#
# 1. where the pass waits: the same run from an empty cache, Python's faulthandler on, sampled
#    every 10 s (each kcollect process's state and kernel wait channel: S+do_select is the loop's
#    0.5 s wait, D a driver, T stopped; pipe_write a blocked stderr), then stopped at 150 s with
#    SIGABRT, on which every Python process prints its stack (the pass's processes into their
#    logs, copied from /tmp/kcollect-precompile-*);
# 2. the time budget as README says to give it: a fresh empty cache, --precompile-limit 60
#    --measure-timeout 60 under timeout 240: how many rows it stores.
set -u
out=${JOB_OUT:-${OUT_DIR:?}}
mkdir -p "$out"

sample() {  # every 10 s: the kcollect processes, their states and wait channels, and the GPU's
  while sleep 10; do
    echo "== $(date +%s)"
    ps -eo pid,ppid,pgid,stat,wchan:32,etimes,pcpu,rss,args --sort=pid | grep -E "kcollect|multiprocessing|ptxas" \
      | grep -v grep
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  done
}

export KCOLLECT_CACHE_DIR=/tmp/stall-cache1
sample > "$out/ps.txt" 2>&1 &
sampler=$!
PYTHONFAULTHANDLER=1 timeout -s ABRT -k 20 150 kcollect run lstm slstm --db "$out/stall.duckdb" > "$out/stall.log" 2>&1
echo "exit $?" >> "$out/stall.log"
kill "$sampler"
mkdir -p "$out/pass_logs"
cp /tmp/kcollect-precompile-*/*.log "$out/pass_logs/" 2>/dev/null
ls -la "$out/pass_logs" >> "$out/stall.log"

export KCOLLECT_CACHE_DIR=/tmp/stall-cache2
timeout 240 kcollect run lstm slstm --precompile-limit 60 --measure-timeout 60 --db "$out/budget.duckdb" \
  > "$out/budget.log" 2>&1
echo "exit $?" >> "$out/budget.log"
