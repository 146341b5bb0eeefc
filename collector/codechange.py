"""Whose code changed between two commits, from git: the gate's question "could this be ours?".

For each kernel (op) the files under kernels/ fall in two sets, found by following imports module
by module at each commit:

- its CODE: every Python file of the op's folder but spec.py (or, in the older flat layout, the op's
  single file `kernels/<op>.py`), and every module they import, transitively: a shared module of
  `kernels/_lib/` is the code of the ops that import it, not of every op;
- its METHOD: spec.py, the other files of its folder (grids.toml), and the modules only spec.py
  imports (the shared input, grid and cost-model helpers): what is measured and on which inputs;
  and the collector's modules that decide how any case is timed (HARNESS): a new ruler. On the H200
  history every same-code line beyond 6 standard errors came at a commit that edited them (eager's
  M=1 layer_norm +32% at d12112f), and no other commit made one.

Between two commits a kernel is 'changed' when a file of its code differs, 'method' when only files
of its method differ (its series may move, every provider's alike, and that is not a regression of
ours), 'unchanged' otherwise. A Python file differs only where its bytecode does, compiled without
docstrings and line numbers: an edit of comments or docstrings alone runs the same program. Imports
are followed as written: `from .._lib import sm_count` is
the module that defines sm_count (through the package's re-export), `from .._lib.rows import x`
is rows.py; a package's __init__ counts only where it is imported by name (Python runs it on any
import of the package, but what it defines is reached only by name). Where git cannot tell (no
repository, a commit it does not have, a kernel that does not live under kernels/), the answer is
None and callers treat our code as changed.

Providers other than ours run code that never changes between our commits; callers decide that
from the row's `ours` flag, never from a provider's name.
"""
from __future__ import annotations

import ast
import hashlib
import subprocess
import types
from functools import lru_cache
from pathlib import Path

KERNELS = "kernels"
PACKAGES = ("kcollect.kernels", "kernels")  # absolute spellings of the kernels package

CHANGED, METHOD, UNCHANGED = "changed", "method", "unchanged"
# How a case is timed: the timers, the runner's warm-up, capture and recheck, and what it does with
# memory and the L2 between calls. An edit of one is a change of every kernel's method.
HARNESS = ("collector/timing.py", "collector/runner.py", "collector/memory.py")


def git(root: str | Path, *args: str, stdin: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60,
                             input=stdin)
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


class Tree:
    """The files under kernels/ at one commit, with the import edges between its Python modules."""

    def __init__(self, commit: str, blobs: dict[str, str], texts: dict[str, str]):
        self.commit, self.blobs = commit, blobs
        self.statements = {path: _statements(blobs[path], text) for path, text in texts.items()}
        self.edges = {path: self._imports(path) for path in texts}
        self.ops = frozenset(op for p in blobs if (op := _op_of(p)))

    def closure(self, roots) -> set[str]:
        seen, todo = set(), list(roots)
        while todo:
            path = todo.pop()
            if path not in seen:
                seen.add(path)
                todo += self.edges.get(path, ())
        return seen

    def parts(self, op: str) -> tuple[set[str], set[str]]:
        """(code files, method files) of one op (see the module docstring)."""
        flat = f"{KERNELS}/{op}.py"
        harness = {p for p in HARNESS if p in self.blobs}
        if flat in self.blobs:
            return self.closure([flat]), harness
        folder = f"{KERNELS}/{op}/"
        mine = [p for p in self.blobs if p.startswith(folder)]
        spec = folder + "spec.py"
        code = self.closure(p for p in mine if p.endswith(".py") and p != spec)
        method = ({p for p in mine if p not in code} | self.closure([spec] if spec in self.blobs else [])) - code
        return code, method | harness

    def _module(self, parts: list[str]) -> tuple[str | None, bool]:
        """The file of a dotted module under kernels/ -> (path, is a package) or (None, False)."""
        base = "/".join(parts)
        if base + ".py" in self.blobs:
            return base + ".py", False
        if base + "/__init__.py" in self.blobs:
            return base + "/__init__.py", True
        return None, False

    def _imports(self, path: str) -> set[str]:
        """The files under kernels/ that one module imports (see the module docstring)."""
        package = path.split("/")[:-1]
        out: set[str] = set()
        for level, module, names in self.statements[path]:
            if names is None:  # `import kcollect.kernels.x`
                parts = _absolute(module)
                found = self._module(parts)[0] if parts else None
                out |= {found} if found else set()
                continue
            if level:
                base = package[:len(package) - level + 1] + (module.split(".") if module else [])
            else:
                base = _absolute(module or "")
            for name in names.values() if base else ():
                out |= self._resolve(base, name, set())
        return out - {path}

    def _resolve(self, base: list[str], name: str, seen: set) -> set[str]:
        """The file that `from <base> import <name>` reaches: a submodule, the module that a
        package's __init__ re-exports the name from, or the module (or __init__) that defines it."""
        sub = self._module(base + [name])[0]
        if sub:
            return {sub}
        path, package = self._module(base)
        if path is None:
            return set()
        if not package or (path, name) in seen:
            return {path}
        seen.add((path, name))
        for level, module, names in self.statements.get(path, ()):  # `from .sub import name` in __init__
            if level == 1 and names and name in names:
                return self._resolve(base + (module.split(".") if module else []), names[name], seen)
        return {path}


@lru_cache(maxsize=8192)
def _statements(blob: str, text: str) -> tuple:
    """The import statements of one file: (level, module, {name as bound: name in its module}, or
    None for `import x`); cached by blob, since most files are alike between commits."""
    out = []
    for node in _import_nodes(text):
        if isinstance(node, ast.Import):
            out += [(0, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module, {(a.asname or a.name): a.name for a in node.names}))
    return tuple(out)


def _import_nodes(text: str):
    """Each import statement of a file, parsed on its own (whole files took seconds over a long
    history): a line that starts like one, with its parenthesised continuation lines; a line of
    prose that only looks like one does not parse and is skipped."""
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        line = lines[k].strip()
        k += 1
        if line.startswith(("from ", "import ")):
            while line.count("(") > line.count(")") and k < len(lines):
                line += " " + lines[k].strip()
                k += 1
            try:
                yield from ast.parse(line.split("#")[0]).body
            except SyntaxError:
                continue


def _absolute(module: str) -> list[str] | None:
    for prefix in PACKAGES:
        if module == prefix or module.startswith(prefix + "."):
            return [KERNELS] + [p for p in module[len(prefix):].split(".") if p]
    return None


class Repo:
    """Code changes between commits of the repository at root, cached per commit."""

    def __init__(self, root: str | Path = "."):
        self.root = root
        self._trees: dict[str, Tree | None] = {}
        self._parts: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
        self._diffs: dict[tuple[str, str], set[str]] = {}

    def tree(self, commit: str) -> Tree | None:
        if commit not in self._trees:
            self._trees[commit] = _load(self.root, commit)
        return self._trees[commit]

    def _op_parts(self, tree: Tree, op: str) -> tuple[set[str], set[str]]:
        key = (tree.commit, op)
        if key not in self._parts:
            self._parts[key] = tree.parts(op)
        return self._parts[key]

    def status(self, kernel: str, a: str | None, b: str | None) -> str | None:
        """'changed', 'method' or 'unchanged' for one kernel from commit a to commit b; None where
        git cannot tell."""
        if a and a == b:
            return UNCHANGED
        ta, tb = (self.tree(c) if c else None for c in (a, b))
        if ta is None or tb is None or kernel not in (ta.ops | tb.ops):
            return None
        changed = self._raw(ta, tb)
        if not changed:
            return UNCHANGED
        code, method = set(), set()
        for t in (ta, tb):
            if kernel in t.ops:
                c, m = self._op_parts(t, kernel)
                code |= c
                method |= m
        if self._runs_differ(ta, tb, changed & code):
            return CHANGED
        return METHOD if self._runs_differ(ta, tb, changed & method) else UNCHANGED

    def method_changed(self, kernel: str, a: str | None, b: str | None) -> bool:
        """Whether a file of the kernel's method differs (whatever its code did): every provider's
        series of the kernel may move."""
        if not a or not b or a == b:
            return False
        ta, tb = self.tree(a), self.tree(b)
        if ta is None or tb is None:
            return False
        changed = self._raw(ta, tb)
        method = set().union(*(self._op_parts(t, kernel)[1] for t in (ta, tb) if kernel in t.ops))
        return self._runs_differ(ta, tb, changed & method)

    def _raw(self, ta: Tree, tb: Tree) -> set[str]:
        """The files whose content differs between two trees."""
        key = (ta.commit, tb.commit)
        if key not in self._diffs:
            self._diffs[key] = {p for p in ta.blobs.keys() | tb.blobs.keys() if ta.blobs.get(p) != tb.blobs.get(p)}
        return self._diffs[key]

    def _runs_differ(self, ta: Tree, tb: Tree, paths: set[str]) -> bool:
        """Whether any of these differing files runs differently: not a Python file in both trees, or
        one whose code (_code_key) differs; an edit of its comments or docstrings alone does not. Files
        are compared one at a time, cheapest first, until one differs."""
        for p in sorted(paths, key=lambda p: p.endswith(".py") and p in ta.blobs and p in tb.blobs):
            a, b = ta.blobs.get(p), tb.blobs.get(p)
            if not p.endswith(".py") or a is None or b is None:
                return True
            keys = _code_keys(self.root, {a, b})
            if keys[a] is None or keys[a] != keys[b]:
                return True
        return False

    def changed_kernels(self, a: str, b: str) -> dict[str, str] | None:
        """{kernel: 'changed' or 'method'} between two commits (kernels of b); None where git cannot tell."""
        tb = self.tree(b)
        if tb is None or self.tree(a) is None:
            return None
        out = {op: self.status(op, a, b) for op in sorted(tb.ops)}
        return {op: s for op, s in out.items() if s in (CHANGED, METHOD)}


def _load(root: str | Path, commit: str) -> Tree | None:
    listing = git(root, "ls-tree", "-r", commit, "--", KERNELS, *HARNESS)
    if listing is None:
        return None
    blobs = {}
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        blobs[path] = meta.split()[2]
    texts = _texts(root, tuple(sorted((p, b) for p, b in blobs.items() if p.endswith(".py") and p.startswith(KERNELS))))
    return Tree(commit, blobs, texts) if texts is not None else None


# blob -> its code key (_code_key), over every Repo: a blob's code never changes
_CODE_KEYS: dict[str, str | None] = {}


def _code_keys(root, blobs: set[str]) -> dict[str, str | None]:
    """{blob: _code_key of its text} for Python blobs, those not seen before read in one batch."""
    todo = sorted(b for b in blobs if b not in _CODE_KEYS)
    # (uncached: the keys are what is kept; a batch of blobs would only push trees out of _texts' cache)
    texts = _texts.__wrapped__(root, tuple((b, b) for b in todo)) if todo else {}
    if texts is None:  # git could not read them: unknown, so changed (and not remembered)
        return dict.fromkeys(blobs)
    for b in todo:
        _CODE_KEYS[b] = _code_key(texts[b])
    return {b: _CODE_KEYS[b] for b in blobs}


def _code_key(text: str) -> str | None:
    """What a Python file runs: its bytecode, compiled without the docstrings of the module and of
    its (nested) classes and functions, line numbers left out (comments are not compiled); None where
    it does not compile. compile() runs in C: a dump of the syntax tree in Python took seconds over a
    history's files."""
    try:
        tree = ast.parse(text)
        todo = [tree]
        while todo:
            node = todo.pop()
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                node.body = node.body[1:] or [ast.copy_location(ast.Pass(), first)]
            todo += [n for n in node.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        code = compile(tree, "<kernels>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return hashlib.sha1(repr(_bytecode(code)).encode()).hexdigest()


def _bytecode(code: types.CodeType) -> tuple:
    """A code object's instructions, names and constants (nested code objects alike), not its lines."""
    consts = tuple(_bytecode(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
            code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags, code.co_name,
            getattr(code, "co_exceptiontable", b""), consts)


@lru_cache(maxsize=64)
def _texts(root, files: tuple[tuple[str, str], ...]) -> dict[str, str] | None:
    """{path: text} of the given (path, blob) pairs, read in one `git cat-file --batch`."""
    if not files:
        return {}
    try:
        out = subprocess.run(["git", "-C", str(root), "cat-file", "--batch"], capture_output=True, timeout=120,
                             input="".join(b + "\n" for _, b in files).encode())
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    data, pos, texts = out.stdout, 0, {}
    for path, _ in files:
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        texts[path] = data[header_end + 1:header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1
    return texts
