"""Tuned configs are data: each op's config.py declares frozen dataclasses (blocks, warps, path)
and a heuristic that picks one from the shape and the GPU's architecture. Launchers take
`config=None` (the heuristic's pick) or a config to force; the collector stores the record of the
config every row ran with, and an A/B is two configs through the lab harness."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Iterator


def arch(device) -> str:
    """'sm90' (Hopper: H100, H200), 'sm80', ... for a CUDA device; 'cpu' for the interpreter."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def gpu_model(device) -> str:
    """'h200', 'h100', ... (the model word of the device's name, lower case) for a CUDA device;
    'cpu' for the interpreter. For configs that a measurement showed to differ between GPUs of one
    architecture (the H200's bandwidth and clocks are not the H100's)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return model_word(torch.cuda.get_device_name(device))


def model_word(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA H200' -> 'h200'."""
    words = name.lower().replace("nvidia", "").split()
    return words[0] if words else "unknown"


def config_record(**configs: Any) -> dict[str, Any]:
    """{name: {field: value, ...}} of the configs a call launches with (None ones left out): what a
    row's `config` column holds."""
    return {name: dataclasses.asdict(c) for name, c in configs.items() if c is not None}


# Forcing a config from outside (the lab's A/B harness, a user's experiment) without touching the
# launchers: ops decorate their `pick` functions with @tunable, and inside `with forced(cfg, ...)` a
# pick whose choice has the type of a forced config returns the forced one instead, or, for a
# `changed(Type, field=value)`, its own choice with those fields changed (one field's A/B over
# shapes whose picks differ). `forced` yields the set of config types a pick took inside it: a forced
# config whose type no pick chose (another path's class at that shape) changed nothing.
_FORCED: contextvars.ContextVar[dict[type, Any]] = contextvars.ContextVar("kcollect_forced_configs", default={})
_TAKEN: contextvars.ContextVar[set | None] = contextvars.ContextVar("kcollect_forced_taken", default=None)


@dataclasses.dataclass(frozen=True)
class Changed:
    kind: type
    fields: tuple[tuple[str, Any], ...]


def changed(kind: type, **fields: Any) -> Changed:
    """The pick of a `kind` config with `fields` changed, for `forced`."""
    unknown = set(fields) - {f.name for f in dataclasses.fields(kind)}
    if unknown:
        raise ValueError(f"{kind.__name__} has no field {', '.join(sorted(unknown))}")
    return Changed(kind, tuple(sorted(fields.items())))


def tunable(pick: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(pick)
    def chosen(*args: Any, **kwargs: Any) -> Any:
        config = pick(*args, **kwargs)
        force = _FORCED.get().get(type(config))
        if force is None:
            return config
        _TAKEN.get().add(type(config))
        return dataclasses.replace(config, **dict(force.fields)) if isinstance(force, Changed) else force

    return chosen


def kind_of(config: Any) -> type:
    """The config type a forced config (or a `changed`) replaces."""
    return config.kind if isinstance(config, Changed) else type(config)


@contextlib.contextmanager
def forced(*configs: Any) -> Iterator[set]:
    taken: set = set()
    token = _FORCED.set({**_FORCED.get(), **{kind_of(c): c for c in configs}})
    token_taken = _TAKEN.set(taken)
    try:
        yield taken
    finally:
        _TAKEN.reset(token_taken)
        _FORCED.reset(token)
