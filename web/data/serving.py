"""What serves production traffic now, for the operator's home page.

Production is the ``production`` alias (who moved it, when, why, through which
promotion and who approved that promotion); the trials are the ``canary`` and
``shadow`` routing slots that currently name a checkpoint.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlmodel import Session, col, select

from triloop.models import Approval, Deployment, DeploymentHistory, Promotion
from triloop.routing_claims import serving_slots
from triloop.statuses import Purpose

PRODUCTION = Purpose.PRODUCTION  # the alias production traffic is served by
TRIAL_SLOTS = ("canary", "shadow")


class ProductionNow(BaseModel):
    """The checkpoint the production alias names, and how it got there."""

    checkpoint_id: str
    since: datetime
    revision: int | None = None
    kind: str | None = None
    reason: str | None = None
    moved_by: str
    promotion_id: str | None = None
    approved_by: str | None = None
    rollback_target_id: str | None = None


class Trial(BaseModel):
    """A candidate receiving a share (canary) or a copy (shadow) of production traffic."""

    slot: str
    checkpoint_id: str
    share: float
    promotion_id: str | None = None
    since: datetime


class ServingNow(BaseModel):
    """Production and the trials beside it."""

    production: ProductionNow | None
    trials: list[Trial]


def promotion_for_checkpoint(session: Session, checkpoint_id: str) -> Promotion | None:
    """The newest promotion of a checkpoint (the one that moved it, when it was promoted)."""
    return session.exec(
        select(Promotion).where(Promotion.checkpoint_id == checkpoint_id)
        .order_by(col(Promotion.created_at).desc()).limit(1)
    ).first()


def _approver(session: Session, promotion_id: str) -> str | None:
    row = session.exec(
        select(Approval).where(Approval.promotion_id == promotion_id,
                               Approval.kind == "operator", Approval.decision == "approve")
        .order_by(col(Approval.created_at).desc()).limit(1)
    ).first()
    return None if row is None else row.user_name


def _production(session: Session) -> ProductionNow | None:
    deployment = session.get(Deployment, PRODUCTION)
    if deployment is None:
        return None
    latest = session.exec(
        select(DeploymentHistory).where(DeploymentHistory.alias == PRODUCTION)
        .order_by(col(DeploymentHistory.id).desc()).limit(1)
    ).first()
    promotion_id = deployment.promotion_id
    if promotion_id is None and latest is not None and latest.kind == "promote":
        found = promotion_for_checkpoint(session, deployment.checkpoint_id)
        promotion_id = None if found is None else found.id
    # Revisions are numbered per alias from 1 (triloop.deployment_history).
    count = len(list(session.exec(
        select(DeploymentHistory.id).where(DeploymentHistory.alias == PRODUCTION))))
    return ProductionNow(
        checkpoint_id=deployment.checkpoint_id, since=deployment.updated_at,
        revision=count or None,
        kind=None if latest is None else latest.kind,
        reason=None if latest is None else latest.reason,
        moved_by=latest.actor if latest is not None else deployment.updated_by,
        promotion_id=promotion_id,
        approved_by=None if promotion_id is None else _approver(session, promotion_id),
        rollback_target_id=deployment.rollback_target_id,
    )


def serving_now(*, session: Session) -> ServingNow:
    """Production and the canary/shadow slots that serve a checkpoint now."""
    # A claim of an ended promotion, or an expired one, serves nothing: show what serves.
    trials = [
        Trial(slot=r.slot, checkpoint_id=r.checkpoint_id, share=r.share,
              promotion_id=r.promotion_id, since=r.updated_at)
        for r in serving_slots(session).values()
        if r.slot in TRIAL_SLOTS and r.checkpoint_id is not None
    ]
    trials.sort(key=lambda t: TRIAL_SLOTS.index(t.slot))
    return ServingNow(production=_production(session), trials=trials)
