"""What changed between two environment contracts: one differ for `triloop env diff A B`, the
API and the console, so each shows a change the same way.

Both documents are canonical contracts (nested dicts, lists and JSON scalars).
Mappings are compared key by key. Lists are aligned (``difflib``), so removing
one action reports one removal instead of shifting every later item; aligned
items that are both containers are compared recursively. Scalars compare by
type and value, so ``1`` vs ``true`` or ``8`` vs ``8.0`` shows as a change:
anything that changes the contract's hash must appear in the diff.

Paths use ``.key`` for identifier-like keys, ``["odd key"]`` otherwise, and
``[i]`` for list positions: added and changed items are positioned in B,
removed items in A.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class ContractDiffError(TypeError):
    """A contract document that is not a mapping at the top."""


class ChangeKind(StrEnum):
    """How a value at a path differs between A and B."""

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True)
class ContractChange:
    """One difference: at ``path``, ``old`` (in A) became ``new`` (in B)."""

    path: str
    kind: ChangeKind
    # None for an added value (there was none in A).
    old: Any
    # None for a removed value (there is none in B).
    new: Any


def _key_path(prefix: str, key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key) if isinstance(key, str) else repr(key)}]"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _same_scalar(a: Any, b: Any) -> bool:
    # Type first: True == 1 and 8 == 8.0 in Python, but not in a contract's canonical form.
    return type(a) is type(b) and bool(a == b)


def _diff(path: str, a: Any, b: Any, out: list[ContractChange]) -> None:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=_canonical):
            sub = _key_path(path, key)
            if key not in b:
                out.append(ContractChange(sub, ChangeKind.REMOVED, a[key], None))
            elif key not in a:
                out.append(ContractChange(sub, ChangeKind.ADDED, None, b[key]))
            else:
                _diff(sub, a[key], b[key], out)
    elif _is_list(a) and _is_list(b):
        _diff_lists(path, a, b, out)
    elif isinstance(a, Mapping) or isinstance(b, Mapping) or _is_list(a) or _is_list(b):
        # A container became a scalar or another kind of container: report it whole.
        out.append(ContractChange(path, ChangeKind.CHANGED, a, b))
    elif not _same_scalar(a, b):
        out.append(ContractChange(path, ChangeKind.CHANGED, a, b))


def _diff_lists(path: str, a: Sequence[Any], b: Sequence[Any], out: list[ContractChange]) -> None:
    matcher = difflib.SequenceMatcher(
        a=[_canonical(x) for x in a], b=[_canonical(x) for x in b], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for offset in range(paired):
            _diff(f"{path}[{j1 + offset}]", a[i1 + offset], b[j1 + offset], out)
        for i in range(i1 + paired, i2):
            out.append(ContractChange(f"{path}[{i}]", ChangeKind.REMOVED, a[i], None))
        for j in range(j1 + paired, j2):
            out.append(ContractChange(f"{path}[{j}]", ChangeKind.ADDED, None, b[j]))


def diff_contracts(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[ContractChange]:
    """List every difference from contract A to contract B (empty when identical)."""
    for name, doc in (("A", a), ("B", b)):
        if not isinstance(doc, Mapping):
            raise ContractDiffError(
                f"contract {name} must be a mapping at the top, got {type(doc).__name__}"
            )
    changes: list[ContractChange] = []
    _diff("", a, b, changes)
    return changes


def _show(value: Any, limit: int) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_diff(changes: Sequence[ContractChange], *, max_value_chars: int = 120) -> str:
    """Human text, one line per change: ``+ path: new``, ``- path: old``, ``~ path: a -> b``."""
    if not changes:
        return "no changes"
    lines = []
    for change in changes:
        if change.kind is ChangeKind.ADDED:
            lines.append(f"+ {change.path}: {_show(change.new, max_value_chars)}")
        elif change.kind is ChangeKind.REMOVED:
            lines.append(f"- {change.path}: {_show(change.old, max_value_chars)}")
        else:
            old, new = _show(change.old, max_value_chars), _show(change.new, max_value_chars)
            lines.append(f"~ {change.path}: {old} -> {new}")
    return "\n".join(lines)
