"""Ids typed by people, resolved on the server: an id or a unique prefix of one
(``triloop.id_prefix``'s rule) against one table's id column.

Routes that take an id in their path resolve it here first, so ``/api/checkpoints/{id}``
and its lineage accept what ``triloop ... show`` accepts; an ambiguous prefix is a 422
whose reasons are the candidate ids.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from triloop.id_prefix import MAX_CANDIDATES, IdMatch, match_prefix, unmatched_message
from web.problems import ProblemError, invalid, not_found


def resolve_ref(*, session: Session, id_column: Any, ref: str) -> IdMatch:
    """The id ``ref`` is or uniquely starts in ``id_column`` (e.g. ``Checkpoint.id``)."""
    column = col(id_column)
    exact = session.exec(select(column).where(column == ref)).first()
    if exact is not None:
        return IdMatch(ref, str(exact))
    ids = list(session.exec(select(column).where(column.startswith(ref, autoescape=True))
                            .order_by(column).limit(MAX_CANDIDATES + 1)))
    return match_prefix(ref, [str(i) for i in ids])


def one_id(found: IdMatch, noun: str) -> str:
    """The id ``found`` names, else the problem: 404 for none, 422 naming the candidates."""
    if found.id is not None:
        return found.id
    if not found.candidates:
        raise not_found(noun, found.ref)
    raise unresolved(found, noun)


def unresolved(found: IdMatch, noun: str) -> ProblemError:
    """422 for an ambiguous prefix; its reasons are the candidates, one a line."""
    return invalid(unmatched_message(found, noun), found.candidates[:MAX_CANDIDATES])
