"""The spec of softmax (transitional: the op's module still declares it)."""
from . import SPEC  # noqa: F401
