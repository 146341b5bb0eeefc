"""Tests run on the CPU through Triton's interpreter; it must be switched on before any Triton
kernel is defined, i.e. before the kernel package is imported."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
