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
be sure of it keeps. Python steps only over what makes a token ambiguous, numpy counts the brackets,
and a definition's identifiers are read only once something kept reaches it (statements, _shake); a
token-by-token reader (statements_by_token) reads any bundle holding what the faster one does not
read alike, and the tests hold the two to the same answers. A bundle of another layout (plotly.js
2.x, built with webpack) is shipped whole, with a note on why.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import deque
from pathlib import Path

import numpy as np

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


class _Counted(_Statement):
    """A statement as statements() finds it: its identifiers are read from the text with its
    strings, comments and regular expressions blanked (`text`) when first asked for (a module that
    nothing keeps is never read: most of plotly.js)."""
    __slots__ = ("_text", "_stop", "_used")

    def __init__(self, start: int, text: str, a: int, stop: int):  # a, stop: the statement in text
        self.start, self.first, self.top = start, [], []
        self._text, self._stop, self._used = text, (a, stop), None

    @property
    def used(self) -> set[str]:
        if self._used is None:
            self._used = set(_USED.findall(self._text, *self._stop))
        return self._used


def statements_by_token(src: str, body: int, end: int):
    """statements() token by token: what it reads where the bundle holds what statements() leaves to
    it, and what the tests compare it with. Tokens are scanned once, without a space or a comment;
    depth counts the brackets and template substitutions open before a token."""
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


# -- statements(): the same answers as statements_by_token, with the brackets counted by numpy -------
#
# One pass of Python over what makes JavaScript's tokens ambiguous (strings, comments, regular
# expressions, template literals: a few tens of thousands in plotly.js) marks the text that is not
# code; numpy then counts the brackets of the code (a million), and a regular expression finds each
# statement's identifiers. Where the bundle holds something this pass does not read the way
# statements_by_token does (a non-ASCII character in the code, a regular expression or template
# literal at the top level or among a statement's first tokens, a member name after a space...), it
# leaves the whole bundle to statements_by_token.

_EVENT = re.compile(r"[\"'`/]")  # where a string, comment, regular expression or template may start
_EVENT_IN_TEMPLATE = re.compile(r"[\"'`/(){}\[\]]")  # and inside a template's ${...}: its brackets too
_STRING = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'""", re.S)  # as _TOKEN reads them
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# an identifier that is not a property name after a dot (after `?.` and `...` it is one)
_USED = re.compile(r"(?:(?<![\w$.])|(?<=\?\.)|(?<=\.\.\.))([A-Za-z_$][\w$]*)")
# where _USED might read otherwise than _TOKEN: a dot before a space (a property name may follow),
# and a sign after an e, which _TOKEN reads as part of a number before it (0xe+n: one token)
_MISREAD = re.compile(r"\.\s")
_EXPONENT = re.compile(r"[eE][+-][A-Za-z_$]")
_NUMBER_END = re.compile(r"(?<![\w$])\.?\d[\w.]*\Z")
# up to the last bracket, comma or semicolon: in code without strings or comments, always a token
_LAST_BRACKET = re.compile(r".*[(){}\[\];,]", re.S)
_STR, _REGEXP, _TEMPLATE, _COMMENTED = range(4)  # what a span of text that is not code holds
# each character of code by what statements() does with it (a table of ASCII; the rest _OTHER)
_OTHER, _CODE, _SPACE, _SEMICOLON, _NOT_CODE, _OPEN_BRACKET, _CLOSE_BRACKET, _CLOSE_BRACE = range(8)
_CLASS = np.full(128, _OTHER, dtype=np.int8)
_CLASS[32:127] = _CODE
_CLASS[[9, 10, 13, 32]] = _SPACE
_CLASS[[ord(";")]] = _SEMICOLON
_CLASS[[ord(c) for c in _OPEN]] = _OPEN_BRACKET
_CLASS[[ord(c) for c in ")]"]] = _CLOSE_BRACKET
_CLASS[ord("}")] = _CLOSE_BRACE
_PAIR = np.zeros(128, dtype=np.int8)  # which pair a bracket is of
for _k, _pair in enumerate(("()", "[]", "{}")):
    _PAIR[[ord(c) for c in _pair]] = _k


class _Unsure(Exception):
    """The bundle holds something that statements() leaves to statements_by_token."""


def statements(src: str, body: int, end: int) -> list[tuple[int, int, _Statement]]:
    """(start, end, statement) of each statement at the top level of the function between body and
    end (a _Statement), as statements_by_token finds them."""
    try:
        return _statements(src, body, end)
    except _Unsure:
        return list(statements_by_token(src, body, end))


def _spans(src: str, body: int, end: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """([(start, stop, kind)] of the text between body and end that is not code, [(position, +1 or
    -1)] of the template substitutions' ${ and }), in order."""
    spans: list[tuple[int, int, int]] = []
    subs: list[tuple[int, int]] = []
    stack: list[str] = []  # inside a template's substitution: its open brackets and '${'
    pos = seg = body  # seg: where the code since the last string, regular expression or template begins
    after: tuple[str, str] | None = None  # the token that ended there (statements_by_token's prev)
    commented = False  # whether a comment came since seg

    def template(at: int, start: int) -> int:  # its text from `start` (a backtick or a closing brace at `at`)
        nonlocal after
        stop = _TEMPLATE_PART.match(src, start).end()
        if src.startswith("`", stop):
            spans.append((at, stop + 1, _TEMPLATE))
            after = ("str", "`")
            return stop + 1
        if not src.startswith("${", stop):
            raise BundleLayoutError(f"an unterminated template literal at {stop}")
        spans.append((at, stop + 2, _TEMPLATE))  # its '{' is counted open below, as a bracket of its own
        subs.append((stop + 1, 1))
        stack.append("${")
        after = ("punct", "${")
        return stop + 2

    while True:
        m = (_EVENT_IN_TEMPLATE if stack else _EVENT).search(src, pos, end)
        if m is None:
            break
        at, ch = m.start(), m.group()
        if ch == '"' or ch == "'":
            s = _STRING.match(src, at)
            if s is None:
                raise _Unsure  # an unterminated string: statements_by_token reads the quote as a token
            spans.append((at, s.end(), _STR))
            after, pos = ("str", s.group()), s.end()
            seg, commented = pos, False
        elif ch == "/":
            if src.startswith(("//", "/*"), at):
                c = _COMMENT.match(src, at)
                if c is None:
                    raise _Unsure
                spans.append((at, c.end(), _COMMENTED))
                pos, commented = c.end(), True
                continue
            prev = after
            if not commented:  # the tokens since seg: from its last bracket, comma or semicolon on
                bracket = _LAST_BRACKET.match(src, max(seg, at - 64), at)
                seg = bracket.end() - 1 if bracket else seg
            for t in _TOKEN.finditer(src, seg, at):
                if t.lastgroup != "ws" and t.lastgroup != "comment":
                    prev = (t.lastgroup, t.group())
            if _division(prev):
                after, pos = ("punct", "/"), at + 1
            else:
                r = _REGEX.match(src, at)
                if not r:
                    raise BundleLayoutError(f"an unreadable regular expression at {at}")
                spans.append((at, r.end(), _REGEXP))
                after, pos = ("regex", r.group()), r.end()
            seg, commented = pos, False
        elif ch == "`":
            pos = seg = template(at, at + 1)
            commented = False
        elif ch in _OPEN:
            stack.append(ch)
            pos = at + 1
        elif ch == "}" and stack[-1] == "${":
            stack.pop()
            subs.append((at, -1))
            pos = seg = template(at, at + 1)
            commented = False
        else:
            if stack[-1] != _OPEN[_CLOSE.index(ch)]:
                raise _Unsure  # unmatched: statements_by_token says where
            stack.pop()
            pos = at + 1
    if stack:
        raise _Unsure
    return spans, subs


def _statements(src: str, body: int, end: int) -> list[tuple[int, int, _Statement]]:
    spans, subs = _spans(src, body, end)
    n = end - body
    chars = np.frombuffer(src[body:end].encode("utf-32-le"), dtype=np.uint32)
    first, last, kind = (np.array(v, dtype=np.int64) for v in (zip(*spans) if spans else ((), (), ())))
    first, last = first - body, last - body

    def covered(which: np.ndarray) -> np.ndarray:  # the characters inside these spans (which never overlap)
        edges = np.zeros(n + 1, dtype=np.int8)
        edges[first[which]] += 1
        edges[last[which]] -= 1
        return np.cumsum(edges, dtype=np.int8)[:n].view(bool)

    inside = covered(np.ones(len(kind), dtype=bool))
    cls = _CLASS[np.minimum(chars, 127)]
    cls[inside] = _NOT_CODE
    if np.any(cls == _OTHER):
        raise _Unsure  # _TOKEN's classes read other characters by Unicode
    delta = np.zeros(n, dtype=np.int32)
    delta[cls >= _OPEN_BRACKET] = 1
    delta[cls >= _CLOSE_BRACKET] = -1
    sub_at = np.array([p for p, _ in subs], dtype=np.int64) - body
    delta[sub_at] = np.array([d for _, d in subs], dtype=np.int32)
    depth = np.cumsum(delta, dtype=np.int32)  # after each character
    if n and (depth.min() < 0 or depth[-1] != 0):
        raise _Unsure  # unmatched, or left open: statements_by_token says where
    moves = np.flatnonzero(delta)
    level = np.where(delta[moves] > 0, depth[moves], depth[moves] + 1)
    types = _PAIR[np.minimum(chars[moves], 127)]
    types[np.isin(moves, sub_at)] = 3  # a substitution's ${ and }
    paired = types[np.argsort(level, kind="stable")]  # each level's brackets in order: open, close, ...
    if np.any(paired[0::2] != paired[1::2]):
        raise _Unsure
    before = depth - delta
    if np.any(before[first[(kind == _REGEXP) | (kind == _TEMPLATE)]] == 0):
        raise _Unsure  # a regular expression or template literal outside every bracket
    blank = chars.copy()
    blank[inside] = 32
    text = blank.tobytes().decode("utf-32-le")
    if _MISREAD.search(text) or any(_NUMBER_END.search(text, max(0, m.start() - 64), m.start() + 1)
                                    for m in _EXPONENT.finditer(text)):
        raise _Unsure
    token = (cls != _SPACE) & ~covered(kind == _COMMENTED)  # where a token may start
    at_top = depth == 0
    semis = np.flatnonzero((cls == _SEMICOLON) & at_top)
    braces = np.flatnonzero((cls == _CLOSE_BRACE) & at_top)
    top_level = (before == 0) | (depth == 0)  # statements_by_token's `top`: at depth 0, and the brackets there
    out, pos = [], 0
    while True:
        if pos >= n:
            break
        a = pos + int(np.argmax(token[pos:]))  # the next statement's first token
        if not token[a]:
            break
        word = _TOKEN.match(src, body + a).group()
        ends = [semis[np.searchsorted(semis, a)]] if len(semis) and semis[-1] >= a else []
        if word == "function" and len(braces) and braces[-1] >= a:
            ends.append(braces[np.searchsorted(braces, a)])
        pos = int(min(ends)) + 1 if ends else n
        st = _Counted(body + a, text, a, pos)
        for t in _TOKEN.finditer(src, body + a, body + pos):
            if t.lastgroup == "ws" or t.lastgroup == "comment":
                continue
            if t.group() in ("`", "/"):
                raise _Unsure  # a template literal or a slash among its first tokens
            st.first.append((t.lastgroup, t.group()))
            if len(st.first) == 4:
                break
        st.top = [t.group() for t in _TOKEN.finditer(chars[a:pos][top_level[a:pos]].tobytes().decode("utf-32-le"))
                  if t.lastgroup != "ws" and t.lastgroup != "comment"]
        out.append((body + a, body + pos, st))
    return out


def partial(src: str) -> str:
    """The bundle with the scatter trace only. Raises BundleLayoutError where the layout differs."""
    start = src.find(HEAD)
    wrapper, init, export = WRAPPER.search(src), INIT.search(src), EXPORT.search(src)
    calls = _register_calls(src)
    if start < 0 or not wrapper or not init or not export or len(calls) != 1:
        raise BundleLayoutError("no esbuild layout (a lazy-module wrapper and one register([...]) of the traces)")
    body = start + len(HEAD)
    end = src.rfind("})();")
    call = calls[0]
    src = src[:call.start()] + f"{call.group(1)}.register([])" + src[call.end():]
    end -= call.end() - call.start() - len(f"{call.group(1)}.register([])")
    return _shake(src, body, end, (wrapper.group(1), init.group(1)), export.group(1))


def _register_calls(src: str) -> list[re.Match]:
    """REGISTER.finditer(src), looked for only where '.register([' is (a pattern that starts with a
    class of characters is tried at every position of the bundle: a tenth of a second)."""
    calls, at = [], src.find(".register([")
    while at >= 0:
        run = at - len(_WORD_END.search(src, max(0, at - 200), at).group())  # the name's characters before it
        if run == max(0, at - 200) and run > 0:
            return list(REGISTER.finditer(src))  # a name too long to look back over
        # REGISTER matches from the first character of the run that can start a name, or from none
        start = next((k for k in range(run, at) if _NAME_START.match(src, k)), None)
        call = REGISTER.match(src, start) if start is not None else None
        if call:
            calls.append(call)
        at = src.find(".register([", call.end() if call else at + 1)
    return calls


_WORD_END = re.compile(r"[\w$]*\Z")
_NAME_START = re.compile(r"[A-Za-z_$]")


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
    defined: dict[str, list[_Statement]] = {}  # defined name -> the statements that define it
    roots: set[str] = set()  # identifiers the other statements use
    for start, stop, st in statements(src, body, end):
        names, bare = _defines(st, lazy, export)
        if not names:
            roots |= st.used
            continue
        spans.append((start, stop, names, bare))
        for n in names:
            defined.setdefault(n, []).append(st)
    keep = _reachable(roots, defined)
    out, at = [], 0
    for a, b, names, bare in spans:
        if not any(n in keep for n in names):
            out.append(src[at:a] + (f"var {','.join(bare)};" if bare else ""))
            at = b
    out.append(src[at:])
    return "".join(out)


def _reachable(roots: set[str], defined: dict[str, list[_Statement]]) -> set[str]:
    """The names the roots use, and those their definitions use, and so on (a definition's
    identifiers are read only once it is reached)."""
    seen = set(roots)
    todo = deque(n for n in roots if n in defined)
    while todo:
        for st in defined[todo.popleft()]:
            for n in st.used:
                if n not in seen:
                    seen.add(n)
                    if n in defined:
                        todo.append(n)
    return seen


_MEMO: dict[str, bytes] = {}  # this process's partial bundles, by key: a test session builds many sites


def build(full: Path, cache: Path | None) -> tuple[bytes, str | None]:
    """(the partial bundle, None) from the full one, or (the full one, why) where its layout is not
    the one partial() reads. Kept in `cache` (a folder) by the full bundle's hash: reading it
    takes over half a second, and plotly changes only with its package."""
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
