"""add_rms_norm's tuned configs: rms_norm's (pick_forward with residual=True, pick_backward with
has_dh=True, which choose differently where a residual was measured to change the answer)."""
from ..rms_norm.config import pick_backward, pick_forward

__all__ = ["pick_backward", "pick_forward"]
