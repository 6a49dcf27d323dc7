"""Frozen eval sets, their items, and versioned thresholds (read-only: governance owns them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, text
from sqlmodel import Session, col, select

from triloop.models import EvalItem, EvalSet, Threshold
from web.pagination import Page, keyset, page_of


class EvalSetPublic(BaseModel):
    """An eval set version; ``content_hash`` is set once it is frozen."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    version: int
    content_hash: str | None = None
    frozen_at: datetime | None = None
    created_by: str
    created_at: datetime


class EvalItemPublic(BaseModel):
    """One task of an eval set."""

    model_config = ConfigDict(from_attributes=True)
    ordinal: int
    task_id: str


class TagCoverage(BaseModel):
    """How many of an eval set's tasks carry one tag value."""

    tag: str  # key=value
    key: str
    value: str
    tasks: int
    share: float  # of the set's items, 0..1


class EvalSetDetail(EvalSetPublic):
    """An eval set with its item count, its coverage per tag and, for roles that may see
    them, its items."""

    item_count: int
    untagged: int = 0  # items whose task carries no tag
    coverage: list[TagCoverage] = []
    items: list[EvalItemPublic] | None = None
    thresholds: list[ThresholdPublic]


class ThresholdPublic(BaseModel):
    """A versioned gate threshold spec."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    version: int
    eval_set_id: str | None = None
    spec: dict[str, Any]
    created_by: str
    created_at: datetime


EvalSetDetail.model_rebuild()


def list_eval_sets(*, session: Session, limit: int, cursor: str | None) -> Page[EvalSetPublic]:
    """Eval sets, newest first."""
    statement = keyset(select(EvalSet), [col(EvalSet.created_at), col(EvalSet.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda e: (e.created_at, e.id), EvalSetPublic.model_validate)


_COVERAGE = text(
    "SELECT tag.key, tag.value, count(*) FROM eval_item e JOIN task t ON t.id = e.task_id,"
    " jsonb_each_text(t.tags) AS tag WHERE e.eval_set_id = :id"
    " GROUP BY tag.key, tag.value ORDER BY tag.key, tag.value")
_UNTAGGED = text(
    "SELECT count(*) FROM eval_item e JOIN task t ON t.id = e.task_id"
    " WHERE e.eval_set_id = :id AND t.tags = '{}'::jsonb")


def tag_coverage(*, session: Session, eval_set_id: str, items: int
                 ) -> tuple[list[TagCoverage], int]:
    """(per tag value: how many of the set's tasks carry it; how many carry no tag)."""
    rows = session.execute(_COVERAGE, {"id": eval_set_id}).all()
    untagged = int(session.execute(_UNTAGGED, {"id": eval_set_id}).scalar_one())
    return [TagCoverage(tag=f"{key}={value}", key=key, value=value, tasks=int(n),
                        share=int(n) / items if items else 0.0)
            for key, value, n in rows], untagged


def eval_set_detail(
    *, session: Session, eval_set_id: str, with_items: bool
) -> EvalSetDetail | None:
    """One eval set; items only when ``with_items`` (the caller checked the policy)."""
    row = session.get(EvalSet, eval_set_id)
    if row is None:
        return None
    count = session.exec(
        select(func.count()).select_from(EvalItem).where(EvalItem.eval_set_id == eval_set_id)
    ).one()
    items = None
    if with_items:
        items = [EvalItemPublic.model_validate(i) for i in session.exec(
            select(EvalItem).where(EvalItem.eval_set_id == eval_set_id)
            .order_by(col(EvalItem.ordinal))
        )]
    thresholds = session.exec(
        select(Threshold).where(Threshold.eval_set_id == eval_set_id)
        .order_by(col(Threshold.name), col(Threshold.version))
    )
    coverage, untagged = tag_coverage(session=session, eval_set_id=eval_set_id,
                                      items=int(count))
    return EvalSetDetail(
        **EvalSetPublic.model_validate(row).model_dump(), item_count=int(count), items=items,
        coverage=coverage, untagged=untagged,
        thresholds=[ThresholdPublic.model_validate(t) for t in thresholds],
    )


def list_thresholds(
    *, session: Session, limit: int, cursor: str | None, eval_set_id: str | None = None
) -> Page[ThresholdPublic]:
    """Thresholds, newest first, optionally of one eval set."""
    statement = select(Threshold)
    if eval_set_id is not None:
        statement = statement.where(Threshold.eval_set_id == eval_set_id)
    statement = keyset(statement, [col(Threshold.created_at), col(Threshold.id)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda t: (t.created_at, t.id), ThresholdPublic.model_validate)


def get_threshold(*, session: Session, threshold_id: str) -> ThresholdPublic | None:
    """One threshold."""
    row = session.get(Threshold, threshold_id)
    return None if row is None else ThresholdPublic.model_validate(row)
