#!/usr/bin/env bash
# One call on a GPU machine of one or more GPUs: installs the wheels carried in .whl/ (the machine
# reaches no registry) and kcollect, then runs the jobs given as arguments in parallel, job i on
# GPU i (CUDA_VISIBLE_DEVICES=i), each in its own shell with KC_DB=$OUT_DIR/job<i>.duckdb and its
# cache under /tmp/kcache<i>. At the end every job's runs are exported and packed, with the jobs'
# logs and whatever they wrote under $JOB_OUT, into $OUT_DIR/results.tar.gz.
#
#   OUT_DIR=out bash lab/gpu_call.sh 'kcollect run rms_norm --db $KC_DB' 'python -m lab.awkward ... --out $JOB_OUT'
#
# A job that outlives the call's time limit is killed with it: give each a `timeout`.
set -u
out=${OUT_DIR:?set OUT_DIR to the folder that comes back}
mkdir -p "$out"
source lab/gpu_env.sh
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,memory.used --format=csv > "$out/gpus.csv" 2>&1

i=0
pids=()
for job in "$@"; do
  mkdir -p "$out/job$i"
  (export CUDA_VISIBLE_DEVICES=$i KC_DB="$out/job$i.duckdb" JOB_OUT="$out/job$i" \
          KCOLLECT_CACHE_DIR=/tmp/kcache$i PYTHONUNBUFFERED=1
   start=$SECONDS
   bash -c "$job" > "$out/job$i/log.txt" 2>&1
   echo "job $i: exit $? after $((SECONDS - start)) s: $job" >> "$out/job$i/log.txt") &
  pids+=($!)
  i=$((i + 1))
done
wait "${pids[@]}"

for db in "$out"/job*.duckdb; do
  [ -f "$db" ] && kcollect export --db "$db" --out "$out/runs" >> "$out/export.log" 2>&1
done
rm -f "$out"/job*.duckdb "$out"/job*.duckdb.wal
tail -n 3 "$out"/job*/log.txt
tar -czf /tmp/results.tar.gz -C "$out" .
find "$out" -mindepth 1 -delete
mv /tmp/results.tar.gz "$out/"
ls -la "$out"
