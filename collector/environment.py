"""The environment fingerprint of a run: which machine and software, and which commit."""
from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
from dataclasses import asdict, dataclass, replace
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


def plugin_versions() -> dict[str, str]:
    """{distribution: version} of the installed packages that register kernels through the
    `kcollect.kernels` entry points: a user's own kernels are code of theirs that a run measured,
    whose version the rows must be traceable to (kcollect's own commit does not say it)."""
    from importlib.metadata import entry_points

    found = {}
    for ep in entry_points(group="kcollect.kernels"):
        dist = getattr(ep, "dist", None)
        if dist is not None and dist.metadata["Name"]:
            found[dist.metadata["Name"]] = dist.version
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
    plugins = plugin_versions()
    if plugins:  # only then in the id: a machine without plugins keeps the id it had before schema 7
        fields["plugins"] = json.dumps(plugins, sort_keys=True)
    env_id = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return Environment(env_id=env_id, **fields)


def host_identity(device: str) -> dict[str, str | None]:
    """Which boot of which machine and which physical GPU a run measured on, beyond the machine's
    name (kept in the run's config as "host"). Hosts lent under one name differ: sLSTM's PyTorch step
    loop ran 3-4% slower on one session's H200 hosts than on the last one's, every shape, with the
    same driver and software (docs/regressions.md), so a run says which host it had. boot_id: the
    kernel's, new at each boot (a fresh VM); gpu_uuid: the GPU this process measures on (its
    CUDA_VISIBLE_DEVICES already narrowed to one)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        boot = None
    uuid = None
    if device == "cuda":
        try:
            uuid = str(torch.cuda.get_device_properties(0).uuid)
        except (AttributeError, RuntimeError):
            uuid = None
    return {"boot_id": boot, "gpu_uuid": uuid}


def describe(env: Environment) -> str:
    d = asdict(env)
    where = d["gpu_name"] or f"CPU ({platform.processor() or platform.machine()}, Triton interpreter)"
    return f"{where} | torch {d['torch']} | triton {d['triton']} | CUDA {d['cuda'] or '-'}"


@dataclass(frozen=True)
class Commit:
    """What a run is keyed by, as the runs table records it: the commit (all None outside git), the
    installed kcollect that measured it, and the `kcollect run` it belongs to."""

    sha: str | None = None
    time: datetime | None = None  # commit time, UTC
    dirty: bool | None = None  # uncommitted changes to tracked files (None: unknown)
    subject: str | None = None
    author: str | None = None
    url: str | None = None  # the commit's page, from the remote (GitHub-style hosts only)
    kcollect_version: str | None = None  # the installed kcollect (Code.version)
    kcollect_commit: str | None = None  # the commit it was built from (Code.commit)
    invocation: str | None = None  # one id for the runs of one `kcollect run` (its workers')


@dataclass(frozen=True)
class Code:
    """The kcollect that runs: its version and the commit it was built from. From a git checkout
    (an editable install, or the source on the path): that checkout's HEAD and whether its tracked
    files differ from it; from an installed copy: the stamp the build wrote (setup.py, BUILD_STAMP);
    commit None where neither says it (an install from a tree without git)."""

    version: str | None = None
    commit: str | None = None  # full SHA
    dirty: bool | None = None


BUILD_STAMP = "_build.json"  # written into the package by setup.py's build: {commit, dirty}
PACKAGE = Path(__file__).resolve().parent


def code_identity(package: Path = PACKAGE) -> Code:
    """Which kcollect this is (see Code). A copy installed inside a checkout (a venv in it) is an
    installed copy: only a checkout whose own collector/ folder is `package` counts as its source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("kcollect")
    except PackageNotFoundError:
        ver = None
    top = _git(package, "rev-parse", "--show-toplevel")
    if top and (Path(top) / "collector").resolve() == package:
        sha = _git(package, "rev-parse", "HEAD")
        return Code(ver, sha, bool(_git(package, "status", "--porcelain", "--untracked-files=no")) if sha else None)
    try:
        built = json.loads((package / BUILD_STAMP).read_text())
    except (OSError, ValueError):
        return Code(ver)
    return Code(ver, built.get("commit") or None, built.get("dirty"))


def key_commit(found: Commit, code: Code, given: str | None, root: Path) -> tuple[Commit, str | None]:
    """The commit a run is keyed by, checked against the code that will run: (the commit, with the
    code's identity and dirty state, and a warning or None). Keying rows to a commit whose code did
    not run (a stale or non-editable install run from a newer checkout of the same repository) is
    refused with CommitError unless --commit names the commit (then a warning). A checkout of
    another repository (a user's own kernels) keys its runs by its own commit, as before."""
    keyed = replace(found, kcollect_version=code.version, kcollect_commit=code.commit)
    if code.commit is None or found.sha is None or found.sha == code.commit:
        if found.sha is not None and found.sha == code.commit:  # the dirty state of the code that runs
            keyed = replace(keyed, dirty=code.dirty)  # (the build's, for a copy), known with --commit too
        return keyed, None
    if _git(root, "cat-file", "-e", code.commit + "^{commit}") is None:
        return keyed, None  # not this repository's code: a checkout of one's own kernels
    what = f"the kcollect that runs here (version {code.version or 'unknown'}) was built from {code.commit[:12]}"
    if given is not None:
        return keyed, f"{what}, not {found.sha[:12]}; the rows are keyed to {found.sha[:12]} as --commit says"
    raise CommitError(f"{what}, but the checkout at {root} is at {found.sha[:12]}: its rows would be keyed to code "
                      f"that did not run. Reinstall kcollect from this checkout (pip install -e .), or give --commit "
                      f"{code.commit[:12]} (or --commit {found.sha[:12]} to key them there anyway)")


class CommitError(ValueError):
    """--commit/--commit-time that cannot be resolved, in one sentence."""


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_url(remote: str | None, sha: str) -> str | None:
    """https://HOST/OWNER/REPO/commit/SHA for a GitHub or GitLab-style remote (https or ssh), else None."""
    m = re.match(r"^(?:https?://(?:[^@/]+@)?|ssh://git@|git@)(github\.com|gitlab\.com)[:/]([^/]+)/(.+?)(?:\.git)?/?$",
                 remote or "")
    return f"https://{m.group(1)}/{m.group(2)}/{m.group(3)}/commit/{sha}" if m else None


def parse_time(text: str) -> datetime:
    """An ISO time (a trailing Z or an offset allowed) as naive UTC; ValueError when it is not one."""
    when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when


def resolve_commit(root: Path, commit: str | None = None, commit_time: str | None = None) -> Commit:
    """The commit of the git checkout at root (the working directory, not the installed package's
    folder, which a normal install has moved out of the checkout), or of `commit` when given: its
    time, subject and author come from git where the checkout has it, and otherwise need
    `commit_time`. Raises CommitError for a bad time, or a commit git does not know with no time."""
    when = None
    if commit_time is not None:
        try:
            when = parse_time(commit_time)
        except ValueError:
            raise CommitError(f"--commit-time {commit_time!r} is not an ISO time (e.g. 2026-11-24T16:25:22Z)") from None
    rev = commit or "HEAD"
    sha = _git(root, "rev-parse", "--verify", "--quiet", rev + "^{commit}")
    if sha is None:
        if commit is None:
            return Commit(time=when)
        if when is None:
            raise CommitError(f"--commit {commit!r} is not a commit of the git checkout at {root}; "
                              "give its time with --commit-time")
        if not re.fullmatch(r"[0-9a-f]{40}", commit):  # a short one would key the rows ambiguously
            raise CommitError(f"--commit {commit!r}: git here does not know it, so give its full 40-character SHA")
        return Commit(sha=commit, time=when, url=commit_url(_git(root, "remote", "get-url", "origin"), commit))
    meta = (_git(root, "show", "-s", "--format=%ct%x00%s%x00%an <%ae>", sha) or "").split("\x00")
    if when is None and meta[0]:
        when = datetime.fromtimestamp(int(meta[0]), tz=timezone.utc).replace(tzinfo=None)
    dirty = None if commit else bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return Commit(sha=sha, time=when, dirty=dirty, subject=meta[1] if len(meta) > 1 else None,
                  author=meta[2] if len(meta) > 2 else None,
                  url=commit_url(_git(root, "remote", "get-url", "origin"), sha))
