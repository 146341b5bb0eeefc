# Sourced by lab/gpu_call.sh and lab/gpu_detached.sh on a GPU machine that reaches no registry:
# installs the wheels carried in .whl/ and kcollect (skipped where KC_INSTALLED is set: a warm
# machine's next call), and puts the wheels' folder on PYTHONPATH. The machine's copy of .git is the
# session's first commit, not the tree that runs: GIT_DIR points nowhere, so that kcollect records no
# provenance from it (give --commit and --commit-time). Deleting .git there instead: both calls that
# followed such a call on the same machine failed and it was given back, caches and a running job
# lost (2026-11-29); with .git left in place, the next call ran.
export GIT_DIR=/nonexistent/git
if [ -z "${KC_INSTALLED:-}" ]; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
  fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
# The CuTe DSL (QuACK, FlashAttention-4) puts its packages on sys.path from a .pth file, which Python
# reads in site directories only, not on PYTHONPATH: without this, 'No module named cutlass'. Its
# wheels: nvidia-cutlass-dsl, -libs-base (the MLIR bindings' Python), -libs-core (the `cutlass`
# package itself: cute, cutlass_dsl; without it 'No module named cutlass.cutlass_dsl', as on the H200
# at 3c3d5d4), -libs-cu13 (92 MB: carried in parts), and cuda-bindings, cuda-pathfinder, protobuf
dsl=/tmp/site/nvidia_cutlass_dsl/dsl_packages
if [ -d "$dsl" ]; then export PYTHONPATH=$dsl:$PYTHONPATH; fi
