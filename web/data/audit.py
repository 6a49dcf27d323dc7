"""The audit log as people read it: filtered, newest first, and its chain verification.

Two views of the same rows. ``chain``: every row as stored, as the hash chain holds them.
``acts`` (what people read): one row per act. An allowed action's outcome (the ``record``
or ``deny`` the web service appends under the same ``decision_id``, ``web.audit_outcomes``)
is folded into the row of its authorization, which then carries the outcome and, for a
refusal, the reason; production traffic (``create trajectory``) is left out unless asked.
Filtering by ``person`` finds what that person did and what a loop recorded about their
decisions: its refusals (``human_decision_id`` of a decision they made) and its policy
questions asked on their behalf (``context.on_behalf_of``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, and_, func, not_, or_
from sqlmodel import Session, col, select

from triloop.audit import stored_hashes, verify_chain
from triloop.audit_anchor import broken_anchors, parse
from triloop.models import AccessEvent, AuditEvent
from triloop.models.decisions import HumanDecisionRow
from web.audit_vocabulary import TRAFFIC
from web.pagination import Page, keyset, page_of


class AuditView(StrEnum):
    """``acts``: one row per act, its outcome folded in; ``chain``: every row as stored."""

    acts = "acts"
    chain = "chain"


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
    reason: str | None = Field(
        default=None, description="why it was refused: the policy's or a loop's reasons for a"
        " deny, the refusal's for an allowed action that was then refused or failed")


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
    person: str | None = None
    view: AuditView = AuditView.chain
    traffic: bool = True
    """With ``view`` acts: include production traffic (``create trajectory``)."""


class ChainVerification(BaseModel):
    """Result of recomputing every hash of the chain (and checking kept anchors, if given)."""

    ok: bool
    checked: int
    broken_seq: int | None = None
    problem: str | None = None
    anchors_checked: int | None = Field(
        default=None, description="how many kept anchors were checked (None: none were given)")
    anchor_problems: list[str] = Field(
        default_factory=list, description="each kept anchor the chain no longer holds")


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
    if where.person is not None:
        statement = statement.where(_about_person(model, where.person))
    if model is AuditEvent and where.view is AuditView.acts:
        statement = statement.where(not_(_is_outcome()))
        if not where.traffic and where.kind != TRAFFIC[1]:
            statement = statement.where(not_(and_(
                col(AuditEvent.action) == TRAFFIC[0],
                # coalesce: a row without a kind is no episode (NOT NULL would drop it)
                func.coalesce(col(AuditEvent.resource)["kind"].astext, "") == TRAFFIC[1])))
    return statement


def _about_person(model: Any, person: str) -> Any:
    """Rows of the person's own acts and, in the audit log, what a loop recorded about them."""
    own = col(model.actor)["user"].astext == person
    if model is not AuditEvent:
        return own
    decided = select(HumanDecisionRow.id).where(HumanDecisionRow.user_name == person)
    return or_(
        own,
        col(AuditEvent.payload)["context"]["on_behalf_of"]["user"].astext == person,
        col(AuditEvent.payload)["human_decision_id"].astext.in_(decided),
    )


def _is_outcome() -> Any:
    """The web service's record of how an allowed action ended (``web.audit_outcomes``)."""
    return and_(col(AuditEvent.decision_id).is_not(None),
                col(AuditEvent.decision).in_(("record", "deny")),
                col(AuditEvent.payload)["outcome"].is_not(None))


def list_events(
    *, session: Session, limit: int, cursor: str | None, where: AuditFilter,
) -> Page[AuditEventPublic]:
    """Events, newest first, each allowed action with its recorded outcome."""
    statement = _filtered(select(AuditEvent), AuditEvent, where)
    statement = keyset(statement, [col(AuditEvent.seq)], cursor, (int,), limit)
    rows = list(session.exec(statement))
    page = page_of(rows, limit, lambda e: (e.seq,), AuditEventPublic.model_validate)
    return page.model_copy(update={"items": with_reasons(with_outcomes(session, page.items))})


def export_events(*, session: Session, where: AuditFilter, limit: int) -> list[AuditEventPublic]:
    """Up to ``limit`` events, oldest first (the order the chain was written in)."""
    statement = _filtered(select(AuditEvent), AuditEvent, where)
    rows = session.exec(statement.order_by(col(AuditEvent.seq)).limit(limit))
    return with_reasons(with_outcomes(session, [AuditEventPublic.model_validate(r) for r in rows]))


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
            "outcome_detail": outcomes[e.decision_id].get("detail"),
            "reason": _reason(outcomes[e.decision_id]) if outcomes[e.decision_id].get(
                "outcome") != "succeeded" else None})
        if e.decision == "allow" and e.decision_id in outcomes else e
        for e in events
    ]


def with_reasons(events: list[AuditEventPublic]) -> list[AuditEventPublic]:
    """Each deny with the reasons it states (the policy's ``reasons``, a loop's ``reason``)."""
    return [e.model_copy(update={"reason": _reason(e.payload)})
            if e.decision == "deny" and e.reason is None else e for e in events]


def _reason(payload: dict[str, Any]) -> str | None:
    reasons = payload.get("reasons")
    if isinstance(reasons, list) and reasons:
        return "; ".join(str(r) for r in reasons)
    for key in ("reason", "detail"):
        if payload.get(key):
            return str(payload[key])
    return None


def list_access_events(
    *, session: Session, limit: int, cursor: str | None, where: AuditFilter,
) -> Page[AccessEventPublic]:
    """Allowed reads from the access log, newest first."""
    statement = _filtered(select(AccessEvent), AccessEvent, where)
    statement = keyset(statement, [col(AccessEvent.id)], cursor, (int,), limit)
    rows = list(session.exec(statement))
    return page_of(rows, limit, lambda e: (e.id,), AccessEventPublic.model_validate)


def verify(engine: Engine, *, anchors: list[str] | None = None,
           key: str | None = None) -> ChainVerification:
    """Walk the whole chain, then check each kept anchor line against the stored hashes
    (blocking; call from a worker thread). A malformed or forged anchor raises
    ``AnchorError``."""
    report = verify_chain(engine)
    result = ChainVerification(ok=report.ok, checked=report.checked,
                               broken_seq=report.broken_seq, problem=report.problem)
    if anchors is None or key is None:
        return result
    kept = parse(anchors, key)
    problems = broken_anchors(kept, stored_hashes(engine, [a.seq for a in kept]))
    return result.model_copy(update={
        "ok": result.ok and not problems, "anchors_checked": len(kept),
        "anchor_problems": problems,
        "problem": result.problem or ("; ".join(problems) if problems else None)})
