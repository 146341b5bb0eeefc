"""The environment fingerprint of a run: which machine and software, and which commit."""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

from .store import Environment


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


# Distributions of the peers that providers import: their versions are part of the environment, so
# that a peer's upgrade shows as a change of environment, never as a change of our kernel.
PEER_DISTRIBUTIONS = ("liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "flash-attn-4", "fla-core",
                      "cortexcore", "mlstm-kernels", "xlstm", "accelerated-scan", "mamba-ssm", "causal-conv1d")


def peer_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in PEER_DISTRIBUTIONS:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return found


def fingerprint(device: str) -> Environment:
    import triton  # here, not at module level: the CLI must switch the interpreter on first
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        fields = dict(device_kind="cuda", gpu_name=props.name, sm_count=props.multi_processor_count,
                      gpu_mem_bytes=props.total_memory, driver=_nvidia_driver(), cuda=torch.version.cuda,
                      interpreted=False)
    else:
        fields = dict(device_kind="cpu", gpu_name=None, sm_count=None, gpu_mem_bytes=None, driver=None,
                      cuda=None, interpreted=True)
    fields.update(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                  peers=json.dumps(peer_versions(), sort_keys=True))
    env_id = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return Environment(env_id=env_id, **fields)


def describe(env: Environment) -> str:
    d = asdict(env)
    where = d["gpu_name"] or f"CPU ({platform.processor() or platform.machine()}, Triton interpreter)"
    return f"{where} | torch {d['torch']} | triton {d['triton']} | CUDA {d['cuda'] or '-'}"


def git_info(root: Path) -> tuple[str | None, datetime | None, bool | None]:
    """(commit, commit time in UTC, dirty) of the checkout at root; Nones outside git."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None, None, None
    when = git("show", "-s", "--format=%ct", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    commit_time = datetime.fromtimestamp(int(when), tz=timezone.utc).replace(tzinfo=None) if when else None
    return commit, commit_time, bool(status)
