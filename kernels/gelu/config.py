"""GELU's tuned config: the flat elementwise launch (one config for every size and GPU measured)."""
from .._host.launch import ElementwiseConfig as GELUConfig
from .._host.launch import elementwise_config as pick

__all__ = ["GELUConfig", "pick"]
