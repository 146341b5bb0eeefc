"""The op folders under kernels/ are subpackages of kcollect.kernels: found here, so that adding an
op never touches the packaging (pyproject.toml holds everything else).

A built (non-editable) kcollect carries `kcollect/_build.json`: the commit of the tree it was built
from and whether that tree had uncommitted changes. A run reads it to record
which code measured (collector/environment.py, code_identity), since an installed copy no longer
sits in the checkout whose HEAD a run would otherwise be keyed by. An editable install is the
checkout itself and needs none.
"""
import json
import os
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _git(*args):
    try:
        out = subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class build_py_with_stamp(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or self.dry_run:
            return
        commit = _git("rev-parse", "HEAD")
        stamp = {"commit": commit,
                 "dirty": None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no"))}
        path = os.path.join(self.build_lib, "kcollect", "_build.json")
        with open(path, "w") as f:
            json.dump(stamp, f)


setup(packages=["kcollect", "kcollect.kernels", "kcollect.templates"]
      + [f"kcollect.kernels.{p}" for p in find_packages("kernels")],
      cmdclass={"build_py": build_py_with_stamp})
