"""GEGLU's tuned config: the flat elementwise launch (one config for every size and GPU measured)."""
from .._host.launch import ElementwiseConfig as GEGLUConfig
from .._host.launch import elementwise_config as pick

__all__ = ["GEGLUConfig", "pick"]
