#!/usr/bin/env bash
# For a GPU machine that gets a copy of the tree without .git and no package index: installs the
# wheels carried in .whl/ (duckdb, liger-kernel) beside the machine's torch and Triton, installs
# kcollect, and collects into $OUT/gpu.duckdb, which is brought back and folded into the local store
# with `kcollect import`. nvidia-smi samples the device memory and SM clock every 2 s into
# $OUT/nvsmi.csv, the independent record of memory creep (both files are appended to, so that one
# device command can collect in several runs).
# Usage: bash scripts/gpu_collect.sh COMMIT COMMIT_TIME [kcollect run options, e.g. --all --gpus all]
# EXTRA_WHEELS="a.whl b.whl" installs more wheels (peers brought in separately) the same way.
set -uo pipefail
commit=$1 commit_time=$2
shift 2
if [ ! -f /tmp/site/.installed ]; then
  # shellcheck disable=SC2086  # EXTRA_WHEELS is a list of paths
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl ${EXTRA_WHEELS:-} && touch /tmp/site/.installed || exit 1
fi
# PYTHONPATH does not process a folder's .pth files (the CuTe DSL's package is found through one):
# site.addsitedir does, and prints the folders it added.
paths=$(python3 -c "import site, sys; old = set(sys.path); site.addsitedir('/tmp/site'); print(':'.join(p for p in sys.path if p not in old))")
export PYTHONPATH=${paths:-/tmp/site}:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,clocks.sm --format=csv -l 2 >> "$OUT/nvsmi.csv" &
smi=$!
# kcollect runs as this shell's own child, not inside a pipeline, so that a `timeout` around this
# script reaches it: SIGTERM ends the run as Ctrl-C does (rows kept, runs marked interrupted, and
# with --gpus every worker stopped).
kcollect run --db "$OUT/gpu.duckdb" --commit "$commit" --commit-time "$commit_time" "$@" >> "$OUT/run.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid' TERM INT
wait $pid
rc=$?
kill $smi 2>/dev/null
tail -n 60 "$OUT/run.log"
exit $rc
