#!/usr/bin/env bash
# A job longer than one command may run on a GPU machine reached one command at a time, each with
# a time limit (as lab/gpu_call.sh's are): started in a process session of its own, which runs on
# after the command that started it returns, for as long as the machine is held, then waited for by
# the next commands. For the whole grid cold on one GPU (issue 43), which takes longer than one.
#
#   OUT_DIR=$OUT bash lab/gpu_detached.sh start 'kcollect run --all --db $KC_DB --commit SHA --commit-time T'
#   OUT_DIR=$OUT bash lab/gpu_detached.sh wait 540     # in the same command or the next ones
#   OUT_DIR=$OUT bash lab/gpu_detached.sh stop 60      # SIGTERM it (kcollect keeps its rows), then pack
#
# start copies the tree to $STATE/tree, installs from there (lab/gpu_env.sh) and launches the job
# in it with KC_DB=$STATE/job.duckdb, JOB_OUT=$STATE/out
# and its cache under /tmp/kcache0 (STATE: $KC_DETACHED, default /tmp/kc_detached, outside the tree that
# each call replaces). wait polls (every second) for up to SECONDS: once the job has ended it exports its runs
# and packs them, its log and $JOB_OUT into $OUT_DIR/results.tar.gz and exits with the job's
# status; while it runs it leaves the log's tail in $OUT_DIR/progress.txt and exits 75. stop, for a
# job that would outlast the session's device time: SIGTERM to every process of the job (kcollect
# stores the run as interrupted, its rows kept; SIGINT would not do: a shell starts a background job
# with SIGINT ignored, for good), SIGKILL after SECONDS, then packs.
#
# Signals go to every process of the job's session, not only its process group: `timeout` puts its
# command in a group of its own, so that a SIGTERM to the job's group ended the job's shell but not
# the kcollect under `timeout`; the status came back at once, the export found the store still in
# use, and the store was deleted unexported (a whole-grid H200 run lost, 2026-11-29). Packing waits
# until no process of the session is left, and a store that does not export is packed as it is.
set -u
out=${OUT_DIR:?set OUT_DIR to the folder that comes back}
state=${KC_DETACHED:-/tmp/kc_detached}
mkdir -p "$out"
case "${1:-}" in
  start)
    job=${2:?start needs a command}
    # The job runs from a copy of the tree: each later call replaces the machine's tree, and a
    # module imported while it was replaced was found without its files (an H200 sweep's workers,
    # 2026-12-01: 97 cases 'cannot import name ... (unknown location)'). The wheels are read where
    # they are, once, by the install below; a local store, a virtual environment and .git stay.
    rm -rf "$state" && mkdir -p "$state/out" "$state/tree"
    tar -cf - --exclude=./.wp --exclude=./.whl --exclude=./.venv --exclude=./.git --exclude='./data/*.duckdb*' . |
      tar -xf - -C "$state/tree"
    [ -d .whl ] && ln -s "$PWD/.whl" "$state/tree/.whl"
    cd "$state/tree" || exit 1
    source lab/gpu_env.sh
    KC_DB="$state/job.duckdb" JOB_OUT="$state/out" KCOLLECT_CACHE_DIR=/tmp/kcache0 PYTHONUNBUFFERED=1 \
      setsid bash -c 'trap : TERM; bash -c "$0"; echo $? > "$1"' "$job" "$state/status" > "$state/log.txt" 2>&1 < /dev/null &
    # the session's id: setsid execs in place (a background child leads no session). The wrapper traps
    # SIGTERM (its child gets the default back) so that it outlives a stop and records the status
    echo $! > "$state/pid"
    echo "started in its own session: $job" ;;
  wait|stop)
    limit=${2:?$1 needs SECONDS}
    [ -d "$state" ] || { echo "no job was started here (or the machine was given back): $state is missing"; exit 2; }
    KC_INSTALLED=1 source lab/gpu_env.sh  # installed by start: the wheels' path only
    sid=$(cat "$state/pid")  # setsid made the wrapper the leader of a session: its id is the session's
    members() {  # the session's live processes (python3 rather than procps, which a machine may
      # lack); a zombie is not one: killed, it waits for a parent that may never reap it
      python3 -c 'import os, sys
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
        if os.getsid(int(p)) == int(sys.argv[1]) and state != "Z": print(p)
    except OSError: pass' "$sid"
    }
    alive() { [ -n "$(members)" ]; }
    [ "$1" = stop ] && kill -TERM $(members) 2>/dev/null
    start=$SECONDS
    while { [ ! -f "$state/status" ] || alive; } && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 1; done
    if alive && [ "$1" = stop ]; then
      kill -KILL $(members) 2>/dev/null; sleep 1
      [ -f "$state/status" ] || echo 137 > "$state/status"
    fi
    if [ ! -f "$state/status" ] || alive; then
      tail -n 40 "$state/log.txt" > "$out/progress.txt"
      echo "still running after $((SECONDS - start)) s of waiting"; exit 75
    fi
    if [ -f "$state/job.duckdb" ]; then
      if kcollect export --db "$state/job.duckdb" --out "$state/runs" > "$state/export.log" 2>&1; then
        rm -f "$state/job.duckdb" "$state/job.duckdb.wal"
        # the history a job imported (benchmarks/gpus_scaling.sh does) is in the tree already: only
        # the job's own runs come back (the whole history packed was 8.5 MB of a call's 16 MiB a file)
        for run in "$state"/runs/*/; do
          [ -e "$state/tree/data/runs/$(basename "$run")" ] && rm -rf "$run"
        done
      else
        echo "the export failed (export.log): the store is packed as it is"
      fi
    fi
    tar -czf "$out/results.tar.gz" -C "$state" --exclude=./tree .
    tail -n 3 "$state/log.txt"
    exit "$(cat "$state/status")" ;;
  *) echo "usage: OUT_DIR=DIR bash lab/gpu_detached.sh start 'COMMAND' | wait SECONDS | stop SECONDS"; exit 2 ;;
esac
