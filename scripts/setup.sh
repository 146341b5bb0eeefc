#!/usr/bin/env bash
# Sets up .venv with kcollect and its test tools, from plain PyPI.
#
# Without an NVIDIA GPU: the CPU build of torch and the Triton release pinned in
# requirements/cpu.txt (the one torch's CUDA build of that version requires; the tests run its
# interpreter). The CPU build comes from PyTorch's CPU index where that is reachable, otherwise
# from wherever pip's own configuration finds torch (on plain PyPI that is the CUDA build with its
# CUDA libraries, several GB: said before it starts). TORCH_INDEX=URL picks another index for it;
# TORCH_INDEX= skips the index. A torch of the pinned version already in .venv is kept.
# With a GPU: the torch and Triton already in .venv stay, or pip chooses them. The benchmark
# runner's locked environment is requirements/gpu.txt (`pip install -c requirements/gpu.txt ...`).
# KCOLLECT_BROWSER=1: also Chromium for the site's browser tests (Debian/Ubuntu, as root; they skip
# themselves without it). Asked for only: it is a system package, installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)

reachable() {  # an index answers within 10 s (no proxy or DNS to reach it: go on without it)
  [ -n "$1" ] && .venv/bin/python - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/torch/", method="HEAD"), timeout=10)
EOF
}

# Headless Chromium for the site's browser tests (Debian/Ubuntu package; Playwright drives it),
# when asked for, installed in the background while pip works: the two downloads overlap.
browser=
if ! command -v chromium >/dev/null 2>&1; then
  if [ "${KCOLLECT_BROWSER:-}" != 1 ]; then
    echo "setup: no chromium: the browser tests will be skipped (KCOLLECT_BROWSER=1 installs it with apt-get)" >&2
  elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing chromium with apt-get (KCOLLECT_BROWSER=1)" >&2
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) &
    browser=$!
  else
    echo "setup: KCOLLECT_BROWSER=1, but chromium can be installed here only as root with apt-get: install it yourself" >&2
  fi
fi

pins=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
  pins=(-c requirements/cpu.txt)
  if reachable "$TORCH_INDEX"; then
    "${pip[@]}" "${pins[@]}" --index-url "$TORCH_INDEX" torch
  else
    [ -z "$TORCH_INDEX" ] || cat >&2 <<EOF
setup: $TORCH_INDEX is unreachable; torch comes from pip's own index. On plain PyPI that is
setup: torch's CUDA build with its CUDA libraries (nvidia-* wheels, several GB), not the CPU build.
setup: To avoid it: TORCH_INDEX=URL (a reachable mirror of PyTorch's CPU index), or install the CPU
setup: build of the torch pinned in requirements/cpu.txt into .venv first (setup.sh keeps it).
EOF
    "${pip[@]}" "${pins[@]}" torch
  fi
fi
"${pip[@]}" "${pins[@]}" -e ".[test]"
if [ -n "$browser" ] && ! wait "$browser"; then
  echo "setup: chromium not installed; browser tests will be skipped" >&2
fi
.venv/bin/python -c 'from importlib.metadata import version as v; print("setup: done (.venv: torch", v("torch") + ", triton", v("triton") + ")")'
