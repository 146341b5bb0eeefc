"""The op folders under kernels/ are subpackages of kcollect.kernels: found here, so that adding an
op never touches the packaging (pyproject.toml holds everything else)."""
from setuptools import find_packages, setup

setup(packages=["kcollect", "kcollect.kernels", "kcollect.templates"]
      + [f"kcollect.kernels.{p}" for p in find_packages("kernels")])
