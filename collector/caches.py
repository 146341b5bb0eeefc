"""Persistent compile caches: Triton's kernels, torch.compile's (inductor's) graphs and the CuTe DSL
builds of the peers written in it (QuACK, FlashAttention-4), kept on disk between runs in one user
cache folder, so that a run at the next commit rebuilds only what changed.

Inductor's default lives under /tmp (lost at a reboot, shared by every user of a machine) and
Triton's in ~/.triton; one folder that the run records makes "was this a warm run?" answerable and
`rm -r` of it a clean cold start. A cache variable the user set already is kept.
"""
from __future__ import annotations

import os
from pathlib import Path

VARIABLES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor", "QUACK_CACHE_DIR": "quack",
             "CUTE_DSL_CACHE_DIR": "cute_dsl", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "fa4"}
# FlashAttention-4 keeps its compiled kernels on disk only when asked to (off by default); on an
# H100 the CuTe DSL peers' first calls were 33 s of a memory-bound run's 270 s of first calls.
# Triton's autotuner keeps its choices (keyed by the kernel's source, the GPU target and the tuning
# arguments) only when asked to: otherwise a peer that autotunes (fla) benchmarks its configs again
# in every run; on four H100s with warm caches fla's mlstm rows took 98 s, 30 s for the first.
SWITCHES = {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1", "TRITON_CACHE_AUTOTUNING": "1"}


def default_root() -> Path:
    """$KCOLLECT_CACHE_DIR, else $XDG_CACHE_HOME/kcollect, else ~/.cache/kcollect."""
    if os.environ.get("KCOLLECT_CACHE_DIR"):
        return Path(os.environ["KCOLLECT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kcollect"


def use(root: str | os.PathLike | None = None) -> str:
    """Points Triton and inductor at folders under root (default_root() when None), before either
    compiles anything; returns a description for the run's config. Raises OSError when the folder
    cannot be made."""
    root = Path(root) if root else default_root()
    os.environ["KCOLLECT_CACHE_DIR"] = str(root)  # for what else keeps its state there (precompile.py)
    for var, sub in VARIABLES.items():
        if not os.environ.get(var):
            (root / sub).mkdir(parents=True, exist_ok=True)
            os.environ[var] = str(root / sub)
    for var, value in SWITCHES.items():
        os.environ.setdefault(var, value)
    return ", ".join(f"{var}={os.environ[var]}" for var in VARIABLES)
