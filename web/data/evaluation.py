"""Frozen eval sets, their items, and versioned thresholds (read-only: governance owns them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func
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


class EvalSetDetail(EvalSetPublic):
    """An eval set with its item count and, for roles that may see them, its items."""

    item_count: int
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
    return EvalSetDetail(
        **EvalSetPublic.model_validate(row).model_dump(), item_count=int(count), items=items,
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
