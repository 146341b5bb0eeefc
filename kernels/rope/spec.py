"""The spec of rope (transitional: the op's module still declares it)."""
from . import SPEC  # noqa: F401
