"""Triton device helpers: the @triton.jit functions (and the constexpr constants they read) that
several ops' kernels call. Device code only: these modules import triton and nothing of the host
(launch shapes, configs: kernels/_host) or of the collector (spec kits: kernels/_spec). An op imports
each helper from its module (`from .._jit.coop import publish`), so that a change here marks as
changed only the ops whose kernels call it (collector/codechange.py follows the imports)."""
