"""The audit log as people read it: filtered, newest first, and its chain verification."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, or_
from sqlmodel import Session, col, select

from triloop.audit import verify_chain
from triloop.models import AccessEvent, AuditEvent
from web.pagination import Page, keyset, page_of


class AuditEventPublic(BaseModel):
    """One audited decision or recorded change, with its place in the hash chain."""

    model_config = ConfigDict(from_attributes=True)
    seq: int
    at: datetime
    actor: dict[str, Any]
    action: str
    resource: dict[str, Any]
    decision: str
    decision_id: str | None = None
    policy_revision: str | None = None
    payload: dict[str, Any]
    prev_hash: str
    hash: str
    outcome: str | None = Field(
        default=None, description="for an allowed action: succeeded, refused or failed, from"
        " the record that followed it (None: not recorded, e.g. before outcomes were)")
    outcome_status: int | None = Field(default=None, description="the HTTP status it ended with")
    outcome_detail: str | None = None


class AccessEventPublic(BaseModel):
    """An allowed read, from the access log (kept apart from the chain of decisions)."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    at: datetime
    actor: dict[str, Any]
    action: str
    resource: dict[str, Any]
    decision_id: str | None = None
    policy_revision: str | None = None
    db_role: str | None = None


@dataclass(frozen=True)
class AuditFilter:
    """What an auditor narrows the log to; every field is optional."""

    action: str | None = None
    actor: str | None = None
    kind: str | None = None
    decision: str | None = None
    since: datetime | None = None
    until: datetime | None = None


class ChainVerification(BaseModel):
    """Result of recomputing every hash of the chain."""

    ok: bool
    checked: int
    broken_seq: int | None = None
    problem: str | None = None


def _filtered(statement: Any, model: Any, where: AuditFilter) -> Any:
    if where.action is not None:
        statement = statement.where(model.action == where.action)
    if where.decision is not None and model is AuditEvent:
        statement = statement.where(AuditEvent.decision == where.decision)
    if where.kind is not None:
        statement = statement.where(col(model.resource)["kind"].astext == where.kind)
    if where.actor is not None:
        statement = statement.where(or_(
            col(model.actor)["user"].astext == where.actor,
            col(model.actor)["service"].astext == where.actor,
        ))
    if where.since is not None:
        statement = statement.where(col(model.at) >= where.since)
    if where.until is not None:
        statement = statement.where(col(model.at) < where.until)
    return statement


def list_events(
    *, session: Session, limit: int, cursor: str | None, where: AuditFilter,
) -> Page[AuditEventPublic]:
    """Events, newest first, each allowed action with its recorded outcome."""
    statement = _filtered(select(AuditEvent), AuditEvent, where)
    statement = keyset(statement, [col(AuditEvent.seq)], cursor, (int,), limit)
    rows = list(session.exec(statement))
    page = page_of(rows, limit, lambda e: (e.seq,), AuditEventPublic.model_validate)
    return page.model_copy(update={"items": with_outcomes(session, page.items)})


def export_events(*, session: Session, where: AuditFilter, limit: int) -> list[AuditEventPublic]:
    """Up to ``limit`` events, oldest first (the order the chain was written in)."""
    statement = _filtered(select(AuditEvent), AuditEvent, where)
    rows = session.exec(statement.order_by(col(AuditEvent.seq)).limit(limit))
    return with_outcomes(session, [AuditEventPublic.model_validate(r) for r in rows])


def with_outcomes(session: Session, events: list[AuditEventPublic]) -> list[AuditEventPublic]:
    """Each allowed event with the outcome recorded under the same decision id."""
    ids = [e.decision_id for e in events if e.decision == "allow" and e.decision_id]
    if not ids:
        return events
    outcomes = {
        row.decision_id: row.payload for row in session.exec(
            select(AuditEvent).where(col(AuditEvent.decision_id).in_(ids),
                                     col(AuditEvent.decision).in_(("record", "deny"))))
        if isinstance(row.payload, dict) and "outcome" in row.payload
    }
    return [
        e.model_copy(update={
            "outcome": outcomes[e.decision_id].get("outcome"),
            "outcome_status": outcomes[e.decision_id].get("status"),
            "outcome_detail": outcomes[e.decision_id].get("detail")})
        if e.decision == "allow" and e.decision_id in outcomes else e
        for e in events
    ]


def list_access_events(
    *, session: Session, limit: int, cursor: str | None, where: AuditFilter,
) -> Page[AccessEventPublic]:
    """Allowed reads from the access log, newest first."""
    statement = _filtered(select(AccessEvent), AccessEvent, where)
    statement = keyset(statement, [col(AccessEvent.id)], cursor, (int,), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda e: (e.id,), AccessEventPublic.model_validate)


def verify(engine: Engine) -> ChainVerification:
    """Walk the whole chain (blocking; call from a worker thread)."""
    report = verify_chain(engine)
    return ChainVerification(ok=report.ok, checked=report.checked, broken_seq=report.broken_seq,
                             problem=report.problem)
