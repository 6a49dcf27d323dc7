"""Deployments (aliases such as ``production``), their history, and production routing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, computed_field
from sqlmodel import Session, col, select

from triloop.deployment_history import Revision, RollbackRefused, plan_rollback, revisions
from triloop.models import Deployment, DeploymentHistory, Promotion, Routing
from web.pagination import Page, keyset, page_of

PREVIEW_HISTORY = 50  # revisions a rollback preview lists, newest first


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
    kind: str
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


class RevisionPublic(BaseModel):
    """One revision of an alias's history, as a rollback sees it."""

    revision: int
    checkpoint_id: str
    previous_checkpoint_id: str | None = None
    kind: str
    actor: str
    reason: str
    created_at: datetime
    rolled_back_at: int | None = None
    serving: bool = False
    promotion_id: str | None = Field(
        default=None, description="the promotion that moved the alias here (promote moves)")
    promotion_status: str | None = Field(
        default=None, description="that promotion's status now (promoted, rolled_back, ...)")

    @classmethod
    def of(cls, revision: Revision, *, current: str,
           promotions: Mapping[str, Promotion] | None = None) -> RevisionPublic:
        """The public view of a revision, marking the one that serves now."""
        promotion = (promotions or {}).get(revision.checkpoint_id)
        return cls(revision=revision.number, checkpoint_id=revision.checkpoint_id,
                   previous_checkpoint_id=revision.previous_checkpoint_id, kind=revision.kind,
                   actor=revision.actor, reason=revision.reason, created_at=revision.created_at,
                   rolled_back_at=revision.rolled_back_at,
                   serving=revision.checkpoint_id == current,
                   promotion_id=None if promotion is None else promotion.id,
                   promotion_status=None if promotion is None else promotion.status)


class RollbackPreview(BaseModel):
    """What a rollback would do, changing nothing: the target (who moved it there, and why)
    or why there is none, and the alias's latest revisions."""

    alias: str
    current_checkpoint_id: str
    target: RevisionPublic | None = None
    refusal: str | None = None
    skipped: list[int] = Field(
        default_factory=list,
        description="newer revisions a plain rollback passes over, because their checkpoint "
                    "serves now or was rolled back")
    history: list[RevisionPublic]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def warnings(self) -> list[str]:
        """What an operator should know before confirming (the refusal aside)."""
        found = []
        rolled = [r for r in self.history if r.revision in self.skipped and r.rolled_back_at]
        if rolled:
            found.append("This rollback passes over " + ", ".join(
                f"revision {r.revision} ({r.checkpoint_id[:12]}…, rolled back by revision "
                f"{r.rolled_back_at})" for r in rolled)
                + ": a rolled-back checkpoint is never offered again without a new promotion.")
        if self.target is not None and self.target.kind == "bootstrap":
            found.append(f"The target was put in place by a bootstrap "
                         f"({self.target.actor}), not through the gates.")
        return found


def rollback_preview(
    *, session: Session, alias: str, to_revision: int | None = None,
    to_checkpoint_id: str | None = None,
) -> RollbackPreview | None:
    """Where a rollback of ``alias`` would go (governance applies the same rules when it moves)."""
    deployment = session.get(Deployment, alias)
    if deployment is None:
        return None
    rows = session.exec(select(DeploymentHistory).where(DeploymentHistory.alias == alias))
    history = revisions(list(rows))
    current = deployment.checkpoint_id
    promoted = _promotions_of(session, {r.checkpoint_id for r in history
                                        if r.kind == "promote"})
    target: RevisionPublic | None = None
    refusal: str | None = None
    skipped: list[int] = []
    try:
        plan = plan_rollback(history, alias=alias, current_checkpoint_id=current,
                             to_revision=to_revision, to_checkpoint_id=to_checkpoint_id)
        target = RevisionPublic.of(plan.target, current=current, promotions=promoted)
        if to_revision is None and to_checkpoint_id is None:
            skipped = [r.number for r in history if r.number > plan.target.number]
    except RollbackRefused as refused:
        refusal = str(refused)
    latest = [RevisionPublic.of(r, current=current, promotions=promoted)
              for r in reversed(history[-PREVIEW_HISTORY:])]
    return RollbackPreview(alias=alias, current_checkpoint_id=current, target=target,
                           refusal=refusal, skipped=skipped, history=latest)


def _promotions_of(session: Session, checkpoint_ids: set[str]) -> dict[str, Promotion]:
    """The newest promotion of each checkpoint (the one a promote move came from)."""
    newest: dict[str, Promotion] = {}
    if not checkpoint_ids:
        return newest
    for row in session.exec(select(Promotion).where(
            col(Promotion.checkpoint_id).in_(checkpoint_ids))
            .order_by(col(Promotion.created_at))):
        newest[row.checkpoint_id] = row
    return newest


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
