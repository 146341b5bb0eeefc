"""Whose code changed between two commits, from git: the gate's question "could this be ours?".

Providers other than ours run code that never changes between our commits (torch, torch.compile,
peers), so their times moving says something about the machine, never about a commit. Our own
provider's code changed for a kernel when a file of its op changed (`kernels/<op>/` or, in the
older flat layout, `kernels/<op>.py`), a file the ops share (`kernels/_lib/`, `kernels/_utils.py`,
`kernels/__init__.py`), or the code of an op it imports (add_rms_norm imports rms_norm's kernels).
Where git cannot tell (no repository, a commit it does not have, a kernel that does not live under
kernels/), the answer is None and callers treat the code as changed.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

KERNELS = "kernels"
IMPORT = re.compile(r"^\s*from\s+(\.+|kcollect\.kernels\.|kernels\.)(\w+)")


def git(root: str | Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _op_of(path: str) -> str | None:
    """kernels/<op>/... or kernels/<op>.py -> op; None for what the ops share."""
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != KERNELS:
        return None
    name = parts[1][:-3] if parts[1].endswith(".py") and len(parts) == 2 else parts[1]
    return None if name.startswith("_") else name


class CodeChanges:
    """The kernels whose code changed from commit a to commit b (see the module docstring)."""

    def __init__(self, root: str | Path, b: str, ops: frozenset[str], changed_files: tuple[str, ...]):
        self.root, self.b, self.ops, self.changed_files = root, b, ops, changed_files
        self.touched = {_op_of(p) for p in changed_files}
        self._imports: dict[str, set[str]] | None = None

    def imports(self) -> dict[str, set[str]]:
        """op -> the ops its files import, at b (read only when an answer depends on it)."""
        if self._imports is None:
            self._imports = {}
            for line in (git(self.root, "grep", "-I", "-E", r"^\s*from\s", self.b, "--", KERNELS) or "").splitlines():
                _, _, rest = line.partition(":")  # <commit>:<path>:<text>
                path, _, text = rest.partition(":")
                op, m = _op_of(path), IMPORT.match(text)
                if op and m and m.group(2) in self.ops and m.group(2) != op:
                    self._imports.setdefault(op, set()).add(m.group(2))
        return self._imports

    def changed(self, kernel: str) -> bool | None:
        if kernel not in self.ops:
            return None
        if None in self.touched:  # a shared file
            return True
        if not self.touched:
            return False
        seen, todo = set(), [kernel]
        while todo:
            op = todo.pop()
            if op in self.touched:
                return True
            seen.add(op)
            todo += [d for d in self.imports().get(op, ()) if d not in seen]
        return False

    def changed_kernels(self) -> list[str]:
        return sorted(op for op in self.ops if self.changed(op))


def between(a: str, b: str, root: str | Path = ".") -> CodeChanges | None:
    """The code changes from commit a to commit b in the repository at root; None where git cannot tell."""
    files = git(root, "ls-tree", "-r", "--name-only", b, "--", KERNELS)
    diff = git(root, "diff", "--name-only", a, b, "--", KERNELS)
    if files is None or diff is None:
        return None
    ops = frozenset(op for p in files.split() if (op := _op_of(p)))
    return CodeChanges(root, b, ops, tuple(diff.split()))
