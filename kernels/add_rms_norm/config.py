"""add_rms_norm's tuned configs: rms_norm's (pick_forward with residual=True, pick_backward with
has_dh=True, which choose differently where a residual was measured to change the answer), with its
config classes, so that an A/B of add_rms_norm (lab/ab.py) can name them here."""
from .._host.rows import LinesConfig
from ..rms_norm.config import (BwdRowsConfig, ColsConfig, CoopConfig, PackedConfig, RowsConfig, SplitConfig,
                               pick_backward, pick_forward)

__all__ = ["BwdRowsConfig", "ColsConfig", "CoopConfig", "LinesConfig", "PackedConfig", "RowsConfig", "SplitConfig",
           "pick_backward", "pick_forward"]
