"""What the recurrent cells' specs share (lstm, slstm, mlstm, axon): the limit on the PyTorch step
loops the collector times, the check that a shape names every dim, the seeded resets of their inputs
(None at p = 0, the kernels' path without resets) and the factor a step loop applies to its state."""
from __future__ import annotations

import torch

from kcollect.spec import Unavailable

from .scans import reset_mask

# The step loops (one small kernel per operation per timestep, ten or more a step) take seconds a
# call past a few hundred steps, fwd+bwd: the collector times them up to this many steps and reports
# them unavailable beyond, so that a full collection stays within minutes.
STEP_LOOP_MAX_T = 256


def step_loop_limit(name: str, T: int) -> None:
    """Raise Unavailable for a step-loop provider past STEP_LOOP_MAX_T steps."""
    if T > STEP_LOOP_MAX_T:
        raise Unavailable(f"{name} launches several kernels per timestep: timed up to T={STEP_LOOP_MAX_T} "
                          f"steps, T={T} would take seconds a call")


def dims_check(op: str, names: tuple[str, ...]):
    """A spec's check_shape for shapes that must name every one of `names`."""

    def check_shape(dims) -> str | None:
        missing = [n for n in names if n not in dims]
        return f"{op} needs dims {', '.join(names)}; missing {', '.join(missing)}" if missing else None

    return check_shape


def resets_or_none(B: int, T: int, p: float, gen: torch.Generator, device) -> torch.Tensor | None:
    """A seeded [B, T] bool mask on `device`, True where a row's state is zeroed before that step
    (reset_mask's draws); None at p = 0, where nothing is drawn: the kernels' path without resets."""
    if p <= 0:
        return None
    return reset_mask(B, T, p, gen).to(device)


def keep_factor(resets: torch.Tensor | None, t: int, like: torch.Tensor) -> torch.Tensor | None:
    """[B, 1] factor 1 - resets[:, t] in like's dtype (None without resets): the state a step reads."""
    if resets is None:
        return None
    return (~resets[:, t]).to(like.dtype)[:, None]
