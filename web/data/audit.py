"""The audit log as people read it: filtered, newest first, and its chain verification."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, or_
from sqlmodel import Session, col, select

from triloop.audit import verify_chain
from triloop.models import AuditEvent
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


class ChainVerification(BaseModel):
    """Result of recomputing every hash of the chain."""

    ok: bool
    checked: int
    broken_seq: int | None = None
    problem: str | None = None


def list_events(
    *, session: Session, limit: int, cursor: str | None, action: str | None = None,
    actor: str | None = None, kind: str | None = None, decision: str | None = None,
) -> Page[AuditEventPublic]:
    """Events, newest first; ``actor`` matches a user name or a service."""
    statement = select(AuditEvent)
    if action is not None:
        statement = statement.where(AuditEvent.action == action)
    if decision is not None:
        statement = statement.where(AuditEvent.decision == decision)
    if kind is not None:
        statement = statement.where(col(AuditEvent.resource)["kind"].astext == kind)
    if actor is not None:
        statement = statement.where(or_(
            col(AuditEvent.actor)["user"].astext == actor,
            col(AuditEvent.actor)["service"].astext == actor,
        ))
    statement = keyset(statement, [col(AuditEvent.seq)], cursor, (int,), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda e: (e.seq,), AuditEventPublic.model_validate)


def verify(engine: Engine) -> ChainVerification:
    """Walk the whole chain (blocking; call from a worker thread)."""
    report = verify_chain(engine)
    return ChainVerification(ok=report.ok, checked=report.checked, broken_seq=report.broken_seq,
                             problem=report.problem)
