"""``/api/audit``: the hash-chained log of decisions (each allowed action with its outcome),
the access log of allowed reads, CSV/JSON export, and chain verification."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BeforeValidator

from web import actions
from web.api.common import Short
from web.data import audit
from web.data.audit import (
    AccessEventPublic,
    AuditEventPublic,
    AuditFilter,
    ChainVerification,
)
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page

router = APIRouter(prefix="/api/audit", tags=["audit"])

MAX_EXPORT = 10_000


class AuditDecision(StrEnum):
    """What an audit event records: the policy allowed, denied, or a recorded fact."""

    allow = "allow"
    deny = "deny"
    record = "record"


class ExportFormat(StrEnum):
    """The export's media type."""

    csv = "csv"
    json = "json"


_NUMBER = re.compile(r"^\s*[+-]?\d+(\.\d*)?\s*$")


def _iso_8601_only(value: object) -> object:
    # pydantic reads a bare number as a Unix timestamp; the API documents ISO 8601, so a
    # number is a wrong type (422 like the other filters), not a time in 1969.
    if isinstance(value, str) and _NUMBER.match(value):
        raise ValueError("a time in ISO 8601 (e.g. 2026-12-01T00:00:00Z), not a number")
    return value


Since = Annotated[datetime | None, BeforeValidator(_iso_8601_only),
                  Query(description="events at or after (ISO 8601)")]
Until = Annotated[datetime | None, BeforeValidator(_iso_8601_only),
                  Query(description="events before (ISO 8601)")]


def _where(action: str | None, actor: str | None, kind: str | None,
           decision: AuditDecision | None, since: datetime | None,
           until: datetime | None) -> AuditFilter:
    return AuditFilter(action=action, actor=actor, kind=kind,
                       decision=decision.value if decision else None, since=since, until=until)


@router.get("/events", response_model=Page[AuditEventPublic])
async def list_events(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    action: Short | None = None, actor: Short | None = None, kind: Short | None = None,
    decision: AuditDecision | None = None, since: Since = None, until: Until = None,
) -> Page[AuditEventPublic]:
    """Decisions and recorded facts, newest first; each allowed action carries its outcome.
    Filter by action, actor (user or service), resource kind, decision and time range."""
    await guard("read", "audit_event")
    return await db.read(audit.list_events, limit=limit, cursor=cursor,
                         where=_where(action, actor, kind, decision, since, until))


CSV_COLUMNS = ("seq", "at", "actor_user", "actor_service", "actor_roles", "action",
               "resource_kind", "resource_id", "decision", "outcome", "outcome_status",
               "outcome_detail", "decision_id", "policy_revision", "hash")


def _csv_row(event: AuditEventPublic) -> list[Any]:
    return [event.seq, event.at.isoformat(), event.actor.get("user") or "",
            event.actor.get("service") or "", " ".join(event.actor.get("roles") or []),
            event.action, event.resource.get("kind") or "", event.resource.get("id") or "",
            event.decision, event.outcome or "", event.outcome_status or "",
            event.outcome_detail or "", event.decision_id or "", event.policy_revision or "",
            event.hash]


@router.get("/events/export", response_class=Response, responses={200: {
    "description": "The events, oldest first, as CSV (one row each) or a JSON array",
    "content": {"text/csv": {"schema": {"type": "string"}},
                "application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/AuditEventPublic"}}}},
}})
async def export_events(
    guard: AuthorizeDep, db: SessionDep,
    format: ExportFormat = ExportFormat.csv,  # noqa: A002 (the query parameter's name)
    limit: Annotated[int, Query(ge=1, le=MAX_EXPORT)] = MAX_EXPORT,
    action: Short | None = None, actor: Short | None = None, kind: Short | None = None,
    decision: AuditDecision | None = None, since: Since = None, until: Until = None,
) -> Response:
    """Download the filtered events (at most 10,000, oldest first) for an audit's working
    papers; the hashes let a reader check each row against the chain."""
    await guard("read", "audit_event")
    events = await db.read(audit.export_events, limit=limit,
                           where=_where(action, actor, kind, decision, since, until))
    name = f"triloop-audit-{datetime.now().strftime('%Y%m%dT%H%M%S')}.{format.value}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    if format is ExportFormat.json:
        body = json.dumps([e.model_dump(mode="json") for e in events], ensure_ascii=False)
        return Response(body, media_type="application/json", headers=headers)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    writer.writerows(_csv_row(e) for e in events)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)


@router.get("/access", response_model=Page[AccessEventPublic])
async def list_access_events(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    actor: Short | None = None, kind: Short | None = None, since: Since = None,
    until: Until = None,
) -> Page[AccessEventPublic]:
    """Allowed reads (the access log, kept apart from decisions), newest first."""
    await guard("read", "audit_event")
    return await db.read(audit.list_access_events, limit=limit, cursor=cursor,
                         where=AuditFilter(actor=actor, kind=kind, since=since, until=until))


@router.post("/verify", response_model=ChainVerification)
async def verify_audit_chain(guard: AuthorizeDep, services: ServicesDep) -> ChainVerification:
    """Recompute every hash of the chain and report the first broken row, if any."""
    return await actions.verify_audit(guard=guard, services=services)
