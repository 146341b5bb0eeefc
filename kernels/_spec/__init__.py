"""Spec kits: what the ops' spec.py modules share when they declare their KernelSpec (inputs, grids,
cost models, tolerances, providers around ours). The collector's side of the house: these modules
import kcollect.spec, and no kernel's code imports them (an op's `__init__.py` and kernel files are
torch and Triton only). The Triton device helpers are kernels/_jit, the host launch code kernels/_host."""
