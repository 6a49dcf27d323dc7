"""Naming a thing by a unique prefix of its id: the one rule every id argument follows.

A person may give an id whole or any prefix that starts exactly one id. The CLI (through
the API's ``id_prefix`` filters) and the web service (path parameters, RUN.yaml's task ids,
``model.base``) resolve with these two functions, so "ambiguous" and "no such id" read the
same wherever an id is typed, and an ambiguous prefix always lists its candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Candidates an ambiguous prefix names; resolvers fetch one more to know there are more.
MAX_CANDIDATES = 5


@dataclass(frozen=True)
class IdMatch:
    """What a reference names: one id, or none (with the ids it starts, if several)."""

    ref: str
    id: str | None
    candidates: list[str] = field(default_factory=list)

    @property
    def ambiguous(self) -> bool:
        """It starts more than one id."""
        return self.id is None and len(self.candidates) > 1


def match_prefix(ref: str, ids: Sequence[str]) -> IdMatch:
    """``ref`` against ids that start with it (an exact id wins over longer ones)."""
    if ref in ids:
        return IdMatch(ref, ref)
    matches = sorted(i for i in ids if i.startswith(ref))
    if len(matches) == 1:
        return IdMatch(ref, matches[0])
    return IdMatch(ref, None, matches)


def unmatched_message(found: IdMatch, noun: str) -> str:
    """Why ``found.ref`` names no one ``noun``: nothing starts with it, or several ids do."""
    if not found.candidates:
        return f"no {noun} has an id starting with {found.ref!r}"
    shown = ", ".join(found.candidates[:MAX_CANDIDATES])
    more = " and more" if len(found.candidates) > MAX_CANDIDATES else ""
    return (f"{found.ref!r} is ambiguous: it starts the ids of more than one {noun}"
            f" ({shown}{more}); give more characters")
