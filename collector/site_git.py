"""Commit metadata the store lacks, read from the git checkout the site is built in.

Runs recorded before the store kept commit subjects, authors and links have none; where the
checkout holds those commits, one `git log` call fills them in for the site (the store is not
changed). Commits the checkout does not hold stay bare hashes; what the store recorded always wins.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .codechange import git as _git

SHA = re.compile(r"[0-9a-f]{40}")
HASH = re.compile(r"[0-9a-f]{7,40}")  # a commit's hash, whole or abbreviated (runs of copies without .git)


def commit_url_template(remote: str | None) -> str | None:
    """The web page of a commit from the remote's URL ({sha} to fill in): GitHub-like hosts take
    /commit/<sha>, GitLab /-/commit/<sha>."""
    if not remote:
        return None
    m = re.match(r"^(?:https?://(?:[^@/]+@)?|ssh://git@|git@)([^/:]+)[:/](.+?)(?:\.git)?/?$", remote.strip())
    if not m:
        return None
    host, path = m.groups()
    return f"https://{host}/{path}/{'-/' if 'gitlab' in host else ''}commit/{{sha}}"


def remote(root: Path) -> str | None:
    """The URL of the checkout's origin, where it has one."""
    return (_git(root, "remote", "get-url", "origin") or "").strip() or None


def refs(root: Path) -> str | None:
    """The checkout's HEAD and refs: what it knows changes only with them (a fetch, a commit)."""
    return _git(root, "show-ref", "--head")


def fill(commits: list[dict[str, Any]], root: Path) -> int:
    """Fills subject, author and url of the commits (dicts with 'sha', whole or abbreviated: runs
    of a copy without .git record what they were given) that have none, from the checkout at root.
    Returns how many were filled."""
    missing = sorted({c["sha"] for c in commits if not c.get("subject") and HASH.fullmatch(c["sha"])})
    if not missing:
        return 0
    known = _git(root, "cat-file", "--batch-check=%(objectname) %(objecttype)", stdin="\n".join(missing) + "\n")
    # one answer a line, in the order asked: "<full hash> commit", or "<what was asked> missing"
    full = {asked: line.split()[0] for asked, line in zip(missing, (known or "").splitlines())
            if line.endswith(" commit")}
    if not full:
        return 0
    log = _git(root, "log", "--no-walk=unsorted", "--format=%H%x00%s%x00%an", *sorted(set(full.values()))) or ""
    template = commit_url_template(remote(root))
    meta = {}
    for line in log.splitlines():
        sha, _, rest = line.partition("\0")
        subject, _, author = rest.partition("\0")
        meta[sha] = (subject, author)
    filled = 0
    for c in commits:
        sha = full.get(c["sha"])
        if c.get("subject") or sha not in meta:
            continue
        c["subject"], c["author"] = meta[sha]
        if not c.get("url") and template:
            c["url"] = template.format(sha=sha)
        filled += 1
    return filled


def check_template(template: str) -> None:
    """Raises SiteError unless template is a web address with {sha} in it and no other field."""
    from .site import SiteError

    example = "e.g. https://github.com/OWNER/REPO/commit/{sha}"
    if not re.match(r"https?://[^\s\"'<>]+$", template) or "{sha}" not in template:
        raise SiteError(f"--commit-url {template!r} must be an http(s) address with {{sha}} in it, {example}")
    try:
        template.format(sha="0" * 40)
    except (KeyError, IndexError, ValueError):
        raise SiteError(f"--commit-url {template!r} may hold no field but {{sha}}, {example}") from None


def apply_template(commits: list[dict[str, Any]], template: str) -> None:
    """Links every commit of git (a hash, not a run outside git) to the page the template names: an
    explicit template wins over the links runs recorded."""
    for c in commits:
        if HASH.fullmatch(c["sha"]):
            c["url"] = template.format(sha=c["sha"])
