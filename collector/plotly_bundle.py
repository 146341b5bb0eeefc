"""A partial plotly.js for the site: the installed plotly package's bundle with only the trace types the
site draws (scatter, which plotly's core registers itself), under a quarter of its size.

plotly.js (3.x and 4.x, built with esbuild) defines each module lazily, as `var NAME=W((e,t)=>{...});`
inside one function, and ends with `CORE.register([TRACE(), ...])`, which pulls in every other trace
type (bar, pie, 3D, maps, WebGL...). This rewrites that call to register none, then drops every lazy
module (and ES module initialiser, export table and function declaration at the top level) that
nothing kept refers to, directly or through other kept code: the same code, fewer modules. No
JavaScript tooling is needed, so the build stays Python-only.

The references are found with a small JavaScript tokenizer (strings, template literals, regular
expressions and comments are skipped, property names after a dot are not references); what it cannot
be sure of it keeps. A bundle of another layout (plotly.js 2.x, built with webpack) is shipped whole,
with a note on why.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import deque
from pathlib import Path

HEAD = "var Plotly=(()=>{"
# The lazy-module wrapper esbuild names in the minified bundle is found from its definition
# (`NAME=(e,t)=>()=>{try{return t||e((t={exports:{}}).exports,t),t.exports}...`).
WRAPPER = re.compile(r"([A-Za-z_$][\w$]*)=\(([\w$]+),([\w$]+)\)=>\(\)=>\{try\{return \3\|\|\2\(\(\3=\{exports:\{\}\}\)")
# ... and the wrapper of an ES module's lazy initialiser (`NAME=(e,t,r)=>()=>{if(r)throw r[0];...`)
INIT = re.compile(r"([A-Za-z_$][\w$]*)=\(([\w$]+),([\w$]+),([\w$]+)\)=>\(\)=>\{if\(\4\)throw \4\[0\]")
# ... and the helper that defines an ES module's exports as getters (`NAME=(e,t)=>{for(var r in t)...`)
EXPORT = re.compile(r"([A-Za-z_$][\w$]*)=\(([\w$]+),([\w$]+)\)=>\{for\(var ([\w$]+) in \3\)[\w$]+\(\2,\4,\{get:\3\[\4\]")
REGISTER = re.compile(r"([A-Za-z_$][\w$]*)\.register\(\[(?:[A-Za-z_$][\w$]*\(\),?)+\]\)")

_TOKEN = re.compile(r"""
  (?P<ws>\s+)
| (?P<comment>//[^\n]*|/\*.*?\*/)
| (?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
| (?P<id>[A-Za-z_$][\w$]*)
| (?P<num>\.?\d(?:[\w.]|[eE][+-])*)
| (?P<punct>\?\.|=>|\.\.\.|[(){}\[\];,.`]|[^\s\w$])
""", re.S | re.X)
_REGEX = re.compile(r"/(?:[^/\\\[\n]|\\.|\[(?:[^\]\\\n]|\\.)*\])+/[A-Za-z]*")
_TEMPLATE_PART = re.compile(r"(?:[^`\\$]|\\.|\$(?!\{))*", re.S)
# after a value (a name, a number, a string, a closing bracket) a slash divides, except after these
# words; after anything else it starts a regular expression
_KEYWORDS = frozenset({"return", "typeof", "case", "do", "else", "in", "of", "new", "delete", "void", "throw",
                       "instanceof", "yield", "await"})
_OPEN, _CLOSE = "([{", ")]}"


class BundleLayoutError(Exception):
    """The bundle is not laid out as this module expects."""


class _Statement:
    """What _shake reads of one top-level statement while it is scanned: its first tokens (kind,
    text), the texts of its tokens at depth 0, and the identifiers it uses (not after a dot)."""
    __slots__ = ("start", "first", "top", "used")

    def __init__(self, start: int):
        self.start, self.first, self.top, self.used = start, [], [], set()


def statements(src: str, body: int, end: int):
    """(start, end, statement) of each statement at the top level of the function between body and
    end (a _Statement). Tokens are scanned once, without a space or a comment; depth counts the
    brackets and template substitutions open before a token."""
    pos, depth, prev = body, 0, None  # prev: the last token, for _division (a regex or template too)
    last = None  # the text of the last token kept (regular expressions and templates are not)
    stack: list[str] = []  # open brackets, and '${' for a substitution inside a template literal
    st: _Statement | None = None
    while pos < end:
        ch = src[pos]
        if ch == "/" and not _division(prev) and not src.startswith(("//", "/*"), pos):
            m = _REGEX.match(src, pos)
            if not m:
                raise BundleLayoutError(f"an unreadable regular expression at {pos}")
            prev = ("regex", m.group())
            pos = m.end()
            continue
        if ch == "`" or (ch == "}" and stack and stack[-1] == "${"):
            if ch == "}":
                stack.pop()
                depth -= 1
            pos = _template(src, pos + 1, stack)
            if src.startswith("${", pos - 2) and stack and stack[-1] == "${":
                depth += 1
                prev = ("punct", "${")
            else:
                prev = ("str", "`")
            continue
        # the tokens from here up to the next one that needs the scan above (a slash that may start
        # a regular expression, a template literal), in one pass of the regex engine
        for m in _TOKEN.finditer(src, pos):
            at = m.start()
            if at != pos:
                raise BundleLayoutError(f"an unreadable character {src[pos]!r} at {pos}")
            if at >= end:
                break
            kind = m.lastgroup
            if kind == "ws" or kind == "comment":
                pos = m.end()
                continue
            text = m.group()
            if text == "`" or (text == "/" and not _division(prev)) or (text == "}" and stack and stack[-1] == "${"):
                break  # pos stays at it: the scan above takes it
            pos = m.end()
            if st is None:
                st = _Statement(at)
            if len(st.first) < 4:
                st.first.append((kind, text))
            if kind == "id" and (last != "." or len(st.first) == 1):
                st.used.add(text)
            if text in _OPEN:
                if depth == 0:
                    st.top.append(text)
                stack.append(text)
                depth += 1
            elif text in _CLOSE:
                if not stack or _OPEN.index(stack.pop()) != _CLOSE.index(text):
                    raise BundleLayoutError(f"an unmatched {text!r} at {at}")
                depth -= 1
                if depth == 0:
                    st.top.append(text)
            elif depth == 0:
                st.top.append(text)
            prev, last = (kind, text), text
            if depth == 0 and (text == ";" or (text == "}" and st.first[0][1] == "function")):
                yield st.start, pos, st
                st = None
        else:
            if pos < end:
                raise BundleLayoutError(f"an unreadable character {src[pos]!r} at {pos}")
    if stack:
        raise BundleLayoutError(f"{len(stack)} bracket(s) left open at the end")
    if st is not None:
        yield st.start, end, st


def _division(prev: tuple[str, str] | None) -> bool:
    if prev is None:
        return False
    kind, text = prev
    if kind in ("num", "str", "regex"):
        return True
    if kind == "id":
        return text not in _KEYWORDS
    return text in (")", "]", "}")


def _template(src: str, pos: int, stack: list[str]) -> int:
    """Scans a template literal's text from pos; returns the position after its closing backtick, or
    after the '${' of a substitution (pushed on the stack)."""
    m = _TEMPLATE_PART.match(src, pos)
    pos = m.end()
    if src.startswith("`", pos):
        return pos + 1
    if src.startswith("${", pos):
        stack.append("${")
        return pos + 2
    raise BundleLayoutError(f"an unterminated template literal at {pos}")


def partial(src: str) -> str:
    """The bundle with the scatter trace only. Raises BundleLayoutError where the layout differs."""
    start = src.find(HEAD)
    wrapper, init, export = WRAPPER.search(src), INIT.search(src), EXPORT.search(src)
    calls = list(REGISTER.finditer(src))
    if start < 0 or not wrapper or not init or not export or len(calls) != 1:
        raise BundleLayoutError("no esbuild layout (a lazy-module wrapper and one register([...]) of the traces)")
    body = start + len(HEAD)
    end = src.rfind("})();")
    call = calls[0]
    src = src[:call.start()] + f"{call.group(1)}.register([])" + src[call.end():]
    end -= call.end() - call.start() - len(f"{call.group(1)}.register([])")
    return _shake(src, body, end, (wrapper.group(1), init.group(1)), export.group(1))


def _defines(st: _Statement, lazy: tuple[str, str], export: str) -> tuple[list[str], list[str]]:
    """(names, bare) of a statement that defines names without running anything, else ([], []):
    - `function NAME(...){...}`;
    - `var a,b,NAME=WRAP(...);`: a lazy module or ES module initialiser, whose body runs when NAME()
      is first called and assigns the bare names a, b (esbuild calls NAME() before any use of them);
    - `var NAME={};` and `EXPORT(NAME,{x:()=>y,...});`: an ES module's namespace and its getters."""
    top, toks = st.top, st.first
    if top[0] == "function" and toks[1][0] == "id":
        return [toks[1][1]], []
    if top == ["var", top[1], "=", "{", "}", ";"]:
        return [top[1]], []
    if top == [export, "(", ")", ";"] and toks[2][0] == "id" and toks[3][1] == ",":
        return [toks[2][1]], []
    if top[:1] != ["var"] or top[-3:] != ["(", ")", ";"]:
        return [], []
    bare, i = [], 1
    while i + 1 < len(top) and top[i + 1] == ",":
        bare.append(top[i])
        i += 2
    if top[i + 1:i + 3] in (["=", lazy[0]], ["=", lazy[1]]) and i + 6 == len(top):
        return [top[i]], bare
    return [], []


def _shake(src: str, body: int, end: int, lazy: tuple[str, str], export: str) -> str:
    """Drops the top-level definitions (see _defines) that nothing kept refers to. A dropped lazy
    module's bare names stay declared: kept code may name them where it never runs."""
    spans: list[tuple[int, int, list[str], list[str]]] = []
    refs: dict[str, set[str]] = {}  # defined name -> the identifiers its statements use
    roots: set[str] = set()  # identifiers the other statements use
    for start, stop, st in statements(src, body, end):
        used = st.used
        names, bare = _defines(st, lazy, export)
        if not names:
            roots |= used
            continue
        spans.append((start, stop, names, bare))
        for n in names:
            refs.setdefault(n, set()).update(used - {n})
    keep = _reachable(roots, refs)
    out, at = [], 0
    for a, b, names, bare in spans:
        if not any(n in keep for n in names):
            out.append(src[at:a] + (f"var {','.join(bare)};" if bare else ""))
            at = b
    out.append(src[at:])
    return "".join(out)


def _reachable(roots: set[str], refs: dict[str, set[str]]) -> set[str]:
    seen = set(roots)
    todo = deque(n for n in roots if n in refs)
    while todo:
        for n in refs[todo.popleft()]:
            if n not in seen:
                seen.add(n)
                if n in refs:
                    todo.append(n)
    return seen


_MEMO: dict[str, bytes] = {}  # this process's partial bundles, by key: a test session builds many sites


def build(full: Path, cache: Path | None) -> tuple[bytes, str | None]:
    """(the partial bundle, None) from the full one, or (the full one, why) where its layout is not
    the one partial() reads. Kept in `cache` (a folder) by the full bundle's hash: the tokenizer
    takes seconds, and plotly changes only with its package."""
    data = full.read_bytes()
    key = hashlib.sha256(data + Path(__file__).read_bytes()).hexdigest()[:20]
    hit = cache / f"plotly-partial-{key}.js" if cache else None
    if key in _MEMO:
        return _MEMO[key], None
    if hit and hit.is_file():
        _MEMO[key] = hit.read_bytes()
        return _MEMO[key], None
    try:
        out = partial(data.decode()).encode()
    except (BundleLayoutError, UnicodeDecodeError) as e:
        return data, f"plotly.min.js shipped whole: {e}"
    _MEMO[key] = out
    if hit:
        hit.parent.mkdir(parents=True, exist_ok=True)
        tmp = hit.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(out)
        tmp.replace(hit)
    return out, None
