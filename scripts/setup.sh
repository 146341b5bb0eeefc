#!/usr/bin/env bash
# Sets up .venv with kcollect and its test tools. On a machine without an NVIDIA GPU it installs
# the CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
# On a GPU machine, install the torch/triton you benchmark beforehand (or let pip pick the CUDA
# build) and add `pip install liger-kernel` for the Liger peer.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # Triton pinned to the version of the GPU machines the committed history comes from (3.6): the
  # CPU tests run its interpreter, whose behaviour changes between releases (3.9's rejects masks
  # that 3.6 and the GPU compiler accept).
  "${pip[@]}" "torch==2.13.0" "triton==3.6.0"
fi
"${pip[@]}" -e ".[test]"
# Headless Chromium for the site's browser tests (Debian/Ubuntu package; Playwright drives it).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "setup: chromium not installed; browser tests will be skipped" >&2
fi
echo "setup: done (.venv)"
