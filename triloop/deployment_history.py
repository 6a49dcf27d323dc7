"""Where a rollback goes: pure rules over an alias's deployment history.

Every move of an alias is a revision, numbered from 1 in order. A checkpoint is
*rolled back* on an alias when a rollback moved the alias away from it, and stays
so until a promotion (or a bootstrap) deploys it again: a rolled-back candidate
never comes back without passing the gates anew.

A rollback walks back from the newest revision to the last one whose checkpoint is
neither rolled back nor the one serving now. An operator may name a revision (by
number, or the latest revision of a checkpoint) instead; naming a rolled-back one
is refused and says why. Governance applies these rules when it moves the alias
(under the alias's row lock); the web service uses them to preview a rollback.
Both import them from here because neither may import the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from triloop.models import DeploymentHistory

# Kinds of move that deploy a checkpoint afresh (and so clear an earlier rollback of it).
DEPLOYING_KINDS = frozenset({"bootstrap", "promote"})
ROLLBACK_KIND = "rollback"


class RollbackRefused(ValueError):
    """No revision this rollback may return to; the message says why and what to do."""


@dataclass(frozen=True)
class Revision:
    """One move of an alias, with whether its checkpoint stands rolled back now."""

    number: int  # 1-based position in the alias's history
    history_id: int
    checkpoint_id: str
    previous_checkpoint_id: str | None
    kind: str
    actor: str
    reason: str
    created_at: datetime
    rolled_back_at: int | None = None  # the rollback revision that rolled its checkpoint back


@dataclass(frozen=True)
class RollbackPlan:
    """The revision a rollback returns to, from what serves now."""

    alias: str
    current_checkpoint_id: str
    target: Revision


def revisions(history: Sequence[DeploymentHistory]) -> list[Revision]:
    """An alias's history rows (any order) as numbered revisions, oldest first."""
    ordered = sorted(history, key=lambda row: row.id or 0)
    rolled_back: dict[str, int] = {}  # checkpoint -> revision number of the rollback
    numbered: list[Revision] = []
    for number, row in enumerate(ordered, start=1):
        if row.kind == ROLLBACK_KIND and row.previous_checkpoint_id:
            rolled_back[row.previous_checkpoint_id] = number
        elif row.kind in DEPLOYING_KINDS:
            rolled_back.pop(row.checkpoint_id, None)
        numbered.append(Revision(
            number=number, history_id=row.id or 0, checkpoint_id=row.checkpoint_id,
            previous_checkpoint_id=row.previous_checkpoint_id, kind=row.kind, actor=row.actor,
            reason=row.reason, created_at=row.created_at,
        ))
    return [replace(r, rolled_back_at=rolled_back.get(r.checkpoint_id)) for r in numbered]


def _check(revision: Revision, current: str, alias: str) -> Revision:
    if revision.checkpoint_id == current:
        raise RollbackRefused(
            f"revision {revision.number} of {alias} is checkpoint {revision.checkpoint_id}, "
            "which serves now; name an earlier revision"
        )
    if revision.rolled_back_at is not None:
        raise RollbackRefused(
            f"revision {revision.number} of {alias} (checkpoint {revision.checkpoint_id}) was "
            f"rolled back at revision {revision.rolled_back_at}; a rolled-back checkpoint "
            "returns to production only through a new promotion"
        )
    return revision


def plan_rollback(
    history: Sequence[Revision], *, alias: str, current_checkpoint_id: str,
    to_revision: int | None = None, to_checkpoint_id: str | None = None,
) -> RollbackPlan:
    """The revision to return to, or ``RollbackRefused`` naming the rule and the way out."""
    if to_revision is not None and to_checkpoint_id is not None:
        raise RollbackRefused("name a revision or a checkpoint to roll back to, not both")
    if to_revision is not None:
        found = [r for r in history if r.number == to_revision]
        if not found:
            raise RollbackRefused(
                f"{alias} has no revision {to_revision} (its revisions are 1 to {len(history)})")
        target = _check(found[0], current_checkpoint_id, alias)
    elif to_checkpoint_id is not None:
        found = [r for r in history if r.checkpoint_id == to_checkpoint_id]
        if not found:
            raise RollbackRefused(f"checkpoint {to_checkpoint_id} never served {alias}")
        target = _check(found[-1], current_checkpoint_id, alias)
    else:
        eligible = [r for r in reversed(history)
                    if r.checkpoint_id != current_checkpoint_id and r.rolled_back_at is None]
        if not eligible:
            raise RollbackRefused(
                f"alias {alias} has no rollback target: no earlier revision that was not "
                "rolled back; promote a candidate instead"
            )
        target = eligible[0]
    return RollbackPlan(alias=alias, current_checkpoint_id=current_checkpoint_id, target=target)


def next_rollback_target(history: Sequence[Revision], *, alias: str, current: str) -> str | None:
    """The checkpoint a plain rollback would return to now (the deployment's rollback target)."""
    try:
        plan = plan_rollback(history, alias=alias, current_checkpoint_id=current)
    except RollbackRefused:
        return None
    return plan.target.checkpoint_id
