"""The spec of fused_linear_cross_entropy (transitional: the op's module still declares it)."""
from . import SPEC  # noqa: F401
