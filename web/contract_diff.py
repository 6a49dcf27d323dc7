"""What changed between two stored environment contracts (pure; the console and API show it).

Web may not import governance's richer differ, so this is a small one over the
canonical JSON both versions store: mappings key by key, lists aligned with
``difflib`` (removing one action is one removal, not a shift of every later
item), scalars by type and value (``1`` and ``true`` differ, as in the hash).
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Literal

from pydantic import BaseModel

ChangeKind = Literal["added", "removed", "changed"]


class ContractChange(BaseModel):
    """At ``path``, ``old`` (in A) became ``new`` (in B)."""

    path: str
    kind: ChangeKind
    old: Any = None
    new: Any = None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def diff_contracts(a: Any, b: Any) -> list[ContractChange]:
    """Every difference between two contract documents, in path order."""
    out: list[ContractChange] = []
    _diff("", a, b, out)
    return out


def _diff(path: str, a: Any, b: Any, out: list[ContractChange]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = _join(path, str(key))
            if key not in b:
                out.append(ContractChange(path=sub, kind="removed", old=a[key]))
            elif key not in a:
                out.append(ContractChange(path=sub, kind="added", new=b[key]))
            else:
                _diff(sub, a[key], b[key], out)
    elif isinstance(a, list) and isinstance(b, list):
        _diff_lists(path, a, b, out)
    elif type(a) is not type(b) or a != b:
        out.append(ContractChange(path=path or "(root)", kind="changed", old=a, new=b))


def _diff_lists(path: str, a: list[Any], b: list[Any], out: list[ContractChange]) -> None:
    matcher = difflib.SequenceMatcher(
        a=[_canonical(x) for x in a], b=[_canonical(x) for x in b], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for k in range(paired):
            _diff(_join(path, j1 + k), a[i1 + k], b[j1 + k], out)
        for i in range(i1 + paired, i2):
            out.append(ContractChange(path=_join(path, i), kind="removed", old=a[i]))
        for j in range(j1 + paired, j2):
            out.append(ContractChange(path=_join(path, j), kind="added", new=b[j]))
