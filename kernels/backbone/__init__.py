"""Sequence backbones at a real-time agent's shape, whole: mlp, lstm, attention, mamba and jamba,
pre-norm residual blocks (common.py), over a window of frames or one streamed frame with carried
state. Three builds of the same weights: PyTorch modules (naive.py, also the float64 reference),
torch.compile of them, and ours (fwd.py: our fused add+RMSNorm, SwiGLU and flash attention).
The benchmark `backbone` (spec.py) times them; the site's budgets page holds them against a
frame's budget."""
from .common import NETS, Arch

__all__ = ["NETS", "Arch"]
