"""Deployments (aliases such as ``production``), their history, and production routing."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from sqlmodel import Session, col, select

from triloop.models import Deployment, DeploymentHistory, Routing
from web.pagination import Page, keyset, page_of


class DeploymentPublic(BaseModel):
    """An alias, the checkpoint it names and the checkpoint a rollback would restore."""

    model_config = ConfigDict(from_attributes=True)
    alias: str
    checkpoint_id: str
    rollback_target_id: str | None = None
    promotion_id: str | None = None
    updated_by: str
    updated_at: datetime


class HistoryEntry(BaseModel):
    """One move of an alias."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    alias: str
    checkpoint_id: str
    previous_checkpoint_id: str | None = None
    reason: str
    actor: str
    created_at: datetime


class DeploymentDetail(DeploymentPublic):
    """An alias with its latest moves (newest first, at most 50)."""

    history: list[HistoryEntry]


class RoutingPublic(BaseModel):
    """Which checkpoint serves a slot of production traffic, and its share."""

    model_config = ConfigDict(from_attributes=True)
    slot: str
    checkpoint_id: str | None = None
    share: float
    promotion_id: str | None = None
    updated_by: str
    updated_at: datetime


def list_deployments(
    *, session: Session, limit: int, cursor: str | None
) -> Page[DeploymentPublic]:
    """Aliases, most recently moved first."""
    statement = keyset(select(Deployment), [col(Deployment.updated_at), col(Deployment.alias)],
                       cursor, (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda d: (d.updated_at, d.alias), DeploymentPublic.model_validate)


def get_deployment(*, session: Session, alias: str) -> DeploymentPublic | None:
    """One alias."""
    row = session.get(Deployment, alias)
    return None if row is None else DeploymentPublic.model_validate(row)


def deployment_detail(*, session: Session, alias: str) -> DeploymentDetail | None:
    """One alias with its history."""
    row = session.get(Deployment, alias)
    if row is None:
        return None
    history = session.exec(
        select(DeploymentHistory).where(DeploymentHistory.alias == alias)
        .order_by(col(DeploymentHistory.id).desc()).limit(50)
    )
    return DeploymentDetail(
        **DeploymentPublic.model_validate(row).model_dump(),
        history=[HistoryEntry.model_validate(h) for h in history],
    )


def list_routing(*, session: Session, limit: int, cursor: str | None) -> Page[RoutingPublic]:
    """Routing slots, most recently changed first."""
    statement = keyset(select(Routing), [col(Routing.updated_at), col(Routing.slot)], cursor,
                       (datetime, str), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda r: (r.updated_at, r.slot), RoutingPublic.model_validate)
