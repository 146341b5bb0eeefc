"""The spec of fp8_quant (transitional: the op's module still declares it)."""
from . import SPEC  # noqa: F401
