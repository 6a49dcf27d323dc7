"""Where a rollback goes: never to what serves now, never to a rolled-back checkpoint."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from triloop.deployment_history import (
    RollbackRefused,
    next_rollback_target,
    plan_rollback,
    revisions,
)
from triloop.models import DeploymentHistory

WHEN = datetime(2026, 12, 1, tzinfo=UTC)


def history(*moves: tuple[str, str]) -> list[DeploymentHistory]:
    """(kind, checkpoint) moves in order, each from the checkpoint before it."""
    rows, previous = [], None
    for index, (kind, checkpoint) in enumerate(moves, start=1):
        rows.append(DeploymentHistory(id=100 + index, alias="production", checkpoint_id=checkpoint,
                                      previous_checkpoint_id=previous, kind=kind,
                                      reason=f"{kind} {checkpoint}", actor="x", created_at=WHEN))
        previous = checkpoint
    return rows


def target_of(rows: list[DeploymentHistory], current: str, **named: object) -> str:
    plan = plan_rollback(revisions(rows), alias="production", current_checkpoint_id=current,
                         **named)  # type: ignore[arg-type]
    return plan.target.checkpoint_id


def test_a_rolled_back_candidate_is_never_the_next_target() -> None:
    # A serves, B is promoted, the watch rolls B back to A: a second rollback skips B.
    rows = history(("bootstrap", "Z"), ("bootstrap", "A"), ("promote", "B"), ("rollback", "A"))
    numbered = revisions(rows)
    assert [r.number for r in numbered] == [1, 2, 3, 4]
    assert numbered[2].rolled_back_at == 4 and numbered[1].rolled_back_at is None
    assert target_of(rows, "A") == "Z"
    assert next_rollback_target(numbered, alias="production", current="A") == "Z"


def test_naming_a_rolled_back_revision_or_checkpoint_is_refused() -> None:
    rows = history(("bootstrap", "A"), ("promote", "B"), ("rollback", "A"))
    for named in ({"to_revision": 2}, {"to_checkpoint_id": "B"}):
        with pytest.raises(RollbackRefused, match="rolled back at revision 3.*new promotion"):
            target_of(rows, "A", **named)
    with pytest.raises(RollbackRefused, match="no rollback target"):
        target_of(rows, "A")


def test_a_new_promotion_clears_the_rollback() -> None:
    rows = history(("bootstrap", "A"), ("promote", "B"), ("rollback", "A"), ("promote", "C"),
                   ("promote", "B"))
    assert revisions(rows)[1].rolled_back_at is None
    assert target_of(rows, "B") == "C"
    assert target_of(rows, "B", to_revision=1) == "A"


def test_named_targets_must_exist_and_not_serve() -> None:
    rows = history(("bootstrap", "A"), ("promote", "B"), ("promote", "C"))
    assert target_of(rows, "C") == "B"
    assert target_of(rows, "C", to_checkpoint_id="A") == "A"
    refusals = [({"to_revision": 9}, "no revision 9"), ({"to_revision": 3}, "serves now"),
                ({"to_checkpoint_id": "Q"}, "never served"),
                ({"to_revision": 1, "to_checkpoint_id": "A"}, "not both")]
    for named, why in refusals:
        with pytest.raises(RollbackRefused, match=why):
            target_of(rows, "C", **named)


def test_rolling_back_twice_walks_further_back_instead_of_swapping() -> None:
    rows = history(("bootstrap", "A"), ("promote", "B"), ("promote", "C"), ("rollback", "B"))
    assert target_of(rows, "B") == "A"  # the old swap would have returned to C
    rows = history(("bootstrap", "A"), ("promote", "B"), ("promote", "C"), ("rollback", "B"),
                   ("rollback", "A"))
    assert next_rollback_target(revisions(rows), alias="production", current="A") is None
