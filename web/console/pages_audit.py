"""Console pages an auditor reads: the audit log (one row per act, its outcome and reason,
filters from fixed vocabularies, resources linked), chain verification, and lineage."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from web import actions
from web.audit_vocabulary import ACTION_GROUPS, AuditAction, AuditKind
from web.console.rendering import ConsoleGuard, CsrfChecked, page, redirect
from web.data import audit, lineage
from web.data.audit import AuditView
from web.deps import Guard, ServicesDep, SessionDep
from web.pagination import CursorParam
from web.problems import invalid, not_found
from web.request_fields import field_with_nul

router = APIRouter(include_in_schema=False)

AUDIT_DECISIONS = ("allow", "deny", "record")

# Where the console shows each kind of resource an audit row names.
RESOURCE_PAGES = {
    "promotion": "/promotions/{id}", "training_run": "/runs/{id}",
    "checkpoint": "/checkpoints/{id}/lineage", "deployment": "/deployments#history-{id}",
    "eval_set": "/eval-sets/{id}", "environment": "/environments/{id}",
    "trajectory": "/trajectories/{id}", "audit_event": "/audit",
}


def resource_link(resource: dict[str, Any]) -> str | None:
    """The console page of an audit row's resource, if it has one."""
    template = RESOURCE_PAGES.get(str(resource.get("kind") or ""))
    ident = resource.get("id")
    if template is None or (ident in (None, "") and "{id}" in template):
        return None
    return template.format(id=quote(str(ident), safe=""))


def _moment(value: str | None, name: str) -> datetime | None:
    """A filter's date or date-time (what <input type=datetime-local> sends), in UTC."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise invalid(f"{name} must be a date or date-time such as 2026-12-01T09:30") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _word(value: str | None, words: type[AuditAction] | type[AuditKind], name: str) -> str | None:
    if not value:
        return None
    if value not in words.__members__:
        raise invalid(f"{name} {value!r} is not a word of the audit log; choose one from the"
                      " list on the page")
    return value


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(
    request: Request, guard: ConsoleGuard, db: SessionDep, cursor: CursorParam = None,
    action: str | None = None, actor: str | None = None, kind: str | None = None,
    decision: str | None = None, since: str | None = None, until: str | None = None,
    person: str | None = None, view: str | None = None, traffic: str | None = None,
) -> Response:
    """The log, one row per act (or every row), filtered by person, kind, action, decision,
    actor and time range, with export links for the same rows."""
    await guard("read", "audit_event")
    if decision and decision not in AUDIT_DECISIONS:
        raise invalid(f"decision must be one of {', '.join(AUDIT_DECISIONS)}")
    if view and view not in AuditView.__members__:
        raise invalid("view must be acts (one row per act) or chain (every row)")
    where = audit.AuditFilter(
        action=_word(action, AuditAction, "action"), actor=actor or None,
        kind=_word(kind, AuditKind, "kind"), decision=decision or None,
        since=_moment(since, "since"), until=_moment(until, "until"), person=person or None,
        view=AuditView(view or AuditView.acts), traffic=bool(traffic))
    listing = await db.read(audit.list_events, limit=30, cursor=cursor, where=where)
    can_verify = await guard.would_allow("verify", "audit_event")
    filters = {k: v for k, v in (("person", person), ("action", action), ("actor", actor),
                                 ("kind", kind), ("decision", decision), ("since", since),
                                 ("until", until), ("view", view), ("traffic", traffic)) if v}
    return page(request, "audit.html", guard.principal, title="Audit log", listing=listing,
                can_verify=can_verify, filters=filters, decisions=AUDIT_DECISIONS,
                action_groups=ACTION_GROUPS, kinds=[k.value for k in AuditKind],
                links={e.seq: resource_link(e.resource) for e in listing.items},
                query=urlencode(filters))


@router.post("/audit/verify")
async def verify_chain(
    request: Request, principal: CsrfChecked, services: ServicesDep,
    next: Annotated[str, Form(max_length=500)] = "/audit",
) -> Response:
    """Recompute the chain and show the result on the page the button was on."""
    report = await actions.verify_audit(guard=Guard(
        services, principal, refused_input=await field_with_nul(request)), services=services)
    target = next if next.startswith("/") and not next.startswith("//") else "/audit"
    if report.ok:
        notice = ("success", f"Audit chain verified: {report.checked} events, no gap, no edit.")
    else:
        notice = ("error", f"Audit chain BROKEN at event {report.broken_seq}: {report.problem} "
                           f"({report.checked} events verified before it).")
    return redirect(request, target, notice=notice)


@router.get("/checkpoints/{checkpoint_id}/lineage", response_class=HTMLResponse)
async def lineage_page(
    request: Request, checkpoint_id: str, guard: ConsoleGuard, db: SessionDep
) -> Response:
    """From the base model to the candidate: runs (their iterations collapsed), environment
    versions, eval sets, hashes."""
    await guard("read", "checkpoint", id=checkpoint_id)
    found = await db.read(lineage.lineage, checkpoint_id=checkpoint_id)
    if found is None:
        raise not_found("checkpoint", checkpoint_id)
    can_verify = await guard.would_allow("verify", "audit_event")
    return page(request, "lineage.html", guard.principal, title="Lineage", lineage=found,
                segments=lineage.segments(found), can_verify=can_verify)
