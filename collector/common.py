"""What the commands share: paths, one-line errors, device and registry resolution, the store."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import click

from .store import Store, StoreError

ROOT = Path(__file__).resolve().parent.parent  # the checkout: git commit, data/
DEFAULT_DB = "data/kbench.duckdb"
DEFAULT_RUNS = "data/runs"
# PyTorch's CUDA allocator for `kcollect run`, unless PYTORCH_CUDA_ALLOC_CONF is set already.
# Expandable segments map each pool into one growing address range instead of one cudaMalloc per
# large block. With the default allocator, where a provider's tensors landed depended on what the
# cases before had allocated and freed, and that alone moved a time by 10% (our swiglu backward at
# 16384x14336, the same launch, with and without the float64 reference computed first); with
# expandable segments the time is the same in every order. Each run records the setting in its config.
ALLOC_CONF = "expandable_segments:True"


def pin_ptxas() -> str:
    """TRITON_PTXAS_PATH for every Triton kernel of a run (ours, Liger's, torch.compile's), unless
    the user set it: the ptxas that torch.compile's inductor itself switches the whole process to
    the first time it compiles (torch/bin/ptxas, where the torch wheel ships one; on the H200
    machine CUDA 13.0's, where Triton bundles its own). Left to inductor, the kernels built before
    the first torch.compile provider ran (ours, of a run's first cases) got Triton's ptxas and every
    later one torch's: a kernel's binary depended on the cases before it. The pin makes the
    toolchain one per run and each run records the path in its config ("" where Triton's own
    ptxas is used)."""
    if "TRITON_PTXAS_PATH" not in os.environ:
        spec = importlib.util.find_spec("torch")
        ptxas = Path(spec.origin).parent / "bin" / "ptxas" if spec and spec.origin else None
        if ptxas is not None and ptxas.is_file() and os.access(ptxas, os.X_OK):
            os.environ["TRITON_PTXAS_PATH"] = str(ptxas)
    return os.environ.get("TRITON_PTXAS_PATH", "")


def fail(message: str, code: int = 2) -> None:
    click.echo(f"kcollect: error: {message}", err=True)
    sys.exit(code)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is visible here; valid: auto, cpu")
    return device


def load_registry(device: str, kernel_modules=()):
    """The built-in ops, the entry points' and the `--kernel-module` files'; on the CPU, Triton's
    interpreter must be on before any kernel is defined."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from .registry import RegistryError, load

    try:
        return load(kernel_modules)
    except RegistryError as e:
        fail(str(e))


kernel_module_option = click.option(
    "--kernel-module", "kernel_modules", multiple=True, type=click.Path(dir_okay=False),
    help="A Python file whose SPEC (or SPECS) adds kernels for this command (repeatable); packages "
         "register theirs through the entry-point group kcollect.kernels.")


def open_store(path: str, read_only: bool = False) -> Store:
    """The store at --db, or a one-line error. Only the default's folder (data/) is made where it
    is missing: another --db in a folder that does not exist is a mistake to report."""
    try:
        return Store(path, read_only=read_only, create_folder=path == DEFAULT_DB)
    except StoreError as e:
        fail(str(e), code=e.code)


def check_choices(kind: str, given: tuple[str, ...], valid) -> None:
    valid = list(valid)
    for g in given:
        if g not in valid:
            fail(f"unknown {kind} {g!r}; valid: {', '.join(valid)}")
