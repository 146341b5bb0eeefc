"""Which kernels exist: the built-in ops, the ops other packages register, and one-off files.

- built-in: one folder per op under kernels/ (`kcollect.kernels.<op>`), whose `spec.py` declares `SPEC`;
- entry points of the group `kcollect.kernels` (in a user's pyproject.toml:
  `[project.entry-points."kcollect.kernels"] my_op = "my_pkg.my_op:SPEC"`), each naming a KernelSpec, a
  sequence of them, a module with `SPEC` or `SPECS`, or a function returning any of those;
- `--kernel-module FILE`: a Python file with `SPEC` or `SPECS`, for a one-off.

Importing an op defines Triton kernels, so whoever wants Triton's CPU interpreter must set
TRITON_INTERPRET=1 before loading (the CLI does). A plugin that fails to load does not stop the
others: its error is kept and `kcollect list` shows it.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from .spec import KernelSpec

GROUP = "kcollect.kernels"
# The built-in ops, in the order `kcollect run --all` measures them.
BUILTIN = ("rms_norm", "swiglu", "cross_entropy", "gelu", "geglu", "rope", "fp8_quant", "layer_norm", "softmax",
           "add_rms_norm", "fused_linear_cross_entropy", "attention", "backbone",
           "rtu", "selective_scan", "conv1d", "lstm", "slstm", "mlstm", "axon")


class RegistryError(Exception):
    """An op that cannot be loaded or a name that does not exist, in one sentence."""


@dataclass
class Registry:
    specs: list[KernelSpec] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # name -> 'builtin', 'entry point X', a file
    errors: dict[str, str] = field(default_factory=dict)  # source -> why it could not be loaded

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    def get(self, name: str) -> KernelSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise RegistryError(f"unknown kernel {name!r}; known: {', '.join(self.names()) or 'none'}")

    def add(self, specs: Iterable[KernelSpec], origin: str) -> None:
        for s in specs:
            if not isinstance(s, KernelSpec):
                raise RegistryError(f"{origin} gave {type(s).__name__}, not a KernelSpec")
            if s.name in self.origin:
                raise RegistryError(f"{origin} declares kernel {s.name!r}, which {self.origin[s.name]} "
                                    "already declares")
            self.specs.append(s)
            self.origin[s.name] = origin


def specs_of(obj: Any, origin: str) -> list[KernelSpec]:
    """The specs an entry point or module stands for (see the module docstring)."""
    if isinstance(obj, ModuleType):
        found = getattr(obj, "SPECS", None) or getattr(obj, "SPEC", None)
        if found is None:
            raise RegistryError(f"{origin} defines neither SPEC nor SPECS")
        obj = found
    if callable(obj) and not isinstance(obj, KernelSpec):
        obj = obj()
    if isinstance(obj, KernelSpec):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return list(obj)
    raise RegistryError(f"{origin} gave {type(obj).__name__}, not a KernelSpec")


def builtin_spec(op: str) -> KernelSpec:
    return importlib.import_module(f"kcollect.kernels.{op}.spec").SPEC


def load_file(path: str | Path) -> list[KernelSpec]:
    """The specs of a Python file (`--kernel-module`), imported under a private module name."""
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"--kernel-module {path}: no such file")
    name = f"kcollect_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RegistryError(f"--kernel-module {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise RegistryError(f"--kernel-module {path} failed to import: {type(e).__name__}: {e}") from None
    return specs_of(module, str(path))


def load(kernel_modules: Iterable[str | Path] = (), plugins: bool = True) -> Registry:
    """Built-ins, then entry points (unless `plugins` is off), then the files given."""
    reg = Registry()
    reg.add((builtin_spec(op) for op in BUILTIN), "builtin")
    if plugins:
        for ep in entry_points(group=GROUP):
            origin = f"entry point {ep.name} ({ep.value})"
            try:
                reg.add(specs_of(ep.load(), origin), origin)
            except Exception as e:  # a broken plugin must not stop the built-ins
                reg.errors[origin] = f"{type(e).__name__}: {e}"
    for path in kernel_modules:
        reg.add(load_file(path), str(path))
    return reg


# `kcollect list`: one record per (kernel, provider), identity first, then what the kernel
# offers, then the verdict (available here or why not) and notes.
LIST_COLUMNS = ("kernel", "provider", "baseline", "modes", "dtypes", "quick", "full", "available", "why",
                "origin", "description")
_PER_KERNEL = ("modes", "dtypes", "quick", "full", "origin", "description")


def describe(registry: Registry, device: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The records of `kcollect list`, and their text form for the table and Markdown, where what
    belongs to the kernel is shown on its first provider's line only."""
    from .spec import DTYPE_NAMES

    recs, text = [], []
    for spec in registry.specs:
        for i, p in enumerate(spec.providers):
            reason = p.available(device)
            recs.append({"kernel": spec.name, "provider": p.name, "baseline": p.name == spec.baseline,
                         "modes": ",".join(spec.modes), "dtypes": ",".join(DTYPE_NAMES[d] for d in spec.dtypes),
                         "quick": len(spec.grids.get("quick", ())), "full": len(spec.grids.get("full", ())),
                         "available": reason is None, "why": reason, "origin": registry.origin[spec.name],
                         "description": spec.description})
            shown = {"baseline": "yes" if p.name == spec.baseline else "", "available": "no" if reason else "yes",
                     "why": reason or ""}
            text.append(shown if i == 0 else {**shown, **{c: "" for c in _PER_KERNEL}})
    return recs, text
