"""What people decided about the site's data, kept in git beside the history: `data/site.toml`.

- `[[flag]]`: a step someone has looked at, acknowledged (a known cost, accepted) or ignored (not a
  real change), with the reason. Such a flag stays on the regressions page with its state and
  reason, and no longer counts as an open regression on the overview, in the navigation's count or
  in the feed (an ignored one). An entry names the flag by its id (the regressions page's link,
  `#flag=ID`), or by the commit it happened at (a prefix of the sha, 7 characters or more) with any
  of kernel, mode, dtype, provider, shape and gpu (a GPU's name or its id in the site's URLs) to
  narrow it: one entry can acknowledge every step one commit made in one kernel.
- `[other_function.KERNEL]`: providers that compute another function than the kernel (a layer the
  op replaces, timed beside it for scale; `Provider.reference` in the kernel's spec), each with what
  it computes. The overview's leaderboard never sets our kernel against them.

    [[flag]]
    commit = "f2cc07b"
    kernel = "gelu"
    state = "acknowledged"
    reason = "exact erf instead of tanh: slower, and what the model needs"

    [other_function.axon]
    linear = "nn.Linear(H, H), the layer AxonLayer replaces"
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATES = ("acknowledged", "ignored")
MATCH = ("flag", "commit", "kernel", "mode", "dtype", "provider", "shape", "gpu")
KEYS = (*MATCH, "state", "reason", "by")


class ConfigError(Exception):
    """A site.toml that cannot be used, in one sentence naming the file and what is valid."""


@dataclass
class SiteConfig:
    acks: list[dict[str, str]] = field(default_factory=list)
    other_function: dict[str, dict[str, str]] = field(default_factory=dict)  # kernel -> provider -> what


def load(path: Path | None) -> SiteConfig:
    """The config at path; an empty one where path is None."""
    if path is None:
        return SiteConfig()
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    unknown = set(raw) - {"flag", "other_function"}
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; valid: flag, other_function")
    return SiteConfig(acks=[_ack(path, i, e) for i, e in enumerate(_list(path, raw.get("flag", [])), 1)],
                      other_function=_other(path, raw.get("other_function", {})))


def _list(path: Path, value: Any) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{path}: 'flag' must be an array of tables ([[flag]] entries)")
    return value


def _ack(path: Path, n: int, e: Any) -> dict[str, str]:
    where = f"{path}: [[flag]] entry {n}"
    if not isinstance(e, dict):
        raise ConfigError(f"{where} is not a table")
    unknown = set(e) - set(KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(KEYS)}")
    if any(not isinstance(v, str) for v in e.values()):
        raise ConfigError(f"{where}: every value must be a string")
    if e.get("state") not in STATES:
        raise ConfigError(f"{where}: state must be one of {', '.join(STATES)}")
    if not e.get("reason", "").strip():
        raise ConfigError(f"{where} has no reason: say why it is {e['state']}")
    if not e.get("flag") and len(e.get("commit", "")) < 7:
        raise ConfigError(f"{where} names no flag: give its id (flag = ...) or its commit (7 characters or more)")
    return dict(e)


def _other(path: Path, value: Any) -> dict[str, dict[str, str]]:
    if not isinstance(value, dict) or not all(
            isinstance(ps, dict) and all(isinstance(v, str) for v in ps.values()) for ps in value.values()):
        raise ConfigError(f"{path}: other_function must hold one table per kernel of provider = \"what it computes\"")
    return {k: dict(ps) for k, ps in value.items()}


def _matches(ack: dict[str, str], row: dict[str, Any]) -> bool:
    if "flag" in ack and ack["flag"] != row["id"]:
        return False
    if "commit" in ack and not row["after"]["sha"].startswith(ack["commit"]):
        return False
    if "gpu" in ack and ack["gpu"] not in (row["gid"], row["glabel"]):
        return False
    return all(ack[k] == row[k] for k in ("kernel", "mode", "dtype", "provider", "shape") if k in ack)


def apply(config: SiteConfig, rows: list[dict[str, Any]]) -> list[str]:
    """Marks each flag row an entry matches (row['ack'] = the entry; the first entry wins); rows of
    changes of conditions are not flags and take none. Returns a warning for each entry that
    matches nothing (its flag may be gone from the history)."""
    warnings = []
    for n, ack in enumerate(config.acks, 1):
        hit = False
        for r in rows:
            if r["id"] is not None and _matches(ack, r):
                r.setdefault("ack", ack)
                hit = True
        if not hit:
            named = ack.get("flag") or f"commit {ack['commit']}"
            warnings.append(f"[[flag]] entry {n} ({named}) matches no flag")
    return warnings
