"""``/api/audit``: the hash-chained log of decisions (one row per act, each allowed action
with its outcome and a refusal with its reason; ``view=chain`` for every row as stored),
the access log of allowed reads, CSV/JSON export, and chain verification."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, BeforeValidator, Field

from web import actions
from web.api.common import Short
from web.audit_vocabulary import AuditAction, AuditKind
from web.data import audit
from web.data.audit import (
    AccessEventPublic,
    AuditEventPublic,
    AuditFilter,
    AuditView,
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


def _iso_8601_only(value: object) -> object:
    # pydantic reads a number (``-3589121``, ``1.5e9``, ``.5``) as a Unix timestamp; the API
    # documents ISO 8601, so anything else is a wrong type (422 like the other filters), not
    # a time in 1970. A time without a zone is UTC, as the console reads its inputs.
    if value is None:
        return None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            moment = None
        if moment is not None:
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise ValueError(f"a time in ISO 8601 (e.g. 2026-12-01T00:00:00Z), not {value!r}")


Since = Annotated[datetime | None, BeforeValidator(_iso_8601_only),
                  Query(description="events at or after (ISO 8601)")]
Until = Annotated[datetime | None, BeforeValidator(_iso_8601_only),
                  Query(description="events before (ISO 8601)")]


PersonParam = Annotated[Short | None, Query(
    description="a person: their own acts, and what a loop recorded about their decisions"
    " (its refusals, and the policy questions it asked on their behalf)")]
ViewParam = Annotated[AuditView, Query(
    description="acts: one row per act, its outcome folded in; chain: every row as stored")]
TrafficParam = Annotated[bool, Query(
    description="with view=acts: include production episodes (create trajectory)")]


@dataclass(frozen=True)
class Filters:
    """The query's filters, read once for the list and the export."""

    action: AuditAction | None = None
    actor: Short | None = None
    kind: AuditKind | None = None
    decision: AuditDecision | None = None
    since: Since = None
    until: Until = None
    person: PersonParam = None
    view: ViewParam = AuditView.acts
    traffic: TrafficParam = False

    def where(self) -> AuditFilter:
        """The data layer's filter."""
        return AuditFilter(
            action=self.action.value if self.action else None, actor=self.actor,
            kind=self.kind.value if self.kind else None,
            decision=self.decision.value if self.decision else None, since=self.since,
            until=self.until, person=self.person, view=self.view, traffic=self.traffic)


FiltersDep = Annotated[Filters, Depends()]


@router.get("/events", response_model=Page[AuditEventPublic])
async def list_events(
    guard: AuthorizeDep, db: SessionDep, filters: FiltersDep, limit: LimitParam = 50,
    cursor: CursorParam = None,
) -> Page[AuditEventPublic]:
    """The log, newest first: one row per act (each allowed action with its outcome, each
    refusal with its reason) or, with ``view=chain``, every row. Filter by action, actor
    (user or service), person, resource kind, decision and time range."""
    await guard("read", "audit_event")
    return await db.read(audit.list_events, limit=limit, cursor=cursor, where=filters.where())


CSV_COLUMNS = ("seq", "at", "actor_user", "actor_service", "actor_roles", "action",
               "resource_kind", "resource_id", "decision", "outcome", "outcome_status",
               "outcome_detail", "reason", "decision_id", "policy_revision", "hash")


def _csv_row(event: AuditEventPublic) -> list[Any]:
    return [event.seq, event.at.isoformat(), event.actor.get("user") or "",
            event.actor.get("service") or "", " ".join(event.actor.get("roles") or []),
            event.action, event.resource.get("kind") or "", event.resource.get("id") or "",
            event.decision, event.outcome or "", event.outcome_status or "",
            event.outcome_detail or "", event.reason or "", event.decision_id or "",
            event.policy_revision or "",
            event.hash]


@router.get("/events/export", response_class=Response, responses={200: {
    "description": "The events, oldest first, as CSV (one row each) or a JSON array",
    "content": {"text/csv": {"schema": {"type": "string"}},
                "application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/AuditEventPublic"}}}},
}})
async def export_events(
    guard: AuthorizeDep, db: SessionDep, filters: FiltersDep,
    format: ExportFormat = ExportFormat.csv,  # noqa: A002 (the query parameter's name)
    limit: Annotated[int, Query(ge=1, le=MAX_EXPORT)] = MAX_EXPORT,
) -> Response:
    """Download the filtered events (at most 10,000, oldest first) for an audit's working
    papers; the hashes let a reader check each row against the chain (``view=chain`` has
    every row)."""
    await guard("read", "audit_event")
    events = await db.read(audit.export_events, limit=limit, where=filters.where())
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


class VerifyRequest(BaseModel):
    """Kept anchors to check besides the chain itself."""

    anchors: list[Annotated[str, Field(max_length=1000)]] | None = Field(
        default=None, max_length=10_000,
        description="lines `triloop audit anchor` printed, one per anchor")


@router.post("/verify", response_model=ChainVerification)
async def verify_audit_chain(guard: AuthorizeDep, services: ServicesDep,
                             body: VerifyRequest | None = None) -> ChainVerification:
    """Recompute every hash of the chain and report the first broken row, if any; with
    ``anchors``, also report each kept anchor the chain no longer holds (``triloop audit
    verify`` calls this with the person's token)."""
    return await actions.verify_audit(guard=guard, services=services,
                                      anchors=body.anchors if body is not None else None)
