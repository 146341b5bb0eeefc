"""Ask plain PyPI what pip would install, without installing anything: the GPU lock
(scripts/lock_gpu.py) is made with it and tests/test_setup.py checks the set-up with it.

"Plain" means no pip configuration at all: PIP_CONFIG_FILE=/dev/null skips every configuration
file (the machine's constraints and extra indexes included, which --isolated alone would still
read from /etc), --isolated the environment variables, and the index is pypi.org's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = "https://pypi.org/simple"
# Linux x86_64 wheels of every glibc a CUDA machine may have: pip takes only the tags named.
LINUX_X86_64 = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 29)] + [
    "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64", "linux_x86_64"]


class ResolutionError(Exception):
    """pip could not resolve: its last lines say why."""


def project_requirements(*extras: str) -> list[str]:
    """kcollect's dependencies from pyproject.toml, with the extras named."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return reqs


def pins(path: Path) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines of a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[normalise(name)] = version.strip()
    return out


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def dry_run(requirements: list[str], *options: str, python_version: str | None = None, index: str = INDEX,
            timeout: float = 900) -> list[dict]:
    """The report's `install` entries (metadata and download URL of each distribution) of
    `pip install --dry-run --ignore-installed` against plain PyPI. With `python_version`, for
    Linux x86_64 wheels of that Python instead of this interpreter's platform; `index` for
    another index than PyPI's (PyTorch's CPU index)."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
               "--disable-pip-version-check", "--no-cache-dir", "--quiet", "--index-url", index, "--report", str(report),
               # Metadata by HTTP range requests: an index without PEP 658 metadata files would
               # otherwise have pip download every wheel (the CUDA set is ~3 GB) to a temporary folder.
               "--use-feature=fast-deps", *options]
        if python_version:
            cmd += ["--target", str(Path(tmp) / "target"), "--python-version", python_version,
                    "--only-binary=:all:", *(f"--platform={p}" for p in LINUX_X86_64)]
        out = subprocess.run(cmd + list(requirements), capture_output=True, text=True, timeout=timeout, env=env)
        if out.returncode != 0:
            lines = [ln for ln in (out.stderr + out.stdout).splitlines() if ln.strip() and "notice" not in ln]
            raise ResolutionError("\n".join(lines[-8:]))
        return json.loads(report.read_text())["install"]


def versions(installed: list[dict]) -> dict[str, str]:
    return {normalise(i["metadata"]["name"]): i["metadata"]["version"] for i in installed}


if __name__ == "__main__":  # a quick look: python scripts/pypi.py REQUIREMENT...
    for name, version in sorted(versions(dry_run(sys.argv[1:])).items()):
        print(f"{name}=={version}")
