"""Data access for the governance loop: plain functions over a session, no policy here.

Callers (activities, ``environments``, ``evalsets``, the CLI) ask ``authorize()``
first; these functions only read and write rows. They run as the governance
database role, whose GRANTs are the last line: the same function called with
another loop's engine fails at the database.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, text
from sqlmodel import Session, col, select

from triloop.deployment_history import Revision, next_rollback_target, revisions
from triloop.episode_plan import batch_plan
from triloop.models import (
    Approval,
    Deployment,
    DeploymentHistory,
    Environment,
    EnvironmentVersion,
    EvalItem,
    EvalSet,
    GateResult,
    Promotion,
    RolloutBatch,
    Routing,
    Task,
    Threshold,
)
from triloop.models._columns import new_id, utcnow
from triloop.routing_claims import ServingSlot, serving_slots
from triloop.statuses import PromotionStatus
from triloop.workflow_api import RolloutBatchInput

ROUTING_SLOTS = ("production", "canary", "shadow")


class StoreError(LookupError):
    """A row the caller needs does not exist or is in the wrong state."""


def db_now(session: Session) -> datetime:
    """The database's clock (trajectory timestamps use it, so gate windows must too)."""
    value = session.execute(text("SELECT now()")).scalar_one()
    assert isinstance(value, datetime)
    return value


def _lock(session: Session, key: str) -> None:
    # Numbering versions is read-max-then-insert: serialise it per name. An advisory
    # lock needs no UPDATE grant (the governance role may only INSERT environments).
    session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": key})


# --- promotions, gate results, approvals -------------------------------------------------


def open_promotion(
    *, session: Session, proposal_id: str, checkpoint_id: str, run_id: str, submitted_by: str,
    baseline_checkpoint_id: str | None, workflow_id: str, workflow_run_id: str | None,
) -> Promotion:
    """The promotion of a proposal, created on first call (a retried activity finds it)."""
    existing = session.exec(select(Promotion).where(Promotion.proposal_id == proposal_id)).first()
    if existing is not None:
        return existing
    promotion = Promotion(
        proposal_id=proposal_id, checkpoint_id=checkpoint_id, run_id=run_id,
        submitted_by=submitted_by, baseline_checkpoint_id=baseline_checkpoint_id,
        workflow_id=workflow_id, workflow_run_id=workflow_run_id,
        status=PromotionStatus.open, updated_at=utcnow(),
    )
    session.add(promotion)
    session.flush()
    return promotion


def get_promotion(*, session: Session, promotion_id: str, for_update: bool = False) -> Promotion:
    """A promotion by id, or ``StoreError``."""
    query = select(Promotion).where(Promotion.id == promotion_id)
    row = session.exec(query.with_for_update() if for_update else query).first()
    if row is None:
        raise StoreError(f"promotion {promotion_id} does not exist")
    return row


# How a promotion's status may change: an open one ends any way; a promoted one is rolled
# back, or aborted when its end state was wrong. Nothing reopens an ended promotion (and
# only the run that opened it may change it at all: ``governance_loop.gates.promote``).
_STATUS_CHANGES: dict[str, frozenset[str]] = {
    PromotionStatus.open: frozenset(PromotionStatus) - {PromotionStatus.refused},
    PromotionStatus.promoted: frozenset({PromotionStatus.rolled_back, PromotionStatus.aborted}),
    # A promote whose end state was wrong is rolled back, then ends aborted.
    PromotionStatus.rolled_back: frozenset({PromotionStatus.aborted}),
}


def update_promotion(
    *, session: Session, promotion_id: str, status: str | None = None,
    current_gate: str | None = None, reason: str | None = None,
) -> Promotion:
    """Move a promotion to a gate and/or status (``StoreError`` for a change it may not make)."""
    promotion = get_promotion(session=session, promotion_id=promotion_id, for_update=True)
    allowed = _STATUS_CHANGES.get(promotion.status, frozenset())
    if status is not None and status != promotion.status and status not in allowed:
        raise StoreError(
            f"promotion {promotion_id} ended {promotion.status}; it cannot become {status} "
            "(an ended promotion stays as it ended; propose the candidate again)")
    if status is not None:
        promotion.status = status
    if current_gate is not None:
        promotion.current_gate = current_gate
    if reason is not None:
        promotion.status_reason = reason
    promotion.updated_at = utcnow()
    session.add(promotion)
    session.flush()
    return promotion


def add_gate_result(
    *, session: Session, promotion_id: str, gate: str, passed: bool, reasons: Sequence[str],
    evidence: dict[str, Any], threshold_id: str | None = None, eval_set_id: str | None = None,
    row_id: str | None = None,
) -> GateResult:
    """Store one gate's final verdict with its evidence."""
    row = GateResult(
        id=row_id or new_id(), promotion_id=promotion_id, gate=gate, passed=passed,
        reasons=list(reasons),
        evidence=evidence, threshold_id=threshold_id, eval_set_id=eval_set_id,
    )
    session.add(row)
    session.flush()
    return row


def gate_results(*, session: Session, promotion_id: str) -> list[GateResult]:
    """A promotion's gate results, oldest first."""
    query = select(GateResult).where(GateResult.promotion_id == promotion_id)
    return list(session.exec(query.order_by(col(GateResult.created_at))))


def add_approval(
    *, session: Session, promotion_id: str, kind: str, decision: str, user_name: str,
    comment: str, row_id: str | None = None,
) -> Approval:
    """Store a person's audit sign-off/rejection or operator approval/rejection."""
    row = Approval(
        id=row_id or new_id(), promotion_id=promotion_id, kind=kind, decision=decision,
        user_name=user_name,
        comment=comment,
    )
    session.add(row)
    session.flush()
    return row


# --- deployments and routing -------------------------------------------------------------


def get_deployment(*, session: Session, alias: str, for_update: bool = False) -> Deployment | None:
    """The deployment of an alias (``production``), optionally locked for a move."""
    query = select(Deployment).where(Deployment.alias == alias)
    return session.exec(query.with_for_update() if for_update else query).first()


def move_alias(
    *, session: Session, alias: str, checkpoint_id: str, rollback_target_id: str | None,
    promotion_id: str | None, actor: str, reason: str, kind: str,
) -> DeploymentHistory:
    """Point an alias at a checkpoint and record the move (bootstrap, promote, rollback)."""
    current = get_deployment(session=session, alias=alias, for_update=True)
    previous = current.checkpoint_id if current is not None else None
    if current is None:
        current = Deployment(alias=alias, checkpoint_id=checkpoint_id, updated_by=actor)
    current.checkpoint_id = checkpoint_id
    current.rollback_target_id = rollback_target_id
    current.promotion_id = promotion_id
    current.updated_by = actor
    current.updated_at = utcnow()
    session.add(current)
    history = DeploymentHistory(
        alias=alias, checkpoint_id=checkpoint_id, previous_checkpoint_id=previous,
        kind=kind, reason=reason, actor=actor,
    )
    session.add(history)
    session.flush()
    return history


def deployment_revisions(*, session: Session, alias: str) -> list[Revision]:
    """An alias's history as numbered revisions, oldest first (with rolled-back marks)."""
    rows = session.exec(select(DeploymentHistory).where(DeploymentHistory.alias == alias))
    return revisions(list(rows))


def refresh_rollback_target(*, session: Session, alias: str) -> str | None:
    """Set the alias's rollback target to where a plain rollback would go now; return it."""
    deployment = get_deployment(session=session, alias=alias, for_update=True)
    if deployment is None:
        return None
    target = next_rollback_target(deployment_revisions(session=session, alias=alias),
                                  alias=alias, current=deployment.checkpoint_id)
    deployment.rollback_target_id = target
    session.add(deployment)
    session.flush()
    return target


def get_routing(*, session: Session, slot: str, for_update: bool = False) -> Routing | None:
    """One routing slot."""
    query = select(Routing).where(Routing.slot == slot)
    return session.exec(query.with_for_update() if for_update else query).first()


def set_routing(
    *, session: Session, slot: str, checkpoint_id: str | None, share: float,
    promotion_id: str | None, updated_by: str, claim_expires_at: datetime | None = None,
) -> Routing:
    """Point a slot at a checkpoint (None empties it), a promotion's claim until an expiry."""
    if slot not in ROUTING_SLOTS:
        raise StoreError(f"unknown routing slot {slot!r}; expected one of {ROUTING_SLOTS}")
    row = get_routing(session=session, slot=slot, for_update=True)
    if row is None:
        row = Routing(slot=slot, updated_by=updated_by)
    row.checkpoint_id = checkpoint_id
    row.share = share
    row.promotion_id = promotion_id
    row.claim_expires_at = claim_expires_at if checkpoint_id is not None else None
    row.updated_by = updated_by
    row.updated_at = utcnow()
    session.add(row)
    session.flush()
    return row


def routing_table(*, session: Session) -> dict[str, ServingSlot]:
    """All routing slots by name, as they serve now (lapsed claims empty)."""
    return serving_slots(session)


def release_claims(*, session: Session, promotion_id: str, updated_by: str) -> list[str]:
    """Empty every shadow/canary slot this promotion claims; the slots emptied."""
    rows = session.exec(select(Routing).where(
        Routing.promotion_id == promotion_id, col(Routing.checkpoint_id).is_not(None),
        col(Routing.slot).in_(("canary", "shadow"))).with_for_update())
    released = []
    for row in rows:
        set_routing(session=session, slot=row.slot, checkpoint_id=None, share=0.0,
                    promotion_id=None, updated_by=updated_by)
        released.append(row.slot)
    return released


def interruption_recorded(*, session: Session, workflow_id: str, run_id: str, kind: str
                          ) -> bool:
    """Whether governance already audited this interruption of a run."""
    found = session.execute(text(
        "SELECT 1 FROM workflow_interruption WHERE workflow_id = :w AND run_id = :r "
        "AND kind = :k"), {"w": workflow_id, "r": run_id, "k": kind}).first()
    return found is not None


def record_interruption(
    *, session: Session, workflow_id: str, run_id: str, kind: str,
    promotion_id: str | None, details: dict[str, Any],
) -> bool:
    """Store an interruption of a governance run once; True when this call stored it."""
    inserted = session.execute(text(
        "INSERT INTO workflow_interruption (workflow_id, run_id, kind, promotion_id, details) "
        "VALUES (:w, :r, :k, :p, CAST(:d AS jsonb)) ON CONFLICT DO NOTHING RETURNING kind"),
        {"w": workflow_id, "r": run_id, "k": kind, "p": promotion_id,
         "d": json.dumps(details, default=str)}).first()
    return inserted is not None


# --- environments and tasks --------------------------------------------------------------


def get_environment_version(*, session: Session, version_id: str) -> EnvironmentVersion:
    """An environment version by id, or ``StoreError``."""
    row = session.get(EnvironmentVersion, version_id)
    if row is None:
        raise StoreError(f"environment version {version_id} does not exist")
    return row


def find_environment_version(
    *, session: Session, name: str, version: int
) -> EnvironmentVersion | None:
    """Version N of a named environment."""
    query = select(EnvironmentVersion).where(
        EnvironmentVersion.environment_name == name, EnvironmentVersion.version == version
    )
    return session.exec(query).first()


def latest_environment_version(*, session: Session, name: str) -> EnvironmentVersion | None:
    """The newest version of a named environment."""
    query = select(EnvironmentVersion).where(EnvironmentVersion.environment_name == name)
    return session.exec(query.order_by(col(EnvironmentVersion.version).desc())).first()


def ensure_environment(*, session: Session, name: str, created_by: str) -> Environment:
    """The named environment, created when new."""
    row = session.get(Environment, name)
    if row is None:
        row = Environment(name=name, created_by=created_by)
        session.add(row)
        session.flush()
    return row


def next_environment_version(*, session: Session, name: str) -> int:
    """The number the next version of an environment gets (locks the environment row)."""
    _lock(session, f"environment_version:{name}")
    query = select(func.max(EnvironmentVersion.version)).where(
        EnvironmentVersion.environment_name == name
    )
    return int(session.exec(query).one() or 0) + 1


def get_task(*, session: Session, task_id: str, for_update: bool = False) -> Task:
    """A task by id, or ``StoreError``."""
    query = select(Task).where(Task.id == task_id)
    row = session.exec(query.with_for_update() if for_update else query).first()
    if row is None:
        raise StoreError(f"task {task_id} does not exist")
    return row




# --- eval sets and thresholds ------------------------------------------------------------


def next_version(*, session: Session, table: type[EvalSet] | type[Threshold], name: str) -> int:
    """The next version number of a named eval set or threshold."""
    _lock(session, f"{table.__tablename__}:{name}")
    query = select(func.max(table.version)).where(table.name == name)
    return int(session.exec(query).one() or 0) + 1


def latest_eval_set(*, session: Session, name: str) -> EvalSet | None:
    """The newest frozen version of a named eval set."""
    query = (
        select(EvalSet)
        .where(EvalSet.name == name, col(EvalSet.frozen_at).is_not(None))
        .order_by(col(EvalSet.version).desc())
    )
    return session.exec(query).first()


def eval_set_tasks(*, session: Session, eval_set_id: str) -> list[tuple[str, int, str]]:
    """(task id, seed, environment version id) of each item, in order."""
    query = (
        select(Task.id, Task.seed, Task.environment_version_id)
        .join(EvalItem, col(EvalItem.task_id) == col(Task.id))
        .where(EvalItem.eval_set_id == eval_set_id)
        .order_by(col(EvalItem.ordinal))
    )
    return [(str(t), int(s), str(v)) for t, s, v in session.exec(query)]


def latest_threshold(*, session: Session, name: str) -> Threshold | None:
    """The newest version of a named threshold."""
    query = select(Threshold).where(Threshold.name == name)
    return session.exec(query.order_by(col(Threshold.version).desc())).first()


def record_rollout_batch(*, session: Session, batch: RolloutBatchInput) -> None:
    """Governance's own ``rollout_batch`` row for a batch it is about to ask for, with the
    episodes it plans; a retry finds its row and adds nothing."""
    existing = session.get(RolloutBatch, batch.batch_id)
    plan = batch_plan(batch)
    if existing is None:
        session.add(RolloutBatch(id=batch.batch_id, purpose=batch.purpose,
                                 checkpoint_id=batch.checkpoint_id, run_id=batch.run_id,
                                 requested_by="governance", planned_episodes=plan))
        return
    if (existing.requested_by, existing.purpose, existing.checkpoint_id,
            existing.planned_episodes) != ("governance", batch.purpose, batch.checkpoint_id, plan):
        raise StoreError(f"batch {batch.batch_id} is already recorded as another request "
                         f"({existing.requested_by}, {existing.purpose} of "
                         f"{existing.checkpoint_id})")
