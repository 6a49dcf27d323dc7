"""``/api/audit``: the hash-chained audit log, filtered, and its verification."""

from __future__ import annotations

from fastapi import APIRouter

from web import actions
from web.api.common import Short
from web.data import audit
from web.data.audit import AuditEventPublic, ChainVerification
from web.deps import AuthorizeDep, ServicesDep, SessionDep
from web.pagination import CursorParam, LimitParam, Page

router = APIRouter(prefix="/api/audit", tags=["audit"])


@router.get("/events", response_model=Page[AuditEventPublic])
async def list_events(
    guard: AuthorizeDep, db: SessionDep, limit: LimitParam = 50, cursor: CursorParam = None,
    action: Short | None = None, actor: Short | None = None, kind: Short | None = None,
    decision: Short | None = None,
) -> Page[AuditEventPublic]:
    """Audit events, newest first; filter by action, actor (user or service), kind, decision."""
    await guard("read", "audit_event")
    return await db.read(audit.list_events, limit=limit, cursor=cursor, action=action,
                         actor=actor, kind=kind, decision=decision)


@router.post("/verify", response_model=ChainVerification)
async def verify_audit_chain(guard: AuthorizeDep, services: ServicesDep) -> ChainVerification:
    """Recompute every hash of the chain and report the first broken row, if any."""
    return await actions.verify_audit(guard=guard, services=services)
