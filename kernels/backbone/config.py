"""The backbone's config: it has no tuned config of its own; a row records the configs our attention,
LSTM and selective scan pick for the shape (their own heuristics)."""
from __future__ import annotations

from .._host.config import config_record
from ..attention import pick as attention_pick
from ..lstm import pick as lstm_pick
from ..selective_scan import pick as scan_pick
from .common import N_STATE, arch_of


def config_of(inputs) -> dict:
    """The configs our attention, LSTM and selective scan launch with, over a window (a streamed
    frame takes their one-step kernels, which have no config)."""
    a, device = arch_of(inputs), inputs["x"].device
    if a.stream:
        return config_record()
    return config_record(
        attention=attention_pick(a.hd, True, a.frames, device, 1).fwd if "attention" in a.layout else None,
        lstm=lstm_pick(a.B, a.H, device) if "lstm" in a.layout else None,
        selective_scan=scan_pick(a.B, a.T, a.Di, N_STATE, device) if "mamba" in a.layout else None)
