"""The spec of rms_norm (transitional: the op's module still declares it)."""
from . import SPEC  # noqa: F401
